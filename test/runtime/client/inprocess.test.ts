import { expect } from 'chai';
import { getIfExists, type Client } from '../../../runtime/client/client.js';
import { InProcessClient } from '../../../runtime/client/inprocess.js';
import { isConflict, isNotFound, StatusError } from '../../../runtime/meta/errors.js';
import type { KubeObject, WatchEvent } from '../../../runtime/meta/types.js';
import { makeEnv, widget, W, type Env } from '../apiserver/registry-fixtures.js';
import { loose } from '../../support/objects.js';
import { eventually } from '../../support/wait.js';

describe('InProcessClient', () => {
  let env: Env;
  let client: InProcessClient;
  beforeEach(() => {
    env = makeEnv();
    client = new InProcessClient(env.registry);
  });
  afterEach(() => env.close());

  it('CRUD through the registry path; the default field manager is fluxvm-controller', async () => {
    const a = await client.create(W, 'default', widget('a') as KubeObject);
    expect(a.metadata.managedFields?.[0].manager).to.equal('fluxvm-controller');
    loose(a).spec.color = 'blue';
    const u = await client.update(W, 'default', a);
    expect(u.metadata.generation).to.equal(2);
    const s = await client.updateStatus(W, 'default', { ...u, status: { phase: 'Ready' } });
    expect(s.status).to.deep.equal({ phase: 'Ready' });
    const p = await client.patch(
      W,
      'default',
      'a',
      'merge',
      { metadata: { labels: { x: 'y' } } },
      { fieldManager: 'me' },
    );
    expect(p.metadata.labels).to.deep.equal({ x: 'y' });
    const l = await client.list(W, 'default', { labelSelector: 'x=y' });
    expect(l.items.map((i) => i.metadata.name)).to.deep.equal(['a']);
    // Returned objects are private copies.
    loose(l.items[0]).spec.color = 'mutated';
    expect(loose(await client.get(W, 'default', 'a')).spec.color).to.equal('blue');
    await client.delete(W, 'default', 'a');
    try {
      await client.get(W, 'default', 'a');
      expect.fail('expected 404');
    } catch (e) {
      expect(isNotFound(e)).to.equal(true);
      expect(e).to.be.instanceOf(StatusError);
    }
  });

  it('getIfExists: the object, undefined for a missing one, other errors thrown', async () => {
    await client.create(W, 'default', widget('a') as KubeObject);
    expect((await getIfExists(client, W, 'default', 'a'))?.metadata.name).to.equal('a');
    expect(await getIfExists(client, W, 'default', 'b')).to.equal(undefined);
    expect(await getIfExists(client, W, 'other', 'a')).to.equal(undefined);
    const failing = { get: () => Promise.reject(new StatusError(500, 'InternalError', 'boom')) } as unknown as Client;
    let err: unknown;
    await getIfExists(failing, W, 'default', 'a').catch((e) => (err = e));
    expect(err).to.be.instanceOf(StatusError).with.property('code', 500);
  });

  it('get of the status subresource is the object; another subresource is refused (501), not answered with the object', async () => {
    await client.create(W, 'default', widget('a') as KubeObject);
    expect((await client.get(W, 'default', 'a', 'status')).metadata.name).to.equal('a');
    let err: any;
    await client.get(W, 'default', 'a', 'files').catch((e) => (err = e));
    expect(err).to.be.instanceOf(StatusError);
    expect(err.code).to.equal(501);
  });

  it('a stale update is a Conflict StatusError', async () => {
    const a = await client.create(W, 'default', widget('a') as KubeObject);
    await client.patch(W, 'default', 'a', 'merge', { spec: { color: 'x' } });
    try {
      await client.update(W, 'default', { ...a, spec: { color: 'y' } });
      expect.fail('expected 409');
    } catch (e) {
      expect(isConflict(e)).to.equal(true);
    }
  });

  it('watch delivers events in order and stop() ends it', async () => {
    const events: WatchEvent[] = [];
    const h = client.watch(W, 'default', {}, (ev) => events.push(ev));
    for (let i = 0; i < 20; i++) await client.create(W, 'default', widget(`w${i}`) as KubeObject);
    await client.patch(W, 'default', 'w3', 'merge', { spec: { n: 1 } });
    await eventually(() => events.length >= 21, 5000, 'the 21 watch events (20 ADDED, 1 MODIFIED)');
    expect(events.length).to.equal(21);
    const rvs = events.map((e) => Number(e.object.metadata.resourceVersion));
    expect(rvs).to.deep.equal([...rvs].sort((x, y) => x - y));
    expect(events[20]).to.deep.include({ type: 'MODIFIED' });
    h.stop();
    await h.done;
    await client.create(W, 'default', widget('late') as KubeObject);
    // A fixed wait on purpose: a window in which a stopped watch must deliver nothing.
    await new Promise((r) => setTimeout(r, 10));
    expect(events.length).to.equal(21);
    h.stop();
  });

  it('watches end when the store closes', async () => {
    const h = client.watch(W, 'default', {}, () => {});
    env.store.close();
    await h.done;
  });

  it('watch done resolves after a 410 ERROR event', async () => {
    const small = makeEnv({}, { compaction: { intervalMs: 0, maxEvents: 1 } });
    try {
      const c = new InProcessClient(small.registry);
      for (let i = 0; i < 5; i++) await c.create(W, 'default', widget(`w${i}`) as KubeObject);
      small.store.compact();
      const events: WatchEvent[] = [];
      const h = c.watch(W, 'default', { resourceVersion: '1' }, (ev) => events.push(ev));
      await h.done;
      expect(events.map((e) => e.type)).to.deep.equal(['ERROR']);
      expect((events[0].object as any).code).to.equal(410);
    } finally {
      small.close();
    }
  });
});
