// The object store's state and its read side: opening the SQLite file, the in-memory copy,
// reads, snapshots, subscriptions and the event log's replay. The writes (the group-commit
// pipeline, compaction, the disk-full mode, close) are in store.ts, whose Store extends this.
//
// The contracts are in README.md.
import type Database from 'better-sqlite3';
import fs from 'node:fs';
import path from 'node:path';
import { errors } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';
import type { ResourceCache } from './cache.js';
import { ck, frozenCopy, span } from './cache.js';
import { Reserve, freeBytes, restrictDatabaseFiles, syncDir } from './disk.js';
import type { Statements } from './statements.js';
import { openDatabase, prepareStatements } from './statements.js';
import type { ListRange, ObjectKey, StoreEvent, StoreEventType, StoreOptions } from './types.js';
import { CHECKPOINT_BYTES, DEFAULT_LOG_BYTES } from './types.js';

export type Subscriber = (ev: StoreEvent) => void;

interface EventRow {
  rv: number;
  type: StoreEventType;
  grp: string;
  resource: string;
  ns: string;
  name: string;
  data: string;
  prev: string | null;
}

/** The Store's state and reads; see Store (store.ts) for the writes. */
export abstract class StoreReads {
  protected readonly db: Database.Database;
  protected readonly now: () => number;
  protected rv: number;
  protected compacted: number;
  protected readonly subscribers = new Set<Subscriber>();
  protected readonly maxEvents: number;
  protected readonly maxAgeMs: number;
  protected readonly maxLogBytes: number;
  /** Bytes of event text in the log (data + prev), kept up to date by flush and compact. */
  protected logBytes = 0;
  protected readonly reserve: Reserve;
  /** Read-and-delete-only mode (disk full); see README.md. */
  protected full = false;
  protected readonly stmt: Statements;
  protected readonly cache = new Map<string, ResourceCache>();
  /** Highest durable rv (what readers may see); `rv` also counts staged writes. */
  protected committed: number;
  /** Highest rv committed to SQLite (durable or waiting for the WAL fsync). */
  protected written_: number;
  /**
   * Staged or not yet durable state per `group\0resource\0ns\0name` (obj null: a deletion),
   * with the rv of the write that set it.
   */
  protected readonly overlay = new Map<string, { rv: number; obj: KubeObject | null }>();
  /** The WAL file, opened for fsync (SQLite never replaces it while the connection is open). */
  protected readonly walFd: number;
  protected readonly syncWAL: NonNullable<StoreOptions['syncWAL']>;
  protected readonly checkpointBytes: number;
  protected readonly closeListeners = new Set<() => void>();

  /**
   * Opens (creating when missing) the database in `opts.dir`. Throws when the file cannot
   * be opened or is not a FluxVM store. Opening the same directory twice in one process is
   * not supported (one writer).
   */
  constructor(opts: StoreOptions) {
    fs.mkdirSync(opts.dir, { recursive: true, mode: 0o700 });
    const file = path.join(opts.dir, opts.fileName ?? 'fluxvm.db');
    this.now = opts.now ?? Date.now;
    this.reserve = new Reserve(`${file}.reserve`, opts.reserveBytes ?? 0);
    // Before SQLite opens (which may need a little space for its -wal and -shm files): on a
    // full disk, start read-and-delete-only with one chunk of the reserve given back.
    if (this.reserve.bytes > 0 && !this.reserve.ensure(opts.dir)) {
      this.full = true;
      if (freeBytes(opts.dir) < 1024 * 1024) this.reserve.releaseChunk();
    }
    restrictDatabaseFiles(file);
    this.db = openDatabase(file);
    this.maxEvents = opts.compaction?.maxEvents ?? 50_000;
    this.maxAgeMs = opts.compaction?.maxAgeMs ?? 30 * 60_000;
    this.maxLogBytes = opts.compaction?.maxBytes ?? DEFAULT_LOG_BYTES;
    this.stmt = prepareStatements(this.db);
    this.logBytes = (this.stmt.logBytes.get() as { n: number | null }).n ?? 0;
    // The sequence is the newest event's rv (compaction always keeps the newest event), so a
    // write touches only the objects and events tables. meta.rv covers an emptied log.
    const lastEvent = (this.stmt.maxEvent.get() as { rv: number | null }).rv ?? 0;
    this.rv = Math.max(lastEvent, (this.stmt.getMeta.get('rv') as { value: number }).value);
    this.committed = this.rv;
    this.written_ = this.rv;
    this.syncWAL = opts.syncWAL ?? fs.fsync;
    this.checkpointBytes = opts.checkpointBytes ?? CHECKPOINT_BYTES;
    // The WAL exists now (the statements above opened it); its directory entry is made durable
    // once, so the first acknowledged write does not depend on it.
    this.walFd = fs.openSync(`${file}-wal`, 'r');
    fs.fsyncSync(this.walFd);
    syncDir(opts.dir);
    this.compacted = (this.stmt.getMeta.get('compacted') as { value: number }).value;
    for (const r of this.stmt.loadAll.iterate() as IterableIterator<{
      grp: string;
      resource: string;
      ns: string;
      name: string;
      data: string;
    }>) {
      const c = this.resourceCache(r.grp, r.resource);
      c.objs.set(ck(r.ns, r.name), frozenCopy(r.data, undefined));
      c.keys.push(ck(r.ns, r.name));
    }
    for (const c of this.cache.values()) c.keys.sort();
  }

  /** The resourceVersion of the last committed write (0 for an empty store). */
  get currentRV(): number {
    return this.committed;
  }

  /** Events with rv <= compactedRV are gone; replay must start at or after it. */
  get compactedRV(): number {
    return this.compacted;
  }

  get path(): string {
    return this.db.name;
  }

  /** Bytes of event text in the watch log (what CompactionOptions.maxBytes bounds). */
  get eventLogBytes(): number {
    return this.logBytes;
  }

  protected resourceCache(group: string, resource: string): ResourceCache {
    const k = `${group}\u0000${resource}`;
    let c = this.cache.get(k);
    if (!c) {
      c = { objs: new Map(), keys: [] };
      this.cache.set(k, c);
    }
    return c;
  }

  /** The stored object (shared, frozen), or undefined. Never throws for a missing key. */
  get(key: ObjectKey): KubeObject | undefined {
    return this.cache.get(`${key.group}\u0000${key.resource}`)?.objs.get(ck(key.namespace, key.name));
  }

  /**
   * The newest state including staged, not yet committed writes (undefined when absent or
   * staged for deletion). For read-modify-write only: a write based on it is still checked
   * by compare-and-swap at staging time, so it can never build on a write that failed.
   */
  getLatest(key: ObjectKey): KubeObject | undefined {
    const staged = this.overlay.get(`${key.group}\u0000${key.resource}\u0000${key.namespace}\u0000${key.name}`);
    return staged === undefined ? this.get(key) : (staged.obj ?? undefined);
  }

  /**
   * Objects of one resource ordered by (namespace, name): shared, frozen objects. A snapshot
   * of the key order is taken at the first step, so writes during iteration are safe.
   */
  *iterate(group: string, resource: string, range: ListRange = {}): Generator<KubeObject> {
    const c = this.cache.get(`${group}\u0000${resource}`);
    if (!c) return;
    const [start, end] = span(c, range);
    const keys = c.keys.slice(start, end);
    for (const k of keys) {
      const o = c.objs.get(k);
      if (o) yield o;
    }
  }

  /**
   * The objects of one resource as they were at `rv` (a consistent snapshot), in the same
   * order as iterate(). Rebuilt from the current state by undoing the logged events after
   * `rv`, so the cost is the number of those events. Throws 410 Expired when `rv` is older
   * than the compaction point; `rv` at or ahead of the committed state reads the current one.
   */
  snapshot(group: string, resource: string, range: ListRange, rv: number): KubeObject[] {
    if (rv >= this.committed) return [...this.iterate(group, resource, range)];
    this.checkNotCompacted(rv);
    const undo = new Map<string, KubeObject | null>();
    // Newest first: the last write wins, leaving each key as it was before the oldest event.
    for (const e of this.stmt.eventsOfResourceAfter.iterate(rv, this.committed, group, resource) as IterableIterator<{
      type: StoreEventType;
      ns: string;
      name: string;
      prev: string | null;
    }>) {
      undo.set(ck(e.ns, e.name), e.type === 'ADDED' || !e.prev ? null : (JSON.parse(e.prev) as KubeObject));
    }
    const c = this.cache.get(`${group}\u0000${resource}`) ?? { objs: new Map<string, KubeObject>(), keys: [] };
    const [start, end] = span(c, range);
    const inRange = (k: string) => {
      const [ns, name] = k.split('\u0000');
      if (range.namespace !== undefined && ns !== range.namespace) return false;
      return !range.after || k > ck(range.after.namespace, range.after.name);
    };
    const keys = new Set(c.keys.slice(start, end));
    for (const k of undo.keys()) if (inRange(k)) keys.add(k);
    const out: KubeObject[] = [];
    for (const k of [...keys].sort()) {
      const o = undo.has(k) ? undo.get(k) : c.objs.get(k);
      if (o) out.push(o);
    }
    return out;
  }

  /** Number of objects in the range (used for remainingItemCount). */
  count(group: string, resource: string, range: ListRange = {}): number {
    const c = this.cache.get(`${group}\u0000${resource}`);
    if (!c) return 0;
    const [start, end] = span(c, range);
    return end - start;
  }

  /** Keys of every object in a namespace, any resource (namespace deletion). */
  keysInNamespace(namespace: string): ObjectKey[] {
    return (this.stmt.nsInUse.all(namespace) as { grp: string; resource: string; name: string }[]).map((r) => ({
      group: r.grp,
      resource: r.resource,
      namespace,
      name: r.name,
    }));
  }

  protected fanout(ev: StoreEvent): void {
    for (const sub of this.subscribers) {
      try {
        sub(ev);
      } catch {
        // A subscriber's failure must not undo or block an acknowledged write.
      }
    }
  }

  /**
   * Subscribes to committed events. With `afterRV`, first replays (synchronously, before
   * returning) every logged event with rv > afterRV, then delivers live events; nothing is
   * lost or duplicated in between. Throws 410 Expired when afterRV is older than the
   * compaction point. Returns the unsubscribe function (safe to call twice).
   */
  subscribe(fn: Subscriber, afterRV?: number): () => void {
    if (afterRV !== undefined) for (const ev of this.eventsAfter(afterRV)) fn(ev);
    this.subscribers.add(fn);
    return () => {
      this.subscribers.delete(fn);
    };
  }

  /** Calls `fn` once when the store closes (watches end then). Returns the unregister function. */
  onClose(fn: () => void): () => void {
    this.closeListeners.add(fn);
    return () => {
      this.closeListeners.delete(fn);
    };
  }

  /** Logged events with rv > afterRV, oldest first. Throws 410 Expired when compacted. */
  eventsAfter(afterRV: number): StoreEvent[] {
    this.checkNotCompacted(afterRV);
    if (afterRV >= this.committed) return [];
    return (this.stmt.eventsAfter.all(afterRV, this.committed) as EventRow[]).map((r) => ({
      rv: r.rv,
      type: r.type,
      key: { group: r.grp, resource: r.resource, namespace: r.ns, name: r.name },
      object: JSON.parse(r.data) as KubeObject,
      prev: r.prev ? (JSON.parse(r.prev) as KubeObject) : undefined,
    }));
  }

  /** Throws 410 Expired when history after `rv` is no longer complete. */
  checkNotCompacted(rv: number): void {
    if (rv < this.compacted) throw errors.expired(`too old resource version: ${rv} (${this.compacted})`);
  }
}
