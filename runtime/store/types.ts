// The store's public types (store.ts re-exports them).
import type { KubeObject } from '../meta/types.js';

export interface ObjectKey {
  group: string;
  resource: string;
  /** '' for cluster-scoped objects. */
  namespace: string;
  name: string;
}

export type StoreEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface StoreEvent {
  rv: number;
  type: StoreEventType;
  key: ObjectKey;
  /** The object after the write; for DELETED, the last state with resourceVersion = rv. */
  object: KubeObject;
  /** The object before the write (MODIFIED and DELETED); lets watchers filter transitions. */
  prev?: KubeObject;
}

export interface CompactionOptions {
  /** Keep at most this many events (default 50000; each keeps the object before and after). */
  maxEvents?: number;
  /** Drop events older than this (default 30 minutes; a watcher further behind relists on 410). */
  maxAgeMs?: number;
  /** How often compaction runs in the background (default 60 s; 0 disables the timer). */
  intervalMs?: number;
  /**
   * Keep at most this many bytes of event text (the object after and before each write;
   * default 64 MiB). The size budget that bounds the file whatever the object sizes.
   */
  maxBytes?: number;
}

/** Default size budget of the watch event log (CompactionOptions.maxBytes). */
export const DEFAULT_LOG_BYTES = 64 * 1024 * 1024;
/** The disk reserve `fluxctl serve` keeps (StoreOptions.reserveBytes, --disk-reserve). */
export const DEFAULT_RESERVE_BYTES = 8 * 1024 * 1024;

export interface StoreOptions {
  /** Directory holding the database file; created when missing. */
  dir: string;
  /** File name inside dir (default `fluxvm.db`). */
  fileName?: string;
  compaction?: CompactionOptions;
  /** Milliseconds since the epoch; injected so tests control time. */
  now?: () => number;
  /**
   * Bytes preallocated in `<dir>/<fileName>.reserve.N`, released when the disk is full so
   * deletes still commit (default 0: no reserve; `fluxctl serve` keeps DEFAULT_RESERVE_BYTES).
   */
  reserveBytes?: number;
  /**
   * The durable sync of the WAL file (default `fs.fsync`, run on libuv's thread pool); tests
   * inject one to hold or fail it. Must call back once the file's data is on stable storage.
   */
  syncWAL?: (fd: number, cb: (err: NodeJS.ErrnoException | null) => void) => void;
  /**
   * Bytes of WAL not yet checkpointed that the store keeps under (default CHECKPOINT_BYTES; the worker runs at half).
   */
  checkpointBytes?: number;
}

/** WAL bytes not yet checkpointed at which the event loop checkpoints (SQLite's own default: 1000 pages of 4 KiB). */
export const CHECKPOINT_BYTES = 4 * 1024 * 1024;

/** Thrown by store writes; the registry maps these to API Status errors. */
export class StoreConflict extends Error {
  constructor(
    readonly kind: 'exists' | 'missing' | 'rv',
    readonly key: ObjectKey,
  ) {
    super(`store ${kind}: ${key.group}/${key.resource}/${key.namespace}/${key.name}`);
    this.name = 'StoreConflict';
  }
}

export interface ListRange {
  /** Only this namespace (undefined: every namespace). */
  namespace?: string;
  /** Start strictly after this (namespace, name) position (pagination). */
  after?: { namespace: string; name: string };
}

export interface WriteLimits {
  /** Largest accepted object, as JSON bytes (etcd's request limit); larger: 413, nothing written. */
  maxBytes?: number;
  /**
   * The update is a step of a deletion (deletionTimestamp, the garbage collector's finalizers):
   * accepted even when the disk is full, as deletes are.
   */
  deletion?: boolean;
}
