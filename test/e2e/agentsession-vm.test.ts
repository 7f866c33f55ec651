// End to end: an AgentSession on the vm backend (QEMU; TCG on a host without a usable KVM)
// through kubectl and the session subresources: Running with the vm capabilities, exec,
// a memory checkpoint and a disk one, restore in place, fork into a child, a change in the
// child promoted to the parent (dry-run plan, then apply with the plan id), delete.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import WebSocket from 'ws';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;

describe('e2e: AgentSessions on the vm backend', function () {
  this.timeout(900_000);
  let fx: Fluxctl;
  const post = async (name: string, sub: string, body: unknown) => {
    const r = await fx.request('POST', agsPath(name, sub), { body, timeoutMs: 300_000 });
    expect(r.status, `${sub}: ${r.body.toString()}`).to.equal(200);
    return r.json;
  };
  const sh = async (name: string, command: string) => (await post(name, 'exec', { command })).stdout as string;

  before(async function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'),
    );
    // A short state directory: the VM sockets live below it.
    fx = await startFluxctl({ stateDir: mkdtempSync('/tmp/fvas-') });
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    await fx.stop();
    // A state directory given to startFluxctl is the caller's to remove (each run left ~900 MB).
    rmSync(fx.stateDir, { recursive: true, force: true });
  });

  it('create, exec, memory and disk checkpoints, restore, fork, promote, delete', async () => {
    const t0 = Date.now();
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'v1' },
        spec: { agent: 'a', runtime: { backend: 'vm' }, policy: { preset: 'offline' } },
      }),
    );
    const w = await fx.kubectl(['wait', 'ags/v1', '--for=condition=Ready', '--timeout=600s'], { timeoutMs: 620_000 });
    expect(w.code, `${w.stderr}\n${fx.logs().slice(-2000)}`).to.equal(0);
    console.log(`      (vm session Running in ${Date.now() - t0} ms, template boot included)`);
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'v1', '-o', 'json']));
    expect(s.status.capabilities).to.include({ backend: 'vm', checkpoint: true, memoryCheckpoint: true, fork: true });
    expect((await kubectlOk(fx, ['get', 'sbx', 'v1', '-o', 'jsonpath={.spec.runtime}'])).trim()).to.equal('vm');

    await sh('v1', 'mkdir -p /work && echo one > /work/a');
    expect(await sh('v1', 'cat /work/a')).to.equal('one\n');
    const mem = await post('v1', 'checkpoint', { tag: 'm1', memory: true });
    expect(mem.kind).to.equal('memory');
    const disk = await post('v1', 'checkpoint', { tag: 'd1', memory: false }); // the default on vm is memory
    expect(disk.kind).to.equal('disk');
    await sh('v1', 'echo two > /work/a; echo junk > /work/b');
    await post('v1', 'restore', { tag: 'd1' });
    expect(await sh('v1', 'cat /work/a; ls /work')).to.equal('one\na\n');

    // identity: a vm child boots with a new hostname and machine-id (unique); preserve is refused, nothing forked.
    const keep = await fx.request('POST', agsPath('v1', 'fork'), { body: { count: 1, identity: 'preserve' } });
    expect(keep.status, keep.body.toString()).to.equal(422);
    expect(keep.json.details.causes[0]).to.include({ field: 'identity', reason: 'FieldValueNotSupported' });
    const f = await post('v1', 'fork', { count: 1 });
    expect(f.identity).to.equal('unique');
    const child = f.children[0].name;
    expect(await sh(child, 'hostname; cat /etc/machine-id')).to.not.equal(
      await sh('v1', 'hostname; cat /etc/machine-id'),
    );
    await sh(child, 'echo from-child > /work/c; echo changed > /work/a');
    const plan = await post(child, 'promote', { dryRun: true });
    expect(plan.apply.map((x: any) => `${x.op} ${x.path}`).sort()).to.deep.equal(
      ['added /work/c', 'modified /work/a'].sort(),
    );
    expect(plan.conflicts).to.deep.equal([]);
    const done = await post(child, 'promote', { planId: plan.planId });
    expect(done.applied).to.equal(2);
    expect(await sh('v1', 'cat /work/a /work/c')).to.equal('changed\nfrom-child\n');
    const led = (await fx.request('GET', agsPath('v1', 'ledger'))).json.entries.map((e: any) => e.kind);
    expect(led).to.include.members(['session.create', 'exec', 'checkpoint', 'restore', 'fork', 'promote']);

    await kubectlOk(fx, ['delete', 'ags', child, 'v1', '--wait=true', '--timeout=120s']);
    expect((await fx.kubectl(['get', 'sbx', 'v1'])).stderr).to.match(/NotFound/);
  });

  it('vm parity: 2 vCPUs from runtime.resources.cpu, a terminal that resizes, a read-only workspace held in the guest', async () => {
    const apply = (name: string, spec: Record<string, unknown>) =>
      kubectlOk(
        fx,
        ['apply', '-f', '-'],
        JSON.stringify({
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'AgentSession',
          metadata: { name },
          spec: { agent: 'a', ...spec },
        }),
      );
    await apply('p1', { runtime: { backend: 'vm', resources: { cpu: '2' } }, policy: { preset: 'offline' } });
    await apply('p2', { runtime: { backend: 'vm' }, workspace: { mode: 'readonly' }, policy: { preset: 'offline' } });
    for (const n of ['p1', 'p2']) {
      const w = await fx.kubectl(['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=600s'], {
        timeoutMs: 620_000,
      });
      expect(w.code, `${n}: ${w.stderr}\n${fx.logs().slice(-2000)}`).to.equal(0);
    }
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'p2', '-o', 'json']));
    expect(s.status.capabilities).to.include({ backend: 'vm', pty: true, confinement: true, execAllowlist: false });
    expect(s.status.compiledPolicy.filesystem.workspaceReadOnly).to.equal(true);
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'p2', '-o', 'json']));
    expect(sbx.status.capabilities.landlockAbi, "the guest kernel's Landlock ABI").to.be.at.least(1);
    expect(await sh('p1', 'nproc')).to.equal('2\n');
    // The read-only workspace holds inside the guest, for the session's own exec.
    const ro = await post('p2', 'exec', { command: ['sh', '-c', 'echo x > /work/f'] });
    expect(ro.exitCode).to.not.equal(0);
    expect(ro.stderr).to.match(/Read-only file system|Permission denied/);
    // A terminal on the vm session: 80x24, then the client's resize, raw bytes both ways.
    const q = ['sh', '-c', 'stty size; read x; stty size'].map((c) => `command=${encodeURIComponent(c)}`).join('&');
    const ws = new WebSocket(
      fx.wsUrl(agsPath('p1', 'exec') + `?${q}&stdin=true&stdout=true&tty=true`),
      ['v5.channel.k8s.io'],
      { ...fx.wsOptions(), perMessageDeflate: false },
    );
    let out = '';
    let sent = false;
    const closed = new Promise<void>((res, rej) => {
      ws.on('close', () => res());
      ws.on('error', rej);
    });
    ws.on('message', (b: Buffer) => {
      if (b[0] === 1) out += b.subarray(1).toString('utf8');
      if (out.includes('24 80') && !sent) {
        sent = true;
        ws.send(Buffer.concat([Buffer.from([4]), Buffer.from(JSON.stringify({ Width: 132, Height: 43 }))]));
        ws.send(Buffer.concat([Buffer.from([0]), Buffer.from('go\r')]));
      }
    });
    await closed;
    expect(out).to.match(/24 80\r\ngo\r\n43 132\r\n/);
  });
});
