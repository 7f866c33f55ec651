// The host's record of a session's background jobs, `<state dir>/<session uid>/jobs.json`:
// what was started (command, stdin, output cap, timeout, approval), and what the runtime last
// said of it (state, exit code, signal, byte counts), and whether its end is in the ledger.
// It outlives a `serve` restart, so the list survives; the runtime is asked again on every
// listing. Written to a temporary name and renamed: a crash of the server leaves the old or the
// new content. Not fsynced: a power cut that loses the last write also ends the jobs it names
// (their processes), and job.start in the ledger is fsynced before the answer.
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { JobInfo, JobState } from '../../native/jobs.js';

export interface JobRecord {
  job: string;
  command: string[];
  stdin: boolean;
  maxOutputBytes: number;
  timeoutSeconds?: number;
  startedAt: string;
  /** How it was started: `jobs` or `exec/stream`. */
  via: 'jobs' | 'exec/stream';
  approval?: string;
  state: JobState;
  exitCode?: number;
  signal?: string;
  endedAt?: string;
  stdoutBytes: number;
  stderrBytes: number;
  droppedBytes: number;
  /** job.exit is in the ledger. */
  exitLedgered?: boolean;
}

/** Jobs one session may have on record; the oldest ended ones are dropped past it. */
export const MAX_RECORDS = 1000;

export class JobBook {
  constructor(private readonly dir: string) {}

  private file(uid: string): string {
    return join(this.dir, uid, 'jobs.json');
  }

  async load(uid: string): Promise<JobRecord[]> {
    try {
      const v = JSON.parse(await fsp.readFile(this.file(uid), 'utf8')) as unknown;
      return Array.isArray(v) ? (v as JobRecord[]) : [];
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT' || e instanceof SyntaxError) return [];
      throw e;
    }
  }

  async save(uid: string, all: JobRecord[]): Promise<void> {
    let keep = all;
    if (keep.length > MAX_RECORDS) {
      const drop = new Set(
        keep
          .filter((j) => j.state !== 'running' && j.exitLedgered)
          .slice(0, keep.length - MAX_RECORDS)
          .map((j) => j.job),
      );
      keep = keep.filter((j) => !drop.has(j.job));
    }
    const dir = join(this.dir, uid);
    await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
    const f = this.file(uid);
    const tmp = `${f}.tmp-${process.pid}`;
    const fh = await fsp.open(tmp, 'w', 0o600);
    try {
      await fh.write(JSON.stringify(keep));
    } finally {
      await fh.close();
    }
    await fsp.rename(tmp, f);
  }
}

/** The record updated with what the runtime says now. Pure. */
export function refreshed(r: JobRecord, j: JobInfo): JobRecord {
  return {
    ...r,
    state: j.state,
    ...(j.exitCode !== undefined ? { exitCode: j.exitCode } : {}),
    ...(j.signal ? { signal: j.signal } : {}),
    ...(j.endedAt ? { endedAt: j.endedAt } : {}),
    stdoutBytes: j.stdoutBytes,
    stderrBytes: j.stderrBytes,
    droppedBytes: j.droppedBytes,
  };
}

/** The JSON of a record (jobView's shape, from the host's copy). Pure. */
export function recordView(r: JobRecord) {
  return {
    job: r.job,
    command: r.command,
    state: r.state,
    ...(r.exitCode !== undefined ? { exitCode: r.exitCode } : {}),
    ...(r.signal ? { signal: r.signal } : {}),
    startedAt: r.startedAt,
    ...(r.endedAt ? { endedAt: r.endedAt } : {}),
    stdoutBytes: r.stdoutBytes,
    stderrBytes: r.stderrBytes,
    droppedBytes: r.droppedBytes,
    stdin: r.stdin,
    maxOutputBytes: r.maxOutputBytes,
    ...(r.timeoutSeconds !== undefined ? { timeoutSeconds: r.timeoutSeconds } : {}),
    via: r.via,
    engine: 'supervisor' as const,
  };
}
