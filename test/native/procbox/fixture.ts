import { expect } from 'chai';
// Shared setup for the procbox tests: a runtime on a fresh state directory, the helper built,
// and a reason to skip when the host cannot run sandboxes (not root, not Linux).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProcboxRuntime, defaultHelperPath, type ProcboxOptions } from '../../../native/procbox/procbox.js';
import { RuntimeError } from '../../../native/runtime.js';

export function skipReason(): string | undefined {
  if (process.platform !== 'linux') return 'procbox needs Linux';
  if (process.getuid?.() !== 0) return 'procbox tests need root (namespaces, cgroups, overlayfs)';
  if (!existsSync(defaultHelperPath())) {
    try {
      execFileSync('make', ['-s', '-C', join(import.meta.dirname, '../../../native/procbox')], { stdio: 'pipe' });
    } catch (err) {
      return `cannot build the procbox helper: ${(err as Error).message}`;
    }
  }
  return undefined;
}

export interface Fixture {
  rt: ProcboxRuntime;
  stateDir: string;
  cleanup(): Promise<void>;
}

/** A started runtime on a temporary state directory; cleanup destroys every sandbox left. */
export async function makeRuntime(opts: Omit<ProcboxOptions, 'stateDir'> = {}): Promise<Fixture> {
  const stateDir = mkdtempSync(join(tmpdir(), 'procbox-test-'));
  const rt = new ProcboxRuntime({ stateDir, ...opts });
  await rt.start();
  const fx: Fixture = {
    rt,
    stateDir,
    async cleanup() {
      // fx.rt, not rt: a test may replace the runtime (adoption tests).
      for (const s of await fx.rt.list()) await fx.rt.destroy(s.id);
      await fx.rt.close();
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
  return fx;
}

/** Runs a shell script in the sandbox; returns stdout, stderr (text) and the exit code. */
export async function sh(rt: ProcboxRuntime, id: string, script: string, timeoutMs = 20_000) {
  const r = await rt.exec(id, { argv: ['sh', '-c', script], timeoutMs });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString(), r };
}

/** Awaits a call that must fail with a RuntimeError and returns it (for its code). */
export async function rejects(p: Promise<unknown>): Promise<RuntimeError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).to.be.instanceOf(RuntimeError);
  return e as RuntimeError;
}

/** Whether a process is gone (or a zombie): an init killed, a helper ended. */
export function gone(pid: number): boolean {
  try {
    return /\) [ZX] /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

/** The live children of process `ppid` (zombies left out), from /proc/PID/stat. */
export function childrenOf(ppid: number): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      if (f[1] === String(ppid) && f[0] !== 'Z') out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}
