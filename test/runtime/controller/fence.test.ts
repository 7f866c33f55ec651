// A paused leader does not act after losing its Lease, in process with
// FakeClocks: leader A's clock jumps past its renew deadline without firing its timers (what a
// SIGSTOPped process sees when it wakes: its I/O callbacks run before its due timers), B takes
// the Lease meanwhile, and a watch event then runs A's reconcile: its write is refused by the
// fence, the term ends on the spot, and the object carries nothing of A.
import { expect } from 'chai';
import { sandbox as sandboxKind } from '../../../apis/sandbox.js';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { fenceWrites, isNotLeader } from '../../../runtime/controller/fence.js';
import { LeaderElector, leasesGVR } from '../../../runtime/controller/leaderelection.js';
import { done, Manager } from '../../../runtime/controller/index.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { eventually, makeEnv, SBX, sandbox, type Env } from './env.js';

/** A FakeClock whose now() can jump ahead without firing the timers due meanwhile (a stopped process). */
class PausableClock extends FakeClock {
  skew = 0;
  override now(): number {
    return super.now() + this.skew;
  }
}

const LEASE = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 };

describe('runtime/controller fencing: a paused leader does not act after losing the Lease (FakeClock)', function () {
  this.timeout(20_000);
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('a leader frozen past its renew deadline, woken by a watch event after B took the Lease, writes nothing and stops', async () => {
    const clockA = new PausableClock();
    let lost = 0;
    const attempts: string[] = [];
    const refused: string[] = [];
    const m = new Manager({
      client: env.client,
      clock: clockA,
      onLostLeadership: () => lost++,
      leaderElection: { namespace: 'default', name: 'fenced', identity: 'a', ...LEASE },
    });
    const { controller } = m.controllerFor(sandboxKind).complete((c) => ({
      async reconcile(key) {
        if (c.informer.cache.get(key.namespace, key.name)?.metadata.annotations?.['test.fluxvm.dev/touched-by'])
          return done();
        attempts.push(key.name);
        try {
          await c.client.patch(SBX, key.namespace, key.name, 'merge', {
            metadata: { annotations: { 'test.fluxvm.dev/touched-by': 'a' } },
          });
        } catch (e) {
          if (isNotLeader(e)) refused.push(key.name);
          throw e;
        }
        return done();
      },
    }));
    const ac = new AbortController();
    const run = m.start(ac.signal);
    await eventually(() => m.elector?.isLeader() === true, 5000, 'a leads');

    // A acts while it leads.
    await env.client.create(SBX, 'default', sandbox('before'));
    await eventually(
      async () =>
        (await env.client.get<KubeObject>(SBX, 'default', 'before')).metadata.annotations?.[
          'test.fluxvm.dev/touched-by'
        ],
      5000,
      'a to touch "before"',
    );

    // A is stopped: its clock moves 20 s (past renewDeadline and leaseDuration), no timer of it fires.
    clockA.skew += 20_000;
    // B, with a clock of its own, sees the lease unchanged for leaseDuration and takes it.
    const clockB = new FakeClock();
    const b = new LeaderElector({
      client: env.client,
      namespace: 'default',
      name: 'fenced',
      identity: 'b',
      clock: clockB,
      ...LEASE,
      onStartedLeading: () => undefined,
    });
    const acB = new AbortController();
    const runB = b.start(acB.signal);
    for (let i = 0; i < 12 && !b.isLeader(); i++) {
      // Each attempt reads the lease through the API; advance only once B sleeps between attempts.
      await eventually(() => b.isLeader() || clockB.pending() > 0, 5000, 'b to wait for its next attempt');
      if (!b.isLeader()) await clockB.advance(2_500);
    }
    expect(b.isLeader()).to.equal(true, 'b took the lease');
    const lease = await env.client.get<KubeObject & { spec: { holderIdentity: string } }>(
      leasesGVR,
      'default',
      'fenced',
    );
    expect(lease.spec.holderIdentity).to.equal('b');

    // A wakes to a watch event (its I/O runs first): the reconcile runs, its write is refused.
    await env.client.create(SBX, 'default', sandbox('after'));
    await eventually(() => lost === 1, 5000, "a's term to end at its first write");
    expect(attempts).to.include('after');
    expect(refused).to.deep.equal(['after']);
    expect(m.fencedWrites).to.equal(1);
    expect(m.elector!.isLeader()).to.equal(false);
    const after = await env.client.get<KubeObject>(SBX, 'default', 'after');
    expect(after.metadata.annotations ?? {}).to.not.have.property('test.fluxvm.dev/touched-by');
    // The queue shut down with the term (synchronously, on the term's abort): nothing more is dequeued.
    expect(controller.queue.isShuttingDown).to.equal(true);
    await env.client.create(SBX, 'default', sandbox('later'));
    expect(controller.queue.len()).to.equal(0);
    expect(attempts).to.not.include('later');

    ac.abort();
    acB.abort();
    await Promise.all([run, runB]);
  });

  it('fenceWrites refuses every write verb, before sending, and passes reads', async () => {
    let leading = true;
    const sent: string[] = [];
    const spy = Object.create(env.client) as typeof env.client;
    for (const v of ['create', 'update', 'updateStatus', 'patch', 'delete'] as const) {
      const orig = env.client[v].bind(env.client) as (...a: unknown[]) => Promise<KubeObject>;
      (spy as unknown as Record<string, unknown>)[v] = (...a: unknown[]) => (sent.push(v), orig(...a));
    }
    const c = fenceWrites(spy, { leading: () => leading });
    await c.create(SBX, 'default', sandbox('x'));
    leading = false;
    const x = await c.get<KubeObject>(SBX, 'default', 'x');
    const tries: Array<[string, () => Promise<unknown>]> = [
      ['create', () => c.create(SBX, 'default', sandbox('y'))],
      ['update', () => c.update(SBX, 'default', x)],
      ['updateStatus', () => c.updateStatus(SBX, 'default', x)],
      ['patch', () => c.patch(SBX, 'default', 'x', 'merge', { metadata: { labels: { a: 'b' } } })],
      ['delete', () => c.delete(SBX, 'default', 'x')],
    ];
    for (const [verb, f] of tries) {
      const err = await f().then(
        () => undefined,
        (e: Error) => e,
      );
      expect(isNotLeader(err), verb).to.equal(true);
    }
    expect(sent).to.deep.equal(['create']);
    expect((await c.list(SBX, 'default')).items.map((o) => o.metadata.name)).to.deep.equal(['x']);
  });
});
