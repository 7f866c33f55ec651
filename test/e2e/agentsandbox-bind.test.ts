// End to end (real `fluxctl serve`, procbox): a SandboxClaim bound at its create
// (controllers/agentsandbox/bind.ts through the registry's create co-write). The POST's answer is
// already bound and Ready; its Sandbox is owned by it, out of the pool and runs a command; a claim
// that asks for claim-time configuration is left to the controller and still bound; concurrent
// claims at create never share a sandbox (every binding a watch ever showed is checked).
import { expect } from 'chai';
import { claim, EXT, FLUX, pool, readyPool, recordBindings, template, type Obj } from './agentsandbox-helpers.js';
import { boundClaim } from './agentsandbox-helpers.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { kstatus } from '../kstatus.js';

const CLAIMS = `${EXT}/namespaces/default/sandboxclaims`;
const ready = (o: any) => o?.status?.conditions?.find((c: any) => c.type === 'Ready');

describe('e2e: agent-sandbox claims bound at create', function () {
  this.timeout(600_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    const t = await api(fx, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, { body: template('t') });
    expect(t.status, JSON.stringify(t.json)).to.equal(201);
  });

  after(async () => {
    if (!fx) return;
    for (const r of ['sandboxclaims', 'sandboxwarmpools'])
      await fx.request('DELETE', `${EXT}/namespaces/default/${r}`, { timeoutMs: 300_000 }).catch(() => undefined);
    await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=300s'], { timeoutMs: 310_000 });
    expect(await fx.stop()).to.equal(0, fx.logs());
  });

  it("the POST's answer is bound and Ready; its sandbox is owned by it, out of the pool, and runs a command", async () => {
    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('p', 't', 2) })).status,
    ).to.equal(201);
    await readyPool(fx, 'default', 'p', 2);
    const r = await api(fx, 'POST', CLAIMS, { body: claim('c1', 'p') });
    expect(r.status, JSON.stringify(r.json)).to.equal(201);
    const c = r.json;
    expect(c.status.sandbox?.name, JSON.stringify(c.status)).to.be.a('string');
    expect(ready(c)).to.include({ status: 'True', reason: 'SandboxReady', observedGeneration: 1 });
    expect(c.status.launchType).to.equal('warm');
    expect(c.status.observedGeneration).to.equal(1);
    expect(c.status.boundAt).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(c.status.conditions.map((x: any) => x.type)).to.deep.equal(['Ready']);
    expect(kstatus(c)).to.deep.equal({ status: 'Current' });
    const name = c.status.sandbox.name as string;
    const s = (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).json;
    expect(s.status.phase).to.equal('Running');
    expect(c.status.sandbox.podIPs).to.deep.equal(s.status.address ? [s.status.address] : []);
    expect(s.metadata.ownerReferences).to.have.length(1);
    expect(s.metadata.ownerReferences[0]).to.include({ kind: 'SandboxClaim', uid: c.metadata.uid, controller: true });
    expect(s.metadata.labels['agents.x-k8s.io/claim-uid']).to.equal(c.metadata.uid);
    expect(s.metadata.labels['agents.x-k8s.io/launch-type']).to.equal('warm');
    expect(s.metadata.labels).to.not.have.property('agents.x-k8s.io/warm-pool-sandbox');
    expect(s.metadata.generation, 'a metadata-only change').to.equal(1);
    expect(JSON.stringify(s.metadata.managedFields)).to.include('ownerReferences');
    // Its agents.x-k8s.io view moved in the same batch (written before the claim), not by a later pass.
    const v = (await api(fx, 'GET', `/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/${name}`)).json;
    expect(v.metadata.labels['agents.x-k8s.io/claim-uid']).to.equal(c.metadata.uid);
    expect(v.metadata.labels).to.not.have.property('agents.x-k8s.io/warm-pool-sandbox');
    expect(Number(v.metadata.resourceVersion)).to.be.lessThan(Number(c.metadata.resourceVersion));
    const out = await exec(fx, name, 'echo claimed');
    expect(out.stdout.trim()).to.equal('claimed');
    // The controller's pass on it finds nothing to change: the claim is unchanged a moment later.
    const again = await boundClaim(fx, 'default', 'c1');
    expect(again.status.sandbox.name).to.equal(name);
    // The pool refills (it lost a member).
    await readyPool(fx, 'default', 'p', 2);
    // Deleting the claim deletes its sandbox.
    expect((await api(fx, 'DELETE', `${CLAIMS}/c1`)).status).to.be.oneOf([200, 202]);
    await eventually(
      async () => (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).status === 404,
      120_000,
      `sandbox ${name} deleted with its claim`,
    );
  });

  it('a claim with claim-time configuration is left to the controller, which binds it', async () => {
    await readyPool(fx, 'default', 'p', 2);
    const r = await api(fx, 'POST', CLAIMS, {
      body: claim('c2', 'p', { additionalPodMetadata: { labels: { team: 'a' } } }),
    });
    expect(r.status, JSON.stringify(r.json)).to.equal(201);
    expect(r.json.status?.sandbox, 'not bound at create').to.equal(undefined);
    const c = await boundClaim(fx, 'default', 'c2');
    expect(c.status.launchType).to.equal('warm');
    const s = (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${c.status.sandbox.name}`)).json;
    expect(s.metadata.labels.team).to.equal('a');
    expect(s.metadata.ownerReferences[0]).to.include({ kind: 'SandboxClaim', uid: c.metadata.uid });
  });

  it('concurrent claims at create never share a sandbox: 30 at once on a pool of 20', async () => {
    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('race', 't', 20) })).status,
    ).to.equal(201);
    await readyPool(fx, 'default', 'race', 20);
    const rec = recordBindings(fx, 'default');
    try {
      const names = Array.from({ length: 30 }, (_, i) => `r${i}`);
      const posted = await Promise.all(names.map((n) => api(fx, 'POST', CLAIMS, { body: claim(n, 'race') })));
      expect(posted.map((p) => p.status)).to.deep.equal(names.map(() => 201));
      const atCreate = posted.filter((p) => p.json.status?.sandbox?.name).map((p) => p.json.status.sandbox.name);
      // Every member was Running and Ready: each of the first 20 creates found one.
      expect(atCreate.length, 'bound in their POST').to.be.at.least(20);
      expect(new Set(atCreate).size, 'no sandbox given at create twice').to.equal(atCreate.length);
      const claims = await Promise.all(names.map((n) => boundClaim(fx, 'default', n)));
      const sandboxes = claims.map((c) => c.status.sandbox.name as string);
      expect(new Set(sandboxes).size, 'never double-bound').to.equal(30);
      for (const p of posted)
        if (p.json.status?.sandbox?.name)
          expect(claims.find((c) => c.metadata.name === p.json.metadata.name)!.status.sandbox.name).to.equal(
            p.json.status.sandbox.name,
          );
      const all = (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes?labelSelector=agents.x-k8s.io/claim-uid`))
        .json.items as Obj[];
      const byName = new Map(all.map((s) => [s.metadata.name, s]));
      for (const c of claims) {
        const s = byName.get(c.status.sandbox.name)!;
        expect(s.metadata.ownerReferences!.filter((x) => (x as any).controller)).to.have.length(1);
        expect(s.metadata.ownerReferences![0].uid).to.equal(c.metadata.uid);
      }
      // Everything a watch ever showed: no claim named two sandboxes, no sandbox had two claims.
      for (const [c, ss] of rec.claimSandboxes) expect([...ss], `claim ${c}`).to.have.length(1);
      for (const [s, cs] of rec.sandboxOwners) expect([...cs], `sandbox ${s}`).to.have.length(1);
    } finally {
      rec.stop();
    }
    await readyPool(fx, 'default', 'race', 20);
  });
});
