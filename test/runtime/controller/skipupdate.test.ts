// Controller skipUpdate with metadataOnlyUpdate (the Sandbox controller's filter): an update that
// changes only labels or owner references runs no pass; a spec, status, finalizer or
// deletion change does. In-process client over a real registry.
import { expect } from 'chai';
import { Controller, metadataOnlyUpdate } from '../../../runtime/controller/controller.js';
import { Manager } from '../../../runtime/controller/manager.js';
import { done, type ObjectKey } from '../../../runtime/controller/reconciler.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { eventually, makeEnv, SBX, sandbox, type Env } from './env.js';

describe('runtime/controller skipUpdate (metadataOnlyUpdate)', () => {
  let env: Env;
  let ac: AbortController;
  beforeEach(() => {
    env = makeEnv();
    ac = new AbortController();
  });
  afterEach(() => {
    ac.abort();
    env.close();
  });

  it('metadataOnlyUpdate: labels, ownerReferences, resourceVersion and managedFields only (annotations run a pass)', () => {
    const base = {
      apiVersion: 'v1',
      kind: 'X',
      metadata: { name: 'a', resourceVersion: '1', generation: 1 },
      spec: { a: 1 },
    };
    const meta = (m: Record<string, unknown>, rest: Record<string, unknown> = {}) => ({
      ...base,
      ...rest,
      metadata: { ...base.metadata, ...m },
    });
    expect(metadataOnlyUpdate(base, meta({ labels: { x: 'y' }, resourceVersion: '2' }))).to.equal(true);
    expect(metadataOnlyUpdate(base, meta({ managedFields: [] }))).to.equal(true);
    // An annotation is how an operator asks for a reconcile: it is not skipped.
    expect(metadataOnlyUpdate(base, meta({ annotations: { x: 'y' } }))).to.equal(false);
    expect(metadataOnlyUpdate(base, meta({ ownerReferences: [{ uid: 'u' }] }))).to.equal(true);
    expect(metadataOnlyUpdate(base, meta({}, { spec: { a: 2 } }))).to.equal(false);
    expect(metadataOnlyUpdate(base, meta({}, { status: { phase: 'Running' } }))).to.equal(false);
    expect(metadataOnlyUpdate(base, meta({ finalizers: ['f'] }))).to.equal(false);
    expect(metadataOnlyUpdate(base, meta({ deletionTimestamp: '2026-01-01T00:00:00Z' }))).to.equal(false);
    expect(metadataOnlyUpdate(base, meta({ generation: 2 }))).to.equal(false);
  });

  it('a label-only update runs no pass; a spec update does', async () => {
    await env.client.create(SBX, 'default', sandbox('one'));
    const m = new Manager({ client: env.client });
    const inf = m.informer<KubeObject & { spec?: { ttlSeconds?: number } }>(SBX);
    // What each pass saw: the label, the spec change.
    const passes: string[] = [];
    const c = new Controller({
      name: 't',
      informer: inf,
      skipUpdate: metadataOnlyUpdate,
      reconciler: async (k: ObjectKey) => {
        const o = inf.cache.get(k.namespace, k.name);
        passes.push(`${o?.metadata.labels?.moved ?? '-'}/${o?.spec?.ttlSeconds ?? '-'}`);
        return done();
      },
    });
    m.add(c);
    const run = m.start(ac.signal);
    await eventually(() => passes.length === 1, 5000, 'the first pass');
    await env.client.patch(SBX, 'default', 'one', 'merge', {
      metadata: { labels: { moved: 'yes' }, ownerReferences: [{ apiVersion: 'v1', kind: 'X', name: 'o', uid: 'u1' }] },
    });
    await eventually(
      () => inf.cache.get('default', 'one')?.metadata.labels?.moved === 'yes',
      5000,
      'the label in the cache',
    );
    // The spec change: its pass sees both. Without the filter a pass would have seen 'yes/-' first.
    await env.client.patch(SBX, 'default', 'one', 'merge', { spec: { ttlSeconds: 60 } });
    await eventually(() => passes.includes('yes/60'), 5000, 'the pass of the spec change');
    expect(passes).to.deep.equal(['-/-', 'yes/60']);
    ac.abort();
    await run;
  });
});
