// Idle standby: wake from standby to the first command's output (goal <= 25 ms
// procbox, Blaxel publishes < 25 ms; <= 150 ms vm). Runtime level, one process: a procbox sandbox
// behind the idle wrapper (native/idle.ts, as serve builds it) is put on standby, then an exec of
// `echo x` is timed from the call to its output (buffered: the output is there when the call
// returns). The same run's floor is the same exec on the awake
// sandbox, alternating with the wake runs. Printed as markdown rows (no pass/fail).
//   npx tsx bench/standby.ts [--runs N] [--vm]
// Needs root (namespaces, cgroups). --vm: a VM sandbox instead (native/vm/idle.ts: QMP stop/cont;
// needs QEMU; the warm pool off; the first VM boots the template when it is not cached).
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { withIdle } from '../native/idle.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { VmRuntime } from '../native/vm/vm.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const RUNS = arg('--runs', 50);
const VM = process.argv.includes('--vm');
const BACKEND = VM ? 'vm' : 'procbox';

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
}
const fmt = (xs: number[]) => `${pct(xs, 50).toFixed(1)} | ${pct(xs, 99).toFixed(1)}`;

// The standby helpers' sockets are unref'd (a server keeps its loop alive by itself): a script must.
const keepAlive = setInterval(() => undefined, 1000);
const stateDir = mkdtempSync(join(tmpdir(), 'standby-bench-'));
const rt = withIdle(VM ? new VmRuntime({ stateDir, warmPool: 0 }) : new ProcboxRuntime({ stateDir, warmPool: 0 }));
await rt.start();
const id = `standby-bench-${process.pid}`;
try {
  await rt.create({ id, network: { mode: 'none' } });
  await rt.exec(id, { argv: ['true'] });
  const wake: number[] = [];
  const floor: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    // The floor: the same exec on the awake sandbox (after the standby exec helper is back).
    await new Promise((r) => setTimeout(r, 300));
    let t0 = performance.now();
    const a = await rt.exec(id, { argv: ['echo', 'x'] });
    floor.push(performance.now() - t0);
    if (a.stdout.toString() !== 'x\n') throw new Error('bad output');
    // Wake: standby, then the exec.
    await new Promise((r) => setTimeout(r, 300));
    const d = await rt.standbyIfIdle(id, 0);
    if (!d.standby) throw new Error(`not on standby: ${JSON.stringify(d)}`);
    t0 = performance.now();
    const b = await rt.exec(id, { argv: ['echo', 'x'] });
    wake.push(performance.now() - t0);
    if (b.stdout.toString() !== 'x\n') throw new Error('bad output after wake');
  }
  console.log(`\nidle standby, ${BACKEND}, ${RUNS} runs each, load ${loadavg()[0]!.toFixed(1)} (ms)\n`);
  console.log('| measurement | p50 | p99 |');
  console.log('|---|---|---|');
  console.log(`| wake from standby -> output of \`echo x\` (buffered exec) | ${fmt(wake)} |`);
  console.log(`| floor: the same buffered exec, awake | ${fmt(floor)} |`);
} finally {
  await rt.destroy(id).catch(() => undefined);
  await rt.close();
  rmSync(stateDir, { recursive: true, force: true });
  clearInterval(keepAlive);
}
