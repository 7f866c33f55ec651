// @fluxvm/sdk: a TypeScript client of the FluxVM API (ESM, typed from the schemas).
export {
  FluxClient,
  GROUP,
  VERSION,
  type Answer,
  type CallOptions,
  type ClientOptions,
  type WatchEvent,
} from './client.js';
export * from './errors.js';
export { Files, type FileEntry } from './files.js';
export { waitFor, conditionOf, type KubeObject, type WaitOptions } from './objects.js';
export {
  ApplyError,
  Changeset,
  FINAL_PHASES,
  Sandbox,
  argv,
  type Command,
  type CreateOptions,
  type ExecOptions,
  type ExecResult,
} from './sandbox.js';
export {
  AgentSession,
  Approvals,
  Git,
  Previews,
  Rewind,
  type FileEvent,
  type Preview,
  type SessionEvent,
  type SessionExecOptions,
} from './session.js';
export {
  Jobs,
  SessionFiles,
  UploadInterruptedError,
  type Job,
  type JobChunk,
  type JobRead,
  type JobStartOptions,
  type Upload,
  type UploadDone,
} from './session-io.js';
export { followSse, parseSse, type SseEvent } from './sse.js';
export type * from './zz_generated.types.js';
