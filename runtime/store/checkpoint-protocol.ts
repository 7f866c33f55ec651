// What the store (checkpointer.ts) and its checkpoint worker (checkpoint-worker.ts) share.
//
// Flags, an Int32Array over a SharedArrayBuffer, one slot each:
// - CLOSED: raised by the worker once its connection is closed;
// - BUSY: a checkpoint runs (taken with compare-and-swap);
// - PAUSED: the store is short of disk: no checkpoint may start, so none grows the database file
//   into the space the store frees.
export const CLOSED = 0;
export const BUSY = 1;
export const PAUSED = 2;
export const FLAG_SLOTS = 3;

/** The worker's workerData. */
export interface CheckpointWorkerData {
  /** The database file. */
  file: string;
  flags: Int32Array;
}

/** What the store posts: run one PASSIVE checkpoint, or close the connection and stop. */
export type CheckpointRequest = 'checkpoint' | 'close';

/** The worker's answer to a 'checkpoint' request. */
export interface CheckpointReply {
  /** SQLite's wal_checkpoint row. */
  result?: { busy: number; log: number; checkpointed: number };
  /** Another checkpoint ran, or the store paused checkpoints. */
  skipped?: boolean;
  error?: string;
}
