import { expect } from 'chai';
import { Controller, mapToControllerOwner } from '../../../runtime/controller/controller.js';
import { ExponentialFailureRateLimiter } from '../../../runtime/controller/ratelimiter.js';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { leasesGVR, microTime } from '../../../runtime/controller/leaderelection.js';
import { Manager } from '../../../runtime/controller/manager.js';
import { done, requeueAfter, TerminalError, type ObjectKey } from '../../../runtime/controller/reconciler.js';
import { eventually, makeEnv, SBX, sandbox, type Env } from './env.js';

const EVENTS = { group: '', version: 'v1', resource: 'events' };

describe('runtime/controller Controller + Manager (in-process client, real registry)', () => {
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

  it('reconciles existing and new objects by key, and the manager stops everything on one signal', async () => {
    await env.client.create(SBX, 'default', sandbox('one'));
    const m = new Manager({ client: env.client });
    const keys: string[] = [];
    const c = new Controller({
      name: 't',
      informer: m.informer(SBX),
      reconciler: async (k: ObjectKey) => {
        keys.push(`${k.namespace}/${k.name}`);
        return done();
      },
    });
    m.add(c);
    const run = m.start(ac.signal);
    await eventually(() => keys.includes('default/one'), 5000, 'first reconcile');
    await env.client.create(SBX, 'default', sandbox('two'));
    await eventually(() => keys.includes('default/two'), 5000, 'second reconcile');
    expect(m.hasSynced()).to.equal(true);
    ac.abort();
    await run;
    expect(c.queue.isShuttingDown).to.equal(true);
  });

  it('throw retries with backoff until success; TerminalError is not retried; requeueAfter runs again', async () => {
    await env.client.create(SBX, 'default', sandbox('flaky'));
    await env.client.create(SBX, 'default', sandbox('broken'));
    await env.client.create(SBX, 'default', sandbox('ttl'));
    const m = new Manager({ client: env.client });
    // Time moves only when the test advances it: the backoff is asserted to the millisecond.
    const clock = new FakeClock();
    const t0 = clock.now();
    const attempts = new Map<string, number[]>();
    const count = (name: string) => attempts.get(name)?.length ?? 0;
    const c = new Controller({
      name: 't',
      informer: m.informer(SBX),
      clock,
      rateLimiter: new ExponentialFailureRateLimiter(20, 1000),
      reconciler: async (k) => {
        const list = attempts.get(k.name) ?? [];
        list.push(clock.now() - t0);
        attempts.set(k.name, list);
        if (k.name === 'flaky' && list.length < 3) throw new Error('not yet');
        if (k.name === 'broken') throw new TerminalError('bad spec');
        if (k.name === 'ttl' && list.length < 3) return requeueAfter(30);
        return done();
      },
    });
    m.add(c);
    const run = m.start(ac.signal);
    await eventually(() => count('flaky') === 1 && count('broken') === 1 && count('ttl') === 1, 5000, 'first passes');
    // The failed key waits its 20 ms backoff: nothing runs before it is due.
    await eventually(() => clock.pending() >= 2, 5000, 'the retry and requeue timers');
    await clock.advance(19);
    expect([count('flaky'), count('ttl')]).to.deep.equal([1, 1], 'nothing before the backoff is due');
    await clock.advance(1);
    await eventually(() => count('flaky') === 2, 5000, 'the first retry at 20 ms');
    await clock.advance(10);
    await eventually(() => count('ttl') === 2, 5000, 'the requeue at 30 ms');
    // The second failure doubles the backoff: 40 ms after the retry at 20, so at 60.
    await clock.advance(29);
    expect([count('flaky'), count('ttl')]).to.deep.equal([2, 2], 'nothing before 60 ms');
    await clock.advance(1);
    await eventually(() => count('flaky') === 3 && count('ttl') === 3, 5000, 'the retry and requeue at 60 ms');
    // Success and done() end both; the TerminalError was never retried: a long advance runs nothing more.
    await clock.advance(5000);
    expect(attempts.get('flaky')).to.deep.equal([0, 20, 60]);
    expect(attempts.get('ttl')).to.deep.equal([0, 30, 60]);
    expect(attempts.get('broken')).to.deep.equal([0]);
    expect(c.queue.numRequeues('default/flaky')).to.equal(0, 'forgotten on success');
    expect(c.stats.terminal).to.equal(1);
    ac.abort();
    await run;
  });

  it('never runs two reconciles of one key at once, even with several workers', async () => {
    await env.client.create(SBX, 'default', sandbox('hot'));
    const m = new Manager({ client: env.client });
    let active = 0;
    let overlap = false;
    let runs = 0;
    let seen: string | undefined;
    const c = new Controller({
      name: 't',
      informer: m.informer(SBX),
      concurrency: 4,
      reconciler: async () => {
        if (active > 0) overlap = true;
        active++;
        seen = m
          .informer(SBX)
          .cache.list()
          .find((o) => o.metadata.name === 'hot')?.metadata.labels?.i;
        // A fixed wait on purpose: the reconcile's own duration, so an overlapping one would be seen.
        await new Promise((r) => setTimeout(r, 20));
        active--;
        runs++;
        return done();
      },
    });
    m.add(c);
    const run = m.start(ac.signal);
    await eventually(() => runs >= 1, 5000, 'first run');
    for (let i = 0; i < 10; i++) {
      await env.client.patch(SBX, 'default', 'hot', 'merge', { metadata: { labels: { i: String(i) } } });
    }
    // Synchronised on the queue, not a sleep: every trigger handled and nothing in flight.
    await eventually(() => seen === '9' && active === 0, 5000, 'a run that saw the last update');
    expect(overlap).to.equal(false);
    // 11 triggers (the create and 10 updates), collapsed while a run is in flight.
    expect(runs).to.be.at.least(2).and.at.most(11);
    ac.abort();
    await run;
  });

  it('a watch of an owned kind enqueues the controller owner', async () => {
    const owner = await env.client.create(SBX, 'default', sandbox('owner'));
    const m = new Manager({ client: env.client });
    const keys: string[] = [];
    const c = new Controller({
      name: 't',
      informer: m.informer(SBX),
      watches: [{ informer: m.informer(EVENTS), map: mapToControllerOwner('Sandbox') }],
      reconciler: async (k) => {
        keys.push(k.name);
        return done();
      },
    });
    m.add(c);
    const run = m.start(ac.signal);
    await eventually(() => keys.length === 1, 5000, 'initial');
    await env.client.create(EVENTS, 'default', {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: {
        name: 'owned',
        namespace: 'default',
        ownerReferences: [
          {
            apiVersion: 'fluxvm.dev/v1alpha1',
            kind: 'Sandbox',
            name: 'owner',
            uid: owner.metadata.uid!,
            controller: true,
          },
        ],
      },
      involvedObject: { kind: 'Sandbox', name: 'owner', namespace: 'default' },
      reason: 'Test',
      message: 'owned object',
    });
    await eventually(() => keys.length >= 2, 5000, 'owner enqueued');
    expect(keys.every((k) => k === 'owner')).to.equal(true);
    ac.abort();
    await run;
  });

  it('with leader election, only the manager holding the Lease runs its controllers; the other takes over', async () => {
    await env.client.create(SBX, 'default', sandbox('le'));
    const clock = new FakeClock();
    const mk = (identity: string) => {
      const m = new Manager({
        client: env.client,
        clock,
        leaderElection: {
          namespace: 'default',
          name: 'mgr',
          identity,
          leaseDurationMs: 1000,
          renewDeadlineMs: 600,
          retryPeriodMs: 100,
        },
      });
      const ran: string[] = [];
      m.add(
        new Controller({
          name: identity,
          informer: m.informer(SBX),
          reconciler: async (k) => (ran.push(k.name), done()),
        }),
      );
      const ac = new AbortController();
      return { m, ran, ac, run: m.start(ac.signal) };
    };
    const a = mk('a');
    await eventually(() => a.ran.length > 0, 5000, 'a reconciles');
    const b = mk('b');
    await eventually(() => b.m.hasSynced(), 5000, 'b synced');
    // Three lease durations pass on the fake clock, in renew-period steps; each step waits for
    // a's renew to land (the lease's renewTime is the fake now), so b never sees it expire.
    for (let i = 0; i < 30; i++) {
      await clock.advance(100);
      await eventually(
        async () => (await env.client.get<any>(leasesGVR, 'default', 'mgr')).spec.renewTime === microTime(clock.now()),
        5000,
        'a renewed',
      );
    }
    expect(b.ran).to.deep.equal([]);
    expect(a.m.elector!.isLeader()).to.equal(true);
    a.ac.abort();
    await a.run;
    await eventually(
      async () => {
        await clock.advance(100);
        return b.ran.includes('le');
      },
      5000,
      'b reconciles after a released the lease',
    );
    b.ac.abort();
    await b.run;
  });
});
