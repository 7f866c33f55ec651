// Commands in a sandbox, the Runtime's exec side: exec (buffered, output capped), execStream
// (pipes or a terminal) and the exec allow-list's resolution. exec.ts holds the helper protocol.
import {
  RuntimeError,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type ResolvedExecutables,
} from '../runtime.js';
import { validateSandboxPath } from '../workspace/paths.js';
import { proxyEnv, syncTrust } from './config.js';
import { nowIso, type ProcboxCore } from './core.js';
import { confinementArgs, drained, parseResolved, startExec } from './exec.js';
import { revive } from './inits.js';
import { execBegins, execEnds } from './standby.js';
import type { SandboxRecord } from './state.js';

const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/**
 * The record of a sandbox a command can run in: not paused, its init running (restarted if dead), its CA bundle
 * current.
 */
export async function runnable(pb: ProcboxCore, id: string): Promise<SandboxRecord> {
  const rec = pb.rec(id);
  if (rec.paused) throw new RuntimeError('Conflict', `sandbox ${id} is paused`);
  if (rec.standby) throw new RuntimeError('Conflict', `sandbox ${id} is on standby (native/idle.ts wakes it)`);
  await revive(pb, rec);
  await syncTrust(pb, rec);
  return rec;
}

/** What `procbox exec` is given for a request (argv, cwd and env checked: InvalidArgument). */
export function execSpec(pb: ProcboxCore, rec: SandboxRecord, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>) {
  if (
    !Array.isArray(req.argv) ||
    req.argv.length === 0 ||
    req.argv.some((a) => typeof a !== 'string' || a.includes('\0'))
  ) {
    throw new RuntimeError('InvalidArgument', 'argv must be a non-empty list of strings without NUL');
  }
  const cwd = req.cwd ?? rec.workspacePath;
  validateSandboxPath(cwd);
  const env: Record<string, string> = {
    PATH: DEFAULT_PATH,
    HOME: '/tmp',
    LANG: 'C.UTF-8',
    TERM: 'xterm',
    HOSTNAME: rec.hostname,
    ...proxyEnv(pb, rec),
    ...rec.env,
    ...(req.env ?? {}),
  };
  for (const [k, v] of Object.entries(env)) {
    if (!k || k.includes('=') || k.includes('\0') || String(v).includes('\0'))
      throw new RuntimeError('InvalidArgument', `invalid env ${k}`);
  }
  const targets = pb.cgroups(rec.id).execTargets();
  return {
    helper: pb.helper,
    pid: rec.pid!,
    workspacePath: rec.workspacePath,
    cwd,
    cgroupProcs: targets.v1Procs,
    cgroupDir: targets.v2Dir,
    argv: req.argv,
    ...(req.tty ? { tty: req.tty } : {}),
    env,
    confinement: confinementArgs(rec.confinement, { serverCommand: req.serverCommand }),
  };
}

export async function resolveExecutables(pb: ProcboxCore, id: string): Promise<ResolvedExecutables> {
  pb.ensureStarted();
  const rec = await runnable(pb, id);
  if (!rec.confinement?.execAllow) return { programs: [], missing: [], implied: [] };
  const spec = {
    ...execSpec(pb, rec, { argv: ['true'] }),
    confinement: [...confinementArgs(rec.confinement), '--resolve-only'],
  };
  const { child, exit } = startExec(spec);
  let out = '';
  child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr!.resume();
  child.stdin!.end();
  const done = exit(10_000);
  await drained(child.stdout!, done);
  const r = await done;
  if (r.exitCode !== 0)
    throw new RuntimeError('Internal', `resolving the exec allow-list of ${id}: ${r.error ?? `exit ${r.exitCode}`}`);
  return parseResolved(out);
}

export async function exec(pb: ProcboxCore, id: string, req: ExecRequest): Promise<ExecResult> {
  pb.ensureStarted();
  const rec = await runnable(pb, id);
  const spec = execSpec(pb, rec, req);
  const cg = pb.cgroups(id);
  const oomBefore = cg.oomKills();
  const t0 = performance.now();
  const max = req.maxOutputBytes ?? Infinity;
  const { child, exit } = startCounted(pb, id, spec, true);
  const out = {
    stdout: [] as Buffer[],
    stderr: [] as Buffer[],
    n: { stdout: 0, stderr: 0 },
    dropped: { stdout: 0, stderr: 0 },
  };
  for (const s of ['stdout', 'stderr'] as const) {
    child[s]!.on('data', (b: Buffer) => {
      const room = Math.max(0, max - out.n[s]);
      if (room >= b.length) {
        out[s].push(b);
        out.n[s] += b.length;
      } else {
        if (room > 0) out[s].push(b.subarray(0, room));
        out.n[s] += room;
        out.dropped[s] += b.length - room;
      }
    });
  }
  child.stdin!.on('error', () => undefined); // the command may not read its stdin
  child.stdin!.end(req.stdin ?? undefined);
  const done = exit(req.timeoutMs);
  await Promise.all([drained(child.stdout!, done), drained(child.stderr!, done)]);
  const r = await done;
  const oom = cg.oomKills() > oomBefore;
  if (oom) {
    rec.lastOomKillAt = nowIso();
    pb.save(rec);
  }
  return {
    exitCode: r.exitCode,
    signal: r.signal,
    stdout: Buffer.concat(out.stdout),
    // A command that could not start: the helper wrote "procbox: exec ...: REASON" there, as on the streamed path.
    stderr: Buffer.concat(out.stderr),
    stdoutDropped: out.dropped.stdout,
    stderrDropped: out.dropped.stderr,
    truncated: out.dropped.stdout + out.dropped.stderr > 0,
    timedOut: r.timedOut,
    oomKilled: oom || undefined,
    durationMs: performance.now() - t0,
  };
}

export async function execStream(
  pb: ProcboxCore,
  id: string,
  req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>,
): Promise<ExecStream> {
  pb.ensureStarted();
  const rec = await runnable(pb, id);
  const spec = execSpec(pb, rec, req);
  const { child, exit, kill, resize } = startCounted(pb, id, spec, !req.tty);
  const done = exit(req.timeoutMs);
  const all = Promise.all([drained(child.stdout!, done), drained(child.stderr!, done)]).then(() => done);
  return {
    stdin: child.stdin!,
    stdout: child.stdout!,
    stderr: child.stderr!,
    exit: all.then((r) => ({ exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut })),
    kill,
    ...(req.tty ? { resize } : {}),
  };
}

/**
 * startExec with the sandbox's running-command count kept: the command counts until its helper is gone (the last one
 * then spawns the next command's standby; a helper is a task of the pids cgroup, so the two never overlap), or at once
 * on a failed start. With `useStandby` its helper is the standby, or one the spawner starts now (no fork of this
 * process).
 */
function startCounted(
  pb: ProcboxCore,
  id: string,
  spec: ReturnType<typeof execSpec>,
  useStandby: boolean,
): ReturnType<typeof startExec> {
  const standby = execBegins(pb, id, spec, useStandby, true);
  let started: ReturnType<typeof startExec>;
  try {
    started = startExec(spec, standby);
  } catch (e) {
    execEnds(pb, id);
    throw e;
  }
  void started.gone.then(() => execEnds(pb, id));
  return started;
}
