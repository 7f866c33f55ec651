// The object store: one SQLite file (better-sqlite3, WAL) holding every API object, one
// global resourceVersion sequence and the watch event log.
//
// The contracts (group commit, the durable sync off the event loop, checkpoints, compaction,
// frozen shared reads, disk full) are in README.md. This file holds the writes; the state and
// the reads are in reads.ts (StoreReads).
import fs from 'node:fs';
import { errors } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';
import { ck, frozenCopy, lowerBound } from './cache.js';
import { Checkpointer } from './checkpointer.js';
import { FULL_LOG_BYTES, FULL_MAX_EVENTS, isDiskFull, NOSPACE_MESSAGE, RESERVE_CHUNKS, freeBytes } from './disk.js';
import { jsonOf, stringifyWithMetadata } from './json-text.js';
import { StoreReads } from './reads.js';
import type { ObjectKey, StoreEventType, StoreOptions, WriteLimits } from './types.js';
import { StoreConflict } from './types.js';

export type {
  CompactionOptions,
  ListRange,
  ObjectKey,
  StoreEvent,
  StoreEventType,
  StoreOptions,
  WriteLimits,
} from './types.js';
export { CHECKPOINT_BYTES, DEFAULT_LOG_BYTES, DEFAULT_RESERVE_BYTES, StoreConflict } from './types.js';

/** A write checked and numbered, waiting for its batch's commit. */
interface Staged {
  key: ObjectKey;
  type: StoreEventType;
  rv: number;
  data: string;
  out: KubeObject;
  /** The private, frozen copy readers get once committed (also the staged state). */
  frozen: KubeObject;
  prev: KubeObject | undefined;
  done: { resolve(o: KubeObject): void; reject(e: unknown): void }[];
  /** Allowed in read-and-delete-only mode (a delete, a deletion step, a shrinking update). */
  whenFull: boolean;
}

export class Store extends StoreReads {
  private compactScheduled = false;
  private lastSpaceCheck = 0;
  private timer?: NodeJS.Timeout;
  private closed = false;
  private pending: Staged[] = [];
  /** Batches committed to SQLite, waiting for the fsync that makes them durable, oldest first. */
  private inflight: Staged[][] = [];
  private flushScheduled = false;
  private syncing = false;
  /** Set when a WAL fsync failed: every later write answers this (see README.md). */
  private broken?: Error;
  private checkpointer?: Checkpointer;
  private noWorker = false;
  /** Bytes committed in all (about what the commits appended to the WAL). */
  private walTotal = 0;
  /** walTotal when the last completed checkpoint started: what it copied into the database. */
  private walBackfilled = 0;
  private idleWaiters: (() => void)[] = [];
  /** The JSON each write result was stored as (see writtenJSON). */
  private readonly written = new WeakMap<object, string>();

  /** Opens the store (StoreReads); then starts the compaction timer (README.md). */
  constructor(opts: StoreOptions) {
    super(opts);
    const interval = opts.compaction?.intervalMs ?? 60_000;
    if (interval > 0) {
      this.timer = setInterval(() => {
        try {
          this.compact();
        } catch {
          // A failed compaction only keeps more history; the next tick retries.
        }
        if (this.full) this.checkSpace(true);
      }, interval);
      this.timer.unref();
    }
  }

  /** Bytes of WAL frames not yet copied into the database (what checkpointBytes bounds). */
  get walPendingBytes(): number {
    return this.walTotal - this.walBackfilled;
  }

  /** WAL checkpoints the worker completed (the bench and tests read it). */
  get walCheckpoints(): number {
    return this.checkpointer?.done ?? 0;
  }

  /** True in read-and-delete-only mode (the disk was full; see README.md). */
  get diskFull(): boolean {
    if (this.full) this.checkSpace(false);
    return this.full;
  }

  /**
   * Inserts a new object; sets metadata.resourceVersion. Throws StoreConflict('exists') when
   * the key is taken (nothing written). Returns the stored object (the caller's `obj`) once
   * durable. Commits any staged writes first.
   */
  create(key: ObjectKey, obj: KubeObject): KubeObject {
    return this.writeNow(key, 'ADDED', obj, undefined);
  }

  /**
   * Replaces an object. With `expectRV`, the write happens only when the stored object still
   * has that resourceVersion (compare-and-swap), else StoreConflict('rv'). Missing object:
   * StoreConflict('missing').
   */
  update(key: ObjectKey, obj: KubeObject, expectRV?: string): KubeObject {
    return this.writeNow(key, 'MODIFIED', obj, expectRV);
  }

  /**
   * Deletes an object, with the same compare-and-swap as update. `final`, when given, is the
   * state watchers receive (an update that removed the last finalizer); else the stored one.
   * Returns that last state with resourceVersion set to the deletion's rv (the DELETED event).
   */
  delete(key: ObjectKey, expectRV?: string, final?: KubeObject): KubeObject {
    return this.writeNow(key, 'DELETED', final, expectRV);
  }

  /**
   * Group-commit create: conflicts throw now; resolves when durable (README.md). With
   * `limits.maxBytes`, an object whose JSON is larger throws 413 now (nothing staged).
   */
  enqueueCreate(key: ObjectKey, obj: KubeObject, limits?: WriteLimits): Promise<KubeObject> {
    return this.enqueue(key, 'ADDED', obj, undefined, limits);
  }

  /** Group-commit update (compare-and-swap on expectRV against committed AND staged state); limits as enqueueCreate. */
  enqueueUpdate(key: ObjectKey, obj: KubeObject, expectRV?: string, limits?: WriteLimits): Promise<KubeObject> {
    return this.enqueue(key, 'MODIFIED', obj, expectRV, limits);
  }

  /**
   * The JSON text the store wrote for `obj`, an object a write of this store returned, or
   * undefined. Only valid while the caller has not modified it (use it right after the await).
   */
  writtenJSON(obj: KubeObject): string | undefined {
    return this.written.get(obj);
  }

  /** Group-commit delete; see delete(). */
  enqueueDelete(key: ObjectKey, expectRV?: string, final?: KubeObject): Promise<KubeObject> {
    return this.enqueue(key, 'DELETED', final, expectRV);
  }

  /** Resolves once nothing is staged (every write enqueued so far is durable or failed). */
  idle(): Promise<void> {
    if (this.pending.length === 0 && this.inflight.length === 0) return Promise.resolve();
    return new Promise((r) => this.idleWaiters.push(r));
  }

  private enqueue(
    key: ObjectKey,
    type: StoreEventType,
    obj: KubeObject | undefined,
    expectRV: string | undefined,
    limits?: WriteLimits,
  ): Promise<KubeObject> {
    const st = this.stage(key, type, obj, expectRV, limits);
    const p = new Promise<KubeObject>((resolve, reject) => st.done.push({ resolve, reject }));
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      // setImmediate: every request handled in this turn of the event loop joins the batch.
      setImmediate(() => {
        this.flushScheduled = false;
        // While an fsync runs, writes gather in `pending`; its callback commits them as one
        // transaction (one commit and one fsync per round, the loop free in between).
        if (this.syncing) return;
        try {
          this.flush();
        } catch {
          // The batch's promises carry the error.
        }
      });
    }
    return p;
  }

  private writeNow(
    key: ObjectKey,
    type: StoreEventType,
    obj: KubeObject | undefined,
    expectRV: string | undefined,
  ): KubeObject {
    const st = this.stage(key, type, obj, expectRV);
    this.flush();
    // The synchronous API: fsync here (blocking), which also covers every batch in flight.
    this.syncNow();
    return st.out;
  }

  /** fsyncs the WAL on the event loop and acknowledges everything committed (writeNow, close). */
  private syncNow(): void {
    if (this.inflight.length === 0) return;
    const upTo = this.written_;
    try {
      fs.fsyncSync(this.walFd);
    } catch (e) {
      this.fail(e as Error);
      throw this.broken;
    }
    this.durable(upTo);
  }

  /** Starts the async WAL fsync for what is committed, unless one runs (its callback starts the next). */
  private startSync(): void {
    if (this.syncing || this.inflight.length === 0 || this.broken) return;
    this.syncing = true;
    const upTo = this.written_;
    const fd = this.walFd;
    this.syncWAL(fd, (err) => {
      this.syncing = false;
      if (this.closed) {
        // close() acknowledged everything with its own fsync; the fd waited for us.
        fs.closeSync(fd);
        return;
      }
      if (err) {
        this.fail(err);
        return;
      }
      this.durable(upTo);
      if (this.pending.length === 0) return this.startSync();
      try {
        this.flush(); // starts the next fsync
      } catch {
        // The batch's promises carry the error.
      }
    });
  }

  /**
   * The WAL is on disk up to rv `upTo`: the batches it covers become visible (in-memory copy,
   * committed rv), fan out in rv order and resolve.
   */
  private durable(upTo: number): void {
    while (this.inflight.length > 0 && this.inflight[0][this.inflight[0].length - 1].rv <= upTo) {
      const batch = this.inflight.shift()!;
      for (const w of batch) {
        // Durable: update the in-memory copy (a private, frozen parse, never the caller's object).
        const c = this.resourceCache(w.key.group, w.key.resource);
        const k = ck(w.key.namespace, w.key.name);
        if (w.type === 'DELETED') {
          c.objs.delete(k);
          const i = lowerBound(c.keys, k);
          if (c.keys[i] === k) c.keys.splice(i, 1);
        } else {
          if (w.type === 'ADDED') c.keys.splice(lowerBound(c.keys, k), 0, k);
          c.objs.set(k, w.frozen);
        }
        const fk = `${w.key.group}\u0000${w.key.resource}\u0000${w.key.namespace}\u0000${w.key.name}`;
        if (this.overlay.get(fk)?.rv === w.rv) this.overlay.delete(fk);
        this.committed = w.rv;
        this.fanout({ rv: w.rv, type: w.type, key: w.key, object: w.frozen, prev: w.prev });
        for (const d of w.done) d.resolve(w.out);
      }
    }
    this.scheduleCompactionIfOver();
    this.maybeCheckpoint();
    this.wakeIdle();
  }

  /** A WAL fsync failed: reject what is in doubt and refuse every later write (README.md). */
  private fail(e: Error): void {
    this.broken ??= errors.unavailable(
      `the object store could not sync its log to disk (${e.message}); restart the server`,
    );
    // The writes in doubt, and those staged behind them (their commit would come after).
    for (const batch of [...this.inflight.splice(0), this.pending.splice(0)])
      for (const w of batch) for (const d of w.done) d.reject(this.broken);
    this.overlay.clear();
    this.wakeIdle();
  }

  /**
   * Keeps the WAL under about checkpointBytes of frames not yet in the database (as SQLite's
   * autocheckpoint does): past half of it the worker is asked to checkpoint; at all of it (the
   * worker fell behind, or there is none) the event loop checkpoints itself. The bound matters
   * on a full disk, where the WAL must fit in the database file through the reserve.
   */
  private maybeCheckpoint(): void {
    if (this.closed || this.full) return;
    const live = this.walTotal - this.walBackfilled;
    if (live < this.checkpointBytes / 2) return;
    if (live >= this.checkpointBytes || this.noWorker || this.checkpointer?.failed) {
      const at = this.walTotal;
      try {
        // NORMAL syncs the WAL before and the database after a checkpoint: safe here too.
        const [r] = this.db.pragma('wal_checkpoint(PASSIVE)') as { busy: number }[];
        if (!r?.busy) this.walBackfilled = at;
      } catch {
        // Only keeps a longer WAL; the next commit retries.
      }
      return;
    }
    try {
      if (!this.checkpointer) {
        this.checkpointer = new Checkpointer(this.db.name, (at) => {
          this.walBackfilled = Math.max(this.walBackfilled, at);
        });
      }
      this.checkpointer.request(this.walTotal);
    } catch {
      // No worker could start: the event loop checkpoints (above), as SQLite's autocheckpoint would.
      this.noWorker = true;
    }
  }

  /** Checks a write against committed + staged state, numbers it and stages it. */
  private stage(
    key: ObjectKey,
    type: StoreEventType,
    obj: KubeObject | undefined,
    expectRV: string | undefined,
    limits?: WriteLimits,
  ): Staged {
    if (this.closed) throw errors.unavailable('the object store is closed');
    if (this.broken) throw this.broken;
    const fk = `${key.group}\u0000${key.resource}\u0000${key.namespace}\u0000${key.name}`;
    const staged = this.overlay.get(fk);
    const cur = staged === undefined ? this.get(key) : (staged.obj ?? undefined);
    if (type === 'ADDED' && cur) throw new StoreConflict('exists', key);
    if (type !== 'ADDED') {
      if (!cur) throw new StoreConflict('missing', key);
      if (expectRV !== undefined && cur.metadata.resourceVersion !== expectRV) throw new StoreConflict('rv', key);
    }
    const rv = this.rv + 1;
    const out: KubeObject = obj ?? { ...cur! };
    out.metadata = { ...out.metadata, resourceVersion: String(rv) };
    const { json: data, metadata } = stringifyWithMetadata(out as unknown as Record<string, unknown>);
    if (limits?.maxBytes !== undefined && type !== 'DELETED' && Buffer.byteLength(data) > limits.maxBytes)
      throw errors.tooLarge(`Request entity too large: limit is ${limits.maxBytes}`);
    const whenFull =
      type === 'DELETED' || !!limits?.deletion || (type === 'MODIFIED' && data.length <= jsonOf(cur!).length);
    if (this.full && !whenFull) {
      this.checkSpace(false);
      if (this.full) throw errors.insufficientStorage(NOSPACE_MESSAGE);
    }
    this.rv = rv;
    const frozen = frozenCopy(data, metadata, out);
    this.written.set(out, data);
    this.overlay.set(fk, { rv, obj: type === 'DELETED' ? null : frozen });
    const st: Staged = { key, type, rv, data, out, frozen, prev: cur, done: [], whenFull };
    this.pending.push(st);
    return st;
  }

  /**
   * Commits every staged write in one transaction and starts the WAL fsync; once it returns,
   * durable() updates the in-memory copy, fans the events out in rv order and resolves. On
   * failure nothing is kept: the sequence rewinds, every staged write rejects (507 when the
   * disk is full, else 503), and the error is rethrown. A batch of writes allowed on a full
   * disk is retried once per reserve chunk released.
   */
  private flush(): void {
    const batch = this.pending;
    if (batch.length === 0) return;
    this.pending = [];
    const s = this.stmt;
    let added = 0;
    const commit = () =>
      this.db.transaction(() => {
        const ts = this.now();
        added = 0;
        for (const w of batch) {
          const sk = [w.key.group, w.key.resource, w.key.namespace, w.key.name] as const;
          if (w.type === 'ADDED') s.insert.run(...sk, w.rv, w.data);
          else if (w.type === 'MODIFIED') s.update.run(w.rv, w.data, ...sk);
          else s.del.run(...sk);
          const prev = w.prev ? jsonOf(w.prev) : null;
          s.event.run(w.rv, ts, w.type, ...sk, w.data, prev);
          added += Buffer.byteLength(w.data) + (prev ? Buffer.byteLength(prev) : 0);
        }
      })();
    try {
      for (;;) {
        try {
          commit();
          break;
        } catch (e) {
          if (!isDiskFull(e)) throw e;
          this.full = true;
          this.lastSpaceCheck = this.now();
          // No checkpoint may grow the database file into the space released below.
          this.checkpointer?.pause();
          // Deletes always get through: give back a chunk of the reserve and try again.
          if (!batch.every((w) => w.whenFull) || !this.reserve.releaseChunk()) throw e;
        }
      }
    } catch (e) {
      this.rv = this.written_;
      // Forget this batch's staged state; the batches waiting for their fsync keep theirs.
      this.overlay.clear();
      for (const b of this.inflight)
        for (const w of b)
          this.overlay.set(`${w.key.group}\u0000${w.key.resource}\u0000${w.key.namespace}\u0000${w.key.name}`, {
            rv: w.rv,
            obj: w.type === 'DELETED' ? null : w.frozen,
          });
      if (isDiskFull(e)) this.scheduleCompactionIfOver();
      const err = isDiskFull(e)
        ? errors.insufficientStorage(NOSPACE_MESSAGE)
        : errors.unavailable(`the object store could not commit: ${(e as Error).message}`);
      for (const w of batch) for (const d of w.done) d.reject(err);
      this.wakeIdle();
      throw err;
    }
    this.logBytes += added;
    // About what the commit appended to the WAL (each object is in its row and its event).
    this.walTotal += added + batch.reduce((n, w) => n + w.data.length, 0);
    this.written_ = batch[batch.length - 1].rv;
    this.inflight.push(batch);
    this.startSync();
  }

  private wakeIdle(): void {
    if (this.pending.length > 0 || this.inflight.length > 0) return;
    for (const r of this.idleWaiters.splice(0)) r();
  }

  /**
   * Drops events beyond the retention (count and age). Returns the new compaction point.
   * Safe to call at any time and repeatedly. Always keeps the latest event.
   */
  compact(): number {
    if (this.closed) return this.compacted;
    this.flush();
    let cut = Math.max(
      this.compacted,
      this.committed - (this.full ? Math.min(this.maxEvents, FULL_MAX_EVENTS) : this.maxEvents),
    );
    const byAge = (this.stmt.eventCutByAge.get(this.now() - this.maxAgeMs) as { rv: number | null }).rv;
    if (byAge !== null && byAge > cut) cut = byAge;
    // Read-and-delete-only: keep a small log, so its freed pages take the deletions' events.
    const budget = this.full ? Math.min(this.maxLogBytes, FULL_LOG_BYTES) : this.maxLogBytes;
    if (this.logBytes > budget) {
      // Oldest first, drop until the log is back under 90% of the budget (hysteresis: a
      // write just past the budget does not compact again at once).
      let drop = cut > this.compacted ? ((this.stmt.logBytesUpTo.get(cut) as { n: number | null }).n ?? 0) : 0;
      const target = this.logBytes - Math.floor(budget * 0.9);
      if (drop < target)
        for (const e of this.stmt.eventSizes.iterate(cut) as IterableIterator<{ rv: number; n: number }>) {
          drop += e.n;
          cut = e.rv;
          if (drop >= target) break;
        }
    }
    cut = Math.min(cut, this.committed - 1);
    if (cut <= this.compacted) return this.compacted;
    const dropped = (this.stmt.logBytesUpTo.get(cut) as { n: number | null }).n ?? 0;
    this.db.transaction(() => {
      this.stmt.deleteEvents.run(cut);
      this.stmt.setMeta.run(cut, 'compacted');
      this.stmt.setMeta.run(this.committed, 'rv');
    })();
    this.compacted = cut;
    this.logBytes = Math.max(0, this.logBytes - dropped);
    return cut;
  }

  /**
   * A write took the log 10% past a limit: compact soon (not inside the commit). On a full
   * disk, after every commit: compact to the small log and cut the WAL back (checkpoint
   * TRUNCATE), so the next deletes reuse the freed pages instead of needing new space.
   */
  private scheduleCompactionIfOver(): void {
    if (this.compactScheduled || this.closed) return;
    const over =
      this.full || this.logBytes > this.maxLogBytes * 1.1 || this.committed - this.compacted > this.maxEvents * 1.1;
    if (!over) return;
    this.compactScheduled = true;
    setImmediate(() => {
      this.compactScheduled = false;
      if (this.closed) return;
      for (let attempt = 0; attempt <= RESERVE_CHUNKS; attempt++) {
        try {
          this.compact();
          if (this.full) this.db.pragma('wal_checkpoint(TRUNCATE)');
          return;
        } catch (e) {
          // Only keeps more history; the timer retries. On a full disk, with reserve space.
          if (!isDiskFull(e) || !this.reserve.releaseChunk()) return;
        }
      }
    });
  }

  /** In read-and-delete-only mode: leaves it when the reserve can be written again. */
  private checkSpace(force: boolean): void {
    if (!this.full) return;
    const now = this.now();
    if (!force && now - this.lastSpaceCheck < 1000) return;
    this.lastSpaceCheck = now;
    const dir = this.reserve.dir;
    // Room for the reserve and as much again (at least 1 MiB) for the database to grow into.
    if (freeBytes(dir) < this.reserve.bytes + this.reserve.headroom()) return;
    if (this.reserve.bytes > 0 && !this.reserve.ensure(dir)) return;
    this.full = false;
    this.checkpointer?.resume();
  }

  /** Closes the database; later writes throw 503. Safe to call twice. */
  close(): void {
    if (this.closed) return;
    try {
      this.flush();
    } catch {
      // The staged writes were rejected; closing goes on.
    }
    try {
      this.syncNow();
    } catch {
      // fail() rejected the writes in doubt.
    }
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.checkpointer?.close();
    // An fsync still running closes the fd when it returns (startSync).
    if (!this.syncing) fs.closeSync(this.walFd);
    this.subscribers.clear();
    for (const fn of [...this.closeListeners]) {
      try {
        fn();
      } catch {
        // A listener's failure must not keep the database open.
      }
    }
    this.closeListeners.clear();
    this.db.close();
  }
}
