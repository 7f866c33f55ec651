// Idle standby and wake (native/idle.ts over a real procbox, native/procbox/idle.ts): an idle
// sandbox is frozen by its cgroup freezer (the kernel says frozen; a counter in the sandbox stops),
// the next exec wakes it and gets its output; concurrent calls thaw once; activity, a call in
// flight and a running job keep it awake; a standby survives a restart of the runtime (still
// frozen, still wakes); a user pause while on standby holds it frozen.
import { expect } from 'chai';
import { withIdle, type IdleRuntime } from '../../native/idle.js';
import { ProcboxRuntime } from '../../native/procbox/procbox.js';
import { skipWith } from '../skip.js';
import { eventually } from '../support/wait.js';
import { COUNTER_LOOP as LOOP, counter, kernelFrozen } from '../support/freezer.js';
import { makeRuntime, skipReason, type Fixture } from './procbox/fixture.js';

describe('idle standby and wake (procbox)', function () {
  this.timeout(120_000);
  let fx: Fixture;
  let rt: ProcboxRuntime & IdleRuntime;
  let n = 0;
  const newId = () => `idle-${process.pid}-${n++}`;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    rt = withIdle(fx.rt);
  });
  after(async () => {
    await fx?.cleanup();
  });

  it('an idle sandbox is frozen (kernel frozen, a counter stops) and the next exec wakes it with its output', async () => {
    const id = newId();
    const info = await rt.create({ id, network: { mode: 'none' } });
    // A loop in the background of the sandbox (not a job: an exec that leaves it running).
    const bg = await rt.exec(id, { argv: ['sh', '-c', `(${LOOP}) >/dev/null 2>&1 </dev/null &`] });
    expect(bg.exitCode).to.equal(0);
    await eventually(() => counter(info.pid!) > 2, 10_000, 'the counter loop to run');
    // Just active: not idle yet, and it says how long to wait.
    const early = await rt.standbyIfIdle(id, 60_000);
    expect(early).to.deep.include({ standby: false, why: 'active' });
    if (!early.standby) expect(early.waitMs).to.be.greaterThan(59_000).and.at.most(60_000);
    expect(await rt.standbyIfIdle(id, 0)).to.deep.equal({ standby: true });
    expect(kernelFrozen(info.pid!), 'the kernel says the cgroup is frozen').to.equal(true);
    expect((await rt.inspect(id)).standby).to.equal(true);
    const at = counter(info.pid!);
    // Observation window for a negative: the loop ticks every 20 ms; 25 ticks' time passes.
    const t0 = Date.now();
    await eventually(() => Date.now() - t0 >= 500, 2000, 'the observation window');
    expect(counter(info.pid!), 'the counter does not advance while frozen').to.equal(at);
    const woke: string[] = [];
    rt.onWake((x) => woke.push(x));
    const r = await rt.exec(id, { argv: ['sh', '-c', 'echo awake; cat /tmp/c >/dev/null'] });
    expect(r.exitCode).to.equal(0);
    expect(r.stdout.toString()).to.equal('awake\n');
    expect(woke).to.deep.equal([id]);
    expect(kernelFrozen(info.pid!)).to.equal(false);
    expect((await rt.inspect(id)).standby).to.equal(undefined);
    await eventually(() => counter(info.pid!) > at + 2, 10_000, 'the counter to advance again after the wake');
  });

  it('concurrent calls on a standby sandbox thaw it once and all get their answers', async () => {
    const id = newId();
    await rt.create({ id, network: { mode: 'none' } });
    expect(await rt.standbyIfIdle(id, 0)).to.deep.equal({ standby: true });
    let calls = 0;
    let wakes = 0;
    const inner = fx.rt.wake;
    fx.rt.wake = async (x: string) => {
      calls++;
      const w = await inner(x);
      if (w) wakes++;
      return w;
    };
    try {
      const outs = await Promise.all([
        ...Array.from({ length: 6 }, (_, i) => rt.exec(id, { argv: ['echo', `n${i}`] })),
        rt.listFiles(id, '/work').then(() => ({ exitCode: 0, stdout: Buffer.from('file\n') })),
        rt.wake(id).then(() => ({ exitCode: 0, stdout: Buffer.from('wake\n') })),
      ]);
      expect(outs.map((o) => o.stdout.toString().trim())).to.deep.equal([
        'n0',
        'n1',
        'n2',
        'n3',
        'n4',
        'n5',
        'file',
        'wake',
      ]);
      expect(calls, 'one backend wake for eight concurrent callers').to.equal(1);
      expect(wakes).to.equal(1);
    } finally {
      fx.rt.wake = inner;
    }
  });

  it('activity resets the idle time; a call in flight and a running job keep the sandbox awake', async () => {
    const id = newId();
    await rt.create({ id, network: { mode: 'none' } });
    const t0 = Date.now();
    await rt.exec(id, { argv: ['true'] });
    const d1 = await rt.standbyIfIdle(id, 5000);
    expect(d1.standby).to.equal(false);
    // The exec just now is the last activity: the wait is counted from it, not from the create.
    if (!d1.standby) expect(d1.waitMs).to.be.greaterThan(5000 - (Date.now() - t0) - 1);
    // A call in flight: never frozen under it, whatever the idle time.
    const running = rt.exec(id, { argv: ['sleep', '1'] });
    await eventually(async () => (await rt.standbyIfIdle(id, 0)).standby === false, 5000, 'refused while in flight');
    const d2 = await rt.standbyIfIdle(id, 0);
    expect(d2).to.deep.include({ standby: false, why: 'a call is in flight' });
    await running;
    // A server command (the workspace size) is not activity.
    await rt.exec(id, { argv: ['true'], serverCommand: true });
    // A background job running: not idle.
    const job = await rt.startJob(id, { id: 'sleeper', argv: ['sleep', '30'] });
    const d3 = await rt.standbyIfIdle(id, 0);
    expect(d3).to.deep.include({ standby: false, why: '1 background job(s) running' });
    await rt.killJob(id, job.id);
    await eventually(async () => (await rt.listJobs(id)).every((j) => j.state !== 'running'), 10_000, 'the job to end');
    expect(await rt.standbyIfIdle(id, 0)).to.deep.equal({ standby: true });
    await rt.wake(id);
  });

  it('a standby survives a restart of the runtime: still frozen, listed as standby, and the next exec wakes it', async () => {
    const id = newId();
    const info = await rt.create({ id, network: { mode: 'none' } });
    expect(await rt.standbyIfIdle(id, 0)).to.deep.equal({ standby: true });
    await fx.rt.close();
    fx.rt = new ProcboxRuntime({ stateDir: fx.stateDir });
    const again = withIdle(fx.rt);
    await again.start();
    rt = again;
    expect(kernelFrozen(info.pid!), 'still frozen after the restart').to.equal(true);
    const i2 = await rt.inspect(id);
    expect(i2.pid).to.equal(info.pid);
    expect(i2.standby).to.equal(true);
    const r = await rt.exec(id, { argv: ['echo', 'back'] });
    expect(r.stdout.toString()).to.equal('back\n');
    expect(kernelFrozen(info.pid!)).to.equal(false);
  });

  it('a pause by the user on a standby sandbox holds it frozen until resumed; a paused sandbox is not put on standby', async () => {
    const id = newId();
    const info = await rt.create({ id, network: { mode: 'none' } });
    expect(await rt.standbyIfIdle(id, 0)).to.deep.equal({ standby: true });
    await rt.pause(id);
    const i = await rt.inspect(id);
    expect(i.state).to.equal('paused');
    expect(i.standby).to.equal(undefined);
    expect(kernelFrozen(info.pid!)).to.equal(true);
    const e = await rt.standbyIfIdle(id, 0).then(
      () => undefined,
      (err: Error) => err,
    );
    expect(e?.message).to.match(/is paused/);
    await rt.resume(id);
    expect(kernelFrozen(info.pid!)).to.equal(false);
    expect((await rt.exec(id, { argv: ['echo', 'ok'] })).stdout.toString()).to.equal('ok\n');
  });

  it('idle time counts from the create, not from the start of the process (fake clock): idle N ms after create, not before', async () => {
    let t = Date.now();
    const clocked = withIdle(fx.rt, () => t);
    // The process has been up a minute when the sandbox is created.
    t += 60_000;
    const id = newId();
    await clocked.create({ id, network: { mode: 'none' } });
    const d0 = await clocked.standbyIfIdle(id, 10_000);
    expect(d0, 'just created: not idle').to.deep.include({ standby: false, why: 'active', waitMs: 10_000 });
    t += 9_999;
    expect(await clocked.standbyIfIdle(id, 10_000), '1 ms before its idle time ends').to.deep.include({
      standby: false,
      waitMs: 1,
    });
    t += 1;
    expect(await clocked.standbyIfIdle(id, 10_000), 'its idle time ended').to.deep.equal({ standby: true });
    await clocked.wake(id);
  });
});
