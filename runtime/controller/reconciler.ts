// The reconciler contract. A reconciler is handed a key, never an event: it re-reads the
// object and converges it. The outcome is a small value; failure is a throw.
//   return done()             -> success; the key's backoff is forgotten
//   return requeueAfter(ms)   -> success; run again after ms (TTLs, polling)
//   throw err                 -> retried with per-key exponential backoff
//   throw new TerminalError() -> logged, not retried (until the object changes again)

export interface ObjectKey {
  /** '' for cluster-scoped objects. */
  namespace: string;
  name: string;
}

export type Result = { requeueAfterMs?: number };

export const done = (): Result => ({});
export const requeueAfter = (ms: number): Result => ({ requeueAfterMs: Math.max(0, ms) });

export interface Reconciler {
  reconcile(key: ObjectKey, signal: AbortSignal): Promise<Result>;
}

/** An error that retrying cannot fix (bad spec, missing capability): no requeue. */
export class TerminalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'TerminalError';
  }
}

export function isTerminal(e: unknown): e is TerminalError {
  return e instanceof TerminalError;
}

/** 'ns/name' or 'name' for cluster-scoped objects, as client-go's MetaNamespaceKeyFunc. */
export function keyString(k: ObjectKey): string {
  return k.namespace ? `${k.namespace}/${k.name}` : k.name;
}

export function parseKey(s: string): ObjectKey {
  const i = s.indexOf('/');
  return i < 0 ? { namespace: '', name: s } : { namespace: s.slice(0, i), name: s.slice(i + 1) };
}

export function keyOf(obj: { metadata: { namespace?: string; name?: string } }): ObjectKey {
  return { namespace: obj.metadata.namespace ?? '', name: obj.metadata.name ?? '' };
}

/** A minimal structured logger; `console`-compatible. */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export const silentLogger: Logger = { info() {}, error() {} };

export const consoleLogger: Logger = {
  info: (msg, f) => console.error(`I ${new Date().toISOString()} ${msg}${f ? ' ' + JSON.stringify(f) : ''}`),
  error: (msg, f) => console.error(`E ${new Date().toISOString()} ${msg}${f ? ' ' + JSON.stringify(f) : ''}`),
};
