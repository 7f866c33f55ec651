// End to end against a real `fluxctl serve` (procbox): Idempotency-Key. A
// generateName create retried with the same key makes one object (sandboxes and agentsessions
// collections), also after a restart of the server; the same key with another body is 422
// naming the header and creates nothing; a create without the header is what Kubernetes does
// (two generateName creates, two objects). An exec retried with its key runs the command once
// (its side effect, a line appended to a file, is counted), on an AgentSession and on a plain
// Sandbox; a session checkpoint retried with its key is taken once.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';

const base = '/apis/fluxvm.dev/v1alpha1/namespaces/default';
const agsPath = (name: string, sub?: string) => `${base}/agentsessions/${name}${sub ? `/${sub}` : ''}`;
const sbxBody = (label: string, spec: Record<string, unknown> = {}) => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'Sandbox',
  metadata: { generateName: 'idem-', labels: { test: label } },
  spec,
});
const agsBody = (label: string) => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'AgentSession',
  metadata: { generateName: 'idem-', labels: { test: label } },
  spec: { agent: 'claude-code', policy: { preset: 'offline' } },
});

describe('e2e: Idempotency-Key on create and exec', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  const post = (path: string, body: unknown, key?: string) =>
    fx.request('POST', path, { body, timeoutMs: 60_000, ...(key ? { headers: { 'idempotency-key': key } } : {}) });
  const names = async (plural: string, label: string) =>
    (await fx.request('GET', `${base}/${plural}?labelSelector=test%3D${label}`)).json.items
      .map((o: any) => o.metadata.name)
      .sort();

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  });

  it('a generateName create retried with the same key makes one object and answers with it; without a key two are made', async () => {
    for (const [plural, body] of [
      ['sandboxes', sbxBody('a')],
      ['agentsessions', agsBody('a')],
    ] as const) {
      const first = await post(`${base}/${plural}`, body, `create-${plural}-1`);
      expect(first.status, JSON.stringify(first.json)).to.equal(201);
      const again = await post(`${base}/${plural}`, body, `create-${plural}-1`);
      expect(again.status).to.equal(201);
      expect(again.headers['idempotent-replayed']).to.equal('true');
      expect(again.json.metadata).to.include({
        name: first.json.metadata.name,
        uid: first.json.metadata.uid,
        resourceVersion: first.json.metadata.resourceVersion,
      });
      expect(await names(plural, 'a')).to.deep.equal([first.json.metadata.name]);
      // The same key with another body: 422 naming the header, nothing created.
      const other = await post(
        `${base}/${plural}`,
        { ...body, metadata: { ...body.metadata, labels: { test: 'a', other: 'yes' } } },
        `create-${plural}-1`,
      );
      expect(other.status, JSON.stringify(other.json)).to.equal(422);
      expect(other.json.details.causes.map((c: any) => c.field)).to.deep.equal(['Idempotency-Key']);
      expect(await names(plural, 'a')).to.deep.equal([first.json.metadata.name]);
    }
    // Without the header: Kubernetes semantics, two generateName creates are two objects.
    const x = await post(`${base}/sandboxes`, sbxBody('b'));
    const y = await post(`${base}/sandboxes`, sbxBody('b'));
    expect([x.status, y.status]).to.deep.equal([201, 201]);
    expect(x.headers['idempotent-replayed']).to.equal(undefined);
    expect(await names('sandboxes', 'b')).to.have.length(2);
    // A malformed key is 400 and creates nothing.
    const bad = await post(`${base}/sandboxes`, sbxBody('c'), 'has space');
    expect(bad.status).to.equal(400);
    expect(await names('sandboxes', 'c')).to.have.length(0);
  });

  it('an exec retried with its key runs the command once (AgentSession and plain Sandbox); the same key with another command is 422', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'ex' },
        spec: { agent: 'claude-code', policy: { preset: 'offline' } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/ex', '--for=condition=Ready', '--timeout=55s']);
    await makeSandbox(fx, 'plain');
    const count = { command: ['sh', '-c', 'echo run >> /work/count; wc -l < /work/count'] };
    for (const path of [agsPath('ex', 'exec'), subPath('default', 'plain', 'exec')]) {
      const a = await post(path, count, 'exec-1');
      expect(a.status, JSON.stringify(a.json)).to.equal(200);
      expect(a.json.stdout).to.equal('1\n');
      const b = await post(path, count, 'exec-1');
      expect(b.status).to.equal(200);
      expect(b.json.stdout, `retry of ${path}`).to.equal('1\n');
      const c = await post(path, { command: ['sh', '-c', 'echo other >> /work/count'] }, 'exec-1');
      expect(c.status, JSON.stringify(c.json)).to.equal(422);
      expect(c.json.details.causes.map((x: any) => x.field)).to.deep.equal(['Idempotency-Key']);
      const seen = await post(path, { command: ['cat', '/work/count'] });
      expect(seen.json.stdout, path).to.equal('run\n');
      const d = await post(path, count, 'exec-2');
      expect(d.json.stdout).to.equal('2\n');
    }
    // A session checkpoint retried with its key: one checkpoint, the first answer (without a key the same tag is 409).
    const ck1 = await post(agsPath('ex', 'checkpoint'), { tag: 'c1' }, 'ck-1');
    expect(ck1.status, JSON.stringify(ck1.json)).to.equal(200);
    const ck2 = await post(agsPath('ex', 'checkpoint'), { tag: 'c1' }, 'ck-1');
    expect(ck2.status).to.equal(200);
    expect(ck2.json).to.deep.equal(ck1.json);
    expect((await post(agsPath('ex', 'checkpoint'), { tag: 'c1' })).status).to.equal(409);
    const cks = (await fx.request('GET', agsPath('ex'))).json.status.checkpoints;
    expect(cks.map((c: any) => c.tag)).to.deep.equal(['c1']);
  });

  it('the records survive a restart: the retry after it answers with the first object and creates nothing', async () => {
    const first = await post(`${base}/sandboxes`, sbxBody('r'), 'create-restart');
    expect(first.status).to.equal(201);
    const stateDir = fx.stateDir;
    await fx.stop({ keepState: true });
    fx = await startFluxctl({ stateDir, readyTimeoutMs: 90_000 });
    const again = await post(`${base}/sandboxes`, sbxBody('r'), 'create-restart');
    expect(again.status, JSON.stringify(again.json)).to.equal(201);
    expect(again.headers['idempotent-replayed']).to.equal('true');
    expect(again.json.metadata.uid).to.equal(first.json.metadata.uid);
    expect(await names('sandboxes', 'r')).to.deep.equal([first.json.metadata.name]);
  });
});
