// A fork's children are recorded before their inits run (one batch for all of them). The Sandbox
// controller of each child inspects its own (with revive) when a pass of it comes while a
// sibling's pass runs the batch: such a child is being started, not dead. Restarting it there
// destroyed the cgroups the batch was putting its init in (the batch failed with ENOENT on
// cgroup.procs, and its teardown took children already reported running). Now revive and inspect
// wait for the start.
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import type { SandboxInfo } from '../../../native/runtime.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

/**
 * The listing once `ids` are all recorded, polled each turn of the event loop (bounded) while a fork runs; undefined
 * when they never were.
 */
async function whenRecorded(fx: Fixture, ids: string[]): Promise<SandboxInfo[] | undefined> {
  for (let i = 0; i < 100_000; i++) {
    const listed = (await fx.rt.list()).filter((s) => ids.includes(s.id));
    if (listed.length === ids.length) return listed;
    await new Promise((r) => setImmediate(r));
  }
  return undefined;
}

describe('procbox fork: a child inspected while its init starts', function () {
  this.timeout(120_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime({ warmPool: 2 });
  });
  after(async () => {
    await fx?.cleanup();
  });

  it('inspect with revive during the batch waits for it: the children keep the inits the fork started', async () => {
    await fx.rt.create({ id: 'parent' });
    expect((await sh(fx.rt, 'parent', 'echo base > /work/base')).code).to.equal(0);
    const ids = Array.from({ length: 12 }, (_, i) => `kid${i}`);
    const forking = fx.rt.fork('parent', ids);
    // The children are recorded (state stopped: no init yet) before the batch starts them.
    const listed = await whenRecorded(fx, ids);
    expect(listed, 'the children were recorded while the fork ran').to.not.equal(undefined);
    expect(
      listed!.map((s) => s.state),
      'some children had no init yet when inspected',
    ).to.include('stopped');
    // What each child's controller pass does when it finds its sandbox stopped.
    const inspected = await Promise.all(ids.map((id) => fx.rt.inspect(id, { revive: true })));
    const forked = await forking;
    const started = new Map(forked.children.map((c) => [c.id, c.pid]));
    for (const info of inspected) {
      expect(info.state, info.id).to.equal('running');
      expect(info.pid, `${info.id}: the init the fork started, not a restart`).to.equal(started.get(info.id));
    }
    for (const id of ids) {
      expect((await fx.rt.inspect(id)).restarted, id).to.not.equal(true);
      expect(await sh(fx.rt, id, 'cat /work/base')).to.include({ code: 0, out: 'base\n' });
    }
  });

  it('a child destroyed while the batch starts it goes after the start; its siblings are unharmed', async () => {
    const ids = Array.from({ length: 8 }, (_, i) => `sib${i}`);
    const forking = fx.rt.fork('parent', ids);
    const sib3 = (await whenRecorded(fx, ['sib3']))?.[0];
    expect(sib3?.state, 'sib3 was recorded, without an init yet, while the fork ran').to.equal('stopped');
    const destroyed = fx.rt.destroy('sib3');
    const forked = await forking; // rejected when the teardown pulled the cgroups from under the batch
    await destroyed;
    expect(forked.children.map((c) => c.id)).to.deep.equal(ids);
    const listed = await fx.rt.list();
    expect(
      listed.some((s) => s.id === 'sib3'),
      'sib3 is gone',
    ).to.equal(false);
    for (const id of ids.filter((x) => x !== 'sib3')) {
      expect((await fx.rt.inspect(id)).state, id).to.equal('running');
      expect(await sh(fx.rt, id, 'cat /work/base')).to.include({ code: 0, out: 'base\n' });
    }
  });
});
