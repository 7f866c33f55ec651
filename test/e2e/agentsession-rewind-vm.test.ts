// End to end: rewind on the vm backend (QEMU, TCG here: kept small): disk points before each
// exec, bisect over 6 steps in a forked copy (step 4 breaks the test) leaving the session as it
// was, undo puts the files back. Skipped without QEMU.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
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
    rmSync(fx.stateDir, { recursive: true, force: true }); // given to the harness: not removed by stop()
  });

  it('disk points before each exec; bisect over 6 steps finds step 4 in a copy; undo restores the files', async () => {
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
    const steps = [
      'mkdir -p /work && echo ok > /work/status',
      'echo two > /work/a',
      'echo three > /work/b',
      'echo broken > /work/status',
      'echo five > /work/a',
      'echo six > /work/c',
    ];
    for (const c of steps) await sh('v1', c);
    const list = (await fx.request('GET', agsPath('v1', 'rewind'))).json;
    expect(list.points.map((p: any) => [p.tag, p.kind])).to.deep.equal(steps.map((_, i) => [`p-${i + 1}`, 'disk']));
    const ledgerLen = async () => (await fx.request('GET', agsPath('v1', 'ledger'))).json.entries.length as number;
    const led0 = await ledgerLen();
    // p-1 was taken before the status file existed: the good end is p-2 (before step 2). The
    // test matches the whole line: `grep -q ok` also matches "broken" (the 501 this test once
    // expected came from that, not from the vm fork).
    const b = await post('v1', 'rewind/bisect', { test: 'grep -qx ok /work/status', good: 'p-2', timeoutSeconds: 120 });
    expect(b.firstBadStep.command).to.equal('echo broken > /work/status');
    expect(b.firstBadStep.entry).to.include({ kind: 'exec', rewindPoint: 'p-4' });
    expect(b).to.include({ lastGood: 'p-4', firstBad: 'p-5' });
    // 5 states after the good end (p-3..p-6, now): the good end's restore + ceil(log2 5).
    expect(b.restores).to.be.at.most(4);
    // The session is untouched: its files, its points, one ledger line (the answer).
    expect(await ledgerLen()).to.equal(led0 + 1);
    expect((await fx.request('GET', agsPath('v1', 'rewind'))).json.points).to.deep.equal(list.points);
    expect(await sh('v1', 'cat /work/a /work/status /work/c')).to.equal('five\nbroken\nsix\n');
    const u = await post('v1', 'rewind/undo', { steps: 4 }); // the cat above was a step too (p-7)
    expect(u.restored).to.equal('p-4');
    expect(await sh('v1', 'cat /work/a /work/status')).to.equal('two\nok\n');
  });
});
