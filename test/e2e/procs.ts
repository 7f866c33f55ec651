// Long-running `fluxctl` processes of the split-mode e2e tests (modes.test.ts, twonodes.test.ts):
// spawned from the repository, their output kept, ready when a pattern shows on stdout, and
// killed when the test process exits.
import { spawn, type ChildProcess } from 'node:child_process';
import { fluxctlCommand, REPO } from './harness.js';

export interface Proc {
  child: ChildProcess;
  logs(): string;
  /** The first match of the pattern in stdout (e.g. the listen address). */
  matched: RegExpExecArray;
  exited: Promise<number | null>;
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

const procs = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of procs) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

/**
 * Spawns `fluxctl args...` and waits for `ready` on its stdout. `prefix` runs it through another
 * command that execs it (e.g. `nsenter --net=...`), so the child is still the fluxctl process.
 */
export async function spawnFluxctl(
  args: string[],
  ready: RegExp,
  timeoutMs = 60_000,
  o: { prefix?: string[]; env?: NodeJS.ProcessEnv } = {},
): Promise<Proc> {
  const argv = [...(o.prefix ?? []), ...fluxctlCommand(), ...args];
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd: REPO,
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(o.env ? { env: { ...process.env, ...o.env } } : {}),
  });
  procs.add(child);
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((r) =>
    child.on('exit', (code) => {
      procs.delete(child);
      r(code);
    }),
  );
  const matched = await new Promise<RegExpExecArray>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`fluxctl ${args[0]} not ready:\n${out}`)), timeoutMs);
    const check = () => {
      const m = ready.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m);
      }
    };
    child.stdout!.on('data', check);
    child.on('exit', () => {
      clearTimeout(t);
      reject(new Error(`fluxctl ${args[0]} exited:\n${out}`));
    });
  });
  return {
    child,
    logs: () => out,
    matched,
    exited,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}
