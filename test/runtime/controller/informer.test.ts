import { expect } from 'chai';
import { Informer } from '../../../runtime/controller/informer.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { eventually, makeEnv, SBX, sandbox, severable, type Env } from './env.js';

describe('runtime/controller informer (in-process client, real registry)', () => {
  let env: Env;
  let ac: AbortController;
  beforeEach(() => {
    env = makeEnv({ compaction: { intervalMs: 0, maxEvents: 1 } });
    ac = new AbortController();
  });
  afterEach(() => {
    ac.abort();
    env.close();
  });

  function record(inf: Informer) {
    const seen: string[] = [];
    inf.addHandler({
      add: (o) => seen.push(`add ${o.metadata.name}`),
      update: (a, b) =>
        seen.push(`update ${b.metadata.name} ${a.metadata.resourceVersion}->${b.metadata.resourceVersion}`),
      delete: (o) => seen.push(`delete ${o.metadata.name}`),
    });
    return seen;
  }

  it('lists, syncs, then follows add / update / delete in the cache and handlers', async () => {
    await env.client.create(SBX, 'default', sandbox('a'));
    const inf = new Informer({ client: env.client, gvr: SBX });
    const seen = record(inf);
    const run = inf.start(ac.signal);
    expect(await inf.waitForSync(ac.signal)).to.equal(true);
    expect(inf.hasSynced()).to.equal(true);
    expect(seen).to.deep.equal(['add a']);
    await env.client.create(SBX, 'default', sandbox('b', { labels: { x: '1' } }));
    const b = await env.client.patch(SBX, 'default', 'b', 'merge', { metadata: { labels: { x: '2' } } });
    await env.client.delete(SBX, 'default', 'a');
    await eventually(() => seen.length === 4, 5000, 'events');
    expect(seen[1]).to.equal('add b');
    expect(seen[2]).to.match(/^update b \d+->\d+$/);
    expect(seen[3]).to.equal('delete a');
    expect(inf.cache.get('default', 'a')).to.equal(undefined);
    expect(inf.cache.get('default', 'b')?.metadata.labels).to.deep.equal({ x: '2' });
    expect(inf.cache.byIndex('namespace', 'default').map((o) => o.metadata.name)).to.deep.equal(['b']);
    expect(Number(inf.lastSyncResourceVersion())).to.be.greaterThan(Number(b.metadata.resourceVersion));
    ac.abort();
    await run;
  });

  it('relists after a 410 Expired and reports what changed while it was disconnected', async () => {
    const client = severable(env.client);
    await env.client.create(SBX, 'default', sandbox('keep'));
    await env.client.create(SBX, 'default', sandbox('gone'));
    const inf = new Informer({ client, gvr: SBX });
    const seen = record(inf);
    const run = inf.start(ac.signal);
    await inf.waitForSync(ac.signal);
    expect(inf.listCount).to.equal(1);
    client.sever();
    // While disconnected: changes, then compaction past the informer's resourceVersion.
    await env.client.delete(SBX, 'default', 'gone');
    await env.client.create(SBX, 'default', sandbox('new'));
    await env.client.patch(SBX, 'default', 'keep', 'merge', { metadata: { labels: { v: '2' } } });
    env.store.compact();
    client.reconnect();
    await eventually(() => inf.listCount === 2 && !!inf.cache.get('default', 'new'), 5000, 'relist');
    expect(inf.cache.keys().sort()).to.deep.equal(['default/keep', 'default/new']);
    expect(inf.cache.get('default', 'keep')?.metadata.labels).to.deep.equal({ v: '2' });
    expect(seen).to.include.members(['delete gone', 'add new']);
    expect(seen.some((s) => s.startsWith('update keep'))).to.equal(true);
    // And it keeps watching after the relist.
    await env.client.create(SBX, 'default', sandbox('after'));
    await eventually(() => !!inf.cache.get('default', 'after'), 5000, 'watch after relist');
    ac.abort();
    await run;
  });

  it('re-watches from its resourceVersion after a dropped connection without relisting', async () => {
    const client = severable(env.client);
    const inf = new Informer({ client, gvr: SBX });
    const seen = record(inf);
    const run = inf.start(ac.signal);
    await inf.waitForSync(ac.signal);
    client.sever();
    client.reconnect();
    await env.client.create(SBX, 'default', sandbox('x'));
    await eventually(() => seen.includes('add x'), 5000, 'add after re-watch');
    expect(inf.listCount).to.equal(1);
    ac.abort();
    await run;
  });

  it('resyncs: every cached object is delivered again as an update', async () => {
    await env.client.create(SBX, 'default', sandbox('r'));
    const inf = new Informer({ client: env.client, gvr: SBX, resyncMs: 50 });
    const updates: KubeObject[] = [];
    inf.addHandler({ update: (a, b) => a === b && updates.push(b) });
    const run = inf.start(ac.signal);
    await eventually(() => updates.length >= 2, 5000, 'resyncs');
    ac.abort();
    await run;
  });

  it('a handler added after sync receives the cached objects as adds', async () => {
    await env.client.create(SBX, 'default', sandbox('late'));
    const inf = new Informer({ client: env.client, gvr: SBX });
    const run = inf.start(ac.signal);
    await inf.waitForSync(ac.signal);
    const seen = record(inf);
    expect(seen).to.deep.equal(['add late']);
    ac.abort();
    await run;
  });
  it("holds the store's shared, frozen objects (no copy per informer), listed and watched", async () => {
    await env.client.create(SBX, 'default', sandbox('listed'));
    const inf = new Informer({ client: env.client, gvr: SBX });
    const run = inf.start(ac.signal);
    await inf.waitForSync(ac.signal);
    await env.client.create(SBX, 'default', sandbox('watched'));
    await eventually(() => inf.cache.get('default', 'watched') !== undefined, 5000, 'the watched object');
    for (const name of ['listed', 'watched']) {
      const cached = inf.cache.get('default', name)!;
      const stored = env.store.get({ group: SBX.group, resource: SBX.resource, namespace: 'default', name });
      expect(cached, name).to.equal(stored);
      expect(Object.isFrozen(cached.metadata), name).to.equal(true);
    }
    // Other reads still get private copies a caller may change.
    const got = await env.client.get(SBX, 'default', 'listed');
    expect(got).to.not.equal(inf.cache.get('default', 'listed'));
    got.metadata.labels = { changed: 'yes' };
    expect(inf.cache.get('default', 'listed')?.metadata.labels).to.equal(undefined);
    ac.abort();
    await run;
  });
});
