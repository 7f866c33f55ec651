// The host's floor: what this machine charges for a first touch of memory, a process, a
// namespace and a mount, measured by a small C program (bench/hostfloor.c, built here with cc)
// with none of FluxVM's code, beside Node's own spawn of /bin/true (what serve pays to start a
// helper). The procbox fork, TTI and VM goals are read against these numbers.
//   npx tsx bench/hostfloor.ts
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { median, section } from './lib.js';

const LABELS: Record<string, string> = {
  'anon4k.first': 'first write to a fresh anonymous 4 KiB page (a page fault), per page',
  'anon4k.again': 'the same pages written again, per page',
  'anonthp.first': 'first write, the range madvised MADV_HUGEPAGE (2 MiB pages), per 4 KiB of it',
  'anonthp.again': 'the same again, per 4 KiB',
  'write.shm.mibps': 'write(2) of 64 MiB into a new /dev/shm file (page cache, no page table), MiB/s',
  'write.tmp.mibps': 'the same into the temp directory, MiB/s',
  fork: 'fork + _exit + waitpid',
  vfork: 'vfork + _exit + waitpid',
  posix_spawn_true: 'posix_spawn of /bin/true + waitpid',
  'clone.ns': 'clone with new mount, pid, ipc and uts namespaces + _exit',
  'clone.ns_net': 'the same with a new network namespace',
  'mount.tmpfs': 'one tmpfs mount in a private mount namespace (median of 20)',
};

async function nodeSpawn(n: number): Promise<number> {
  const xs: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await new Promise<void>((res, rej) =>
      spawn('/bin/true')
        .on('exit', () => res())
        .on('error', rej),
    );
    xs.push((performance.now() - t0) * 1000);
  }
  return median(xs);
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-hostfloor-'));
  try {
    const bin = join(dir, 'hostfloor');
    const cc = spawnSync('cc', ['-O2', '-o', bin, join(import.meta.dirname, 'hostfloor.c')], { encoding: 'utf8' });
    if (cc.status !== 0) throw new Error(`cc failed: ${cc.stderr || cc.error?.message}`);
    const load = loadavg()[0]!.toFixed(1);
    const run = spawnSync(bin, { encoding: 'utf8' });
    if (run.status !== 0) throw new Error(`hostfloor failed: ${run.stderr}`);
    const got = new Map<string, string>();
    for (const line of run.stdout.trim().split('\n')) {
      const m = /^(\S+) (.*)$/.exec(line);
      if (m) got.set(m[1]!, m[2]!);
    }
    const val = (k: string) => Number(got.get(k));
    const rows = [...got].map(([k, v]) => {
      const unit = k.endsWith('mibps') ? '' : ' us';
      return `| ${LABELS[k] ?? k} | ${/^[\d.]+$/.test(v) ? v + unit : v} |`;
    });
    const spawnUs = await nodeSpawn(60);
    // A fork write-protects every page of the parent: after it, each first write to a page of
    // the parent's is a page fault, even once the child has exec'd (why serve starts helpers
    // through procbox's spawner and not child_process.spawn).
    const held = Buffer.allocUnsafeSlow(100 << 20).fill(1);
    let t0 = performance.now();
    held.fill(2);
    const before = performance.now() - t0;
    const heldSpawnUs = await nodeSpawn(1);
    t0 = performance.now();
    held.fill(3);
    const after = performance.now() - t0;
    rows.push(
      `| Node's child_process.spawn of /bin/true until its exit event (what serve pays per helper) | ${spawnUs.toFixed(1)} us |`,
    );
    rows.push(
      `| the same spawn (one) from a Node process holding 100 MiB it has written | ${heldSpawnUs.toFixed(1)} us |`,
      `| rewriting those 100 MiB (once each): before that spawn / after it, the child gone | ${before.toFixed(1)} / ${after.toFixed(1)} ms |`,
    );

    const lines = [
      `cc -O2 bench/hostfloor.c, run once; each row the median of its repetitions. Load ${load} before it, ${process.getuid?.() === 0 ? 'as root' : 'not root (namespaces and mounts skipped)'}.`,
      '',
      '| measurement | median |',
      '|---|---|',
      ...rows,
      '',
    ];
    const fault = val('anon4k.first');
    const thp = val('anonthp.first');
    if (fault > 0 && thp > 0)
      lines.push(
        `A first touch of a 4 KiB page costs ${(fault / val('anon4k.again')).toFixed(0)}x a write to a page already mapped; with 2 MiB pages a 4 KiB share of one costs ${(fault / thp).toFixed(0)}x less than a 4 KiB page. A process, a namespace and a copy-on-write page all pay that first touch.`,
      );
    section('The host floor: memory, processes, namespaces', lines);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
