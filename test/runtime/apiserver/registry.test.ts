import { expect } from 'chai';
import { collect, ctx, makeEnv, statusOf, widget, W, G, NS, type Env } from './registry-fixtures.js';
import { eventually } from '../../support/wait.js';

describe('registry: CRUD', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('creates with server-owned metadata and the global resourceVersion', async () => {
    const before = env.store.currentRV;
    const r = await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    expect(r.created).to.equal(true);
    const m = r.object.metadata;
    expect(m.uid).to.match(/^[0-9a-f-]{36}$/);
    expect(m.creationTimestamp).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(m.generation).to.equal(1);
    expect(m.namespace).to.equal('default');
    expect(m.resourceVersion).to.equal(String(before + 1));
    expect(m.managedFields?.[0]).to.include({ manager: 'kubectl', operation: 'Update' });
    const g = await env.registry.create(
      G,
      undefined,
      { apiVersion: 'test.fluxvm.dev/v1', kind: 'Gadget', metadata: { name: 'g' } },
      {},
      ctx,
    );
    expect(g.object.metadata.resourceVersion).to.equal(String(before + 2));
    expect(g.object.metadata.namespace).to.equal(undefined);
    const got = await env.registry.get(W, 'default', 'a', ctx);
    expect(got).to.deep.equal(r.object);
  });

  it('timestamps are formatted once per second of the clock, and follow it', async () => {
    let t = Date.parse('2026-12-05T00:00:07.250Z');
    const clocked = makeEnv({ now: () => new Date(t) });
    const real = Date.prototype.toISOString;
    let formatted = 0;
    Date.prototype.toISOString = function (this: Date) {
      formatted++;
      return real.call(this);
    };
    try {
      t += 1000; // a second later than the registry's start (its default namespace)
      const a = await clocked.registry.create(W, 'default', widget('a') as any, {}, ctx);
      t += 500;
      const b = await clocked.registry.create(W, 'default', widget('b') as any, {}, ctx);
      expect(formatted, 'toISOString calls for two creates in one second').to.equal(1);
      for (const o of [a.object, b.object]) {
        expect(o.metadata.creationTimestamp).to.equal('2026-12-05T00:00:08Z');
        expect(o.metadata.managedFields?.[0]?.time).to.equal('2026-12-05T00:00:08Z');
      }
      t += 1000;
      const c = await clocked.registry.create(W, 'default', widget('c') as any, {}, ctx);
      expect(c.object.metadata.creationTimestamp).to.equal('2026-12-05T00:00:09Z');
    } finally {
      Date.prototype.toISOString = real;
      clocked.close();
    }
  });

  it('a default namespace exists and writes into a missing one are 404 for the namespace', async () => {
    const ns = await env.registry.get(NS, undefined, 'default', ctx);
    expect(ns.status).to.deep.equal({ phase: 'Active' });
    const st = await statusOf(() => env.registry.create(W, 'nope', widget('a') as any, {}, ctx));
    expect(st).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'namespaces "nope" not found',
      reason: 'NotFound',
      details: { name: 'nope', group: '', kind: 'namespaces' },
      code: 404,
    });
  });

  it('AlreadyExists, NotFound and Conflict have the exact Status bodies', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    expect(await statusOf(() => env.registry.create(W, 'default', widget('a') as any, {}, ctx))).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'widgets.test.fluxvm.dev "a" already exists',
      reason: 'AlreadyExists',
      details: { name: 'a', group: 'test.fluxvm.dev', kind: 'widgets' },
      code: 409,
    });
    expect(await statusOf(() => env.registry.get(W, 'default', 'nope', ctx))).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'widgets.test.fluxvm.dev "nope" not found',
      reason: 'NotFound',
      details: { name: 'nope', group: 'test.fluxvm.dev', kind: 'widgets' },
      code: 404,
    });
    const stale = { ...widget('a', { color: 'blue' }), metadata: { name: 'a', resourceVersion: '1' } };
    expect(await statusOf(() => env.registry.update(W, 'default', 'a', stale as any, {}, ctx))).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message:
        'Operation cannot be fulfilled on widgets.test.fluxvm.dev "a": the object has been modified; please apply your changes to the latest version and try again',
      reason: 'Conflict',
      details: { name: 'a', group: 'test.fluxvm.dev', kind: 'widgets' },
      code: 409,
    });
  });

  it('update bumps generation on spec change only and keeps status (status split)', async () => {
    const a = (await env.registry.create(W, 'default', { ...widget('a'), status: { phase: 'X' } } as any, {}, ctx))
      .object;
    expect(a.status).to.equal(undefined);
    const s = (
      await env.registry.update(
        W,
        'default',
        'a',
        { ...a, status: { phase: 'Running' } },
        { subresource: 'status' },
        ctx,
      )
    ).object;
    expect(s.status).to.deep.equal({ phase: 'Running' });
    expect(s.metadata.generation).to.equal(1);
    const l = (
      await env.registry.update(
        W,
        'default',
        'a',
        { ...s, metadata: { ...s.metadata, labels: { x: 'y' } }, status: { phase: 'Ignored' } },
        {},
        ctx,
      )
    ).object;
    expect(l.metadata.generation).to.equal(1);
    expect(l.status).to.deep.equal({ phase: 'Running' });
    const sp = (await env.registry.update(W, 'default', 'a', { ...l, spec: { color: 'blue' } }, {}, ctx)).object;
    expect(sp.metadata.generation).to.equal(2);
    expect(Number(sp.metadata.resourceVersion)).to.be.greaterThan(Number(l.metadata.resourceVersion));
    // A no-op update writes nothing.
    const rv = env.store.currentRV;
    const same = (await env.registry.update(W, 'default', 'a', sp, {}, ctx)).object;
    expect(same.metadata.resourceVersion).to.equal(sp.metadata.resourceVersion);
    expect(env.store.currentRV).to.equal(rv);
  });

  it('delete removes the object and later get is 404', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const d = await env.registry.delete(W, 'default', 'a', {}, ctx);
    expect(d.deleted).to.equal(true);
    expect((await statusOf(() => env.registry.get(W, 'default', 'a', ctx))).code).to.equal(404);
  });

  it('lists with the current resourceVersion', async () => {
    for (const n of ['b', 'a', 'c']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const l = await env.registry.list(W, 'default', {}, ctx);
    expect(l.kind).to.equal('WidgetList');
    expect(l.apiVersion).to.equal('test.fluxvm.dev/v1');
    expect(l.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b', 'c']);
    expect(l.metadata.resourceVersion).to.equal(String(env.store.currentRV));
  });
});

describe('registry: watch', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('RV unset: synthetic ADDED then live events in order', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const w = collect(env, {});
    await env.registry.create(W, 'default', widget('b') as any, {}, ctx);
    await env.registry.patch(W, 'default', 'b', 'merge', { spec: { color: 'blue' } }, {}, ctx);
    await env.registry.delete(W, 'default', 'a', {}, ctx);
    await eventually(() => w.events.length >= 4, 2000, 'four watch events');
    expect(w.events.map((e) => `${e.type} ${e.object.metadata.name}`)).to.deep.equal([
      'ADDED a',
      'ADDED b',
      'MODIFIED b',
      'DELETED a',
    ]);
    const rvs = w.events.slice(1).map((e) => Number(e.object.metadata.resourceVersion));
    expect(rvs).to.deep.equal([...rvs].sort((x, y) => x - y));
    w.stream.close();
    expect(w.closed()).to.equal(true);
  });

  it('RV=N replays events after N, then live', async () => {
    const a = (await env.registry.create(W, 'default', widget('a') as any, {}, ctx)).object;
    await env.registry.create(W, 'default', widget('b') as any, {}, ctx);
    const w = collect(env, { resourceVersion: a.metadata.resourceVersion });
    await env.registry.create(W, 'default', widget('c') as any, {}, ctx);
    await eventually(() => w.events.length >= 2, 2000, 'two watch events');
    expect(w.events.map((e) => `${e.type} ${e.object.metadata.name}`)).to.deep.equal(['ADDED b', 'ADDED c']);
    w.stream.close();
  });
});
