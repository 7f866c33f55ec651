// End to end: ResourceQuota through `fluxctl serve` with real kubectl and real (procbox)
// sandboxes: `kubectl create quota`, the 11th sandbox refused with kube's message as kubectl
// prints it, `kubectl describe quota` (status.hard/used) current after a delete, a warm pool
// larger than its namespace's quota says so in its status, and a pool naming another namespace's
// template is refused.
import { expect } from 'chai';
import { EXT, template } from './agentsandbox-helpers.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventsUntil } from './event-waits.js';

const COUNT = 'count/sandboxes.fluxvm.dev';

describe('e2e: ResourceQuota (kubectl, real sandboxes)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    for (const ns of ['q1', 'q2']) await kubectlOk(fx, ['create', 'namespace', ns]);
  });

  after(async () => {
    if (!fx) return;
    for (const ns of ['q1', 'q2'])
      await fx
        .request('DELETE', `${EXT}/namespaces/${ns}/sandboxwarmpools`, { timeoutMs: 120_000 })
        .catch(() => undefined);
    await fx.kubectl(['delete', 'sbx', '--all', '-A', '--wait=true', '--timeout=300s'], { timeoutMs: 310_000 });
    expect(await fx.stop()).to.equal(0, fx.logs());
  });

  const describeQuota = async (ns: string) => kubectlOk(fx, ['describe', 'quota', 'q', '-n', ns]);
  const usedLine = (out: string) =>
    out
      .split('\n')
      .find((l) => l.startsWith(COUNT))
      ?.trim()
      .split(/\s+/);

  it("refuses the 11th sandbox with kube's message (kubectl), describe quota shows used/hard, a delete frees it", async () => {
    await kubectlOk(fx, ['create', 'quota', 'q', `--hard=${COUNT}=10`, '-n', 'q1']);
    const list = {
      apiVersion: 'v1',
      kind: 'List',
      items: Array.from({ length: 10 }, (_, i) => JSON.parse(sandboxYaml(`s${i + 1}`, { runtime: 'procbox' }))),
    };
    await kubectlOk(fx, ['create', '-n', 'q1', '-f', '-'], JSON.stringify(list));
    const r = await fx.kubectl(['create', '-n', 'q1', '-f', '-'], {
      input: sandboxYaml('s11', { runtime: 'procbox' }),
    });
    expect(r.code).to.equal(1);
    expect(r.stderr.trim()).to.equal(
      'Error from server (Forbidden): error when creating "STDIN": sandboxes.fluxvm.dev "s11" is forbidden: ' +
        `exceeded quota: q, requested: ${COUNT}=1, used: ${COUNT}=10, limited: ${COUNT}=10`,
    );
    expect((await fx.kubectl(['get', 'sbx', 's11', '-n', 'q1'])).code).to.equal(1);

    // kubectl get resourcequota / quota (short name) list it.
    expect(await kubectlOk(fx, ['get', 'resourcequota', '-n', 'q1', '-o', 'name'])).to.equal('resourcequota/q\n');
    expect(await kubectlOk(fx, ['get', 'quota', '-n', 'q1', '-o', 'name'])).to.equal('resourcequota/q\n');
    let out = '';
    await eventually(
      async () => {
        out = await describeQuota('q1');
        return usedLine(out)?.join(' ') === `${COUNT} 10 10`;
      },
      30_000,
      'kubectl describe quota: used 10 of 10',
    );
    expect(out).to.match(/^Name:\s+q$/m);
    expect(out).to.match(/^Namespace:\s+q1$/m);
    expect(out).to.match(/^Resource\s+Used\s+Hard$/m);

    await kubectlOk(fx, ['delete', 'sbx', 's1', '-n', 'q1', '--wait=true', '--timeout=120s']);
    await eventually(
      async () => usedLine(await describeQuota('q1'))?.join(' ') === `${COUNT} 9 10`,
      30_000,
      'kubectl describe quota: used 9 of 10 after the delete',
    );
    await kubectlOk(fx, ['create', '-n', 'q1', '-f', '-'], sandboxYaml('s11', { runtime: 'procbox' }));
  });

  it('a warm pool larger than the namespace quota fills to the quota and says QuotaExceeded in its status', async () => {
    await kubectlOk(fx, ['create', 'quota', 'q', `--hard=${COUNT}=2`, '-n', 'q2']);
    expect((await api(fx, 'POST', `${EXT}/namespaces/q2/sandboxtemplates`, { body: template('t') })).status).to.equal(
      201,
    );
    const pool = {
      apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
      kind: 'SandboxWarmPool',
      metadata: { name: 'big' },
      spec: { replicas: 3, sandboxTemplateRef: { name: 't' } },
    };
    expect((await api(fx, 'POST', `${EXT}/namespaces/q2/sandboxwarmpools`, { body: pool })).status).to.equal(201);
    let cond: any;
    await eventually(
      async () => {
        const p = (await api(fx, 'GET', `${EXT}/namespaces/q2/sandboxwarmpools/big`)).json;
        cond = p?.status?.conditions?.find((c: any) => c.type === 'Ready');
        return cond?.reason === 'QuotaExceeded' && p.status.replicas === 2;
      },
      120_000,
      'pool status QuotaExceeded with 2 sandboxes',
    );
    expect(cond.status).to.equal('False');
    expect(cond.message).to.match(
      new RegExp(`is forbidden: exceeded quota: q, requested: ${COUNT}=1, used: ${COUNT}=2, limited: ${COUNT}=2$`),
    );
    const sbx = await kubectlOk(fx, ['get', 'sbx', '-n', 'q2', '-o', 'name']);
    expect(sbx.trim().split('\n')).to.have.length(2);
    await eventsUntil(fx, 'reason=QuotaExceeded', (items) => items.length > 0, 'a QuotaExceeded Event', {
      namespace: 'q2',
    });
  });

  it("refuses a pool naming another namespace's template (kubectl, 422 naming the field)", async () => {
    const pool = {
      apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
      kind: 'SandboxWarmPool',
      metadata: { name: 'foreign' },
      spec: { replicas: 1, sandboxTemplateRef: { name: 't', namespace: 'q2' } },
    };
    const r = await fx.kubectl(['create', '-n', 'q1', '-f', '-'], { input: JSON.stringify(pool) });
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain(
      'spec.sandboxTemplateRef.namespace: Forbidden: may not refer to another namespace ("q2")',
    );
  });
});
