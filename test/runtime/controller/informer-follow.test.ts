// A metadataOnly informer (the garbage collector's) with a full twin in the same Manager (same
// resource, scope and selectors) mirrors the twin instead of opening its own list and watch:
// one watch per resource per process, the API server writing each event once per process. In-process
// client over a real registry, its watches counted.
import { expect } from 'chai';
import { Manager } from '../../../runtime/controller/manager.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import type { Client } from '../../../runtime/client/client.js';
import { eventually, makeEnv, SBX, sandbox, type Env } from './env.js';

const CHECKPOINTS = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'checkpoints' };

/** The client with its list and watch calls counted per resource. */
function counting(inner: Client): Client & { lists: Map<string, number>; watches: Map<string, number> } {
  const c = Object.create(inner) as Client & { lists: Map<string, number>; watches: Map<string, number> };
  c.lists = new Map();
  c.watches = new Map();
  const bump = (m: Map<string, number>, r: string) => m.set(r, (m.get(r) ?? 0) + 1);
  c.list = (gvr, ns, opts) => {
    bump(c.lists, gvr.resource);
    return inner.list(gvr, ns, opts);
  };
  c.watch = (gvr, ns, opts, on) => {
    bump(c.watches, gvr.resource);
    return inner.watch(gvr, ns, opts, on);
  };
  return c;
}

describe('runtime/controller metadataOnly informer following its full twin', () => {
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

  it('opens no watch of its own; mirrors add, update and delete in slim form, synced with the twin', async () => {
    await env.client.create(SBX, 'default', sandbox('before', { labels: { a: '1' } }));
    const client = counting(env.client);
    const m = new Manager({ client });
    // The metadata informer asked for first, as the garbage collector does.
    const meta = m.informer<KubeObject>(SBX, { metadataOnly: true });
    const full = m.informer<KubeObject>(SBX);
    // A metadataOnly informer with no twin keeps its own watch.
    const alone = m.informer<KubeObject>(CHECKPOINTS, { metadataOnly: true });
    const seen: string[] = [];
    meta.addHandler({
      add: (o) => seen.push(`add ${o.metadata.name} ${JSON.stringify(Object.keys(o))}`),
      update: (a, b) => seen.push(`update ${b.metadata.name} ${b.metadata.labels?.a ?? '-'}`),
      delete: (o) => seen.push(`delete ${o.metadata.name}`),
    });
    void m.start(ac.signal);
    await eventually(() => m.hasSynced(), 10_000, 'the manager synced');
    expect(meta.hasSynced()).to.equal(true);
    expect(meta.cache.get('default', 'before')?.metadata.labels).to.deep.equal({ a: '1' });
    expect(meta.cache.get('default', 'before')).to.not.have.property('spec');

    await env.client.create(SBX, 'default', sandbox('x'));
    await eventually(() => full.cache.get('default', 'x') !== undefined, 10_000, 'x in the full cache');
    const x = await env.client.get<KubeObject>(SBX, 'default', 'x');
    await env.client.update(SBX, 'default', { ...x, metadata: { ...x.metadata, labels: { a: '2' } } });
    await env.client.delete(SBX, 'default', 'x');
    await eventually(() => seen.includes('delete x'), 10_000, 'the delete mirrored');
    expect(seen).to.deep.equal([
      'add before ["apiVersion","kind","metadata"]',
      'add x ["apiVersion","kind","metadata"]',
      'update x 2',
      'delete x',
    ]);
    expect(meta.cache.get('default', 'x')).to.equal(undefined);
    expect(meta.lastSyncResourceVersion()).to.equal(full.lastSyncResourceVersion());
    // One list and one watch of sandboxes (the full informer's); the lone metadata informer has its own.
    expect(client.lists.get('sandboxes')).to.equal(1);
    expect(client.watches.get('sandboxes')).to.equal(1);
    expect(client.watches.get('checkpoints')).to.equal(1);
    expect(alone.hasSynced()).to.equal(true);
  });
});
