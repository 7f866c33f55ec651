// End to end: files/watch of an AgentSession on the vm backend through a real
// `fluxctl serve`: the watcher runs in the guest (native/vm/watch.ts); create, modify, delete and
// rename arrive in order over Server-Sent Events, a hostile name arrives intact. Was 501 on vm.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { eventually } from '../support/wait.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { openSse, type SseStream } from './sse-client.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const CHANGES = new Set(['created', 'modified', 'deleted', 'renamed']);

describe('e2e: files/watch of a vm AgentSession', function () {
  this.timeout(900_000);
  let fx: Fluxctl;
  let stateDir = '';
  const open: SseStream[] = [];
  const exec = async (script: string) => {
    const r = await fx.request('POST', agsPath('vw', 'exec'), {
      body: { command: ['sh', '-c', script] },
      timeoutMs: 300_000,
    });
    expect(r.status, r.body.toString()).to.equal(200);
    expect(r.json.exitCode, r.json.stderr).to.equal(0);
  };
  const changes = (s: SseStream) => s.messages.filter((m) => CHANGES.has(m.event));
  const seen = (s: SseStream, fn: () => boolean, what: string) =>
    eventually(fn, 60_000, what).catch((e: Error) => {
      throw new Error(`${e.message}; the stream delivered ${JSON.stringify(s.messages.map((m) => [m.event, m.data]))}`);
    });

  before(async function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'),
    );
    // A short state directory: the VM sockets live below it.
    stateDir = mkdtempSync('/tmp/fvaw-');
    fx = await startFluxctl({ stateDir });
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'vw' },
        spec: { agent: 'a', runtime: { backend: 'vm' }, policy: { preset: 'offline' } },
      }),
    );
    const w = await fx.kubectl(['wait', 'ags/vw', '--for=condition=Ready', '--timeout=600s'], { timeoutMs: 620_000 });
    expect(w.code, `${w.stderr}\n${fx.logs().slice(-2000)}`).to.equal(0);
  });
  after(async () => {
    for (const s of open) s.close();
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    await fx.stop();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('create, modify, delete and rename arrive in order; a hostile name arrives intact', async () => {
    await exec('mkdir -p /work/a');
    const s = openSse(fx, agsPath('vw', 'files/watch') + '?path=/work/a&recursive=true');
    open.push(s);
    const code = await s.status;
    expect(code, code === 200 ? '' : await s.errorBody).to.equal(200);
    await seen(s, () => s.messages.some((m) => m.event === 'ready'), 'ready');
    await exec(`cd /work/a && echo 1 > f && echo 2 >> f && mv f g && rm g && : > "$(printf 'x\\033[31m\\nid: 9')"`);
    await seen(s, () => changes(s).some((m) => m.event === 'created' && m.json.name !== 'f'), 'the last creation');
    const got = changes(s).map((m) => `${m.event} ${m.json.name}${m.json.oldName ? ' <- ' + m.json.oldName : ''}`);
    // Two writes may arrive as one coalesced `modified` or as two (timing): repeats are folded.
    const folded = got.filter((g, i) => g !== got[i - 1]);
    expect(folded, JSON.stringify(got)).to.deep.equal([
      'created f',
      'modified f',
      'renamed g <- f',
      'deleted g',
      'created x\u001b[31m\nid: 9',
    ]);
  });
});
