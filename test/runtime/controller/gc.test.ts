// The garbage collector against the real in-process API server and a temp SQLite file:
// background, foreground and orphan deletion, dangling references, several owners.
import { expect } from 'chai';
import { allKinds } from '../../../apis/registry.js';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { GarbageCollector, gcResources } from '../../../runtime/controller/gc.js';
import { Manager } from '../../../runtime/controller/manager.js';
import { isNotFound } from '../../../runtime/meta/errors.js';
import type { GVR, KubeObject, OwnerReference } from '../../../runtime/meta/types.js';
import { eventually, makeEnv, SBX, sandbox, type Env } from './env.js';
import type { AnyObject } from '../../support/objects.js';

const SECRETS: GVR = { group: '', version: 'v1', resource: 'secrets' };

const secret = (name: string, ownerReferences?: OwnerReference[], finalizers?: string[]): AnyObject => ({
  apiVersion: 'v1',
  kind: 'Secret',
  metadata: {
    name,
    namespace: 'default',
    ...(ownerReferences ? { ownerReferences } : {}),
    ...(finalizers ? { finalizers } : {}),
  },
  data: {},
});

const refTo = (o: KubeObject, extra: Partial<OwnerReference> = {}): OwnerReference => ({
  apiVersion: o.apiVersion,
  kind: o.kind,
  name: o.metadata.name!,
  uid: o.metadata.uid!,
  ...extra,
});

describe('runtime/controller GarbageCollector (real registry, temp SQLite, FakeClock)', () => {
  let env: Env;
  let ac: AbortController;
  let gc: GarbageCollector;
  let run: Promise<void> | undefined;

  const start = () => {
    const m = new Manager({ client: env.client, clock: new FakeClock() });
    gc = new GarbageCollector({
      manager: m,
      client: env.client,
      resources: gcResources(env.registry.kinds()),
      clock: new FakeClock(),
    });
    m.add(gc);
    run = m.start(ac.signal);
  };
  const exists = async (gvr: GVR, name: string) => {
    try {
      await env.client.get(gvr, 'default', name);
      return true;
    } catch (e) {
      if (isNotFound(e)) return false;
      throw e;
    }
  };
  const gone = (gvr: GVR, name: string) => eventually(async () => !(await exists(gvr, name)), 5000, `${name} deleted`);
  const passed = (resource: string, name: string) =>
    eventually(() => (gc.passes.get(`${resource}/default/${name}`) ?? 0) > 0, 5000, `a pass over ${name}`);

  beforeEach(() => {
    env = makeEnv();
    ac = new AbortController();
    run = undefined;
  });
  afterEach(async () => {
    ac.abort();
    await run;
    env.close();
  });

  it('serves every kind of the registry', () => {
    expect(gcResources(env.registry.kinds()).map((r) => r.gvr.resource)).to.include.members([
      'namespaces',
      'secrets',
      'events',
      ...allKinds.filter((k) => k.group === 'fluxvm.dev').map((k) => k.plural),
    ]);
  });

  it('background: the dependents of a deleted owner go, across kinds; one with another live owner only loses the reference', async () => {
    start();
    const owner = await env.client.create(SBX, 'default', sandbox('owner'));
    const other = await env.client.create(SECRETS, 'default', secret('other'));
    await env.client.create(SECRETS, 'default', secret('dep', [refTo(owner)]));
    await env.client.create(SECRETS, 'default', secret('shared', [refTo(owner), refTo(other)]));
    await passed('secrets', 'dep');
    expect(await exists(SECRETS, 'dep')).to.equal(true);
    await env.client.delete(SBX, 'default', 'owner', { propagationPolicy: 'Background' });
    await gone(SECRETS, 'dep');
    await eventually(
      async () => (await env.client.get(SECRETS, 'default', 'shared')).metadata.ownerReferences?.length === 1,
      5000,
      'ref removed',
    );
    const shared = await env.client.get(SECRETS, 'default', 'shared');
    expect(shared.metadata.ownerReferences).to.deep.equal([refTo(other)]);
  });

  it('a dangling reference (no such uid, or the same name with another uid) gets the dependent deleted, even when the owner went before the collector started', async () => {
    const owner = await env.client.create(SECRETS, 'default', secret('owner'));
    await env.client.create(SECRETS, 'default', secret('dep', [refTo(owner)]));
    await env.client.delete(SECRETS, 'default', 'owner');
    // Same name, new uid: not the owner the reference means.
    await env.client.create(SECRETS, 'default', secret('owner'));
    await env.client.create(
      SECRETS,
      'default',
      secret('nouid', [{ apiVersion: 'v1', kind: 'Secret', name: 'ghost', uid: 'no-such-uid' }]),
    );
    // A kind this server does not serve: never collected.
    await env.client.create(
      SECRETS,
      'default',
      secret('foreign', [{ apiVersion: 'apps/v1', kind: 'Deployment', name: 'web', uid: 'u-1' }]),
    );
    start();
    await gone(SECRETS, 'dep');
    await gone(SECRETS, 'nouid');
    await passed('secrets', 'foreign');
    expect(await exists(SECRETS, 'foreign')).to.equal(true);
    expect(await exists(SECRETS, 'owner')).to.equal(true);
  });

  it('foreground: the owner gets foregroundDeletion and goes only after its blocking dependents are gone', async () => {
    start();
    const owner = await env.client.create(SECRETS, 'default', secret('owner'));
    await env.client.create(
      SECRETS,
      'default',
      secret('held', [refTo(owner, { blockOwnerDeletion: true })], ['example.com/hold']),
    );
    await env.client.create(SECRETS, 'default', secret('free', [refTo(owner)]));
    const d = await env.client.delete(SECRETS, 'default', 'owner', { propagationPolicy: 'Foreground' });
    expect(d.metadata.finalizers).to.deep.equal(['foregroundDeletion']);
    expect(d.metadata.deletionTimestamp).to.be.a('string');
    await gone(SECRETS, 'free');
    // `held` is being deleted but its own finalizer keeps it: the owner waits.
    await eventually(
      async () => !!(await env.client.get(SECRETS, 'default', 'held')).metadata.deletionTimestamp,
      5000,
      'held deleting',
    );
    await passed('secrets', 'owner');
    const waiting = await env.client.get(SECRETS, 'default', 'owner');
    expect(waiting.metadata.finalizers).to.deep.equal(['foregroundDeletion']);
    await env.client.patch(SECRETS, 'default', 'held', 'merge', { metadata: { finalizers: null } });
    await gone(SECRETS, 'held');
    await gone(SECRETS, 'owner');
  });

  it('foreground down a chain: a dependent with its own dependents is deleted in the foreground too, leaves first', async () => {
    start();
    const top = await env.client.create(SECRETS, 'default', secret('top'));
    const mid = await env.client.create(SECRETS, 'default', secret('mid', [refTo(top, { blockOwnerDeletion: true })]));
    await env.client.create(
      SECRETS,
      'default',
      secret('leaf', [refTo(mid, { blockOwnerDeletion: true })], ['example.com/hold']),
    );
    await passed('secrets', 'leaf');
    await env.client.delete(SECRETS, 'default', 'top', { propagationPolicy: 'Foreground' });
    // mid is deleted with Foreground (it has a dependent), so it waits for leaf, and top for mid.
    await eventually(
      async () =>
        ((await env.client.get(SECRETS, 'default', 'mid')).metadata.finalizers ?? []).includes('foregroundDeletion'),
      5000,
      'mid foreground',
    );
    await eventually(
      async () => !!(await env.client.get(SECRETS, 'default', 'leaf')).metadata.deletionTimestamp,
      5000,
      'leaf deleting',
    );
    expect(await exists(SECRETS, 'top')).to.equal(true);
    await env.client.patch(SECRETS, 'default', 'leaf', 'merge', { metadata: { finalizers: null } });
    await gone(SECRETS, 'leaf');
    await gone(SECRETS, 'mid');
    await gone(SECRETS, 'top');
  });

  it("foreground through a cycle of blocking references: both go (the dependent's references stop blocking, as kube)", async () => {
    start();
    const a = await env.client.create(SECRETS, 'default', secret('cyc-a'));
    const b = await env.client.create(SECRETS, 'default', secret('cyc-b', [refTo(a, { blockOwnerDeletion: true })]));
    await env.client.patch(SECRETS, 'default', 'cyc-a', 'merge', {
      metadata: { ownerReferences: [refTo(b, { blockOwnerDeletion: true })] },
    });
    await passed('secrets', 'cyc-a');
    await env.client.delete(SECRETS, 'default', 'cyc-a', { propagationPolicy: 'Foreground' });
    await gone(SECRETS, 'cyc-b');
    await gone(SECRETS, 'cyc-a');
  });

  it('foreground with no dependents: the finalizer is removed and the owner goes', async () => {
    start();
    await env.client.create(SECRETS, 'default', secret('lonely'));
    await env.client.delete(SECRETS, 'default', 'lonely', { propagationPolicy: 'Foreground' });
    await gone(SECRETS, 'lonely');
  });

  it('orphan: the owner gets the orphan finalizer, goes, and its dependents stay without the reference', async () => {
    start();
    const owner = await env.client.create(SECRETS, 'default', secret('owner'));
    const keep = await env.client.create(SECRETS, 'default', secret('keeper'));
    await env.client.create(SECRETS, 'default', secret('dep', [refTo(owner)]));
    await env.client.create(
      SECRETS,
      'default',
      secret('dep2', [refTo(keep), refTo(owner, { blockOwnerDeletion: true })]),
    );
    const d = await env.client.delete(SECRETS, 'default', 'owner', { propagationPolicy: 'Orphan' });
    expect(d.metadata.finalizers).to.deep.equal(['orphan']);
    await gone(SECRETS, 'owner');
    expect((await env.client.get(SECRETS, 'default', 'dep')).metadata.ownerReferences).to.equal(undefined);
    expect((await env.client.get(SECRETS, 'default', 'dep2')).metadata.ownerReferences).to.deep.equal([refTo(keep)]);
    await passed('secrets', 'dep');
    expect(await exists(SECRETS, 'dep')).to.equal(true);
  });

  it("an owner's status and label writes and a dependent's data writes run no pass; a reference change and a deletion do", async () => {
    start();
    const owner = await env.client.create(SBX, 'default', sandbox('owner'));
    const deps = ['d0', 'd1', 'd2', 'd3', 'd4'];
    for (const d of deps) await env.client.create(SECRETS, 'default', secret(d, [refTo(owner)]));
    for (const d of deps) await passed('secrets', d);
    const before = Object.fromEntries(deps.map((d) => [d, gc.passes.get(`secrets/default/${d}`)]));
    for (let i = 0; i < 10; i++) {
      await env.client.patch(
        SBX,
        'default',
        'owner',
        'merge',
        { status: { message: `m${i}` } },
        { subresource: 'status' },
      );
      await env.client.patch(SBX, 'default', 'owner', 'merge', { metadata: { labels: { n: `${i}` } } });
    }
    for (const d of deps) await env.client.patch(SECRETS, 'default', d, 'merge', { data: { k: 'dg==' } });
    // Negative check through a sentinel: a pass enqueued by the writes above would be queued before
    // the sentinel's (one FIFO queue), so it would have run by the time the sentinel's has.
    await env.client.create(SECRETS, 'default', secret('sentinel', [refTo(owner)]));
    await passed('secrets', 'sentinel');
    expect(Object.fromEntries(deps.map((d) => [d, gc.passes.get(`secrets/default/${d}`)]))).to.deep.equal(before);
    expect(gc.passes.get('sandboxes/default/owner')).to.equal(undefined);
    // A reference change is a pass (it may make the dependent an orphan, or block its owner).
    await env.client.patch(SECRETS, 'default', 'd0', 'merge', {
      metadata: { ownerReferences: [refTo(owner, { blockOwnerDeletion: true })] },
    });
    await eventually(
      () => gc.passes.get('secrets/default/d0')! > before.d0!,
      5000,
      'a pass over d0 after its reference changed',
    );
    await env.client.delete(SBX, 'default', 'owner', { propagationPolicy: 'Background' });
    for (const d of [...deps, 'sentinel']) await gone(SECRETS, d);
  });

  it('a bad propagationPolicy is 422 naming the field, and changes nothing', async () => {
    await env.client.create(SECRETS, 'default', secret('x'));
    let err: any;
    await env.client.delete(SECRETS, 'default', 'x', { propagationPolicy: 'Sideways' as any }).catch((e) => (err = e));
    expect(err.status.code).to.equal(422);
    expect(err.status.details.causes[0].field).to.equal('propagationPolicy');
    const x = await env.client.get(SECRETS, 'default', 'x');
    expect(x.metadata.deletionTimestamp).to.equal(undefined);
    expect(x.metadata.finalizers).to.equal(undefined);
  });
  it('a second DELETE switches the propagation as kube does: Orphan replaces foregroundDeletion, none keeps it, Background ends it', async () => {
    // No collector runs here: the finalizers stay as the deletes leave them.
    await env.client.create(SECRETS, 'default', secret('twice', undefined, ['example.com/hold']));
    const fg = await env.client.delete(SECRETS, 'default', 'twice', { propagationPolicy: 'Foreground' });
    expect(fg.metadata.finalizers).to.deep.equal(['example.com/hold', 'foregroundDeletion']);
    const orphan = await env.client.delete(SECRETS, 'default', 'twice', { propagationPolicy: 'Orphan' });
    expect(orphan.metadata.finalizers).to.deep.equal(['example.com/hold', 'orphan']);
    expect(orphan.metadata.deletionTimestamp).to.equal(fg.metadata.deletionTimestamp);
    expect(orphan.metadata.generation).to.equal(fg.metadata.generation);
    const none = await env.client.delete(SECRETS, 'default', 'twice', {});
    expect(none.metadata.resourceVersion).to.equal(orphan.metadata.resourceVersion);
    const bg = await env.client.delete(SECRETS, 'default', 'twice', { propagationPolicy: 'Background' });
    expect(bg.metadata.finalizers).to.deep.equal(['example.com/hold']);
    // Held by foregroundDeletion alone, a Background delete deletes it at once.
    await env.client.create(SECRETS, 'default', secret('once'));
    await env.client.delete(SECRETS, 'default', 'once', { propagationPolicy: 'Foreground' });
    expect(await exists(SECRETS, 'once')).to.equal(true);
    await env.client.delete(SECRETS, 'default', 'once', { propagationPolicy: 'Background' });
    expect(await exists(SECRETS, 'once')).to.equal(false);
  });

  it('orphan and foregroundDeletion together are 422 naming metadata.finalizers, and change nothing', async () => {
    let err: any;
    await env.client
      .create(SECRETS, 'default', secret('both', undefined, ['orphan', 'foregroundDeletion']))
      .catch((e) => (err = e));
    expect(err?.status?.code).to.equal(422);
    expect(err.status.details.causes[0].field).to.equal('metadata.finalizers');
    expect(err.status.message).to.contain('finalizer orphan and foregroundDeletion cannot be both set');
    expect(await exists(SECRETS, 'both')).to.equal(false);
    await env.client.create(SECRETS, 'default', secret('one', undefined, ['orphan']));
    err = undefined;
    await env.client
      .patch(SECRETS, 'default', 'one', 'merge', { metadata: { finalizers: ['orphan', 'foregroundDeletion'] } })
      .catch((e) => (err = e));
    expect(err?.status?.code).to.equal(422);
    expect((await env.client.get(SECRETS, 'default', 'one')).metadata.finalizers).to.deep.equal(['orphan']);
  });
});
