// The rewind points of a session: `<session dir>/rewind.json`, kept outside the
// session record (taking a point changes neither the object nor its revision). A point is a
// runtime checkpoint (`ags-<uid>-rw-<seq>`) plus what it was taken before. The ring is the
// unpinned points, oldest first, at most spec.rewind.maxPoints; pinned points leave it and stay
// until unpinned or the session goes. Writes are atomic (temp + fsync + rename + directory
// fsync) and serialized per session; `evicting` names the runtime checkpoints a write dropped,
// deleted right after it and again by the next reconcile should the process die in between
// (so a point's storage is never leaked).
import { mkdirSync, promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { AgentSession } from '../../apis/zz_generated.types.js';
import { fsyncFile, writeFileAtomic } from '../../native/workspace/atomic.js';
import { realClock, type Clock, type TimerHandle } from '../../runtime/controller/clock.js';
import { KeyedLock } from '../common/keyedlock.js';
import type { SessionState } from './state.js';

export type RewindTrigger = 'exec' | 'fileWrite' | 'git.commit' | 'git.branch' | 'promote';

export interface RewindPoint {
  /** The name undo/pin/branch/bisect use: `p-<seq>`. */
  tag: string;
  seq: number;
  /** The runtime checkpoint id. */
  ckId: string;
  kind: 'disk' | 'memory';
  takenAt: string;
  /** What the runtime reports for the checkpoint (its whole layer stack on procbox). */
  sizeBytes: number;
  /** What this point added over the newest point before it (the bytes it holds on its own; counted in usage). */
  addedBytes: number;
  pinned?: boolean;
  /** The ledger entry of its rewind.intent. */
  intent: number;
  /** The step it was taken before. */
  step: { trigger: RewindTrigger; command: string | string[] };
  /** The ledger entry of that step once it was recorded. */
  stepEntry?: number;
  /** The server stopped before the step was recorded (recovery). */
  stepInterrupted?: boolean;
  /** The process that took it (recovery finishes only other processes' points). */
  boot?: string;
}

export interface RewindFile {
  /** The last sequence number given out. */
  seq: number;
  points: RewindPoint[];
  /** Runtime checkpoints dropped from the file and not yet known to be deleted. */
  evicting?: string[];
  /**
   * Bisect copies (runtime sandboxes) that may exist: on disk before the fork that makes one, dropped once it is
   * destroyed; one a dead process left is destroyed by the next reconcile (rewind-point.ts sweepBisectCopies).
   */
  bisectCopies?: string[];
}

/** Bisect copies a bisect of this process is using now (the sweep leaves them alone). */
export const liveBisectCopies = new Set<string>();

export interface RewindConfig {
  enabled: boolean;
  maxPoints: number;
  memory: boolean;
  triggers: RewindTrigger[];
}

export const DEFAULT_MAX_POINTS = 50;
export const MAX_POINTS = 1000;
/** Pinned points a session may hold at once (they leave the ring, so they are bounded on their own). */
export const MAX_PINNED = 1000;

/** The session's rewind configuration with the schema's defaults; the spec's short names expanded. Pure. */
export function rewindConfig(s: AgentSession): RewindConfig {
  const r = s.spec.rewind ?? {};
  const raw = (r.triggers as string[] | undefined) ?? ['exec'];
  const t = new Set<RewindTrigger>();
  for (const x of raw) {
    if (x === 'file') t.add('fileWrite');
    else if (x === 'git') {
      t.add('git.commit');
      t.add('git.branch');
    } else t.add(x as RewindTrigger);
  }
  return {
    enabled: r.enabled === true,
    maxPoints: r.maxPoints ?? DEFAULT_MAX_POINTS,
    memory: r.memory !== false,
    triggers: [...t],
  };
}

/** Points oldest first (pinned and ring alike). Pure. */
export function ordered(f: RewindFile): RewindPoint[] {
  return [...f.points].sort((a, b) => a.seq - b.seq);
}

/**
 * The file with the ring trimmed to `max` unpinned points (oldest dropped first) and what was
 * dropped. Pure.
 */
export function trimRing(f: RewindFile, max: number): { file: RewindFile; dropped: RewindPoint[] } {
  const ring = ordered(f).filter((p) => !p.pinned);
  const over = Math.max(0, ring.length - max);
  if (!over) return { file: f, dropped: [] };
  const dropped = ring.slice(0, over);
  const gone = new Set(dropped.map((p) => p.seq));
  return {
    file: {
      ...f,
      points: f.points.filter((p) => !gone.has(p.seq)),
      evicting: [...(f.evicting ?? []), ...dropped.map((p) => p.ckId)],
    },
    dropped,
  };
}

/** Bytes the session's points hold (each point's own). Pure. */
export function storageBytes(f: RewindFile): number {
  return f.points.reduce((a, p) => a + p.addedBytes, 0);
}

/**
 * How long writeLater waits: the steps in it make one write. Serializing the ring and the
 * rename cost 0.7-1 ms of the server's thread per write (more with a long ring), which at 20 ms
 * landed inside the next step of an agent issuing them back to back.
 */
export const WRITE_LATER_MS = 1000;

export class RewindStore {
  private readonly cache = new Map<string, RewindFile>();
  private readonly later = new Map<string, TimerHandle>();
  readonly lock = new KeyedLock();

  constructor(
    private readonly sessionDir: (uid: string) => string,
    private readonly clock: Clock = realClock,
  ) {}

  private file(uid: string): string {
    return join(this.sessionDir(uid), 'rewind.json');
  }

  async read(uid: string): Promise<RewindFile> {
    const c = this.cache.get(uid);
    if (c) return c;
    let f: RewindFile = { seq: 0, points: [] };
    try {
      const j = JSON.parse(await fsp.readFile(this.file(uid), 'utf8')) as RewindFile;
      if (j && Array.isArray(j.points) && Number.isSafeInteger(j.seq)) f = j;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    this.cache.set(uid, f);
    return f;
  }

  /** Whether the session has a rewind file (without reading it). */
  async exists(uid: string): Promise<boolean> {
    if (this.cache.has(uid)) return true;
    return fsp.stat(this.file(uid)).then(
      () => true,
      () => false,
    );
  }

  /** Replaces the file (durably unless `durable` is false: a rename without fsync, for what the ledger also proves). */
  async write(uid: string, f: RewindFile, durable = true): Promise<void> {
    // Synchronous: a stat of the directory when it exists (one thread-pool round trip was
    // 0.3-0.5 ms on the path of every step that took a point).
    mkdirSync(this.sessionDir(uid), { recursive: true, mode: 0o700 });
    await writeFileAtomic(this.file(uid), JSON.stringify(f), 0o600, { durable });
    this.cache.set(uid, f);
  }

  /** Replaces the file in memory only (readers see it at once); the next write puts it on disk. */
  put(uid: string, f: RewindFile): void {
    this.cache.set(uid, f);
  }

  /**
   * Writes the file as the cache then has it, without fsync, WRITE_LATER_MS from now under the
   * lock: once for every call until then. For what the ledger proves (a step's entry on its
   * point): the write ran on the microtasks ahead of the step's answer before, and now runs
   * once per burst of steps. Lost with the process, it is redone from the ledger at the next
   * start (recoverRewind); nothing reads the file while the process runs (the cache).
   */
  writeLater(uid: string): void {
    if (this.later.has(uid)) return;
    const t = this.clock.setTimeout(() => {
      this.later.delete(uid);
      void this.lock
        .run(uid, async () => {
          const f = this.cache.get(uid);
          if (f) await this.write(uid, f, false); // not after forget(): the session is gone
        })
        .catch(() => undefined); // left to the next write, or to recovery from the ledger
    }, WRITE_LATER_MS);
    this.later.set(uid, t);
  }

  /**
   * fsyncs the file as it is now and its directory (after writes with `durable` false). Not
   * under the lock: a write racing it renames a whole new file, and the next flush covers that.
   */
  async sync(uid: string): Promise<void> {
    await Promise.all([this.file(uid), this.sessionDir(uid)].map((p) => fsyncFile(p)));
  }

  /** Runs `fn` with the session's file under its lock; a returned file is written (durably). */
  update<T>(uid: string, fn: (f: RewindFile) => Promise<{ file?: RewindFile; value: T }>): Promise<T> {
    return this.lock.run(uid, async () => {
      const r = await fn(await this.read(uid));
      if (r.file) await this.write(uid, r.file);
      return r.value;
    });
  }

  forget(uid: string): void {
    this.later.get(uid)?.cancel();
    this.later.delete(uid);
    this.cache.delete(uid);
  }
}

const stores = new WeakMap<SessionState, RewindStore>();
/**
 * The one store of a state directory (the reconciler and the handlers share it), made on the
 * first call with that call's clock (its writeLater timers; tests pass a FakeClock first).
 */
export function rewindStore(state: SessionState, clock?: Clock): RewindStore {
  let s = stores.get(state);
  if (!s) stores.set(state, (s = new RewindStore((uid) => state.sessionDir(uid), clock)));
  return s;
}

export const pointTag = (seq: number) => `p-${seq}`;
/** The runtime checkpoint of point `seq` (as the session's other checkpoints: ags-<uid>-...). */
export const pointCk = (s: AgentSession, seq: number) => `ags-${s.metadata.uid}-rw-${seq}`;
