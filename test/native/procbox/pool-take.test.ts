// Taking a warm pool init (native/procbox/pool.ts launchWarm): a sandbox with the default limits
// keeps the cgroups the init was born in, with no cgroup write on the event loop; one with other
// limits (same memory, so the same /tmp size) gets them written before it runs a command.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { refill } from '../../../native/procbox/pool.js';
import { skipWith } from '../../skip.js';
import { whileSpying } from '../../support/spy-builtin.js';
import { eventually } from '../../runtime/controller/env.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

/** The paths under /sys/fs/cgroup that fs.mkdirSync / fs.writeFileSync were called on while `fn` ran. */
async function cgroupWrites(fn: () => Promise<void>): Promise<string[]> {
  const seen: string[] = [];
  await whileSpying(
    'node:fs',
    ['mkdirSync', 'writeFileSync'],
    (name, a) => String(a[0]).startsWith('/sys/fs/cgroup') && seen.push(`${name} ${String(a[0])}`),
    fn,
  );
  return seen;
}

describe('procbox warm pool take: cgroups', function () {
  this.timeout(120_000);
  let fx: Fixture;
  let pb: ProcboxCore;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime({ warmPool: 1 });
    pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
  });
  after(async () => fx?.cleanup());

  const pooled = async () => {
    await refill(pb);
    await eventually(() => pb.pool.length === 1, 30_000, 'a pool init');
    return pb.pool[0]!;
  };

  it('a sandbox with the default limits takes the init with no cgroup write, and runs under those limits', async () => {
    const e = await pooled();
    const writes = await cgroupWrites(
      async () => void (await fx.rt.create({ id: 'take-default', network: { mode: 'none' } })),
    );
    expect(pb.records.get('take-default')!.cgroupKey, 'the pool init was taken').to.equal(e.cgroupKey);
    expect(writes, 'cgroup writes on the event loop during the take').to.deep.equal([]);
    const dirs = pb.cgroups('take-default').dirs();
    const pidsDir = dirs.find((d) => d.includes('/pids/')) ?? dirs[dirs.length - 1]!;
    expect(readFileSync(join(pidsDir, 'pids.max'), 'utf8').trim()).to.equal(String(pb.effectiveLimits({}).pids));
    expect((await sh(fx.rt, 'take-default', 'echo ok')).out).to.equal('ok\n');
  });

  it('a sandbox with other limits (pids, cpu weight) takes the init and gets its own limits written', async () => {
    const e = await pooled();
    const writes = await cgroupWrites(
      async () =>
        void (await fx.rt.create({
          id: 'take-limits',
          network: { mode: 'none' },
          resources: { pids: 77, cpuWeight: 50 },
        })),
    );
    expect(pb.records.get('take-limits')!.cgroupKey, 'the pool init was taken').to.equal(e.cgroupKey);
    expect(writes.length, 'the limits were written').to.be.greaterThan(0);
    // Inside: more than 77 processes at once fail (the pids limit is the sandbox's, not the pool's 1024).
    const r = await sh(
      fx.rt,
      'take-limits',
      'for i in $(seq 1 100); do sleep 5 & done 2>/dev/null; jobs -p | wc -l; kill $(jobs -p) 2>/dev/null; true',
    );
    expect(Number(r.out.trim())).to.be.below(77);
  });
});
