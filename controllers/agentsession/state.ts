// Per-session controller state on disk, `<dir>/<session uid>/`:
//   usage.json        what the session consumed (budget checks read it; status.usage mirrors it)
//   op.json           the lifecycle marker: the operation in flight and the process running it
//   interrupted.json  an operation whose process died with it (status.interruptedOp)
//   idempotency.json  Idempotency-Key records (24 h)
//   revision.json     the session revision: bumped (durably) when a checkpoint, restore, fork
//                     or promote starts; an Approval's digest covers it (approvals.ts)
// Every file is written to a temporary name, fsynced and renamed, so a crash leaves the old
// or the new content, never half of either.
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { errors } from '../../runtime/meta/errors.js';
import { writeFileAtomic } from '../../native/workspace/atomic.js';
import { requestDigest } from '../../runtime/apiserver/idempotency.js';

/** This process: a running Idempotency-Key record of another boot was cut by a restart. */
const BOOT = randomUUID();

export interface Usage {
  execs: number;
  execMs: number;
  computeMs: number;
  jobs: number;
  children: number;
  workspaceBytes: number;
}

export const emptyUsage = (): Usage => ({ execs: 0, execMs: 0, computeMs: 0, jobs: 0, children: 0, workspaceBytes: 0 });

export type LifecycleOp = 'checkpoint' | 'restore' | 'fork' | 'promote' | 'delete';

export interface OpMarker {
  op: LifecycleOp;
  startedAt: string;
  pid: number;
  /** The holder process's start time (/proc/<pid>/stat field 22), so a recycled pid is not mistaken for it. */
  pidStart: string;
}

export interface IdemRecord {
  key: string;
  op: string;
  bodyHash: string;
  state: 'running' | 'done';
  at: number;
  /** The process that ran it (BOOT); absent in records written before it was kept. */
  boot?: string;
  response?: unknown;
}

export const IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000;

/** Start time of process `pid` from /proc, '' when unknown (not Linux, gone). */
export function processStart(pid: number): string {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? '';
  } catch {
    return '';
  }
}

/** Whether the process that wrote `m` still runs. */
export function holderAlive(m: OpMarker): boolean {
  try {
    process.kill(m.pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  return processStart(m.pid) === m.pidStart;
}

/**
 * Writes `value` to a temporary name and renames it over `file`: a crash of the process leaves
 * the old or the new content. With `durable`, the file and its directory are fsynced too (a
 * power cut keeps it). Usage counters and the lifecycle marker are written without: the
 * counters are recounted from the fsynced ledger on load (see usage()), and the marker reports
 * a crash of this process, whose page cache survives it.
 */
async function writeAtomic(file: string, value: unknown, durable = false): Promise<void> {
  await writeFileAtomic(file, JSON.stringify(value), 0o600, { durable });
}

async function readJson<T>(file: string): Promise<T | undefined> {
  try {
    return JSON.parse(await fsp.readFile(file, 'utf8')) as T;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' || e instanceof SyntaxError) return undefined;
    throw e;
  }
}

export class SessionState {
  /** Serializes read-modify-write of one session's files in this process. */
  private readonly locks = new Map<string, Promise<unknown>>();
  /** Execs running now, per session (restore and fork refuse while any runs). */
  readonly running = new Map<string, number>();
  /** Usage loaded in this process (the file is a cache of it). */
  private readonly usages = new Map<string, Usage>();
  /** Revisions read or written by this process (the only writer of its state directory). */
  private readonly revisions = new Map<string, number>();
  /** Session directories this process made (or found) already. */
  private readonly made = new Set<string>();

  /**
   * `recount` gives the usage the session's ledger proves (execs and their time, children):
   * on the first load in a process each counter is the larger of it and usage.json, so a
   * usage file lost or stale after a power cut never under-counts an acknowledged exec.
   */
  constructor(
    readonly dir: string,
    private readonly now: () => number = Date.now,
    private readonly alive: (m: OpMarker) => boolean = holderAlive,
    private readonly recount?: (uid: string) => Promise<Partial<Usage>>,
  ) {}

  sessionDir(uid: string): string {
    return join(this.dir, uid);
  }

  /** Runs fn with the session's lock held (one at a time per session, in this process). */
  async locked<T>(uid: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(uid) ?? Promise.resolve();
    const run = prev.catch(() => undefined).then(fn);
    this.locks.set(uid, run);
    try {
      return await run;
    } finally {
      if (this.locks.get(uid) === run) this.locks.delete(uid);
    }
  }

  private async ensure(uid: string): Promise<string> {
    const d = this.sessionDir(uid);
    if (this.made.has(uid)) return d;
    await fsp.mkdir(d, { recursive: true, mode: 0o700 });
    this.made.add(uid);
    return d;
  }

  async usage(uid: string): Promise<Usage> {
    const cached = this.usages.get(uid);
    if (cached) return { ...cached };
    const file: Usage = {
      ...emptyUsage(),
      ...((await readJson<Usage>(join(this.sessionDir(uid), 'usage.json'))) ?? {}),
    };
    const proven = (await this.recount?.(uid)) ?? {};
    const u = { ...file };
    for (const [k, v] of Object.entries(proven) as [keyof Usage, unknown][])
      if (typeof v === 'number' && v > u[k]) u[k] = v;
    this.usages.set(uid, u);
    return { ...u };
  }

  /**
   * Applies `f` to the usage under the lock, persists it (usage.json, see writeAtomic), returns
   * the new value. With `persist` false only this process's copy changes (an exec's
   * reservation: the lock is what keeps parallel requests under maxExecs; the file is written
   * when the exec finishes, and the ledger is the record).
   */
  async updateUsage(uid: string, f: (u: Usage) => Usage, o: { persist?: boolean } = {}): Promise<Usage> {
    return this.locked(uid, async () => {
      const next = f(await this.usage(uid));
      this.usages.set(uid, { ...next });
      if (o.persist !== false) await writeAtomic(join(await this.ensure(uid), 'usage.json'), next);
      return next;
    });
  }

  /**
   * Takes the session's lifecycle slot for `op`: 409 naming what is in flight when another
   * operation holds it (in this process or in another live one: the marker is on disk), and
   * for restore/fork/promote also while commands run. A marker left by a dead process is
   * turned into interrupted.json first (reported, not repaired) and the slot is free.
   * Returns the release function, which removes the marker; call it exactly once.
   */
  async begin(uid: string, name: string, op: LifecycleOp): Promise<() => Promise<void>> {
    return this.locked(uid, async () => {
      // No marker on disk (the common case): a stat on the event loop, not two reads queued in
      // libuv's thread pool behind other I/O (they were most of the slot's cost).
      const marker = join(this.sessionDir(uid), 'op.json');
      let held: OpMarker | undefined;
      if (existsSync(marker) && !(await this.reap(uid))) held = await readJson<OpMarker>(marker);
      if (held)
        throw errors.conflict(
          'agentsessions',
          'fluxvm.dev',
          name,
          `a ${held.op} of this session is in flight since ${held.startedAt}; retry when it is done`,
        );
      const n = this.running.get(uid) ?? 0;
      if (n > 0 && (op === 'restore' || op === 'fork' || op === 'promote')) {
        throw errors.conflict(
          'agentsessions',
          'fluxvm.dev',
          name,
          `${op} is refused while commands run on the session (${n} running)`,
        );
      }
      const m: OpMarker = {
        op,
        startedAt: new Date(this.now()).toISOString(),
        pid: process.pid,
        pidStart: processStart(process.pid),
      };
      // Before the operation can change anything: an approval granted for the session as it
      // was no longer matches, even if the operation then fails or the process dies in it.
      // The two files are independent: written at the same time (the marker needs no fsync:
      // a crash that loses it loses the operation's start too).
      const dir = await this.ensure(uid);
      const bump = async () => {
        if (op === 'delete') return;
        const next = (await this.readRevision(uid)) + 1;
        await writeAtomic(join(dir, 'revision.json'), { revision: next }, true);
        this.revisions.set(uid, next);
      };
      await Promise.all([bump(), writeAtomic(join(dir, 'op.json'), m)]);
      let released = false;
      return async () => {
        if (released) return;
        released = true;
        await this.locked(uid, async () => {
          // Two unlinks, synchronous: through the thread pool they were 1.8-2.4 ms on the path of
          // every lifecycle answer (an undo's among them), the answer waiting for the slot's release.
          rmSync(join(this.sessionDir(uid), 'op.json'), { force: true });
          rmSync(join(this.sessionDir(uid), 'interrupted.json'), { force: true });
        });
      };
    });
  }

  /** The session revision (0 before any checkpoint, restore, fork or promote). */
  async revision(uid: string): Promise<number> {
    return this.locked(uid, () => this.readRevision(uid));
  }

  private async readRevision(uid: string): Promise<number> {
    const known = this.revisions.get(uid);
    if (known !== undefined) return known;
    const r = await readJson<{ revision: number }>(join(this.sessionDir(uid), 'revision.json'));
    const v = Number.isSafeInteger(r?.revision) ? r!.revision : 0;
    this.revisions.set(uid, v);
    return v;
  }

  /** The operation in flight, if any (a dead holder's marker is reaped first). */
  async inFlight(uid: string): Promise<OpMarker | undefined> {
    // No marker (the common case, every exec asks): a stat on the event loop, not a queued read.
    if (!existsSync(join(this.sessionDir(uid), 'op.json'))) return undefined;
    return this.locked(uid, async () => {
      await this.reap(uid);
      return readJson<OpMarker>(join(this.sessionDir(uid), 'op.json'));
    });
  }

  /**
   * Usage known without reading: a session that has just started (its ledger's first
   * session.create) has used nothing, so the first usage() need not read usage.json and
   * recount the ledger (reads that wait in libuv's thread pool behind other I/O).
   */
  primeUsage(uid: string, u: Usage = emptyUsage()): void {
    if (!this.usages.has(uid)) this.usages.set(uid, { ...u });
  }

  /** The interrupted operation, if one is reported. */
  async interrupted(uid: string): Promise<OpMarker | undefined> {
    // Neither marker on disk (the common case): nothing to reap or report. A stat on the event
    // loop (microseconds) instead of two reads queued in the thread pool.
    const dir = this.sessionDir(uid);
    if (!existsSync(join(dir, 'op.json')) && !existsSync(join(dir, 'interrupted.json'))) return undefined;
    return this.locked(uid, async () => {
      await this.reap(uid);
      return readJson<OpMarker>(join(this.sessionDir(uid), 'interrupted.json'));
    });
  }

  /** Under the lock: a marker whose process is gone becomes interrupted.json. Returns it when it did. */
  private async reap(uid: string): Promise<OpMarker | undefined> {
    const f = join(this.sessionDir(uid), 'op.json');
    const m = await readJson<OpMarker>(f);
    if (!m || this.alive(m)) return undefined;
    await writeAtomic(join(this.sessionDir(uid), 'interrupted.json'), m, true);
    await fsp.rm(f, { force: true });
    return m;
  }

  /**
   * Idempotency-Key handling. Without a key, runs fn. With one: a done record with the same
   * body replays its response; a different body is 422; a running one is 409; otherwise the
   * record is stored as running, fn runs, and its result is stored (a failure removes the
   * record, so only a 2xx is replayed). Records older than 24 h are dropped.
   */
  async idempotent<T>(
    uid: string,
    name: string,
    key: string | undefined,
    op: string,
    body: unknown,
    fn: () => Promise<T>,
  ): Promise<T> {
    if (!key) return fn();
    if (key.length > 256) throw errors.badRequest('Idempotency-Key must be at most 256 characters');
    // Canonical JSON (sorted keys): the same request with its fields in another order is the same request.
    const bodyHash = requestDigest({ op, body: body ?? {} });
    const file = () => join(this.sessionDir(uid), 'idempotency.json');
    const load = async () => ((await readJson<Record<string, IdemRecord>>(file())) ?? {}) as Record<string, IdemRecord>;
    const save = async (all: Record<string, IdemRecord>, durable = false) => {
      await this.ensure(uid);
      const cut = this.now() - IDEMPOTENCY_TTL_MS;
      for (const [k, r] of Object.entries(all)) if (r.at < cut) delete all[k];
      await writeAtomic(file(), all, durable);
    };
    const first = await this.locked(uid, async () => {
      const all = await load();
      const r = all[key];
      if (r && r.at >= this.now() - IDEMPOTENCY_TTL_MS) {
        if (r.bodyHash !== bodyHash) {
          throw errors.invalid('AgentSession', 'fluxvm.dev', name, [
            {
              reason: 'FieldValueInvalid',
              field: 'Idempotency-Key',
              message: `the key was used with a different ${r.op} request; use a new key`,
            },
          ]);
        }
        if (r.state === 'running' && r.boot !== undefined && r.boot !== BOOT) {
          throw errors.conflict(
            'agentsessions',
            'fluxvm.dev',
            name,
            `the request with Idempotency-Key ${JSON.stringify(key)} was cut by a restart of the server: whether it ran is unknown, so it is not run again; check the ledger, then use a new key`,
          );
        }
        if (r.state === 'running')
          throw errors.conflict(
            'agentsessions',
            'fluxvm.dev',
            name,
            `the request with Idempotency-Key ${JSON.stringify(key)} is still running`,
          );
        return { replay: r.response as T };
      }
      all[key] = { key, op, bodyHash, state: 'running', at: this.now(), boot: BOOT };
      await save(all);
      return undefined;
    });
    if (first) return first.replay;
    try {
      const res = await fn();
      await this.locked(uid, async () => {
        const all = await load();
        all[key] = { key, op, bodyHash, state: 'done', at: this.now(), boot: BOOT, response: res };
        await save(all, true);
      });
      return res;
    } catch (e) {
      await this.locked(uid, async () => {
        const all = await load();
        delete all[key];
        await save(all);
      });
      throw e;
    }
  }

  /** Removes every file of the session. Idempotent. */
  async remove(uid: string): Promise<void> {
    this.usages.delete(uid);
    this.revisions.delete(uid);
    this.made.delete(uid);
    await this.locked(uid, async () => {
      await fsp.rm(join(this.sessionDir(uid), 'usage.json'), { force: true });
      await fsp.rm(join(this.sessionDir(uid), 'op.json'), { force: true });
      await fsp.rm(join(this.sessionDir(uid), 'interrupted.json'), { force: true });
      await fsp.rm(join(this.sessionDir(uid), 'idempotency.json'), { force: true });
      await fsp.rm(join(this.sessionDir(uid), 'revision.json'), { force: true });
    });
  }

  exists(uid: string): boolean {
    return existsSync(this.sessionDir(uid));
  }
}
