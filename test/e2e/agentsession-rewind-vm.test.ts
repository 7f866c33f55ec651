// End to end: rewind on the vm backend (QEMU): disk points before each exec, undo 1
// puts the file back; bisect is refused (501, not supported on vm yet). Skipped without QEMU.
import { expect } from 'chai';
import { mkdtempSync } from 'node:fs';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;

describe('e2e: AgentSession rewind on the vm backend', function () {
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
    fx = await startFluxctl({ stateDir: mkdtempSync('/tmp/fvrw-') });
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    await fx.stop();
  });

  it('disk points before each exec; undo restores the file; bisect is 501 on vm', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'v1' },
        spec: {
          agent: 'a',
          runtime: { backend: 'vm' },
          policy: { preset: 'offline' },
          rewind: { enabled: true, memory: false },
        },
      }),
    );
    const w = await fx.kubectl(['wait', 'ags/v1', '--for=condition=Ready', '--timeout=600s'], { timeoutMs: 620_000 });
    expect(w.code, w.stderr).to.equal(0);
    await sh('v1', 'mkdir -p /work && echo ok > /work/status');
    await sh('v1', 'echo two > /work/a');
    await sh('v1', 'echo broken > /work/status');
    await sh('v1', 'echo four > /work/a');
    const list = (await fx.request('GET', agsPath('v1', 'rewind'))).json;
    expect(list.points.map((p: any) => [p.tag, p.kind])).to.deep.equal([
      ['p-1', 'disk'],
      ['p-2', 'disk'],
      ['p-3', 'disk'],
      ['p-4', 'disk'],
    ]);
    // Bisect on vm is refused (501): its fork copy did not show the session's latest writes when it was tried.
    const b = await fx.request('POST', agsPath('v1', 'rewind/bisect'), { body: { test: 'grep -q ok /work/status' } });
    expect(b.status, b.body.toString()).to.equal(501);
    expect(await sh('v1', 'cat /work/a /work/status')).to.equal('four\nbroken\n');
    const u = await post('v1', 'rewind/undo', { steps: 2 }); // the cat above was a step too (p-5)
    expect(u.restored).to.equal('p-4');
    expect(await sh('v1', 'cat /work/a')).to.equal('two\n');
  });
});
