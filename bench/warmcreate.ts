// A procbox create from the warm pool, in the driver (no API): the pool refilled and its
// init's standby exec helper started before each timed create, so only the take is timed (the
// rename of the init's root, the cgroups, the attach of the workspace overlay by the fileops
// helper, the record). Peer in the same run: a create with no pool (a cold start of the init).
//   npx tsx bench/warmcreate.ts [--runs 25]
import os from 'node:os';
import type { ProcboxCore } from '../native/procbox/core.js';
import { refill } from '../native/procbox/pool.js';
import { makeRuntime } from '../test/native/procbox/fixture.js';
import { arg, percentile, section } from './lib.js';

const RUNS = arg('runs', 25);

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) return section('warmcreate', ['Not run: procbox needs root.']);
  const load = os.loadavg()[0]!.toFixed(1);
  const warm = await makeRuntime({ warmPool: 1 });
  const cold = await makeRuntime();
  const pb = (warm.rt as unknown as { pb: ProcboxCore }).pb;
  const w: number[] = [];
  const c: number[] = [];
  let coldTakes = 0;
  try {
    for (let i = 0; i < RUNS; i++) {
      await refill(pb);
      while (pb.pool.length < 1 || !pb.pool[0]!.standby?.child.pid) await new Promise((r) => setTimeout(r, 5));
      await new Promise((r) => setTimeout(r, 50)); // the standby joins the init's namespaces
      let t = performance.now();
      await warm.rt.create({ id: `w${i}`, network: { mode: 'none' } });
      w.push(performance.now() - t);
      if (!pb.records.get(`w${i}`)?.cgroupKey?.includes('.pool-')) coldTakes++;
      t = performance.now();
      await cold.rt.create({ id: `c${i}`, network: { mode: 'none' } });
      c.push(performance.now() - t);
    }
  } finally {
    await warm.cleanup();
    await cold.cleanup();
  }
  const row = (xs: number[]) => `${percentile(xs, 50).toFixed(2)} ms | ${percentile(xs, 90).toFixed(2)} ms`;
  section('warmcreate (procbox create from the warm pool, driver)', [
    `${RUNS} creates each way, alternating, network none, default limits; load average ${load} before it.`,
    '',
    '| create | p50 | p90 |',
    '|---|---|---|',
    `| from the warm pool (init, root and standby made ahead) | ${row(w)} |`,
    `| cold (no pool: the init started by the create) | ${row(c)} |`,
    '',
    `Warm creates that found no pool init: ${coldTakes} of ${RUNS}.`,
  ]);
}

await main();
process.exit(0);
