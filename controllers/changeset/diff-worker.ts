// Worker thread of the diff pool (diffpool.ts). Protocol (structured clone), one job at a time:
//   out first: { ready: true }                      once this module is loaded
//   in:  { id, path, before?, after?, limits }       before/after: the file's bytes (Uint8Array)
//   out: { id, text } | { id, error }                text: fileDiff's section for the file
// Runs until the pool terminates it (idle, job deadline, close) or it hits its heap limit.
import { parentPort } from 'node:worker_threads';
import { fileDiff, type DiffLimits } from './unidiff.js';

export interface DiffJobMessage {
  id: number;
  path: string;
  before?: Uint8Array;
  after?: Uint8Array;
  limits: DiffLimits;
}

export type DiffResultMessage = { ready: true } | { id: number; text: string } | { id: number; error: string };

const port = parentPort!;
port.on('message', (m: DiffJobMessage) => {
  let reply: DiffResultMessage;
  try {
    reply = { id: m.id, text: fileDiff(m.path, m.before, m.after, m.limits) };
  } catch (e) {
    reply = { id: m.id, error: String(e) };
  }
  port.postMessage(reply);
});
port.postMessage({ ready: true } satisfies DiffResultMessage);
