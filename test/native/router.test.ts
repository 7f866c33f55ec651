// RuntimeRouter over a real procbox and a real VmRuntime (no VM is booted here: the VM paths
// through the router run in test/e2e/vm-sandbox.test.ts, which pays for one template boot).
// Covers: create goes to the named backend, per-backend capabilities, an absent or failed vm
// backend (Unsupported create, procbox keeps serving), ids routed after a restart by asking
// each backend, cross-backend sources refused, idempotent destroy of unknown ids.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProcboxRuntime } from '../../native/procbox/procbox.js';
import { RuntimeRouter } from '../../native/router.js';
import { RuntimeError } from '../../native/runtime.js';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { VmRuntime } from '../../native/vm/vm.js';
import { skipReason } from './procbox/fixture.js';
import { skipWith } from '../skip.js';

async function code(p: Promise<unknown>): Promise<string> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e, 'expected a RuntimeError').to.be.instanceOf(RuntimeError);
  return (e as RuntimeError).code;
}

describe('native/router RuntimeRouter (procbox + vm)', function () {
  this.timeout(60_000);
  let dir: string;
  const routers: RuntimeRouter[] = [];

  const router = (vm: boolean | 'broken') => {
    const r = new RuntimeRouter({
      backends: {
        procbox: new ProcboxRuntime({ stateDir: join(dir, 'runtime') }),
        // A vm state dir under a regular file cannot be created: start() fails.
        vm:
          vm === 'broken'
            ? new VmRuntime({ stateDir: join(dir, 'file', 'vm') })
            : vm
              ? new VmRuntime({ stateDir: join(dir, 'runtime', 'vm'), warmPool: 0 })
              : undefined,
      },
      defaultBackend: 'procbox',
    });
    routers.push(r);
    return r;
  };

  before(function () {
    skipWith(this, skipReason());
    dir = mkdtempSync(join(tmpdir(), 'router-'));
    writeFileSync(join(dir, 'file'), '');
  });

  after(async () => {
    if (!dir) return;
    const r = router(false);
    await r.start();
    for (const s of await r.list()) await r.destroy(s.id);
    for (const x of routers) await x.close().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  });

  it("reports each backend's capabilities and falls back to the default for one it does not have", async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed');
    const r = router(true);
    await r.start();
    expect(r.available()).to.have.members(['procbox', 'vm']);
    expect(r.capabilities().backend).to.equal('procbox');
    expect(r.capabilities('procbox')).to.include({ backend: 'procbox', layeredWorkspace: true });
    const vm = r.capabilities('vm');
    expect(vm).to.include({ backend: 'vm', layeredWorkspace: false, memoryCheckpoint: true });
    expect(['tcg', 'kvm']).to.include(vm.accelerator);
    expect(await code(r.inspect('nobody'))).to.equal('NotFound');
    await r.close();
  });

  it('without a vm backend (absent or failing to start) procbox serves and a vm create is Unsupported', async () => {
    for (const vm of [false, 'broken'] as const) {
      const r = router(vm);
      await r.start();
      expect(r.available(), String(vm)).to.deep.equal(['procbox']);
      expect(r.capabilities('vm').backend).to.equal('procbox');
      expect(await code(r.create({ id: `v-${vm}`, backend: 'vm' }))).to.equal('Unsupported');
      const info = await r.create({ id: `p-${vm}` });
      expect(info.state).to.equal('running');
      expect((await r.exec(`p-${vm}`, { argv: ['sh', '-c', 'echo hi'] })).stdout.toString()).to.equal('hi\n');
      await r.destroy(`p-${vm}`);
      expect(await code(r.inspect(`p-${vm}`))).to.equal('NotFound');
      await r.close();
    }
  });

  it('after a restart, ids are routed to the backend that holds them; sources must be on the same backend', async () => {
    const a = router(false);
    await a.start();
    await a.create({ id: 'keep', backend: 'procbox' });
    await a.writeFile('keep', '/work/f', Buffer.from('kept\n'));
    await a.checkpoint('keep', 'keep-ck');
    await a.close();

    const b = router(qemuInstalled());
    await b.start();
    expect((await b.list()).map((s) => s.id)).to.include('keep');
    expect((await b.readFile('keep', '/work/f')).toString()).to.equal('kept\n');
    if (qemuInstalled()) {
      // A VM cannot fork a procbox sandbox (nor start from its checkpoint, once the router knows it).
      expect(await code(b.create({ id: 'v1', backend: 'vm', source: { sandboxId: 'keep' } }))).to.equal(
        'InvalidArgument',
      );
      await b.checkpoint('keep', 'keep-ck2');
      expect(await code(b.create({ id: 'v2', backend: 'vm', source: { checkpointId: 'keep-ck2' } }))).to.equal(
        'InvalidArgument',
      );
      await b.deleteCheckpoint('keep-ck2');
    }
    // Unknown to every backend: destroy and deleteCheckpoint are no-ops, not errors.
    await b.destroy('never-was');
    await b.deleteCheckpoint('never-was-ck');
    await b.deleteCheckpoint('keep-ck');
    await b.destroy('keep');
    expect(await code(b.inspect('keep'))).to.equal('NotFound');
    await b.close();
  });
});
