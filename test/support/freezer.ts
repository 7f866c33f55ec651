// What the kernel says about a sandbox's freezer, for the idle standby tests: the cgroup of a
// process (v2 cgroup.events `frozen 1`, else the v1 freezer.state FROZEN), the processes of a
// and a counter the sandbox's background loop writes, read from
// the host through /proc/PID/root (never through the API, which would wake the sandbox).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** A shell loop that writes an ever-growing counter to /tmp/c (20 ms a tick). */
export const COUNTER_LOOP =
  'i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new && mv /tmp/c.new /tmp/c; sleep 0.02; done';

function cgroupLines(pid: number): string[][] {
  return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .trim()
    .split('\n')
    .map((l) => l.split(':'));
}

function v2Mount(): string | undefined {
  return readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .find((f) => f[2] === 'cgroup2')?.[1];
}

/** Whether every process of the cgroup of `pid` is frozen, as the kernel says. */
export function kernelFrozen(pid: number): boolean {
  const lines = cgroupLines(pid);
  const path = (ctl: string) => lines.find((f) => f[1] === ctl)?.[2];
  const v2 = v2Mount();
  const p2 = path('');
  if (v2 && p2 && p2 !== '/' && existsSync(join(v2, p2, 'cgroup.events')))
    return readFileSync(join(v2, p2, 'cgroup.events'), 'utf8').includes('frozen 1');
  const p1 = path('freezer');
  if (p1 && p1 !== '/')
    return readFileSync(join('/sys/fs/cgroup/freezer', p1, 'freezer.state'), 'utf8').trim() === 'FROZEN';
  throw new Error(`no freezer cgroup of the sandbox for pid ${pid}`);
}

/** The counter COUNTER_LOOP writes in the sandbox of process `pid` (0 before its first tick). */
export function counter(pid: number): number {
  try {
    return Number(readFileSync(`/proc/${pid}/root/tmp/c`, 'utf8').trim() || '0');
  } catch {
    return 0;
  }
}
