// The object store: one SQLite file (better-sqlite3, WAL, synchronous=FULL) holding every
// API object, one global resourceVersion sequence and the watch event log.
//
// Contracts:
// - Every write (create/update/delete) takes the next resourceVersion of ONE global integer
//   sequence and appends one event to the log in the same transaction; when the call
//   returns, the write is durable (WAL fsync on commit) and has been fanned out to every
//   subscriber, in resourceVersion order.
// - Stored objects carry `metadata.resourceVersion` = String(rv) of their last write.
// - The event log is compacted (keep the last `maxEvents` events, and none older than
//   `maxAgeMs`); replaying from a resourceVersion older than the compaction point throws
//   410 Expired `too old resource version: X (Y)`.
// - The store knows nothing about API semantics (no defaults, no admission); it only does
//   compare-and-swap on resourceVersion. Callers must treat returned objects as their own
//   copies, but event objects handed to subscribers are shared between subscribers and
//   must not be mutated.
import Database from 'better-sqlite3';
import fs from 'node:fs';
import path from 'node:path';
import { errors } from '../meta/errors.js';
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
  /** Keep at most this many events (default 100000). */
  maxEvents?: number;
  /** Drop events older than this (default 60 minutes). */
  maxAgeMs?: number;
  /** How often compaction runs in the background (default 60 s; 0 disables the timer). */
  intervalMs?: number;
}

export interface StoreOptions {
  /** Directory holding the database file; created when missing. */
  dir: string;
  /** File name inside dir (default `fluxvm.db`). */
  fileName?: string;
  compaction?: CompactionOptions;
  /** Milliseconds since the epoch; injected so tests control time. */
  now?: () => number;
}

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

/** Within one namespace, the name to start after for a position that may be in another. */
function nameAfter(ns: string, a: { namespace: string; name: string }): string {
  if (a.namespace === ns) return a.name;
  return a.namespace < ns ? '' : '\uffff';
}

type Subscriber = (ev: StoreEvent) => void;

interface ObjRow {
  rv: number;
  data: string;
}

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

export class Store {
  private readonly db: Database.Database;
  private readonly now: () => number;
  private rv: number;
  private compacted: number;
  private readonly subscribers = new Set<Subscriber>();
  private readonly maxEvents: number;
  private readonly maxAgeMs: number;
  private timer?: NodeJS.Timeout;
  private closed = false;
  private readonly stmt: ReturnType<Store['prepare']>;

  /**
   * Opens (creating when missing) the database in `opts.dir`. Throws when the file cannot
   * be opened or is not a FluxVM store. Opening the same directory twice in one process is
   * not supported (one writer).
   */
  constructor(opts: StoreOptions) {
    fs.mkdirSync(opts.dir, { recursive: true, mode: 0o700 });
    this.db = new Database(path.join(opts.dir, opts.fileName ?? 'fluxvm.db'));
    this.db.pragma('journal_mode = WAL');
    // FULL: the WAL is fsynced on every commit, so an acknowledged write survives kill -9
    // and power loss (NORMAL would only survive a process crash).
    this.db.pragma('synchronous = FULL');
    this.db.pragma('busy_timeout = 5000');
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS objects (
        grp TEXT NOT NULL, resource TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
        rv INTEGER NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (grp, resource, ns, name)) WITHOUT ROWID;
      CREATE TABLE IF NOT EXISTS events (
        rv INTEGER PRIMARY KEY, ts INTEGER NOT NULL, type TEXT NOT NULL,
        grp TEXT NOT NULL, resource TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
        data TEXT NOT NULL, prev TEXT);
      CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
      INSERT OR IGNORE INTO meta (key, value) VALUES ('rv', 0), ('compacted', 0);
    `);
    this.now = opts.now ?? Date.now;
    this.maxEvents = opts.compaction?.maxEvents ?? 100_000;
    this.maxAgeMs = opts.compaction?.maxAgeMs ?? 60 * 60_000;
    this.stmt = this.prepare();
    // The sequence is the newest event's rv (compaction always keeps the newest event), so a
    // write touches only the objects and events tables. meta.rv covers an emptied log.
    const lastEvent = (this.stmt.maxEvent.get() as { rv: number | null }).rv ?? 0;
    this.rv = Math.max(lastEvent, (this.stmt.getMeta.get('rv') as { value: number }).value);
    this.compacted = (this.stmt.getMeta.get('compacted') as { value: number }).value;
    const interval = opts.compaction?.intervalMs ?? 60_000;
    if (interval > 0) {
      this.timer = setInterval(() => {
        try {
          this.compact();
        } catch {
          // A failed compaction only keeps more history; the next tick retries.
        }
      }, interval);
      this.timer.unref();
    }
  }

  private prepare() {
    const db = this.db;
    return {
      getMeta: db.prepare('SELECT value FROM meta WHERE key = ?'),
      setMeta: db.prepare('UPDATE meta SET value = ? WHERE key = ?'),
      get: db.prepare('SELECT rv, data FROM objects WHERE grp = ? AND resource = ? AND ns = ? AND name = ?'),
      insert: db.prepare('INSERT INTO objects (grp, resource, ns, name, rv, data) VALUES (?, ?, ?, ?, ?, ?)'),
      update: db.prepare('UPDATE objects SET rv = ?, data = ? WHERE grp = ? AND resource = ? AND ns = ? AND name = ?'),
      del: db.prepare('DELETE FROM objects WHERE grp = ? AND resource = ? AND ns = ? AND name = ?'),
      event: db.prepare(
        'INSERT INTO events (rv, ts, type, grp, resource, ns, name, data, prev) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)',
      ),
      listAll: db.prepare('SELECT ns, name, data FROM objects WHERE grp = ? AND resource = ? ORDER BY ns, name'),
      listAllAfter: db.prepare(
        'SELECT ns, name, data FROM objects WHERE grp = ? AND resource = ? AND (ns > ? OR (ns = ? AND name > ?)) ORDER BY ns, name',
      ),
      listNs: db.prepare('SELECT ns, name, data FROM objects WHERE grp = ? AND resource = ? AND ns = ? ORDER BY name'),
      listNsAfter: db.prepare(
        'SELECT ns, name, data FROM objects WHERE grp = ? AND resource = ? AND ns = ? AND name > ? ORDER BY name',
      ),
      countAll: db.prepare('SELECT count(*) AS n FROM objects WHERE grp = ? AND resource = ?'),
      countAllAfter: db.prepare(
        'SELECT count(*) AS n FROM objects WHERE grp = ? AND resource = ? AND (ns > ? OR (ns = ? AND name > ?))',
      ),
      countNs: db.prepare('SELECT count(*) AS n FROM objects WHERE grp = ? AND resource = ? AND ns = ?'),
      countNsAfter: db.prepare('SELECT count(*) AS n FROM objects WHERE grp = ? AND resource = ? AND ns = ? AND name > ?'),
      maxEvent: db.prepare('SELECT max(rv) AS rv FROM events'),
      eventsAfter: db.prepare('SELECT * FROM events WHERE rv > ? ORDER BY rv'),
      eventCutByAge: db.prepare('SELECT max(rv) AS rv FROM events WHERE ts < ?'),
      deleteEvents: db.prepare('DELETE FROM events WHERE rv <= ?'),
      nsInUse: db.prepare('SELECT grp, resource, name FROM objects WHERE ns = ?'),
    };
  }

  /** The resourceVersion of the last committed write (0 for an empty store). */
  get currentRV(): number {
    return this.rv;
  }

  /** Events with rv <= compactedRV are gone; replay must start at or after it. */
  get compactedRV(): number {
    return this.compacted;
  }

  get path(): string {
    return this.db.name;
  }

  /** Returns a fresh copy of the object, or undefined. Never throws for a missing key. */
  get(key: ObjectKey): KubeObject | undefined {
    const row = this.stmt.get.get(key.group, key.resource, key.namespace, key.name) as ObjRow | undefined;
    return row ? (JSON.parse(row.data) as KubeObject) : undefined;
  }

  /**
   * Iterates objects of one resource ordered by (namespace, name), as fresh copies.
   * The iterator holds a read statement open: consume or return() it before writing.
   */
  *iterate(group: string, resource: string, range: ListRange = {}): Generator<KubeObject> {
    const s = this.stmt;
    const a = range.after;
    let it: IterableIterator<unknown>;
    if (range.namespace !== undefined) {
      it = a
        ? s.listNsAfter.iterate(group, resource, range.namespace, nameAfter(range.namespace, a))
        : s.listNs.iterate(group, resource, range.namespace);
    } else {
      it = a ? s.listAllAfter.iterate(group, resource, a.namespace, a.namespace, a.name) : s.listAll.iterate(group, resource);
    }
    for (const row of it as IterableIterator<{ data: string }>) yield JSON.parse(row.data) as KubeObject;
  }

  /** Number of objects in the range (used for remainingItemCount). */
  count(group: string, resource: string, range: ListRange = {}): number {
    const s = this.stmt;
    const a = range.after;
    let r: unknown;
    if (range.namespace !== undefined) {
      r = a ? s.countNsAfter.get(group, resource, range.namespace, nameAfter(range.namespace, a)) : s.countNs.get(group, resource, range.namespace);
    } else {
      r = a ? s.countAllAfter.get(group, resource, a.namespace, a.namespace, a.name) : s.countAll.get(group, resource);
    }
    return (r as { n: number }).n;
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

  /**
   * Inserts a new object; sets metadata.resourceVersion. Throws StoreConflict('exists') when
   * the key is taken (nothing written). Returns the stored object (the caller's `obj`).
   */
  create(key: ObjectKey, obj: KubeObject): KubeObject {
    return this.write(key, 'ADDED', obj, undefined);
  }

  /**
   * Replaces an object. With `expectRV`, the write happens only when the stored object still
   * has that resourceVersion (compare-and-swap), else StoreConflict('rv'). Missing object:
   * StoreConflict('missing').
   */
  update(key: ObjectKey, obj: KubeObject, expectRV?: string): KubeObject {
    return this.write(key, 'MODIFIED', obj, expectRV);
  }

  /**
   * Deletes an object, with the same compare-and-swap as update. `final`, when given, is the
   * state watchers receive (an update that removed the last finalizer); else the stored one.
   * Returns that last state with resourceVersion set to the deletion's rv (the DELETED event).
   */
  delete(key: ObjectKey, expectRV?: string, final?: KubeObject): KubeObject {
    return this.write(key, 'DELETED', final, expectRV);
  }

  private write(key: ObjectKey, type: StoreEventType, obj: KubeObject | undefined, expectRV: string | undefined): KubeObject {
    if (this.closed) throw errors.unavailable('the object store is closed');
    const s = this.stmt;
    const k = [key.group, key.resource, key.namespace, key.name] as const;
    let ev!: StoreEvent;
    this.db.transaction(() => {
      // A create needs no read: the primary key refuses a duplicate (caught below).
      const row = type === 'ADDED' ? undefined : (s.get.get(...k) as ObjRow | undefined);
      if (type !== 'ADDED') {
        if (!row) throw new StoreConflict('missing', key);
        if (expectRV !== undefined && String(row.rv) !== expectRV) throw new StoreConflict('rv', key);
      }
      const rv = this.rv + 1;
      const prev = row ? (JSON.parse(row.data) as KubeObject) : undefined;
      const out = obj ?? (JSON.parse(row!.data) as KubeObject);
      out.metadata = { ...out.metadata, resourceVersion: String(rv) };
      const data = JSON.stringify(out);
      if (type === 'ADDED') {
        try {
          s.insert.run(...k, rv, data);
        } catch (e) {
          if ((e as { code?: string }).code === 'SQLITE_CONSTRAINT_PRIMARYKEY') throw new StoreConflict('exists', key);
          throw e;
        }
      }
      else if (type === 'MODIFIED') s.update.run(rv, data, ...k);
      else s.del.run(...k);
      s.event.run(rv, this.now(), type, ...k, data, type === 'ADDED' ? null : row!.data);
      this.rv = rv;
      ev = { rv, type, key, object: out, prev };
    })();
    this.fanout(ev);
    return ev.object;
  }

  private fanout(ev: StoreEvent): void {
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

  /** Logged events with rv > afterRV, oldest first. Throws 410 Expired when compacted. */
  eventsAfter(afterRV: number): StoreEvent[] {
    this.checkNotCompacted(afterRV);
    if (afterRV >= this.rv) return [];
    return (this.stmt.eventsAfter.all(afterRV) as EventRow[]).map((r) => ({
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

  /**
   * Drops events beyond the retention (count and age). Returns the new compaction point.
   * Safe to call at any time and repeatedly. Always keeps the latest event.
   */
  compact(): number {
    if (this.closed) return this.compacted;
    let cut = Math.max(this.compacted, this.rv - this.maxEvents);
    const byAge = (this.stmt.eventCutByAge.get(this.now() - this.maxAgeMs) as { rv: number | null }).rv;
    if (byAge !== null && byAge > cut) cut = byAge;
    cut = Math.min(cut, this.rv - 1);
    if (cut <= this.compacted) return this.compacted;
    this.db.transaction(() => {
      this.stmt.deleteEvents.run(cut);
      this.stmt.setMeta.run(cut, 'compacted');
      this.stmt.setMeta.run(this.rv, 'rv');
    })();
    this.compacted = cut;
    return cut;
  }

  /** Closes the database; later writes throw 503. Safe to call twice. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.subscribers.clear();
    this.db.close();
  }
}
