import { expect } from 'chai';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { EventRecorder, eventsGVR } from '../../../runtime/controller/events.js';
import { finalize } from '../../../runtime/controller/finalizer.js';
import { done, requeueAfter } from '../../../runtime/controller/reconciler.js';
import { isNotFound } from '../../../runtime/meta/errors.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { makeEnv, SBX, sandbox, type Env } from './env.js';

describe('runtime/controller finalize() (real registry)', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('adds the finalizer then applies; on deletion cleans up, removes it, and the object goes', async () => {
    await env.client.create(SBX, 'default', sandbox('f'));
    const log: string[] = [];
    const handlers = {
      apply: async (o: KubeObject) => {
        log.push(`apply ${o.metadata.finalizers?.join(',')}`);
        return done();
      },
      cleanup: async () => {
        log.push('cleanup');
      },
    };
    const pass = async () =>
      finalize(env.client, SBX, await env.client.get(SBX, 'default', 'f'), 'fluxvm.dev/f', handlers);
    await pass();
    await pass(); // idempotent: no second add
    let obj = await env.client.get(SBX, 'default', 'f');
    expect(obj.metadata.finalizers).to.deep.equal(['fluxvm.dev/f']);
    expect(log).to.deep.equal(['apply fluxvm.dev/f', 'apply fluxvm.dev/f']);
    await env.client.delete(SBX, 'default', 'f');
    obj = await env.client.get(SBX, 'default', 'f');
    expect(obj.metadata.deletionTimestamp).to.be.a('string');
    await pass();
    expect(log[2]).to.equal('cleanup');
    try {
      await env.client.get(SBX, 'default', 'f');
      expect.fail('still there');
    } catch (e) {
      expect(isNotFound(e)).to.equal(true);
    }
  });

  it('keeps other finalizers, and a cleanup asking to requeue keeps its own', async () => {
    await env.client.create(SBX, 'default', sandbox('g', { finalizers: ['other.example/keep'] }));
    let cleanups = 0;
    const handlers = {
      apply: async () => done(),
      cleanup: async () => (++cleanups < 2 ? requeueAfter(10) : undefined),
    };
    const pass = async () =>
      finalize(env.client, SBX, await env.client.get(SBX, 'default', 'g'), 'fluxvm.dev/f', handlers);
    await pass();
    expect((await env.client.get(SBX, 'default', 'g')).metadata.finalizers).to.deep.equal([
      'other.example/keep',
      'fluxvm.dev/f',
    ]);
    await env.client.delete(SBX, 'default', 'g');
    expect(await pass()).to.deep.equal({ requeueAfterMs: 10 });
    expect((await env.client.get(SBX, 'default', 'g')).metadata.finalizers).to.deep.equal([
      'other.example/keep',
      'fluxvm.dev/f',
    ]);
    expect(await pass()).to.deep.equal({});
    expect((await env.client.get(SBX, 'default', 'g')).metadata.finalizers).to.deep.equal(['other.example/keep']);
    await pass(); // finalizer gone: nothing to do
    expect(cleanups).to.equal(2);
  });

  it('a stale object answers 409 instead of overwriting a newer finalizer list', async () => {
    await env.client.create(SBX, 'default', sandbox('h'));
    const stale = await env.client.get(SBX, 'default', 'h');
    await env.client.patch(SBX, 'default', 'h', 'merge', { metadata: { finalizers: ['x.example/y'] } });
    let err: unknown;
    try {
      await finalize(env.client, SBX, stale, 'fluxvm.dev/f', { apply: async () => done(), cleanup: async () => {} });
    } catch (e) {
      err = e;
    }
    expect((err as any)?.code).to.equal(409);
    expect((await env.client.get(SBX, 'default', 'h')).metadata.finalizers).to.deep.equal(['x.example/y']);
  });
});

describe('runtime/controller EventRecorder (real registry)', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('writes core/v1 Events and aggregates repeats within 10 minutes into count', async () => {
    const obj = await env.client.create(SBX, 'default', sandbox('e'));
    const clock = new FakeClock(Date.UTC(2026, 0, 1, 12, 0, 0));
    const rec = new EventRecorder({ client: env.client, clock });
    const first = await rec.event(obj, 'Normal', 'Booted', 'VM booted in 120ms');
    expect(first).to.not.equal(undefined);
    await clock.advance(60_000);
    await rec.event(obj, 'Normal', 'Booted', 'VM booted in 120ms');
    await rec.event(obj, 'Warning', 'Slow', 'took long');
    let list = await env.client.list(eventsGVR, 'default');
    expect(list.items.length).to.equal(2);
    const booted = list.items.find((e: any) => e.reason === 'Booted') as any;
    expect(booted).to.deep.include({
      type: 'Normal',
      message: 'VM booted in 120ms',
      count: 2,
      firstTimestamp: '2026-01-01T12:00:00Z',
      lastTimestamp: '2026-01-01T12:01:00Z',
    });
    expect(booted.source).to.deep.equal({ component: 'fluxvm-controller' });
    expect(booted.involvedObject).to.deep.include({
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      name: 'e',
      namespace: 'default',
      uid: obj.metadata.uid,
    });
    // Past the window: a new Event.
    await clock.advance(10 * 60_000);
    await rec.event(obj, 'Normal', 'Booted', 'VM booted in 120ms');
    list = await env.client.list(eventsGVR, 'default');
    expect(list.items.filter((e: any) => e.reason === 'Booted').length).to.equal(2);
    // The involvedObject field selector kubectl describe uses finds them.
    const sel = await env.client.list(eventsGVR, 'default', {
      fieldSelector: `involvedObject.name=e,involvedObject.namespace=default,involvedObject.kind=Sandbox,involvedObject.uid=${obj.metadata.uid}`,
    });
    expect(sel.items.length).to.equal(3);
  });

  it('concurrent repeats are counted exactly', async () => {
    const obj = await env.client.create(SBX, 'default', sandbox('c'));
    const rec = new EventRecorder({ client: env.client });
    await Promise.all(Array.from({ length: 5 }, () => rec.event(obj, 'Normal', 'Tick', 'same')));
    const list = await env.client.list(eventsGVR, 'default');
    expect(list.items.length).to.equal(1);
    expect((list.items[0] as any).count).to.equal(5);
  });

  it('never throws: a failing write is logged and resolves undefined', async () => {
    const errors: string[] = [];
    const rec = new EventRecorder({ client: env.client, log: { info() {}, error: (m) => errors.push(m) } });
    const bad = { apiVersion: 'v1', kind: 'X', metadata: { name: 'x', namespace: 'missing-ns' } };
    expect(await rec.event(bad, 'Normal', 'R', 'm')).to.equal(undefined);
    expect(errors.length).to.equal(1);
  });
});
