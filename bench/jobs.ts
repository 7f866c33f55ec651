// Background jobs on procbox: job start -> first output byte at the runtime, i.e.
// startJob of `echo x` until readJob (long poll) returns the byte, over N runs, beside the
// floor of a buffered exec of the same command in the same sandbox (a Node-spawned helper
// either way). Measured at the Runtime, not through the HTTP API (the client-side number of
// the target adds the API layer on top). Also the stream throughput of a job writing to stdout
// (`head -c 256M /dev/zero`, read back with readJob in 4 MiB reads from the start to its end: the
// supervisor's spool write plus the reader's long polls), the median of 3.
//   npx tsx bench/jobs.ts [--runs N]       (needs root: namespaces, cgroups)
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { arg, median, percentile, section } from './lib.js';

const runs = arg('runs', 50);
const stateDir = mkdtempSync(join(tmpdir(), 'bench-jobs-'));
const rt = new ProcboxRuntime({ stateDir });
await rt.start();
try {
  await rt.create({ id: 'b', resources: { memoryBytes: 256 << 20, pids: 256 } });
  await rt.exec('b', { argv: ['true'] }); // warm
  const first: number[] = [];
  const start: number[] = [];
  const exec: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await rt.startJob('b', { id: `j${i}`, argv: ['sh', '-c', 'echo x'] });
    const t1 = performance.now();
    const r = await rt.readJob('b', `j${i}`, { stream: 'stdout', offset: 0, maxBytes: 16, waitMs: 5000 });
    const t2 = performance.now();
    if (r.data.toString() !== 'x\n') throw new Error(`job j${i}: got ${JSON.stringify(r.data.toString())}`);
    start.push(t1 - t0);
    first.push(t2 - t0);
    const t3 = performance.now();
    await rt.exec('b', { argv: ['sh', '-c', 'echo x'] });
    exec.push(performance.now() - t3);
  }
  const MiB = 1 << 20;
  const total = 256 * MiB;
  const rates: number[] = [];
  for (let k = 0; k < 3; k++) {
    const id = `tp${k}`;
    const t0 = performance.now();
    await rt.startJob('b', { id, argv: ['head', '-c', String(total), '/dev/zero'], maxOutputBytes: total });
    let offset = 0;
    for (;;) {
      const r = await rt.readJob('b', id, { stream: 'stdout', offset, maxBytes: 4 * MiB, waitMs: 5000 });
      offset = r.nextOffset;
      if (r.eof) break;
    }
    const s = (performance.now() - t0) / 1000;
    if (offset !== total) throw new Error(`job ${id}: read ${offset} bytes, not ${total}`);
    rates.push(total / MiB / s);
  }
  const f = (x: number) => x.toFixed(1);
  section('jobs (procbox)', [
    `${runs} runs, one sandbox, \`sh -c 'echo x'\`; ms.`,
    '',
    '| measure | p50 | p95 |',
    '|---|---|---|',
    `| job start -> first output byte (startJob + readJob long poll) | ${f(median(first))} | ${f(percentile(first, 95))} |`,
    `| of which startJob (helper spawned detached, supervisor reports) | ${f(median(start))} | ${f(percentile(start, 95))} |`,
    `| floor: buffered exec of the same command (standby helper) | ${f(median(exec))} | ${f(percentile(exec, 95))} |`,
    '',
    `Stream throughput, a job writing 256 MiB to stdout read back to its end (startJob + readJob, 4 MiB reads), median of 3: **${f(median(rates))} MiB/s** (runs: ${rates.map(f).join(', ')}; target >= 200).`,
  ]);
} finally {
  for (const s of await rt.list()) await rt.destroy(s.id);
  await rt.close();
  rmSync(stateDir, { recursive: true, force: true });
}
