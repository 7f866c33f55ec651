import { expect } from 'chai';
import { collect, ctx, makeEnv, statusOf, tick, widget, W, EV, NS, type Env } from './registry-fixtures.js';
import { loose } from '../../support/objects.js';
import { eventually } from '../../support/wait.js';

const base = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure' };

describe('registry: finalizers, delete and dryRun', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('finalizer lifecycle: deletionTimestamp once, no new finalizers, DELETED when the last goes', async () => {
    await env.registry.create(W, 'default', widget('a', { color: 'r' }, { finalizers: ['x.dev/one'] }) as any, {}, ctx);
    const w = collect(env, { resourceVersion: String(env.store.currentRV) });
    const d = await env.registry.delete(W, 'default', 'a', { propagationPolicy: 'Foreground' }, ctx);
    expect(d.deleted).to.equal(false);
    const m = d.object.metadata;
    expect(m.deletionTimestamp).to.match(/Z$/);
    expect(m.deletionGracePeriodSeconds).to.equal(0);
    expect(m.generation).to.equal(2);
    const again = await env.registry.delete(W, 'default', 'a', {}, ctx);
    expect(again.object.metadata.resourceVersion).to.equal(m.resourceVersion);
    const add = await statusOf(() =>
      env.registry.patch(W, 'default', 'a', 'merge', { metadata: { finalizers: ['x.dev/one', 'x.dev/two'] } }, {}, ctx),
    );
    expect(add).to.deep.equal({
      ...base,
      message:
        'Widget.test.fluxvm.dev "a" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"x.dev/two"}',
      reason: 'Invalid',
      details: {
        name: 'a',
        group: 'test.fluxvm.dev',
        kind: 'Widget',
        causes: [
          {
            reason: 'FieldValueForbidden',
            field: 'metadata.finalizers',
            message:
              'Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"x.dev/two"}',
          },
        ],
      },
      code: 422,
    });
    const spec = (await env.registry.patch(W, 'default', 'a', 'merge', { spec: { color: 'b' } }, {}, ctx)).object;
    expect(spec.metadata.deletionTimestamp).to.equal(m.deletionTimestamp);
    const fin = await env.registry.patch(W, 'default', 'a', 'merge', { metadata: { finalizers: null } }, {}, ctx);
    expect(fin.object.metadata.finalizers).to.equal(undefined);
    expect((await statusOf(() => env.registry.get(W, 'default', 'a', ctx))).code).to.equal(404);
    await eventually(() => w.names().length >= 3, 2000, 'three watch events');
    expect(w.names()).to.deep.equal(['MODIFIED a', 'MODIFIED a', 'DELETED a']);
    w.stream.close();
  });

  it('delete preconditions are 409 with kube messages', async () => {
    const a = (await env.registry.create(W, 'default', widget('a') as any, {}, ctx)).object;
    expect(
      (await statusOf(() => env.registry.delete(W, 'default', 'a', { preconditions: { uid: 'u' } }, ctx))).message,
    ).to.equal(
      `Operation cannot be fulfilled on widgets.test.fluxvm.dev "a": Precondition failed: UID in precondition: u, UID in object meta: ${a.metadata.uid}`,
    );
    const rv = await statusOf(() =>
      env.registry.delete(W, 'default', 'a', { preconditions: { resourceVersion: '1' } }, ctx),
    );
    expect(rv).to.deep.include({ code: 409, reason: 'Conflict' });
    expect(rv.message).to.match(
      /Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: \d+$/,
    );
    const ok = await env.registry.delete(
      W,
      'default',
      'a',
      { preconditions: { uid: a.metadata.uid, resourceVersion: a.metadata.resourceVersion } },
      ctx,
    );
    expect(ok.deleted).to.equal(true);
  });

  it('dryRun on every write computes the result and persists nothing, no events', async () => {
    await env.registry.create(W, 'default', widget('a', { color: 'r' }, { finalizers: ['f'] }) as any, {}, ctx);
    const rv = env.store.currentRV;
    const w = collect(env, { resourceVersion: String(rv) });
    const c = await env.registry.create(W, 'default', widget('b') as any, { dryRun: true }, ctx);
    expect(c.object.metadata.uid).to.be.a('string');
    expect((await statusOf(() => env.registry.get(W, 'default', 'b', ctx))).code).to.equal(404);
    const u = await env.registry.patch(W, 'default', 'a', 'merge', { spec: { color: 'z' } }, { dryRun: true }, ctx);
    expect(loose(u.object).spec.color).to.equal('z');
    expect(u.object.metadata.generation).to.equal(2);
    await env.registry.patch(W, 'default', 'n', 'apply', widget('n'), { dryRun: true, fieldManager: 'kubectl' }, ctx);
    await env.registry.update(
      W,
      'default',
      'a',
      { ...(await env.registry.get(W, 'default', 'a', ctx)), status: { p: 1 } },
      { dryRun: true, subresource: 'status' },
      ctx,
    );
    const d = await env.registry.delete(W, 'default', 'a', { dryRun: true }, ctx);
    expect(d.object.metadata.deletionTimestamp).to.be.a('string');
    await env.registry.deleteCollection(W, 'default', { dryRun: true }, ctx);
    expect(env.store.currentRV).to.equal(rv);
    const a = await env.registry.get(W, 'default', 'a', ctx);
    expect(loose(a).spec.color).to.equal('r');
    expect(a.metadata.deletionTimestamp).to.equal(undefined);
    // A fixed wait on purpose: a window in which the watch must deliver nothing.
    await tick();
    expect(w.events).to.deep.equal([]);
    w.stream.close();
  });

  it('deleteCollection honours selectors', async () => {
    for (const [n, app] of [
      ['a', 'x'],
      ['b', 'y'],
      ['c', 'x'],
    ])
      await env.registry.create(W, 'default', widget(n, {}, { labels: { app } }) as any, {}, ctx);
    const r = await env.registry.deleteCollection(W, 'default', { labelSelector: 'app=x' }, ctx);
    expect(r.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'c']);
    expect((await env.registry.list(W, 'default', {}, ctx)).items.map((i) => i.metadata.name)).to.deep.equal(['b']);
  });

  it('the default namespace cannot be deleted', async () => {
    expect(await statusOf(() => env.registry.delete(NS, undefined, 'default', {}, ctx))).to.deep.equal({
      ...base,
      message: 'namespaces "default" is forbidden: this namespace may not be deleted',
      reason: 'Forbidden',
      details: { name: 'default', kind: 'namespaces' },
      code: 403,
    });
  });

  it('deleting a namespace marks it Terminating and leaves its content to the namespace controller; creating in it is 403', async () => {
    await env.registry.create(
      NS,
      undefined,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'team' } },
      {},
      ctx,
    );
    await env.registry.create(W, 'team', widget('a') as any, {}, ctx);
    const d = await env.registry.delete(NS, undefined, 'team', {}, ctx);
    expect(d.deleted).to.equal(false);
    const ns = await env.registry.get(NS, undefined, 'team', ctx);
    expect(loose(ns).status.phase).to.equal('Terminating');
    expect(loose(ns).spec.finalizers).to.deep.equal(['kubernetes']);
    // The request itself deletes nothing inside (runtime/controller/namespace.ts does, level-based).
    expect((await env.registry.list(W, 'team', {}, ctx)).items.map((i) => i.metadata.name)).to.deep.equal(['a']);
    expect((await statusOf(() => env.registry.create(W, 'team', widget('b') as any, {}, ctx))).code).to.equal(403);
    // Once the kubernetes finalizer is removed (what the controller does when it is empty), it goes.
    await env.registry.delete(W, 'team', 'a', {}, ctx);
    // spec.finalizers is left alone by a write to the namespace itself (kube's strategy) ...
    await env.registry.patch(NS, undefined, 'team', 'merge', { spec: { finalizers: [] } }, {}, ctx);
    expect(loose(await env.registry.get(NS, undefined, 'team', ctx)).spec.finalizers).to.deep.equal(['kubernetes']);
    // ... and changes through namespaces/finalize.
    await env.registry.patch(
      NS,
      undefined,
      'team',
      'merge',
      { spec: { finalizers: [] } },
      { subresource: 'finalize' },
      ctx,
    );
    expect((await statusOf(() => env.registry.get(NS, undefined, 'team', ctx))).code).to.equal(404);
  });
});

describe('registry: list pagination and resourceVersion', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv({}, { compaction: { intervalMs: 0, maxEvents: 3 } })));
  afterEach(() => env.close());

  it('limit/continue walk one consistent snapshot with remainingItemCount', async () => {
    for (const n of ['e', 'd', 'c', 'b', 'a']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const p1 = await env.registry.list(W, 'default', { limit: 2 }, ctx);
    expect(p1.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b']);
    expect(p1.metadata.remainingItemCount).to.equal(3);
    // Changes between pages do not show: later pages read at the first page's resourceVersion.
    const cBefore = await env.registry.get(W, 'default', 'c', ctx);
    await env.registry.create(W, 'default', widget('f') as any, {}, ctx);
    await env.registry.delete(W, 'default', 'c', {}, ctx);
    await env.registry.patch(W, 'default', 'd', 'merge', { spec: { color: 'changed' } }, {}, ctx);
    const p2 = await env.registry.list(W, 'default', { limit: 2, continue: p1.metadata.continue }, ctx);
    expect(p2.items.map((i) => i.metadata.name)).to.deep.equal(['c', 'd']);
    expect(p2.items[0]).to.deep.equal(cBefore);
    expect(loose(p2.items[1]).spec.color).to.equal('red');
    expect(p2.metadata.resourceVersion).to.equal(p1.metadata.resourceVersion);
    expect(p2.metadata.remainingItemCount).to.equal(1);
    const p3 = await env.registry.list(W, 'default', { limit: 2, continue: p2.metadata.continue }, ctx);
    expect(p3.items.map((i) => i.metadata.name)).to.deep.equal(['e']);
    expect(p3.metadata.continue).to.equal(undefined);
    expect(p3.metadata.remainingItemCount).to.equal(undefined);
    const now = await env.registry.list(W, 'default', {}, ctx);
    expect(now.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b', 'd', 'e', 'f']);
    // resourceVersionMatch=Exact reads the same snapshot.
    const exact = await env.registry.list(
      W,
      'default',
      { resourceVersion: p1.metadata.resourceVersion, resourceVersionMatch: 'Exact' },
      ctx,
    );
    expect(exact.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b', 'c', 'd', 'e']);
    expect(exact.metadata.resourceVersion).to.equal(p1.metadata.resourceVersion);
    const sel = await env.registry.list(W, undefined, { limit: 1, fieldSelector: 'metadata.name!=a' }, ctx);
    expect(sel.items.map((i) => i.metadata.name)).to.deep.equal(['b']);
    expect(sel.metadata.remainingItemCount).to.equal(undefined);
    expect(sel.metadata.continue).to.be.a('string');
  });

  it('a continue token older than compaction is 410 Expired', async () => {
    for (const n of ['a', 'b', 'c']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const p1 = await env.registry.list(W, 'default', { limit: 1 }, ctx);
    for (const n of ['d', 'e', 'f', 'g', 'h']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    env.store.compact();
    expect(
      await statusOf(() => env.registry.list(W, 'default', { limit: 1, continue: p1.metadata.continue }, ctx)),
    ).to.deep.equal({
      ...base,
      message:
        'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response.',
      reason: 'Expired',
      code: 410,
    });
  });

  it('field selectors of the kind and of core Events', async () => {
    await env.registry.create(W, 'default', widget('a', { color: 'red' }) as any, {}, ctx);
    await env.registry.create(W, 'default', widget('b', { color: 'blue' }) as any, {}, ctx);
    expect(
      (await env.registry.list(W, undefined, { fieldSelector: 'spec.color=blue' }, ctx)).items.map(
        (i) => i.metadata.name,
      ),
    ).to.deep.equal(['b']);
    const ev = (name: string, uid: string) => ({
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name },
      involvedObject: { kind: 'Widget', name: 'a', namespace: 'default', uid },
      reason: 'Booted',
      type: 'Normal',
    });
    await env.registry.create(EV, 'default', ev('e1', 'u1') as any, {}, ctx);
    await env.registry.create(EV, 'default', ev('e2', 'u2') as any, {}, ctx);
    const l = await env.registry.list(
      EV,
      'default',
      {
        fieldSelector:
          'involvedObject.namespace=default,involvedObject.kind=Widget,involvedObject.uid=u2,involvedObject.name=a',
      },
      ctx,
    );
    expect(l.items.map((i) => i.metadata.name)).to.deep.equal(['e2']);
  });
});

describe('registry: watch semantics', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv({ bookmarkIntervalMs: 20 }, { compaction: { intervalMs: 0, maxEvents: 2 } })));
  afterEach(() => env.close());

  it('too old resourceVersion: one ERROR 410 event, then the stream closes', async () => {
    for (const n of ['a', 'b', 'c', 'd']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const cut = env.store.compact();
    const w = collect(env, { resourceVersion: '1' });
    await eventually(() => w.closed(), 2000, 'the stream to close after its ERROR event');
    expect(w.events).to.deep.equal([
      {
        type: 'ERROR',
        object: { ...base, message: `too old resource version: 1 (${cut})`, reason: 'Expired', code: 410 },
      },
    ]);
    expect(w.closed()).to.equal(true);
  });

  it('selectors filter events; leaving the selection is DELETED, entering is ADDED', async () => {
    await env.registry.create(W, 'default', widget('a', {}, { labels: { app: 'x' } }) as any, {}, ctx);
    const w = collect(env, { labelSelector: 'app=x', resourceVersion: String(env.store.currentRV) });
    await env.registry.create(W, 'default', widget('b', {}, { labels: { app: 'y' } }) as any, {}, ctx);
    await env.registry.patch(W, 'default', 'a', 'merge', { metadata: { labels: { app: 'y' } } }, {}, ctx);
    await env.registry.patch(W, 'default', 'b', 'merge', { metadata: { labels: { app: 'x' } } }, {}, ctx);
    await env.registry.patch(W, 'default', 'b', 'merge', { spec: { n: 1 } }, {}, ctx);
    await env.registry.delete(W, 'default', 'a', {}, ctx);
    await env.registry.delete(W, 'default', 'b', {}, ctx);
    await eventually(() => w.names().length >= 4, 2000, 'four watch events');
    expect(w.names()).to.deep.equal(['DELETED a', 'ADDED b', 'MODIFIED b', 'DELETED b']);
    w.stream.close();
  });

  it('namespace scoping: a watch in one namespace does not see another', async () => {
    await env.registry.create(
      NS,
      undefined,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'other' } },
      {},
      ctx,
    );
    const w = collect(env, {}, 'default');
    const all = collect(env, {}, ''); // '' = every namespace
    await env.registry.create(W, 'other', widget('x') as any, {}, ctx);
    await env.registry.create(W, 'default', widget('y') as any, {}, ctx);
    await eventually(() => all.names().length >= 2 && w.names().length >= 1, 2000, 'the events of both watches');
    expect(w.names()).to.deep.equal(['ADDED y']);
    expect(all.names()).to.deep.equal(['ADDED x', 'ADDED y']);
    w.stream.close();
    all.stream.close();
  });

  it('sendInitialEvents: ADDED then a BOOKMARK marking the end of initial events; periodic bookmarks', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const w = collect(env, {
      sendInitialEvents: true,
      allowWatchBookmarks: true,
      resourceVersionMatch: 'NotOlderThan',
    });
    await eventually(() => w.events.length >= 2, 2000, 'the ADDED event and the initial-events bookmark');
    expect(w.events[0].type).to.equal('ADDED');
    expect(w.events[1]).to.deep.equal({
      type: 'BOOKMARK',
      object: {
        kind: 'Widget',
        apiVersion: 'test.fluxvm.dev/v1',
        metadata: {
          resourceVersion: String(env.store.currentRV),
          annotations: { 'k8s.io/initial-events-end': 'true' },
        },
      },
    });
    await env.registry.create(W, 'default', widget('b') as any, {}, ctx);
    await eventually(
      () => {
        const later = w.events.filter((e) => e.type === 'BOOKMARK').slice(1);
        const rv = later[later.length - 1]?.object.metadata.resourceVersion;
        return rv === String(env.store.currentRV);
      },
      2000,
      'a bookmark at the current resourceVersion',
    );
    const bm = w.events.filter((e) => e.type === 'BOOKMARK').slice(1);
    expect(bm.length).to.be.greaterThan(0);
    expect(bm[bm.length - 1].object.metadata.resourceVersion).to.equal(String(env.store.currentRV));
    w.stream.close();
  });

  it('no bookmarks unless allowed; timeoutSeconds closes the stream', async () => {
    const w = collect(env, { timeoutSeconds: 0.05 });
    await eventually(() => w.closed(), 2000, 'timeoutSeconds to close the stream');
    expect(w.events).to.deep.equal([]);
    expect(w.closed()).to.equal(true);
  });

  it('RV ahead of the store: one ERROR event 504 ResourceVersionTooLarge, as kube, then the stream ends', async () => {
    const current = env.store.currentRV;
    const w = collect(env, { resourceVersion: String(current + 1) });
    await env.registry.create(W, 'default', widget('later') as any, {}, ctx);
    await tick();
    expect(w.events.map((e: any) => e.type)).to.deep.equal(['ERROR']);
    expect((w.events[0] as any).object).to.deep.include({
      kind: 'Status',
      code: 504,
      reason: 'Timeout',
      message: `Timeout: Too large resource version: ${current + 1}, current: ${current}`,
    });
    expect((w.events[0] as any).object.details).to.deep.equal({
      causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }],
      retryAfterSeconds: 1,
    });
    expect(w.closed()).to.equal(true);
  });

  it('resourceVersion is an unsigned 64-bit decimal: exact beyond 2^53, garbage and overflow are 400', async () => {
    // 2^53 + 1 would round to 2^53 as a float: the message must carry it exactly.
    const huge = '9007199254740993';
    const w = collect(env, { resourceVersion: huge });
    await tick();
    expect((w.events[0] as any).object.message).to.equal(
      `Timeout: Too large resource version: ${huge}, current: ${env.store.currentRV}`,
    );
    const list = await statusOf(() =>
      env.registry.list(W, 'default', { resourceVersion: '18446744073709551615' }, ctx),
    );
    expect(list).to.deep.include({ code: 504, reason: 'Timeout' });
    for (const rv of ['18446744073709551616', '-1', '1e3', '0x10', ' 1', '1.0', '99999999999999999999999']) {
      expect((await statusOf(() => env.registry.list(W, 'default', { resourceVersion: rv }, ctx))).code, rv).to.equal(
        400,
      );
      expect(() => env.registry.watch(W, 'default', { resourceVersion: rv }, ctx), rv).to.throw(
        /must be an unsigned 64-bit decimal integer/,
      );
    }
  });

  it('resume from the last seen resourceVersion gives exactly the missed events', async () => {
    const w1 = collect(env, {});
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    await tick();
    const last = w1.events[w1.events.length - 1].object.metadata.resourceVersion!;
    w1.stream.close();
    await env.registry.create(W, 'default', widget('b') as any, {}, ctx);
    const w2 = collect(env, { resourceVersion: last });
    await tick();
    expect(w2.names()).to.deep.equal(['ADDED b']);
    w2.stream.close();
  });
});
