// Running a command in a sandbox: spawns `procbox exec` (it joins the init's namespaces and
// cgroups, confines, execs) with the command's stdio wired straight to Node pipes and a
// status line ("exit N" / "signal N" / "error MSG") on fd 3. With `tty` the helper runs the
// command on a pty of the sandbox's own devpts (procbox.c "exec --tty") and relays it: stdin
// in, the merged terminal output on stdout, window sizes as "ROWS COLS" lines on fd 4.
import { spawn, type ChildProcess } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import type { Readable } from 'node:stream';
import type { Writable } from 'node:stream';
import { RuntimeError, type Confinement, type ResolvedExecutables, type TtySize } from '../runtime.js';
import { SpawnedHelper, type HelperProcess, type Spawner } from './spawner.js';

export interface ExecSpec {
  helper: string;
  pid: number;
  workspacePath: string;
  cwd: string;
  /** v1 cgroup.procs files the helper joins before cloning the command. */
  cgroupProcs: string[];
  /** v2 cgroup directory the command is cloned into. */
  cgroupDir?: string;
  argv: string[];
  env: Record<string, string>;
  /** Run on a pseudo-terminal of this size. */
  tty?: TtySize;
  /** The helper's confinement options (confinementArgs). */
  confinement?: string[];
}

/**
 * The `procbox exec` options for a sandbox's confinement (procbox.c "per-command confinement").
 * `serverCommand` drops the exec allow-list (ExecRequest.serverCommand) and runs in the full view. Pure.
 */
export function confinementArgs(c: Confinement | undefined, opts: { serverCommand?: boolean } = {}): string[] {
  if (!c) return [];
  const args: string[] = [];
  if (c.execAllow && !opts.serverCommand) {
    // --exec-list turns the allow-list on also when it is empty (the shell, true and the loader only).
    args.push('--exec-list');
    for (const p of c.execAllow) args.push('--exec-allow', p);
  } else if (c.execAllow) {
    // The sandbox's mounts are noexec but for its allowed programs (execview.c): the server's
    // own command runs in a private copy of them without noexec.
    args.push('--full-view');
  }
  if (c.readonlyWorkspace) args.push('--ro-workspace');
  if (c.readPaths) {
    args.push('--fs-read-list');
    for (const p of c.readPaths) args.push('--fs-read', p);
  }
  for (const p of c.writePaths ?? []) args.push('--fs-write', p);
  return args;
}

/**
 * Parses the helper's --resolve-only report ("allow NAME PATH REAL", "implied PATH REAL", "missing NAME" lines). Pure.
 */
export function parseResolved(out: string): ResolvedExecutables {
  const r: ResolvedExecutables = { programs: [], missing: [], implied: [] };
  const seen = new Set<string>();
  for (const line of out.split('\n')) {
    const [word, ...rest] = line.split(' ');
    if (word === 'allow' && rest.length >= 3)
      r.programs.push({ name: rest[0]!, path: rest[1]!, realPath: rest.slice(2).join(' ') });
    else if (word === 'missing' && rest.length >= 1) r.missing.push(rest.join(' '));
    else if (word === 'implied' && rest.length >= 2 && !seen.has(rest[0]!)) {
      seen.add(rest[0]!);
      r.implied.push({ path: rest[0]!, realPath: rest.slice(1).join(' ') });
    }
  }
  return r;
}

/** Rows and columns a terminal may have (the kernel's winsize holds 16 bits each). */
export function validTtySize(s: TtySize): boolean {
  return (
    Number.isInteger(s.rows) &&
    Number.isInteger(s.cols) &&
    s.rows >= 1 &&
    s.cols >= 1 &&
    s.rows <= 65535 &&
    s.cols <= 65535
  );
}

export interface RawExit {
  exitCode: number;
  signal?: string;
  timedOut: boolean;
  /** Why the command could not be started (exitCode 127 or 126); the helper has written it to the command's stderr. */
  error?: string;
}

/** Exec helpers this process spawned itself (a fork of Node), not through the spawner (tests count them). */
export const execCounts = { nodeSpawns: 0 };

const SIGNAMES = new Map<number, string>(Object.entries(osConstants.signals).map(([k, v]) => [v as number, k]));

/**
 * A helper started ahead of a command (`procbox exec PID WS - --cg ... --cgdir ...`, standby.ts):
 * it has joined the sandbox's cgroups (moving a task into a v1 cgroup waits for an RCU grace
 * period, 10-20 ms on a busy host) and namespaces and waits on stdin for the request. Its exit
 * and status line are tracked from the spawn, so one that died while waiting is never used.
 */
export interface Standby {
  /** Started by the runtime's spawner (spawner.ts), or spawned from Node when there is none. */
  child: HelperProcess;
  /** The init, workspace and cgroups it joined (standbyKey): a request must match them. */
  key: string;
  state: HelperState;
}

interface HelperState {
  status: string;
  exited: boolean;
  error?: Error;
  /** Settles when the helper has exited (or could not be spawned). */
  gone: Promise<void>;
  /** Settles when the command's final status line has come (exit or signal), or at `gone`. */
  settled: Promise<void>;
}

/**
 * The status text ends with the command's final line. The helper writes it after the command's
 * exit and then only exits; it closed its copies of the command's fds when the command started
 * (exec.c), so the output ends with the command's processes, not with the helper.
 */
const FINAL_STATUS = /(?:^|\n)(?:exit|signal) \d+\n$/;

/** What a standby helper joined: a command may use it only when its own spec joins the same. Pure. */
export function standbyKey(
  spec: Pick<ExecSpec, 'pid' | 'workspacePath' | 'cgroupProcs' | 'cgroupDir'>,
  pidStart: string | undefined,
): string {
  return JSON.stringify([spec.pid, pidStart ?? '', spec.workspacePath, spec.cgroupProcs, spec.cgroupDir ?? '']);
}

function track(child: HelperProcess): HelperState {
  const st: HelperState = { status: '', exited: false, gone: Promise.resolve(), settled: Promise.resolve() };
  let final = () => {};
  const finalLine = new Promise<void>((resolve) => (final = resolve));
  const onStatus = (s: Readable) =>
    s.on('data', (b: Buffer) => {
      st.status += b.toString();
      if (FINAL_STATUS.test(st.status)) final();
    });
  // A spawner's helper connects its status fd after the spawn.
  if (child.stdio[3]) onStatus(child.stdio[3] as Readable);
  else child.once('fd3', onStatus);
  st.gone = new Promise<void>((resolve) => {
    child.once('exit', () => ((st.exited = true), resolve()));
    child.once('error', (err) => ((st.error = err), (st.exited = true), resolve()));
  });
  st.settled = Promise.race([finalLine, st.gone]);
  return st;
}

/**
 * Spawns a standby helper for commands matching `spec` (its argv, env, cwd and confinement come with the request). Not
 * ref'd: it keeps no process alive.
 */
export function spawnStandby(
  spec: Pick<ExecSpec, 'helper' | 'pid' | 'workspacePath' | 'cgroupProcs' | 'cgroupDir'>,
  pidStart: string | undefined,
  spawner?: Spawner,
): Standby {
  const args = ['exec', String(spec.pid), spec.workspacePath, '-'];
  for (const f of spec.cgroupProcs) args.push('--cg', f);
  if (spec.cgroupDir) args.push('--cgdir', spec.cgroupDir);
  if (spawner && !spawner.dead) {
    // No fork of this process: the spawner forks itself and execs the helper (spawner.ts).
    const child = spawner.spawnStandby(args);
    return { child, key: standbyKey(spec, pidStart), state: track(child) };
  }
  execCounts.nodeSpawns++;
  const child = spawn(spec.helper, args, { env: {}, stdio: ['pipe', 'pipe', 'pipe', 'pipe'] });
  const state = track(child);
  child.stdin!.on('error', () => undefined); // it may be gone when asked
  setRef(child, false);
  return { child, key: standbyKey(spec, pidStart), state };
}

function setRef(child: HelperProcess, on: boolean): void {
  if (on) child.ref();
  else child.unref();
  for (const s of child.stdio)
    (s as unknown as { ref?: () => void; unref?: () => void } | null)?.[on ? 'ref' : 'unref']?.();
}

/**
 * A standby's request: "NARGS NENV LEN\n", then the arguments (CWD [OPTION]... -- ARGV...) and KEY=VALUE strings, each
 * NUL-terminated. Pure.
 */
export function standbyRequest(spec: ExecSpec): Buffer {
  const args = [spec.cwd, ...(spec.confinement ?? []), '--', ...spec.argv];
  const env = Object.entries(spec.env).map(([k, v]) => `${k}=${v}`);
  const body = Buffer.from([...args, ...env].map((x) => x + '\0').join(''));
  return Buffer.concat([Buffer.from(`${args.length} ${env.length} ${body.length}\n`), body]);
}

/**
 * Starts the helper; the caller owns stdin/stdout/stderr. With `standby` (one the caller took
 * for this sandbox: its key matches the spec; still waiting), the request goes to it instead
 * of a new spawn: no fork of the server and no cgroup migration before the command. A standby
 * that cannot be used (exited, or a terminal is asked for) is killed and a helper spawned.
 */
export function startExec(
  spec: ExecSpec,
  standby?: Standby,
): {
  child: HelperProcess;
  exit: (timeoutMs?: number) => Promise<RawExit>;
  /** Settles when the helper has exited: after `exit`'s answer (which comes with the status line). */
  gone: Promise<void>;
  kill: () => void;
  resize: (s: TtySize) => void;
  usedStandby: boolean;
} {
  let child: HelperProcess;
  let st: HelperState;
  // A spawner's standby taken right after its spawn: its fds may still be connecting.
  if (standby?.child instanceof SpawnedHelper && !spec.tty && !standby.state.exited) standby.child.bridge();
  const usable = !!standby && !spec.tty && !standby.state.exited && standby.child.stdin?.writable === true;
  if (usable) {
    child = standby!.child;
    st = standby!.state;
    setRef(child, true);
    child.stdin!.write(standbyRequest(spec));
  } else {
    if (standby) standby.child.kill('SIGKILL');
    const args = ['exec', String(spec.pid), spec.workspacePath, spec.cwd];
    for (const f of spec.cgroupProcs) args.push('--cg', f);
    if (spec.cgroupDir) args.push('--cgdir', spec.cgroupDir);
    if (spec.tty) {
      if (!validTtySize(spec.tty))
        throw new RuntimeError(
          'InvalidArgument',
          `tty size must be 1..65535 rows and columns, got ${spec.tty.rows}x${spec.tty.cols}`,
        );
      args.push('--tty', `${spec.tty.rows}x${spec.tty.cols}`);
    }
    args.push(...(spec.confinement ?? []));
    args.push('--', ...spec.argv);
    execCounts.nodeSpawns++;
    child = spawn(spec.helper, args, {
      env: spec.env,
      stdio: spec.tty ? ['pipe', 'pipe', 'pipe', 'pipe', 'pipe'] : ['pipe', 'pipe', 'pipe', 'pipe'],
    });
    st = track(child);
  }
  const control = spec.tty ? (child.stdio[4] as Writable) : undefined;
  control?.on('error', () => undefined); // the helper has exited
  const resize = (s: TtySize) => {
    if (!control || control.destroyed || !validTtySize(s)) return;
    control.write(`${s.rows} ${s.cols}\n`);
  };
  const statusStream = child.stdio[3] as Readable;
  let killed = false;
  const kill = () => {
    if (!killed && child.exitCode === null && child.signalCode === null) {
      killed = true;
      child.kill('SIGTERM'); // the helper SIGKILLs the command's process group
    }
  };
  const exit = (timeoutMs?: number) =>
    new Promise<RawExit>((resolve, reject) => {
      let timedOut = false;
      const timer =
        timeoutMs && timeoutMs > 0
          ? setTimeout(() => {
              timedOut = true;
              kill();
            }, timeoutMs)
          : undefined;
      void st.settled.then(() => {
        if (timer) clearTimeout(timer);
        if (st.error) return reject(new RuntimeError('Internal', `procbox helper: ${st.error.message}`));
        // The status line is written before the helper exits; give the pipe a moment.
        const finish = () => {
          const line = st.status.trim().split('\n').pop() ?? '';
          const [word, ...rest] = line.split(' ');
          if (word === 'exit') return resolve({ exitCode: Number(rest[0]), timedOut });
          if (word === 'signal') {
            const n = Number(rest[0]);
            return resolve({ exitCode: 128 + n, signal: SIGNAMES.get(n) ?? String(n), timedOut });
          }
          const msg = rest.join(' ') || `helper exited ${child.exitCode ?? child.signalCode}`;
          // A command that cannot be started is a result (127 or 126), like a shell reports it.
          // The helper's own code tells 127 (no such program) from 126 (cannot be run).
          if (word === 'error' && /^exec /.test(msg))
            return resolve({ exitCode: child.exitCode === 126 ? 126 : 127, timedOut, error: msg });
          if (word === 'error' && /^chdir /.test(msg))
            return reject(new RuntimeError('NotFound', `working directory: ${msg}`));
          if (killed) return resolve({ exitCode: 137, signal: 'SIGKILL', timedOut });
          reject(new RuntimeError('Internal', `procbox exec: ${msg}`));
        };
        if (statusStream.readableEnded || statusStream.destroyed || FINAL_STATUS.test(st.status)) finish();
        else {
          // fd 3 is held by nobody else (the command closes it), so EOF follows at once; the
          // timeout only guards against a stuck pipe.
          const t = setTimeout(finish, 2000);
          statusStream.once('end', () => {
            clearTimeout(t);
            finish();
          });
        }
      });
    });
  child.once('exit', () => control?.destroy());
  return { child, exit, gone: st.gone, kill, resize, usedStandby: usable };
}

/**
 * Resolves when `stream` ends, or `graceMs` after `after` settles if it has not: a background
 * process started by the command keeps the pipe open, and we must not wait for it. The grace
 * runs while a reader reads: one that paused is waited for.
 */
export function drained(stream: Readable, after: Promise<unknown>, graceMs = 30): Promise<void> {
  return new Promise((resolve) => {
    if (stream.readableEnded || stream.destroyed) return resolve();
    let done = false;
    const end = () => {
      if (!done) {
        done = true;
        resolve();
      }
    };
    stream.once('end', end);
    stream.once('close', end);
    const grace = () =>
      setTimeout(() => {
        // setImmediate runs after the next poll phase, so whatever the command wrote before
        // it exited has been read even if the event loop was blocked past the timer.
        setImmediate(() => {
          if (done) return;
          // A reader that paused (a WebSocket with a lot unsent behind it) has not had the
          // output yet: wait for it to read on, then give the background process its grace.
          if (stream.readableFlowing === false) {
            stream.once('resume', grace);
            return;
          }
          stream.destroy();
          end();
        });
      }, graceMs);
    after.then(grace, () => end());
  });
}
