// Background jobs on procbox (native/jobs.ts; README "Background jobs"). A job is `procbox exec`
// in job mode: the helper joins the sandbox like any exec, confines the command exactly as an
// exec's (allow-list included), then stays behind as the job's supervisor (jobsup.c), detached
// from this process. Everything about a job lives in its directory in the sandbox's state
// directory, which the sandbox cannot see:
//   sandboxes/<id>/jobs/<job>/meta.json   written here: argv, times, caps, the supervisor's pid
//                             stdout, stderr  the spools (written by the supervisor, <= the cap)
//                             status     one fixed-size line the supervisor rewrites in place
//                             ctl.sock   the supervisor's control socket (stdin frames)
// and in the job's own cgroup (a child of the sandbox's v2 cgroup) that tree signals go to. A
// restarted server finds all of it where it was: nothing of a job is in this process's memory.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmdirSync,
  rmSync,
  statSync,
  watch,
  writeFileSync,
  renameSync,
} from 'node:fs';
import { createConnection } from 'node:net';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import {
  MAX_JOB_STDIN_WRITE,
  MAX_JOB_WAIT_MS,
  type JobInfo,
  type JobReadRequest,
  type JobReadResult,
  type JobRequest,
} from '../jobs.js';
import { RuntimeError } from '../runtime.js';
import { checkJobId, checkJobRequest, JOB_ID } from '../jobcheck.js';
import { execSpec, runnable } from './commands.js';
import { nowIso, procStart, type ProcboxCore } from './core.js';
import { standbyRequest, type ExecSpec, type Standby } from './exec.js';
import { SpawnedHelper } from './spawner.js';
import { execBegins, execEnds } from './standby.js';

/** The most bytes one read returns (a caller's maxBytes above it is lowered). */
export const MAX_JOB_READ = 4 << 20;
const STATUS_LEN = 256;
const SIGNALS = osConstants.signals as Record<string, number>;
const SIGNAMES = new Map<number, string>(Object.entries(SIGNALS).map(([k, v]) => [v, k]));

interface JobMeta {
  id: string;
  argv: string[];
  startedAt: string;
  maxOutputBytes: number;
  stdin: boolean;
  timeoutMs?: number;
  /** The job's v2 cgroup (tree signals), when the host has one. */
  cgroup?: string;
  /** The supervisor (host pid and start time) and the command's main process (host pid). */
  supPid?: number;
  supStart?: string;
  pid?: number;
  killRequested?: boolean;
}

interface Status {
  ended: boolean;
  code: number;
  signal: number;
  timedOut: boolean;
  stdinOpen: boolean;
  dropped: number;
  endedMs: number;
}

function jobsDir(pb: ProcboxCore, id: string): string {
  return join(pb.sbxDir(id), 'jobs');
}

function jobDir(pb: ProcboxCore, id: string, jobId: string): string {
  checkJobId(jobId);
  return join(jobsDir(pb, id), jobId);
}

function readMeta(dir: string): JobMeta | undefined {
  try {
    return JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')) as JobMeta;
  } catch {
    return undefined;
  }
}

function writeMeta(dir: string, m: JobMeta): void {
  writeFileSync(join(dir, 'meta.json.tmp'), JSON.stringify(m), { mode: 0o600 });
  renameSync(join(dir, 'meta.json.tmp'), join(dir, 'meta.json'));
}

/**
 * The supervisor's status line (jobsup.c write_status), read with a bounded read and a strict parse; undefined when
 * torn or absent. Pure apart from the read.
 */
export function parseStatus(line: string): Status | undefined {
  const m =
    /^fluxjob 1 state=(running|ended) pid=\d+ code=(-?\d{1,3}) signal=(\d{1,2}) timedout=([01]) stdin=([01]) out=\d{1,20} err=\d{1,20} dropped=(\d{1,20}) ended=(\d{1,16}) *\n$/.exec(
      line,
    );
  if (!m) return undefined;
  return {
    ended: m[1] === 'ended',
    code: Number(m[2]),
    signal: Number(m[3]),
    timedOut: m[4] === '1',
    stdinOpen: m[5] === '1',
    dropped: Number(m[6]),
    endedMs: Number(m[7]),
  };
}

function readStatus(dir: string): Status | undefined {
  for (let i = 0; i < 3; i++) {
    let fd: number;
    try {
      fd = openSync(join(dir, 'status'), 'r');
    } catch {
      return undefined;
    }
    const b = Buffer.alloc(STATUS_LEN);
    let n = 0;
    try {
      n = readSync(fd, b, 0, STATUS_LEN, 0);
    } finally {
      closeSync(fd);
    }
    const s = parseStatus(b.subarray(0, n).toString('latin1'));
    if (s) return s;
  }
  return undefined;
}

/** Bytes kept in a spool: its size, never more than the cap the supervisor was given. */
function spoolSize(dir: string, stream: 'stdout' | 'stderr', cap: number): number {
  try {
    return Math.min(statSync(join(dir, stream)).size, cap);
  } catch {
    return 0;
  }
}

function infoOf(dir: string, m: JobMeta): JobInfo {
  let st = readStatus(dir);
  const supAlive = !!m.supPid && !!m.supStart && procStart(m.supPid) === m.supStart;
  // The supervisor writes the end before it exits: one that ended between the two reads above
  // has written it by now.
  if (!st?.ended && !supAlive) st = readStatus(dir);
  const base = {
    id: m.id,
    argv: m.argv,
    startedAt: m.startedAt,
    stdoutBytes: spoolSize(dir, 'stdout', m.maxOutputBytes),
    stderrBytes: spoolSize(dir, 'stderr', m.maxOutputBytes),
    droppedBytes: st?.dropped ?? 0,
    engine: 'supervisor' as const,
  };
  if (!st?.ended) {
    // A supervisor that is gone without saying how the job ended (a host reboot, a kill -9).
    if (!supAlive && !(st === undefined && !m.supPid)) return { ...base, state: 'lost', stdinOpen: false };
    return { ...base, state: 'running', stdinOpen: st?.stdinOpen ?? m.stdin };
  }
  const ended = { ...base, stdinOpen: false, endedAt: new Date(st.endedMs).toISOString() };
  const how = st.signal > 0 ? { signal: SIGNAMES.get(st.signal) ?? String(st.signal) } : { exitCode: st.code };
  if (st.timedOut) return { ...ended, ...how, state: 'timed_out' };
  if (m.killRequested) return { ...ended, ...how, state: 'killed' };
  return { ...ended, ...how, state: st.signal > 0 ? 'signaled' : 'exited' };
}

function load(pb: ProcboxCore, id: string, jobId: string): { dir: string; meta: JobMeta } {
  pb.ensureStarted();
  pb.rec(id); // NotFound for an unknown sandbox
  const dir = jobDir(pb, id, jobId);
  const meta = readMeta(dir);
  if (!meta) throw new RuntimeError('NotFound', `job ${jobId} not found in sandbox ${id}`);
  return { dir, meta };
}

// Job cgroups made ahead, one per sandbox cgroup: a start takes its sandbox's, the next is made
// after it, so the mkdir (milliseconds with controllers to set up) is off the start's path. A spare
// is an empty `job-s<hex>` removed with the sandbox's cgroup (cgroups.ts: every `job-` child).
// `enabled` is the benches' switch (A/B).
export const spareJobCgroups = { enabled: true, parents: new Map<string, string>() };

function takeJobCgroup(parent: string): string {
  const spare = spareJobCgroups.parents.get(parent);
  spareJobCgroups.parents.delete(parent);
  if (spare !== undefined && existsSync(spare)) return spare;
  const d = join(parent, `job-s${randomBytes(6).toString('hex')}`);
  mkdirSync(d);
  return d;
}

function makeSpareJobCgroup(parent: string): void {
  if (!spareJobCgroups.enabled) return;
  setImmediate(() => {
    const m = spareJobCgroups.parents;
    for (const [p, d] of m) if (!existsSync(d)) m.delete(p); // sandboxes gone since
    if (m.has(parent) || !existsSync(parent)) return;
    const d = join(parent, `job-s${randomBytes(6).toString('hex')}`);
    try {
      mkdirSync(d);
      m.set(parent, d);
    } catch {
      // the sandbox went away: the next start makes its own
    }
  });
}

export async function startJob(pb: ProcboxCore, id: string, req: JobRequest): Promise<JobInfo> {
  pb.ensureStarted();
  const max = checkJobRequest(req);
  const jobId = req.id;
  const dir = jobDir(pb, id, jobId);
  return pb.locked(`job:${id}`, async () => {
    const existing = readMeta(dir);
    if (existing) return infoOf(dir, existing);
    const rec = await runnable(pb, id);
    const spec = execSpec(pb, rec, { argv: req.argv, env: req.env, cwd: req.cwd });
    mkdirSync(jobsDir(pb, id), { recursive: true, mode: 0o700 });
    mkdirSync(dir, { mode: 0o700 });
    const cgroup = !spec.cgroupDir
      ? undefined
      : spareJobCgroups.enabled
        ? takeJobCgroup(spec.cgroupDir)
        : join(spec.cgroupDir, `job-${jobId}`);
    const meta: JobMeta = {
      id: jobId,
      argv: [...req.argv],
      startedAt: nowIso(),
      maxOutputBytes: max,
      stdin: !!req.stdin,
      ...(req.timeoutMs ? { timeoutMs: req.timeoutMs } : {}),
      ...(cgroup ? { cgroup } : {}),
    };
    try {
      if (cgroup && !spareJobCgroups.enabled) mkdirSync(cgroup);
      writeMeta(dir, meta);
      const jobArgs = ['--job', dir, '--job-max', String(max)];
      if (cgroup) jobArgs.push('--job-cg', cgroup);
      if (req.timeoutMs) jobArgs.push('--job-timeout', String(req.timeoutMs));
      if (req.stdin) jobArgs.push('--job-stdin');
      // The sandbox's standby helper when it has one (it joined the sandbox ahead of time; the
      // command still goes into the job's own cgroup, a child of the standby's), else a helper
      // spawned for the job.
      const standby = pb.jobsFromStandby ? execBegins(pb, id, spec, true) : undefined;
      let report: string;
      try {
        if (standby && standbyUsable(standby)) {
          report = await launchStandby(standby, { ...spec, confinement: [...jobArgs, ...spec.confinement] });
        } else {
          standby?.child.kill('SIGKILL');
          const args = ['exec', String(spec.pid), spec.workspacePath, spec.cwd];
          for (const f of spec.cgroupProcs) args.push('--cg', f);
          if (cgroup) args.push('--cgdir', cgroup);
          args.push(...jobArgs, ...spec.confinement, '--', ...spec.argv);
          report = await launch(spec.helper, args, spec.env);
        }
      } finally {
        if (pb.jobsFromStandby) execEnds(pb, id);
      }
      const m = /^job (\d+) (\d+)\n/.exec(report);
      if (!m)
        throw new RuntimeError(
          'Internal',
          `procbox job: ${report.replace(/^error /, '').trim() || 'no report from the supervisor'}`,
        );
      meta.supPid = Number(m[1]);
      meta.supStart = procStart(meta.supPid);
      meta.pid = Number(m[2]);
      writeMeta(dir, meta);
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      if (cgroup) rmdirQuiet(cgroup);
      throw e;
    } finally {
      if (spec.cgroupDir) makeSpareJobCgroup(spec.cgroupDir);
    }
    return infoOf(dir, meta);
  });
}

function rmdirQuiet(d: string): void {
  try {
    rmdirSync(d);
  } catch {
    // busy or gone
  }
}

function standbyUsable(s: Standby): boolean {
  // A spawner's standby taken right after its spawn: its fds may still be connecting (stand-ins meanwhile).
  if (s.child instanceof SpawnedHelper && !s.state.exited) s.child.bridge();
  return !s.state.exited && s.child.stdin?.writable === true && !!s.child.stdio[3];
}

/** A waiting standby's process and pipes are unref'd: ref'd while a request on it is pending (a plain script). */
function refStandby(s: Standby, on: boolean): void {
  if (on) s.child.ref();
  else s.child.unref();
  for (const x of s.child.stdio)
    (x as unknown as { ref?: () => void; unref?: () => void } | null)?.[on ? 'ref' : 'unref']?.();
}

/** Gives the job's request to a standby helper (it becomes the supervisor) and what it reported on fd 3. */
function launchStandby(s: Standby, spec: ExecSpec): Promise<string> {
  refStandby(s, true);
  return new Promise((resolve) => {
    const fd3 = s.child.stdio[3] as Readable;
    const line = () => s.state.status.includes('\n');
    let settled = false;
    const done = () => {
      if (settled) return;
      settled = true;
      refStandby(s, false);
      clearTimeout(timer);
      fd3.off('data', onData);
      resolve(s.state.status.slice(0, 4096));
    };
    // track() (exec.ts) collects the status; this listener runs after it.
    const onData = () => line() && done();
    const timer = setTimeout(() => (s.child.kill('SIGKILL'), done()), 30_000);
    fd3.on('data', onData);
    // A helper that ended without a whole line: what it wrote before its exit is read by then, or at the stream's end.
    void s.state.gone.then(() => {
      if (fd3.readableEnded || fd3.destroyed) return done();
      fd3.once('end', done);
      fd3.once('close', done);
      setTimeout(done, 2000).unref();
    });
    s.child.stdin!.end(standbyRequest(spec));
  });
}

/** Spawns the helper detached (its supervisor outlives this process) and gives what it reported on fd 3. */
function launch(helper: string, args: string[], env: Record<string, string>): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(helper, args, { env, stdio: ['ignore', 'ignore', 'ignore', 'pipe'], detached: true });
    let out = '';
    const fd3 = child.stdio[3] as Readable;
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    const done = () => (clearTimeout(timer), child.unref(), fd3.destroy(), resolve(out));
    fd3.on('data', (b: Buffer) => {
      if (out.length < 4096) out += b.toString('latin1');
      // The report is one line: the job runs from here (the helper that relayed it exits on its own).
      if (out.includes('\n')) done();
    });
    child.once(
      'error',
      (e) => (clearTimeout(timer), reject(new RuntimeError('Internal', `procbox helper: ${e.message}`))),
    );
    child.once('close', done);
  });
}

export async function listJobs(pb: ProcboxCore, id: string): Promise<JobInfo[]> {
  pb.ensureStarted();
  pb.rec(id);
  let names: string[] = [];
  try {
    names = readdirSync(jobsDir(pb, id));
  } catch {
    return [];
  }
  const out: JobInfo[] = [];
  for (const n of names) {
    if (!JOB_ID.test(n)) continue;
    const meta = readMeta(join(jobsDir(pb, id), n));
    if (meta) out.push(infoOf(join(jobsDir(pb, id), n), meta));
  }
  return out.sort((a, b) => (a.startedAt < b.startedAt ? -1 : a.startedAt > b.startedAt ? 1 : a.id < b.id ? -1 : 1));
}

export async function job(pb: ProcboxCore, id: string, jobId: string): Promise<JobInfo> {
  const { dir, meta } = load(pb, id, jobId);
  return infoOf(dir, meta);
}

export async function readJob(pb: ProcboxCore, id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult> {
  const { dir, meta } = load(pb, id, jobId);
  if (req.stream !== 'stdout' && req.stream !== 'stderr')
    throw new RuntimeError('InvalidArgument', 'stream must be stdout or stderr');
  if (!Number.isSafeInteger(req.offset) || req.offset < 0)
    throw new RuntimeError('InvalidArgument', 'offset must be a non-negative integer');
  if (!Number.isSafeInteger(req.maxBytes) || req.maxBytes < 1)
    throw new RuntimeError('InvalidArgument', 'maxBytes must be a positive integer');
  const waitMs = Math.min(Math.max(0, req.waitMs ?? 0), MAX_JOB_WAIT_MS);
  const deadline = Date.now() + waitMs;
  const want = Math.min(req.maxBytes, MAX_JOB_READ);
  for (;;) {
    // Watch before looking, so bytes that arrive in between wake the wait.
    const changed = waitMs > 0 && !req.signal?.aborted ? watchDir(dir) : undefined;
    try {
      const info = infoOf(dir, meta); // the status first: once it says ended, the spools are whole
      const size = req.stream === 'stdout' ? info.stdoutBytes : info.stderrBytes;
      const ended = info.state !== 'running';
      if (size > req.offset || ended || !changed || Date.now() >= deadline) {
        const data =
          size > req.offset
            ? readSpool(join(dir, req.stream), req.offset, Math.min(want, size - req.offset))
            : Buffer.alloc(0);
        const next = req.offset + data.length;
        return { data, nextOffset: next, eof: ended && next >= size, job: info };
      }
      await changed.wait(deadline - Date.now(), req.signal);
    } finally {
      changed?.close();
    }
  }
}

function readSpool(path: string, offset: number, n: number): Buffer {
  const fd = openSync(path, 'r');
  try {
    const size = fstatSync(fd).size;
    const len = Math.max(0, Math.min(n, size - offset));
    const b = Buffer.alloc(len);
    let got = 0;
    while (got < len) {
      const r = readSync(fd, b, got, len - got, offset + got);
      if (r <= 0) break;
      got += r;
    }
    return b.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

/**
 * An inotify watch of a job directory: wait() resolves at the next change in it, after `ms`, or when `signal` aborts.
 */
function watchDir(dir: string): { wait: (ms: number, signal?: AbortSignal) => Promise<void>; close: () => void } {
  let fire: (() => void) | undefined;
  let fired = false;
  const w = watch(dir, { persistent: false }, () => {
    fired = true;
    fire?.();
  });
  w.on('error', () => ((fired = true), fire?.()));
  return {
    wait: (ms, signal) =>
      new Promise<void>((resolve) => {
        if (fired || ms <= 0 || signal?.aborted) return resolve();
        const done = () => {
          clearTimeout(t);
          signal?.removeEventListener('abort', done);
          resolve();
        };
        const t = setTimeout(done, ms);
        signal?.addEventListener('abort', done, { once: true });
        fire = done;
      }),
    close: () => w.close(),
  };
}

export async function writeJobStdin(
  pb: ProcboxCore,
  id: string,
  jobId: string,
  data: Buffer,
  opts?: { close?: boolean },
): Promise<void> {
  const { dir, meta } = load(pb, id, jobId);
  if (!Buffer.isBuffer(data) || data.length > MAX_JOB_STDIN_WRITE)
    throw new RuntimeError('InvalidArgument', `a stdin write carries at most ${MAX_JOB_STDIN_WRITE} bytes`);
  if (!meta.stdin) throw new RuntimeError('Conflict', `job ${jobId} was started without stdin`);
  await pb.locked(`jobstdin:${id}/${jobId}`, async () => {
    if (!infoOf(dir, meta).stdinOpen)
      throw new RuntimeError('Conflict', `job ${jobId}: stdin is closed or the job has ended`);
    if (data.length > 0) await control(dir, jobId, Buffer.concat([frameHead('W', data.length), data]));
    // A job that ended right after taking the data has no stdin left to close: that is not an error.
    if (opts?.close)
      await control(dir, jobId, frameHead('C', 0)).catch((e: unknown) => {
        if (!(data.length > 0 && e instanceof RuntimeError && e.code === 'Conflict')) throw e;
      });
  });
}

function frameHead(op: 'W' | 'C', len: number): Buffer {
  const h = Buffer.alloc(5);
  h.write(op, 0, 'latin1');
  h.writeUInt32LE(len, 1);
  return h;
}

/** One frame to the supervisor's control socket and its one-byte answer. */
function control(dir: string, jobId: string, frame: Buffer): Promise<void> {
  let dfd: number;
  try {
    dfd = openSync(dir, 'r');
  } catch {
    throw new RuntimeError('Conflict', `job ${jobId} has ended`);
  }
  return new Promise<void>((resolve, reject) => {
    const sock = createConnection({ path: `/proc/self/fd/${dfd}/ctl.sock` });
    let answer = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(
        new RuntimeError(
          'Conflict',
          `job ${jobId}: its stdin has not taken the data for 30 s (the job is not reading it)`,
        ),
      );
    }, 30_000);
    const finish = (err?: RuntimeError) => {
      clearTimeout(timer);
      try {
        closeSync(dfd);
      } catch {
        // closed
      }
      if (err) reject(err);
      else resolve();
    };
    sock.on('connect', () => sock.end(frame));
    sock.on('data', (b) => (answer += b.toString('latin1').slice(0, 1)));
    sock.on('error', (e: NodeJS.ErrnoException) => {
      finish(new RuntimeError('Conflict', `job ${jobId} has ended (${e.code ?? e.message})`));
    });
    sock.on('close', () => {
      if (answer === 'k') finish();
      else if (answer === 'e') finish(new RuntimeError('Internal', `job ${jobId}: the supervisor refused the frame`));
      else finish(new RuntimeError('Conflict', `job ${jobId}: stdin is closed or the job has ended`));
    });
  });
}

/**
 * Signals the job's whole tree: every process of its cgroup (frozen meanwhile, so no pid is reused under us), or its
 * process group without one.
 */
export async function killJob(pb: ProcboxCore, id: string, jobId: string, signal = 'SIGTERM'): Promise<void> {
  const { dir, meta } = load(pb, id, jobId);
  const name = typeof signal === 'string' && !signal.startsWith('SIG') ? `SIG${signal}` : signal;
  const num = typeof name === 'string' ? SIGNALS[name] : undefined;
  if (num === undefined || num === 0) throw new RuntimeError('InvalidArgument', `unknown signal ${String(signal)}`);
  if (infoOf(dir, meta).state !== 'running') return;
  if (!meta.killRequested) {
    meta.killRequested = true;
    writeMeta(dir, meta);
  }
  const cg = meta.cgroup;
  if (!cg || !existsSync(cg)) {
    if (meta.pid) signalQuiet(-meta.pid, num);
    return;
  }
  if (name === 'SIGKILL' && existsSync(join(cg, 'cgroup.kill'))) return writeFileSync(join(cg, 'cgroup.kill'), '1');
  await pb.locked(`jobkill:${id}/${jobId}`, async () => {
    const freeze = existsSync(join(cg, 'cgroup.freeze'));
    if (freeze) {
      writeFileSync(join(cg, 'cgroup.freeze'), '1');
      for (let i = 0; i < 500 && !readQuiet(join(cg, 'cgroup.events')).includes('frozen 1'); i++)
        await new Promise((r) => setTimeout(r, 1));
    }
    try {
      for (const p of readQuiet(join(cg, 'cgroup.procs')).split('\n').filter(Boolean)) signalQuiet(Number(p), num);
    } finally {
      if (freeze) {
        try {
          writeFileSync(join(cg, 'cgroup.freeze'), '0');
        } catch {
          // removed: the job has ended
        }
      }
    }
  });
}

function signalQuiet(pid: number, sig: number): void {
  try {
    process.kill(pid, sig);
  } catch {
    // gone
  }
}

function readQuiet(p: string): string {
  try {
    return readFileSync(p, 'utf8');
  } catch {
    return '';
  }
}
