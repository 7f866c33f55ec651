// Idle standby of a VM (native/vm/idle.ts through the idle wrapper native/idle.ts), real QEMU: the
// guest is stopped for real (QMP query-status says paused), its record says standby, the next exec
// wakes it, an agent call's timeout does not run while the guest is stopped, and a restart of the
// runtime keeps it stopped and still wakes it.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { withIdle } from '../../../native/idle.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';

describe('native/vm idle standby (QEMU)', function () {
  this.timeout(600_000);
  let stateDir: string;
  let vm: VmRuntime;
  let rt: ReturnType<typeof withIdle<VmRuntime>>;

  const status = (r: VmRuntime) => r.vm('s').qmp!.status();
  const record = () => JSON.parse(readFileSync(join(stateDir, 'vms', 's', 'vm.json'), 'utf8')) as { standby?: boolean };

  before(async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmidle-'));
    vm = new VmRuntime({ stateDir, warmPool: 0 });
    rt = withIdle(vm);
    await rt.start();
    await rt.create({ id: 's' });
  });
  after(async () => {
    if (!vm) return;
    for (const s of await vm.list()) await vm.destroy(s.id).catch(() => undefined);
    await vm.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('stops the guest on standby (QMP paused, record on disk) and the next exec wakes it', async () => {
    await rt.exec('s', { argv: ['sh', '-c', 'echo 0 > /tmp/c'] });
    expect(await status(vm)).to.equal('running');
    const d = await rt.standbyIfIdle('s', 0);
    expect(d).to.deep.equal({ standby: true });
    expect(await status(vm)).to.equal('paused');
    expect(record().standby).to.equal(true);
    expect((await rt.inspect('s')).standby).to.equal(true);
    expect((await rt.inspect('s')).state).to.equal('running');
    const r = await rt.exec('s', { argv: ['cat', '/tmp/c'] });
    expect(r.stdout.toString()).to.equal('0\n');
    expect(await status(vm)).to.equal('running');
    expect(record().standby).to.equal(undefined);
    expect((await rt.inspect('s')).standby).to.equal(undefined);
  });

  it("does not run an agent call's timeout while the guest is stopped", async () => {
    const agent = await vm.agent('s');
    await rt.standbyIfIdle('s', 0);
    expect(await status(vm)).to.equal('paused');
    const ping = agent.ping(300).then(
      () => 'answered',
      (e: Error) => e.message,
    );
    // The time passing while stopped is what is under test: 3 x the call's timeout.
    await new Promise((r) => setTimeout(r, 900));
    await rt.wake('s');
    expect(await ping).to.equal('answered');
    expect(agent.closed).to.equal(false);
    expect((await rt.exec('s', { argv: ['echo', 'ok'] })).stdout.toString()).to.equal('ok\n');
  });

  it('keeps a standby VM stopped across a restart of the runtime, and wakes it', async () => {
    await rt.exec('s', { argv: ['sh', '-c', 'echo kept > /tmp/k'] });
    await rt.standbyIfIdle('s', 0);
    await vm.close();
    vm = new VmRuntime({ stateDir, warmPool: 0 });
    rt = withIdle(vm);
    await rt.start();
    expect(await status(vm)).to.equal('paused');
    expect((await rt.inspect('s')).standby).to.equal(true);
    expect(record().standby).to.equal(true);
    const r = await rt.exec('s', { argv: ['cat', '/tmp/k'] });
    expect(r.stdout.toString()).to.equal('kept\n');
    expect(await status(vm)).to.equal('running');
    expect((await rt.inspect('s')).standby).to.equal(undefined);
  });

  it('refuses standby of a VM the user paused, and a wake leaves a pause in place', async () => {
    await rt.pause('s');
    const e = await rt.standbyIfIdle('s', 0).then(
      () => undefined,
      (err: Error) => err,
    );
    expect(e?.message).to.match(/paused/);
    expect(await status(vm)).to.equal('paused');
    await rt.resume('s');
    expect(await status(vm)).to.equal('running');
  });
});
