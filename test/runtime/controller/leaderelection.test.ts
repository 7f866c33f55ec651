import { expect } from 'chai';
import { LeaderElector, leasesGVR } from '../../../runtime/controller/leaderelection.js';
import { eventually, makeEnv, type Env } from './env.js';

describe('runtime/controller leader election (real registry, Lease)', function () {
  this.timeout(20_000);
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

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
    await new Promise((r) => setTimeout(r, 400));
    expect(b.state.leading).to.equal(false);
    expect(b.elector.getLeader()).to.equal('a');
    const lease = await env.client.get(leasesGVR, 'default', 'ctrl');
    expect(lease.spec).to.include({ holderIdentity: 'a', leaseDurationSeconds: 1, leaseTransitions: 0 });
    expect(lease.spec.acquireTime).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    expect(Date.parse(lease.spec.renewTime)).to.be.at.least(Date.parse(lease.spec.acquireTime));
    const t0 = Date.now();
    a.ac.abort();
    await a.run;
    expect(a.state.stopped).to.equal(1);
    await eventually(() => b.state.leading, 5000, 'b takes over');
    expect(Date.now() - t0).to.be.below(900, 'released, not expired');
    const after = await env.client.get(leasesGVR, 'default', 'ctrl');
    expect(after.spec).to.include({ holderIdentity: 'b', leaseTransitions: 1 });
    b.ac.abort();
    await b.run;
  });

  it('a leader that vanishes without releasing is replaced after the lease duration', async () => {
    const a = candidate('a', { releaseOnCancel: false });
    await eventually(() => a.state.leading, 5000, 'a leads');
    const b = candidate('b');
    await new Promise((r) => setTimeout(r, 200));
    a.ac.abort();
    await a.run;
    const t0 = Date.now();
    await eventually(() => b.state.leading, 5000, 'b takes over');
    expect(Date.now() - t0).to.be.at.least(500, 'waited for expiry');
    expect((await env.client.get(leasesGVR, 'default', 'ctrl')).spec.holderIdentity).to.equal('b');
    b.ac.abort();
    await b.run;
  });

  it('a leader whose lease is taken steps down', async () => {
    const a = candidate('a');
    await eventually(() => a.state.leading, 5000, 'a leads');
    const lease = await env.client.get(leasesGVR, 'default', 'ctrl');
    await env.client.update(leasesGVR, 'default', { ...lease, spec: { ...lease.spec, holderIdentity: 'intruder', renewTime: new Date().toISOString() } });
    await eventually(() => !a.state.leading, 5000, 'a steps down');
    expect(a.state.stopped).to.equal(1);
    a.ac.abort();
    await a.run;
  });
});
