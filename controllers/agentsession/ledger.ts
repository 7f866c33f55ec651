// The session ledger (spec/agent-sessions.md "Ledger"): an append-only JSON-lines file per
// session, `<dir>/<session uid>/ledger.jsonl`, one entry a line, numbered from 1. An append
// returns once the line is written and fsynced (and the directory too for the file's first
// line), so what a response reports is on disk. Watchers are told of every entry in order;
// a reader resumes after entry N with read(uid, N), so a reconnect neither repeats nor
// misses one. Appends of one session are serialized; different sessions run in parallel.
import { EventEmitter } from 'node:events';
import { closeSync, openSync, promises as fsp, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fsyncFd, fsyncFile } from '../../native/workspace/atomic.js';

export const LEDGER_KINDS = [
  'session.create',
  'session.expire',
  'session.fail',
  'session.delete',
  'policy.unenforced',
  'workspace.clone',
  'workspace.overlay',
  'exec',
  'exec.refused',
  'budget.exceeded',
  'checkpoint',
  'restore',
  'fork',
  'fork.child',
  'promote',
  'promote.out',
  'lifecycle.interrupted',
  'file.write',
  'file.delete',
  'file.upload',
  'upload.open',
  'upload.abort',
  'git.commit',
  'git.branch',
  'approval.requested',
  'approval.approved',
  'approval.denied',
  'approval.consumed',
  'approval.refused',
  'token.mint',
  'token.revoke',
  'preview.expose',
  'preview.revoke',
  'job.start',
  'job.refused',
  'job.stdin',
  'job.kill',
  'job.exit',
  'replay', // replay.ts: one entry in the target per replay request
  // rewind (rewind.ts, rewind-point.ts, bisect.ts)
  'rewind.config',
  'rewind.intent',
  'rewind.point',
  'rewind.abandoned',
  'rewind.capture_failed',
  'rewind.skipped',
  'rewind.step_interrupted',
  'rewind.undo',
  'rewind.pin',
  'rewind.unpin',
  'rewind.branch',
  'rewind.bisect',
  'rewind.bisect_swept',
  'session.branch_child',
] as const;
export type LedgerKind = (typeof LEDGER_KINDS)[number];

export interface LedgerEntry {
  entry: number;
  time: string;
  kind: LedgerKind;
  [field: string]: unknown;
}

export class Ledger {
  private readonly counts = new Map<string, number>();
  private readonly tails = new Map<string, Promise<unknown>>();
  private readonly events = new EventEmitter();

  constructor(
    private readonly dir: string,
    private readonly now: () => Date = () => new Date(),
  ) {
    this.events.setMaxListeners(0);
  }

  file(uid: string): string {
    return join(this.dir, uid, 'ledger.jsonl');
  }

  /**
   * Appends one entry and resolves with it once it is fsynced. Throws (and appends nothing
   * visible: the count is not advanced) when the write fails. Safe to call concurrently.
   * `sync: false` resolves once the line is written, not fsynced (a rewind point's lines: the
   * point's flush or the next append's fsync, which covers every earlier line, makes them durable).
   */
  append(
    uid: string,
    kind: LedgerKind,
    fields: Record<string, unknown> = {},
    opts: { sync?: boolean } = {},
  ): Promise<LedgerEntry> {
    const run = (this.tails.get(uid) ?? Promise.resolve())
      .catch(() => undefined)
      .then(async () => {
        const n = (await this.count(uid)) + 1;
        const e: LedgerEntry = { ...fields, entry: n, time: this.now().toISOString(), kind };
        // later lines: it holds the file already
        if (n === 1) await fsp.mkdir(join(this.dir, uid), { recursive: true, mode: 0o700 });
        // The open, the append of the line (O_APPEND: one write) and the close are synchronous;
        // only the fsync goes to the thread pool. Four thread-pool round trips per line were on
        // the path of every exec, rewind point and lifecycle answer of a session.
        const fd = openSync(this.file(uid), 'a', 0o600);
        try {
          writeFileSync(fd, JSON.stringify(e) + '\n'); // the whole line: it loops on a short write
          if (opts.sync !== false || n === 1) await fsyncFd(fd);
        } finally {
          closeSync(fd);
        }
        if (n === 1) await syncDir(join(this.dir, uid));
        this.counts.set(uid, n);
        this.events.emit(uid, e);
        return e;
      });
    this.tails.set(uid, run);
    return run;
  }

  /** fsyncs the session's ledger: every line written before the call is on disk when it resolves. */
  async sync(uid: string): Promise<void> {
    await fsyncFile(this.file(uid));
  }

  /** Entries after entry `after` (0: all), oldest first, at most `limit`. A missing ledger is empty. */
  async read(uid: string, after = 0, limit = Infinity): Promise<LedgerEntry[]> {
    let text: string;
    try {
      text = await fsp.readFile(this.file(uid), 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw e;
    }
    const out: LedgerEntry[] = [];
    for (const line of text.split('\n')) {
      if (!line) continue;
      let e: LedgerEntry;
      try {
        e = JSON.parse(line);
      } catch {
        continue; // a torn last line after a crash mid-write: it was never acknowledged
      }
      if (e.entry > after) out.push(e);
      if (out.length >= limit) break;
    }
    return out;
  }

  /** Whether the ledger holds an entry of `kind` (for entries written once per session). */
  async has(uid: string, kind: LedgerKind): Promise<boolean> {
    return (await this.read(uid)).some((e) => e.kind === kind);
  }

  /** Calls `fn` with every entry appended from now on, in order; returns the unsubscribe function. */
  subscribe(uid: string, fn: (e: LedgerEntry) => void): () => void {
    this.events.on(uid, fn);
    return () => this.events.off(uid, fn);
  }

  /** Removes the session's ledger (the session is gone). Idempotent. */
  async remove(uid: string): Promise<void> {
    await (this.tails.get(uid) ?? Promise.resolve()).catch(() => undefined);
    this.counts.delete(uid);
    this.tails.delete(uid);
    await fsp.rm(join(this.dir, uid, 'ledger.jsonl'), { force: true });
  }

  private async count(uid: string): Promise<number> {
    const c = this.counts.get(uid);
    if (c !== undefined) return c;
    await this.trimTornLine(uid);
    const all = await this.read(uid);
    const n = all.length ? all[all.length - 1]!.entry : 0;
    this.counts.set(uid, n);
    return n;
  }

  /**
   * A crash mid-append can leave a last line without its newline (never acknowledged): cut it, so the next entry starts
   * a line.
   */
  private async trimTornLine(uid: string): Promise<void> {
    let buf: Buffer;
    try {
      buf = await fsp.readFile(this.file(uid));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw e;
    }
    if (buf.length === 0 || buf[buf.length - 1] === 0x0a) return;
    await fsp.truncate(this.file(uid), buf.lastIndexOf(0x0a) + 1);
  }
}

/** fsync of a directory (a new file's entry), best effort where the platform refuses it. */
export async function syncDir(dir: string): Promise<void> {
  const fd = openSync(dir, 'r');
  try {
    await fsyncFd(fd);
  } catch {
    // some filesystems refuse fsync on a directory; the file's own fsync stands
  } finally {
    closeSync(fd);
  }
}

/**
 * The usage a session's ledger proves: every exec entry and its duration, every fork's children, every job started and
 * the time of each ended one.
 */
export async function usageFromLedger(
  ledger: Ledger,
  uid: string,
): Promise<{ execs: number; execMs: number; computeMs: number; children: number; jobs: number }> {
  const u = { execs: 0, execMs: 0, computeMs: 0, children: 0, jobs: 0 };
  for (const e of await ledger.read(uid)) {
    if (e.kind === 'exec') {
      u.execs++;
      u.execMs += Number(e.durationMs) || 0;
      u.computeMs += Number(e.durationMs) || 0;
    } else if (e.kind === 'job.start') u.jobs++;
    else if (e.kind === 'job.exit') u.computeMs += Number(e.durationMs) || 0;
    else if (e.kind === 'fork' && Array.isArray(e.children)) u.children += e.children.length;
  }
  return u;
}
