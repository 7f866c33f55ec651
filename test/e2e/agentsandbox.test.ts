// End to end: the agent-sandbox API (extensions.agents.x-k8s.io SandboxTemplate, SandboxWarmPool,
// SandboxClaim) through `fluxctl serve` on procbox: admission refuses what cannot be honoured, a
// pool keeps its warm sandboxes, a claim binds one (warm) and runs a command in it, deleting the
// claim deletes the sandbox, the pool refills, a claim never reaches another namespace's pool, and
// 100 concurrent claims on a pool of 10 never share a sandbox.
import { expect } from 'chai';
import {
  boundClaim,
  claim,
  EXT,
  FLUX,
  pool,
  readyPool,
  recordBindings,
  template,
  type Obj,
} from './agentsandbox-helpers.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

describe('e2e: agent-sandbox templates, warm pools and claims', function () {
  this.timeout(600_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
  });

  after(async () => {
    if (!fx) return;
    // Deleting 100 claims cascades to 100 sandbox teardowns: a long answer on a loaded host.
    for (const ns of ['default', 'other'])
      for (const r of ['sandboxclaims', 'sandboxwarmpools'])
        await fx.request('DELETE', `${EXT}/namespaces/${ns}/${r}`, { timeoutMs: 300_000 }).catch(() => undefined);
    await fx.kubectl(['delete', 'sbx', '--all', '-A', '--wait=true', '--timeout=300s'], { timeoutMs: 310_000 });
    expect(await fx.stop()).to.equal(0, fx.logs());
  });

  it('refuses template fields FluxVM cannot honour with 422 naming the field (never prunes or ignores them)', async () => {
    const cases: Array<[Record<string, unknown>, Record<string, unknown>, string, RegExp]> = [
      [
        {},
        { ports: [{ containerPort: 8888 }] },
        'spec.podTemplate.spec.containers[0].ports',
        /cannot be honoured by FluxVM/,
      ],
      [{}, { image: 'python:3.12' }, 'spec.podTemplate.spec.containers[0].image', /procbox/],
      [{}, { command: ['python', 'server.py'] }, 'spec.podTemplate.spec.containers[0].command', /no entrypoint/],
      [{ volumeClaimTemplates: [{ metadata: { name: 'w' } }] }, {}, 'spec.volumeClaimTemplates', /cannot be honoured/],
      [
        {},
        { env: [{ name: 'A', valueFrom: { secretKeyRef: { name: 's', key: 'k' } } }] },
        'spec.podTemplate.spec.containers[0].env[0].valueFrom',
        /by value only/,
      ],
    ];
    for (const [spec, c, field, msg] of cases) {
      const r = await api(fx, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, { body: template('bad', spec, c) });
      expect(r.status, JSON.stringify(r.json)).to.equal(422);
      expect(r.json.reason).to.equal('Invalid');
      const cause = r.json.details.causes.find((x: any) => x.field === field);
      expect(cause, JSON.stringify(r.json.details.causes)).to.not.equal(undefined);
      expect(cause.message).to.match(msg);
    }
    const pod = await api(fx, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, {
      body: { ...template('bad'), spec: { podTemplate: { spec: { containers: [{ name: 'm' }], hostNetwork: true } } } },
    });
    expect(pod.status).to.equal(422);
    expect(pod.json.details.causes.map((x: any) => x.field)).to.include('spec.podTemplate.spec.hostNetwork');
    // Nothing was stored.
    expect((await api(fx, 'GET', `${EXT}/namespaces/default/sandboxtemplates/bad`)).status).to.equal(404);
  });

  it('a pool keeps its warm sandboxes; a claim binds one warm, runs a command in it; deleting the claim deletes it; the pool refills', async () => {
    const t = await api(fx, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, {
      body: template(
        'py',
        {},
        { env: [{ name: 'FROM_TEMPLATE', value: 't' }], resources: { limits: { memory: '512Mi' } } },
      ),
    });
    expect(t.status, JSON.stringify(t.json)).to.equal(201);
    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('py-pool', 'py', 3) })).status,
    ).to.equal(201);
    await readyPool(fx, 'default', 'py-pool', 3);
    const warm = (
      await api(
        fx,
        'GET',
        `${FLUX}/namespaces/default/sandboxes?labelSelector=agents.x-k8s.io/warm-pool-sandbox=py-pool`,
      )
    ).json.items as Obj[];
    expect(warm).to.have.length(3);
    expect(warm[0].spec.resources.memory).to.equal('512Mi');

    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/default/sandboxclaims`, { body: claim('c1', 'py-pool') })).status,
    ).to.equal(201);
    const c = await boundClaim(fx, 'default', 'c1');
    expect(c.status.launchType).to.equal('warm');
    const name = c.status.sandbox.name as string;
    expect(warm.map((w) => w.metadata.name)).to.include(name);
    const sbx = (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).json as Obj;
    expect(sbx.metadata.ownerReferences).to.deep.include({
      ...sbx.metadata.ownerReferences![0],
      kind: 'SandboxClaim',
      uid: c.metadata.uid,
    });
    // The agents.x-k8s.io view, as agent-sandbox's client reads it (Ready, podIPs), owned by ours.
    const viewPath = `/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/${name}`;
    let view: any;
    await eventually(
      async () => {
        view = (await api(fx, 'GET', viewPath)).json;
        return view?.status?.conditions?.some((x: any) => x.type === 'Ready' && x.status === 'True');
      },
      60_000,
      'the agents.x-k8s.io Sandbox view Ready',
    );
    expect(view.metadata.ownerReferences[0]).to.include({ kind: 'Sandbox', uid: sbx.metadata.uid });
    expect(view.metadata.labels['agents.x-k8s.io/claim-uid']).to.equal(c.metadata.uid);
    expect(view.spec.podTemplate.spec.containers[0].name).to.equal('main');
    const out = await exec(fx, name, ['sh', '-c', 'echo hi $FROM_TEMPLATE']);
    expect(out.stdout).to.equal('hi t\n');

    await readyPool(fx, 'default', 'py-pool', 3); // refilled
    const after = (
      await api(
        fx,
        'GET',
        `${FLUX}/namespaces/default/sandboxes?labelSelector=agents.x-k8s.io/warm-pool-sandbox=py-pool`,
      )
    ).json.items as Obj[];
    expect(after.map((w) => w.metadata.name)).to.not.include(name);

    expect((await api(fx, 'DELETE', `${EXT}/namespaces/default/sandboxclaims/c1`)).status).to.equal(200);
    await eventually(
      async () =>
        (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).status === 404 &&
        (await api(fx, 'GET', viewPath)).status === 404,
      60_000,
      'the claimed sandbox deleted with its claim',
    );
  });

  it('a claim cannot reach a pool of another namespace: WarmPoolNotFound, nothing bound there', async () => {
    await api(fx, 'POST', '/api/v1/namespaces', {
      body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'other' } },
    });
    // A `namespace` in the reference naming another namespace is refused (under any field validation).
    for (const fv of ['Strict', 'Ignore']) {
      const foreign = await api(fx, 'POST', `${EXT}/namespaces/other/sandboxclaims?fieldValidation=${fv}`, {
        body: claim('x', 'py-pool', { warmPoolRef: { name: 'py-pool', namespace: 'default' } }),
      });
      expect(foreign.status).to.equal(422);
      expect(foreign.json.details.causes).to.deep.equal([
        {
          reason: 'FieldValueForbidden',
          field: 'spec.warmPoolRef.namespace',
          message:
            'Forbidden: may not refer to another namespace ("default"): it is visible only to its own namespace "other"',
        },
      ]);
    }
    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/other/sandboxclaims`, { body: claim('x', 'py-pool') })).status,
    ).to.equal(201);
    await eventually(
      async () => {
        const r = (await api(fx, 'GET', `${EXT}/namespaces/other/sandboxclaims/x`)).json;
        return r.status?.conditions?.some((c: any) => c.type === 'Ready' && c.reason === 'WarmPoolNotFound');
      },
      60_000,
      'WarmPoolNotFound',
    );
    const bound = (await api(fx, 'GET', `${FLUX}/sandboxes?labelSelector=agents.x-k8s.io/claim-uid`)).json
      .items as Obj[];
    expect(bound.filter((s) => (s as any).metadata.namespace === 'other')).to.have.length(0);
    expect((await api(fx, 'GET', `${EXT}/namespaces/other/sandboxclaims/x`)).json.status.sandbox).to.equal(undefined);
  });

  it('100 claims at once on a pool of 10: every claim gets its own sandbox (warm from the pool first, then cold), none shared; the pool refills', async () => {
    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('storm', 'py', 10) })).status,
    ).to.equal(201);
    await readyPool(fx, 'default', 'storm', 10);
    const warmBefore = new Set(
      (
        (
          await api(
            fx,
            'GET',
            `${FLUX}/namespaces/default/sandboxes?labelSelector=agents.x-k8s.io/warm-pool-sandbox=storm`,
          )
        ).json.items as Obj[]
      ).map((s) => s.metadata.name),
    );
    const names = Array.from({ length: 100 }, (_, i) => `s${i}`);
    const rec = recordBindings(fx, 'default');
    const created = await Promise.all(
      names.map((n) => api(fx, 'POST', `${EXT}/namespaces/default/sandboxclaims`, { body: claim(n, 'storm') })),
    );
    expect(created.map((r) => r.status)).to.deep.equal(names.map(() => 201));
    const claims = await Promise.all(names.map((n) => boundClaim(fx, 'default', n)));
    const sandboxes = claims.map((c) => c.status.sandbox.name as string);
    expect(new Set(sandboxes).size).to.equal(100); // never double-bound
    const warm = claims.filter((c) => c.status.launchType === 'warm');
    // Every warm sandbox of the pool went to a claim; refills made during the storm may serve more.
    for (const w of warmBefore) expect(sandboxes).to.include(w);
    expect(warm.length).to.be.at.least(10);
    // Each sandbox is owned by exactly its claim.
    const all = (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes?labelSelector=agents.x-k8s.io/claim-uid`))
      .json.items as Obj[];
    const byName = new Map(all.map((s) => [s.metadata.name, s]));
    for (const c of claims) {
      const s = byName.get(c.status.sandbox.name)!;
      expect(s.metadata.ownerReferences!.filter((r) => (r as any).controller)).to.have.length(1);
      expect(s.metadata.ownerReferences![0].uid).to.equal(c.metadata.uid);
    }
    // Over the whole storm: no claim ever showed two sandboxes, no sandbox ever had two claims.
    rec.stop();
    for (const n of names) expect([...(rec.claimSandboxes.get(n) ?? [])], n).to.have.length(1);
    for (const [s, owners] of rec.sandboxOwners) expect([...owners], s).to.have.length(1);
    expect(rec.sandboxOwners.size).to.equal(100);
    await readyPool(fx, 'default', 'storm', 10);
  });
});
