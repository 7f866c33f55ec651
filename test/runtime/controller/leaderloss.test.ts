// Leadership ends at renewDeadline even when the renew never returns, and the manager calls
// onLostLeadership at that instant (fluxctl controller exits there); the manager's cache sync
// is bounded and names the resource that never synced. Injected FakeClock, no sleeps.
import { expect } from 'chai';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { LeaderElector } from '../../../runtime/controller/leaderelection.js';
import { Manager } from '../../../runtime/controller/manager.js';
import type { Client } from '../../../runtime/client/client.js';
import { eventually, makeEnv, type Env } from './env.js';

/** The real client whose update() hangs forever once `hang` is set (an API server that stopped answering). */
function hangingUpdates(inner: Client): Client & { hang: boolean } {
  const c = Object.create(inner) as Client & { hang: boolean };
  c.hang = false;
  c.update = ((...a: Parameters<Client['update']>) =>
    c.hang ? new Promise(() => undefined) : inner.update(...a)) as Client['update'];
  return c;
}

describe('runtime/controller leadership loss and cache sync timeout (FakeClock)', function () {
  this.timeout(20_000);
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('a renew that hangs ends the term exactly at renewDeadline; isLeader() is false from then on', async () => {
    const clock = new FakeClock();
    const client = hangingUpdates(env.client);
    let lostAt: number | undefined;
    const el = new LeaderElector({
      client,
      namespace: 'default',
      name: 'hang',
      identity: 'a',
      clock,
      leaseDurationMs: 15_000,
      renewDeadlineMs: 10_000,
      retryPeriodMs: 2_000,
      onStartedLeading: (leading) => leading.addEventListener('abort', () => (lostAt = clock.now())),
    });
    const ac = new AbortController();
    void el.start(ac.signal);
    await eventually(() => el.isLeader(), 5000, 'a leads');
    const t0 = clock.now();
    client.hang = true;
    await clock.advance(9_999); // the first renew (at +2 s) never returns
    expect(el.isLeader()).to.equal(true);
    expect(lostAt).to.equal(undefined);
    await clock.advance(1);
    expect(el.isLeader()).to.equal(false);
    expect(lostAt! - t0).to.equal(10_000);
    ac.abort();
  });

  it('a renew whose GET answers after the term ended (the process was stopped meanwhile) writes nothing', async () => {
    const clock = new FakeClock();
    const held: Array<() => void> = [];
    let hold = false;
    let updates = 0;
    const client = Object.create(env.client) as Client;
    client.get = ((...a: Parameters<Client['get']>) =>
      hold ? new Promise((res) => held.push(() => res(env.client.get(...a)))) : env.client.get(...a)) as Client['get'];
    client.update = ((...a: Parameters<Client['update']>) => (updates++, env.client.update(...a))) as Client['update'];
    const el = new LeaderElector({
      client,
      namespace: 'default',
      name: 'late-get',
      identity: 'a',
      clock,
      leaseDurationMs: 15_000,
      renewDeadlineMs: 10_000,
      retryPeriodMs: 2_000,
      releaseOnCancel: false,
      onStartedLeading: () => undefined,
    });
    const ac = new AbortController();
    void el.start(ac.signal);
    await eventually(() => el.isLeader(), 5000, 'a leads');
    hold = true;
    await clock.advance(2_000); // the renew's GET is sent and waits
    await eventually(() => held.length === 1, 5000, 'the renew GET in flight');
    const before = updates;
    await clock.advance(8_000); // the deadline: the term ends while the GET waits
    expect(el.isLeader()).to.equal(false);
    // Stopped as fluxctl controller stops when its term ends (it exits): no campaign follows,
    // so a write from here on can only be the renew the late GET was for.
    ac.abort();
    hold = false;
    held.shift()!();
    for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
    expect(updates - before, 'lease writes after the term ended').to.equal(0);
  });

  it('the manager calls onLostLeadership when the term ends, not when it is stopped', async () => {
    const clock = new FakeClock();
    const client = hangingUpdates(env.client);
    let lost = 0;
    let running = 0;
    const mk = () =>
      new Manager({
        client,
        clock,
        onLostLeadership: () => lost++,
        leaderElection: {
          namespace: 'default',
          name: 'mgr',
          identity: 'm',
          leaseDurationMs: 15_000,
          renewDeadlineMs: 10_000,
          retryPeriodMs: 2_000,
        },
      });
    const m = mk();
    m.add({
      name: 'probe',
      start: (s) =>
        new Promise<void>((r) => (running++, s.addEventListener('abort', () => (running--, r()), { once: true }))),
    });
    const ac = new AbortController();
    void m.start(ac.signal);
    await eventually(() => running === 1, 5000, 'runnable started under the lease');
    client.hang = true;
    await clock.advance(10_000);
    expect(lost).to.equal(1);
    expect(running).to.equal(0, 'the runnable was stopped with the term');
    ac.abort();

    // A graceful stop is not a loss.
    client.hang = false;
    const m2 = new Manager({
      client,
      clock,
      onLostLeadership: () => lost++,
      leaderElection: { namespace: 'default', name: 'mgr2', identity: 'm2' },
    });
    const ac2 = new AbortController();
    const run2 = m2.start(ac2.signal);
    await eventually(() => m2.elector?.isLeader() === true, 5000, 'm2 leads');
    ac2.abort();
    await run2;
    expect(lost).to.equal(1);
  });

  it('cache sync times out with an error naming the resource that never synced', async () => {
    const clock = new FakeClock();
    const m = new Manager({ client: env.client, clock, cacheSyncTimeoutMs: 30_000 });
    m.informer({ group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' });
    m.informer({ group: 'nothing.example.dev', version: 'v1', resource: 'widgets' }, { namespace: 'team-a' });
    let err: Error | undefined;
    const run = m.start(new AbortController().signal).catch((e: Error) => (err = e));
    await clock.advance(29_999);
    expect(err).to.equal(undefined);
    await clock.advance(1);
    await run;
    expect(err?.message).to.equal(
      'timed out after 30000 ms waiting for the informer caches to sync: widgets.nothing.example.dev/v1 (namespace team-a) never listed',
    );
  });
});
