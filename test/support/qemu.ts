// QEMU processes of a test's state directory, found in /proc: for the checks that a test left no
// VM behind (QEMU runs in the VM's state directory with relative paths, so its cwd is matched too).
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

/** Pids of QEMU processes whose command line mentions `marker` or that run in a directory below it. */
export function qemuPids(marker: string): number[] {
  const out: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8');
      const cwd = () => readlinkSync(`/proc/${p}/cwd`);
      if (cmd.includes('qemu-system') && (cmd.includes(marker) || cwd() === marker || cwd().startsWith(`${marker}/`)))
        out.push(Number(p));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}
