import fs from 'node:fs';
import { expect } from 'chai';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { LeaderElector, leasesGVR, microTime } from '../../../runtime/controller/leaderelection.js';
import { eventually, makeEnv, type Env } from './env.js';
import { loose } from '../../support/objects.js';

describe('runtime/controller leader election (real registry, Lease)', function () {
  this.timeout(20_000);
  let env: Env;
  let clock: FakeClock;
  beforeEach(() => {
    // The store's fsync runs inline here (as it did on the event loop before it moved to the
    // thread pool), so a write is visible within the fake instant it was made in: the bounds
    // below count fake time only, and a real fsync in flight while the fake clock moves on
    // would shift what a candidate observed by a retry period.
    env = makeEnv({ syncWAL: (fd, cb) => (fs.fsyncSync(fd), cb(null)) });
    clock = new FakeClock();
  });
  afterEach(() => env.close());

  /** Moves the fake clock one renew period; while `holder` leads, waits for its renew to land. */
  async function tick(holder?: string) {
    await clock.advance(100);
    if (!holder) return;
    await eventually(
      async () => {
        const l = await env.client.get<any>(leasesGVR, 'default', 'ctrl');
        return l.spec.holderIdentity === holder && l.spec.renewTime === microTime(clock.now());
      },
      5000,
      `${holder} renewed at the fake now`,
    );
  }

  function candidate(identity: string, opts: { releaseOnCancel?: boolean } = {}) {
    const state = { leading: false, terms: 0, stopped: 0 };
    const elector = new LeaderElector({
      client: env.client,
      namespace: 'default',
      name: 'ctrl',
      identity,
      leaseDurationMs: 1000,
      renewDeadlineMs: 600,
      retryPeriodMs: 100,
      releaseOnCancel: opts.releaseOnCancel,
      clock,
      onStartedLeading: (leading) => {
        state.leading = true;
        state.terms++;
        leading.addEventListener('abort', () => (state.leading = false));
      },
      onStoppedLeading: () => state.stopped++,
    });
    const ac = new AbortController();
    const run = elector.start(ac.signal);
    return { elector, state, ac, run };
  }

  it('one leader at a time; a released lease passes to the other candidate at once', async () => {
    const a = candidate('a');
    await eventually(() => a.state.leading, 5000, 'a leads');
    const b = candidate('b');
    for (let i = 0; i < 30; i++) await tick('a'); // three lease durations while a renews
    expect(b.state.leading).to.equal(false);
    expect(b.elector.getLeader()).to.equal('a');
    const lease = await env.client.get(leasesGVR, 'default', 'ctrl');
    expect(lease.spec).to.include({ holderIdentity: 'a', leaseDurationSeconds: 1, leaseTransitions: 0 });
    expect(loose(lease).spec.acquireTime).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    expect(Date.parse(loose(lease).spec.renewTime)).to.be.at.least(Date.parse(loose(lease).spec.acquireTime));
    const t0 = clock.now();
    a.ac.abort();
    await a.run;
    expect(a.state.stopped).to.equal(1);
    await eventually(async () => (await tick(), b.state.leading), 5000, 'b takes over');
    // b's next retry (100 ms + up to 20% jitter) finds the released lease: no lease duration waited.
    expect(clock.now() - t0).to.be.at.most(200, 'released, not expired');
    const after = await env.client.get(leasesGVR, 'default', 'ctrl');
    expect(after.spec).to.include({ holderIdentity: 'b', leaseTransitions: 1 });
    b.ac.abort();
    await b.run;
  });

  it('a leader that vanishes without releasing is replaced after the lease duration', async () => {
    const a = candidate('a', { releaseOnCancel: false });
    await eventually(() => a.state.leading, 5000, 'a leads');
    const b = candidate('b');
    for (let i = 0; i < 3; i++) await tick('a');
    a.ac.abort();
    await a.run;
    const t0 = clock.now();
    await eventually(async () => (await tick(), b.state.leading), 5000, 'b takes over');
    // a renewed last at t0; b observed that at most one retry (120 ms) later and waits a whole
    // lease duration (1000 ms) from then, on its own clock.
    expect(clock.now() - t0).to.be.within(1000, 1000 + 120 + 100, 'waited for expiry');
    expect(loose(await env.client.get(leasesGVR, 'default', 'ctrl')).spec.holderIdentity).to.equal('b');
    b.ac.abort();
    await b.run;
  });

  it('a leader whose lease is taken steps down', async () => {
    const a = candidate('a');
    await eventually(() => a.state.leading, 5000, 'a leads');
    const lease = await env.client.get(leasesGVR, 'default', 'ctrl');
    await env.client.update(leasesGVR, 'default', {
      ...lease,
      spec: { ...loose(lease).spec, holderIdentity: 'intruder', renewTime: new Date().toISOString() },
    });
    await eventually(async () => (await tick(), !a.state.leading), 5000, 'a steps down');
    expect(a.state.stopped).to.equal(1);
    a.ac.abort();
    await a.run;
  });
});
