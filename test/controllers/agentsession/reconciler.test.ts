// The AgentSession reconciler against the real API registry, SQLite, the garbage collector,
// the Sandbox controller and procbox: the owned Sandbox, phases and conditions, capabilities
// from the runtime, the compiled policy, strict/bestEffort refusals (nothing half-created),
// expiry (sandbox deleted, record and ledger kept) and deletion through the collector.
import { expect } from 'chai';
import { agentSessionsGVR } from '../../../controllers/agentsession/index.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { skipWith } from '../../skip.js';
import { makeEnv, skipReason, type Env } from './env.js';

const cond = (o: any, type: string) => (o.status?.conditions ?? []).find((c: any) => c.type === type);

describe('controllers/agentsession reconciler', function () {
  this.timeout(60_000);
  let env: Env;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
  });
  after(async () => env?.close());

  it('creates and owns one Sandbox named after the session; Running with Ready, capabilities and the compiled policy', async () => {
    const s = await env.session('alpha');
    const run = await env.until('alpha', (o) => o.status?.phase === 'Running');
    const sbx = (await env.sandbox('alpha'))!;
    expect(sbx.metadata.ownerReferences).to.deep.equal([
      { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'AgentSession', name: 'alpha', uid: s.metadata.uid, controller: true, blockOwnerDeletion: true },
    ]);
    expect(sbx.status?.phase).to.equal('Running');
    expect(sbx.spec.network).to.deep.equal({ mode: 'open' });
    expect(run.status!.sandbox).to.deep.equal({ name: 'alpha' });
    expect(run.status!.observedGeneration).to.equal(run.metadata.generation);
    expect(cond(run, 'Ready')).to.include({ status: 'True', reason: 'Running' });
    expect(cond(run, 'Reconciling')).to.include({ status: 'False' });
    expect(cond(run, 'Stalled')).to.include({ status: 'False' });
    const caps = env.rt.capabilities();
    expect(run.status!.capabilities).to.include({ backend: 'procbox', checkpoint: caps.diskCheckpoint, memoryCheckpoint: caps.memoryCheckpoint, fork: caps.fork, confinement: false, httpPolicy: false });
    expect(run.status!.compiledPolicy).to.deep.include({ offline: false, networkMode: 'open', allowHosts: [] });
    expect(Date.parse(run.status!.expiresAt) - Date.parse(run.metadata.creationTimestamp!)).to.equal(3600_000);
    const ledger = await env.ledger.read(s.metadata.uid!);
    expect(ledger.map((e) => e.kind)).to.deep.equal(['session.create']);
    expect(ledger[0]).to.include({ entry: 1, agent: 'test-agent', backend: 'procbox', sandbox: 'alpha' });
  });

  it('deleting the session deletes its Sandbox (garbage collector) and its state', async () => {
    const s = await env.session('beta');
    await env.until('beta', (o) => o.status?.phase === 'Running');
    const sbxUid = (await env.sandbox('beta'))!.metadata.uid!;
    await env.client.delete(agentSessionsGVR, 'default', 'beta');
    await env.untilGone(agentSessionsGVR, 'beta');
    await env.untilGone(sandboxesGVR, 'beta');
    expect((await env.rt.list()).map((i) => i.id)).to.not.include(sbxUid);
    expect(env.state.exists(s.metadata.uid!)).to.equal(false);
  });

  it('strict: an allow-list procbox cannot enforce fails the session with the reason and creates no Sandbox', async () => {
    await env.session('strict', { policy: { preset: 'developerSafe' } });
    const f = await env.until('strict', (o) => o.status?.phase === 'Failed');
    expect(cond(f, 'Stalled')).to.include({ status: 'True', reason: 'PolicyNotEnforceable' });
    expect(cond(f, 'Ready')).to.include({ status: 'False', reason: 'PolicyNotEnforceable' });
    expect(f.status!.message).to.match(/allow-list \(11 hosts\) cannot be enforced by the procbox backend/);
    expect(await env.sandbox('strict')).to.equal(undefined);
  });

  it('bestEffort: the same policy runs without network (fails closed) and says so', async () => {
    const s = await env.session('besteffort', { policy: { preset: 'developerSafe', network: { enforcement: 'bestEffort' } } });
    const r = await env.until('besteffort', (o) => o.status?.phase === 'Running');
    expect(r.status!.compiledPolicy).to.deep.include({ offline: true, networkMode: 'none' });
    expect((await env.sandbox('besteffort'))!.spec.network).to.deep.equal({ mode: 'none' });
    const kinds = (await env.ledger.read(s.metadata.uid!)).map((e) => e.kind);
    expect(kinds).to.deep.equal(['session.create', 'policy.unenforced']);
  });

  it('filesystem paths and a readonly workspace: 400-equivalent Failed under strict, Running under bestEffort', async () => {
    await env.session('fs-strict', { policy: { filesystem: { write: ['/data'] } } });
    const f = await env.until('fs-strict', (o) => o.status?.phase === 'Failed');
    expect(f.status!.message).to.match(/policy\.filesystem: extra read\/write paths cannot be handed/);
    await env.session('ro-strict', { workspace: { mode: 'readonly' } });
    expect((await env.until('ro-strict', (o) => o.status?.phase === 'Failed')).status!.message).to.match(/workspace\.mode readonly/);
    await env.session('fs-best', { policy: { filesystem: { write: ['/data'], enforcement: 'bestEffort' } } });
    const r = await env.until('fs-best', (o) => o.status?.phase === 'Running');
    expect(r.status!.compiledPolicy!.filesystem).to.deep.equal({ read: [], write: [] });
  });

  it('a Sandbox of the same name that the session does not own is left alone: Failed SandboxNameTaken', async () => {
    await env.client.create(sandboxesGVR, 'default', { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Sandbox', metadata: { name: 'taken', namespace: 'default' }, spec: {} });
    await env.session('taken');
    const f = await env.until('taken', (o) => o.status?.phase === 'Failed');
    expect(cond(f, 'Stalled')).to.include({ reason: 'SandboxNameTaken' });
    const sbx = (await env.sandbox('taken'))!;
    expect(sbx.metadata.deletionTimestamp).to.equal(undefined);
    expect(sbx.metadata.ownerReferences ?? []).to.deep.equal([]);
  });

  it('expires at ttlSeconds: phase Expired, the Sandbox deleted, the record and ledger kept', async () => {
    const s = await env.session('short', { ttlSeconds: 2 });
    await env.until('short', (o) => o.status?.phase === 'Running');
    const e = await env.until('short', (o) => o.status?.phase === 'Expired', 15_000);
    expect(cond(e, 'Ready')).to.include({ status: 'False', reason: 'Expired' });
    await env.untilGone(sandboxesGVR, 'short');
    const kinds = (await env.ledger.read(s.metadata.uid!)).map((x) => x.kind);
    expect(kinds).to.deep.equal(['session.create', 'session.expire']);
    expect((await env.get('short')).status!.phase).to.equal('Expired');
  });

  it('ttl bounds at the schema edge: 1 and 2592000 accepted, 0 and 2592001 refused (422 naming spec.ttlSeconds)', async () => {
    for (const [ttl, ok] of [[1, true], [2592000, true], [0, false], [2592001, false]] as const) {
      const p = env.client.create(agentSessionsGVR, 'default', { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'AgentSession', metadata: { name: `ttl-${ttl}`, namespace: 'default' }, spec: { agent: 'a', ttlSeconds: ttl }, }, { dryRun: true } as any);
      if (ok) await p;
      else {
        const err: any = await p.then(() => undefined, (x) => x);
        expect(err?.code, String(ttl)).to.equal(422);
        expect(err.message).to.match(/spec\.ttlSeconds/);
      }
    }
  });
});
