// writeStatus against a real registry over SQLite: the precondition is real (a stale object
// answers 409), and a conflict is answered by re-reading and re-applying the mutation, so a
// concurrent writer's change survives next to ours.
import { expect } from 'chai';
import type { Sandbox } from '../../../apis/zz_generated.types.js';
import { setCondition } from '../../../runtime/controller/conditions.js';
import { FakeClock } from '../../../runtime/controller/clock.js';
import { Informer } from '../../../runtime/controller/informer.js';
import { cachedGet, OwnWrites, primaryGet } from '../../../runtime/controller/read.js';
import { MAX_STATUS_ATTEMPTS, writeStatus } from '../../../runtime/controller/status.js';
import { isConflict, isNotFound } from '../../../runtime/meta/errors.js';
import type { GVR, KubeObject } from '../../../runtime/meta/types.js';
import { makeEnv, SBX, sandbox, type Env } from './env.js';
import { gc } from '../../support/gc.js';

const T0 = Date.parse('2026-01-01T00:00:00Z');

describe('runtime/controller writeStatus (real registry)', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  const get = () => env.client.get<Sandbox>(SBX, 'default', 's');
  const withPhase = (phase: 'Running' | 'Starting') => (cur: Sandbox) => ({ ...(cur.status ?? {}), phase: phase });

  it('writes the mutation of the object it was given and returns what is stored', async () => {
    const created = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    const seen: (string | undefined)[] = [];
    const out = await writeStatus(env.client, SBX, created, (cur) => {
      seen.push(cur.metadata.resourceVersion);
      return { ...(cur.status ?? {}), phase: 'Starting' as const };
    });
    expect(seen).to.deep.equal([created.metadata.resourceVersion]);
    expect(out.status?.phase).to.equal('Starting');
    expect((await get()).status?.phase).to.equal('Starting');
    expect(out.metadata.resourceVersion).to.equal((await get()).metadata.resourceVersion);
  });

  it('a stale object is refused by the registry (the precondition is real)', async () => {
    const stale = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    await env.client.patch(SBX, 'default', 's', 'merge', { metadata: { labels: { other: 'writer' } } });
    const err = await writeStatus(env.client, SBX, stale, withPhase('Running'), { attempts: 1 }).catch((e) => e);
    expect(isConflict(err), String(err)).to.equal(true);
    expect((await get()).status?.phase).to.equal(undefined);
  });

  it('a writer that bumped the object in between: re-read, the mutation re-applied, its change survives', async () => {
    const stale = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    // The other writer: a label (metadata) and a condition (status), after our read.
    await env.client.patch(SBX, 'default', 's', 'merge', { metadata: { labels: { other: 'writer' } } });
    const bumped = await get();
    await env.client.updateStatus<Sandbox>(SBX, 'default', {
      ...bumped,
      status: {
        conditions: setCondition(undefined, { type: 'Other', status: 'True', reason: 'ByTheOtherWriter' }, T0),
      },
    });
    const seen: (string | undefined)[] = [];
    const out = await writeStatus(env.client, SBX, stale, (cur) => {
      seen.push(cur.metadata.resourceVersion);
      return {
        ...(cur.status ?? {}),
        phase: 'Running' as const,
        conditions: setCondition(cur.status?.conditions, { type: 'Ready', status: 'True', reason: 'Running' }, T0),
      };
    });
    const stored = await get();
    expect(seen).to.have.length(2);
    expect(seen[0]).to.equal(stale.metadata.resourceVersion);
    expect(seen[1]).to.not.equal(stale.metadata.resourceVersion);
    expect(stored.metadata.labels).to.deep.equal({ other: 'writer' });
    expect(stored.status?.phase).to.equal('Running');
    expect(stored.status?.conditions?.map((c) => `${c.type}=${c.reason}`)).to.deep.equal([
      'Other=ByTheOtherWriter',
      'Ready=Running',
    ]);
    expect(out.metadata.resourceVersion).to.equal(stored.metadata.resourceVersion);
  });

  it('a writer landing between the mutation and the PUT is seen on the next round, never overwritten', async () => {
    const first = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    // The real client, with the other writer's status write landing just before our first PUT.
    const racing = Object.create(env.client) as typeof env.client;
    let puts = 0;
    racing.updateStatus = async (gvr, ns, obj, opts) => {
      if (puts++ === 0) {
        await env.client.patch(
          SBX,
          'default',
          's',
          'merge',
          { metadata: { resourceVersion: obj.metadata.resourceVersion }, status: { phase: 'Starting' as const } },
          { subresource: 'status' },
        );
      }
      return env.client.updateStatus(gvr, ns, obj, opts);
    };
    let rounds = 0;
    await writeStatus(racing, SBX, first, (cur) => {
      rounds++;
      return {
        ...(cur.status ?? {}),
        conditions: setCondition(
          cur.status?.conditions,
          { type: 'Mine', status: 'True', reason: `Round${rounds}` },
          T0,
        ),
      };
    });
    const stored = await get();
    expect(rounds).to.equal(2);
    expect(puts).to.equal(2);
    expect(stored.status?.phase).to.equal('Starting');
    // (The registry may have set an initial Reconciling condition at create: only ours are looked at.)
    expect(
      stored.status?.conditions?.filter((c) => c.type === 'Mine').map((c) => `${c.type}=${c.reason}`),
    ).to.deep.equal(['Mine=Round2']);
  });

  it('a write staged but not yet committed (a re-read still shows the conflicting version): waits for its event, then re-applies', async () => {
    const first = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    // Not awaited: the store stages it at once (the precondition sees it), reads see it once committed.
    const other = env.client.patch(SBX, 'default', 's', 'merge', { metadata: { labels: { other: 'writer' } } });
    const seen: (string | undefined)[] = [];
    const out = await writeStatus(env.client, SBX, first, (cur) => {
      seen.push(cur.metadata.resourceVersion);
      return { ...(cur.status ?? {}), phase: 'Running' as const };
    });
    await other;
    const stored = await get();
    expect(stored.metadata.labels).to.deep.equal({ other: 'writer' });
    expect(stored.status?.phase).to.equal('Running');
    expect(out.metadata.resourceVersion).to.equal(stored.metadata.resourceVersion);
    expect(new Set(seen).size, 'the mutation saw the newer version').to.equal(seen.length);
  });

  it('gives up after MAX_STATUS_ATTEMPTS conflicts with the Conflict, and nothing of ours is stored', async () => {
    const first = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    // Every PUT is preceded by another writer's label change: each round is stale.
    const busy = Object.create(env.client) as typeof env.client;
    let n = 0;
    busy.updateStatus = async (gvr, ns, obj, opts) => {
      await env.client.patch(SBX, 'default', 's', 'merge', { metadata: { labels: { bump: String(n++) } } });
      return env.client.updateStatus(gvr, ns, obj, opts);
    };
    let calls = 0;
    const err = await writeStatus(busy, SBX, first, (cur) => {
      calls++;
      return { ...(cur.status ?? {}), phase: 'Running' as const };
    }).catch((e) => e);
    expect(isConflict(err), String(err)).to.equal(true);
    expect(calls).to.equal(MAX_STATUS_ATTEMPTS);
    expect((await get()).status?.phase).to.equal(undefined);
  });

  it('undefined from the mutation writes nothing; a deleted object is NotFound at once', async () => {
    const first = await env.client.create<Sandbox>(SBX, 'default', sandbox('s') as Sandbox);
    const out = await writeStatus(env.client, SBX, first, () => undefined);
    expect(out.metadata.resourceVersion).to.equal(first.metadata.resourceVersion);
    expect((await get()).metadata.resourceVersion).to.equal(first.metadata.resourceVersion);
    await env.client.delete(SBX, 'default', 's');
    let calls = 0;
    const err = await writeStatus(
      env.client,
      SBX,
      first,
      (cur) => (calls++, { ...(cur.status ?? {}), phase: 'Running' as const }),
    ).catch((e) => e);
    expect(isNotFound(err), String(err)).to.equal(true);
    expect(calls).to.equal(1);
  });
});

describe('runtime/controller cachedGet, primaryGet and OwnWrites (real registry and informer)', () => {
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

  it('a hit comes from the synced cache (no API read); a miss, or no sync yet, reads the API; absent is undefined', async () => {
    await env.client.create<Sandbox>(SBX, 'default', sandbox('a') as Sandbox);
    const inf = new Informer<Sandbox>({ client: env.client, gvr: SBX });
    // Not synced: the API answers.
    expect((await cachedGet(env.client, SBX, 'default', 'a', inf))?.metadata.name).to.equal('a');
    void inf.start(ac.signal);
    expect(await inf.waitForSync(ac.signal)).to.equal(true);
    // Counting client: every API get is seen.
    const { gets, counting } = countingGets(env);
    const hit = await cachedGet(counting, SBX, 'default', 'a', inf);
    expect(hit).to.equal(inf.cache.get('default', 'a'));
    expect(gets).to.deep.equal([]);
    // Created after the cache was filled and not in it yet: a miss goes to the API, never "absent".
    const b = await env.client.create<Sandbox>(SBX, 'default', sandbox('b') as Sandbox);
    inf.cache.delete(b);
    expect((await cachedGet(counting, SBX, 'default', 'b', inf))?.metadata.uid).to.equal(b.metadata.uid);
    expect(await cachedGet(counting, SBX, 'default', 'nope', inf)).to.equal(undefined);
    expect(await cachedGet(counting, SBX, 'default', 'a')).to.not.equal(undefined);
    expect(gets).to.deep.equal(['b', 'nope', 'a']);
  });

  it("a pass reads its object from the cache (a copy it may change) unless the cache is behind its own last write; then that write's answer, with no API read", async () => {
    await env.client.create<Sandbox>(SBX, 'default', sandbox('a') as Sandbox);
    const inf = new Informer<Sandbox>({ client: env.client, gvr: SBX });
    const stop = new AbortController();
    void inf.start(stop.signal);
    expect(await inf.waitForSync(ac.signal)).to.equal(true);
    const { gets, counting } = countingGets(env);
    const writes = new OwnWrites();
    const client = writes.wrap(counting);
    const key = { namespace: 'default', name: 'a' };

    const first = (await primaryGet<Sandbox>(client, SBX, key, inf, writes))!;
    expect(gets).to.deep.equal([]);
    expect(first).to.deep.equal(inf.cache.get('default', 'a'));
    (first.metadata.labels ??= {}).changed = 'by the pass';
    expect(inf.cache.get('default', 'a')!.metadata.labels?.changed).to.equal(undefined);

    // The informer stops here, so it never sees the write below: the cache stays one write behind.
    stop.abort();
    const written = await client.updateStatus<Sandbox>(SBX, 'default', {
      ...inf.cache.get('default', 'a')!,
      status: { phase: 'Running' },
    } as Sandbox);
    const read = (await primaryGet<Sandbox>(client, SBX, key, inf, writes))!;
    // The write's answer stands in for the lagging cache: no round trip to the API server.
    expect(gets).to.deep.equal([]);
    expect(read.metadata.resourceVersion).to.equal(written.metadata.resourceVersion);
    expect(read.status?.phase).to.equal('Running');
    (read.metadata.labels ??= {}).changed = 'by the pass';
    expect((await primaryGet<Sandbox>(client, SBX, key, inf, writes))!.metadata.labels?.changed).to.equal(undefined);
    // Without its writes noted, the same read would have taken the stale copy.
    expect((await primaryGet<Sandbox>(client, SBX, key, inf))!.status?.phase).to.equal(undefined);

    // A kept answer is used only for a while after its write; then the API answers.
    const realNow = Date.now;
    try {
      Date.now = () => realNow() + OwnWrites.KEEP_ANSWER_MS + 1;
      expect((await primaryGet<Sandbox>(client, SBX, key, inf, writes))!.status?.phase).to.equal('Running');
    } finally {
      Date.now = realNow;
    }
    expect(gets).to.deep.equal(['a']);

    // Once the cache holds the write (or a newer version), the cache answers again.
    inf.cache.set(written);
    const caught = (await primaryGet<Sandbox>(client, SBX, key, inf, writes))!;
    expect(caught.status?.phase).to.equal('Running');
    expect(gets).to.deep.equal(['a']);
    // A miss is never "absent".
    expect(await primaryGet<Sandbox>(client, SBX, { namespace: 'default', name: 'nope' }, inf, writes)).to.equal(
      undefined,
    );
    expect(gets).to.deep.equal(['a', 'nope']);

    // A delete's answer is never kept (the object may be gone): behind the delete, the API answers.
    await client.delete(SBX, 'default', 'a');
    expect(await primaryGet<Sandbox>(client, SBX, key, inf, writes)).to.equal(undefined);
    expect(gets).to.deep.equal(['a', 'nope', 'a']);
  });
});

describe('runtime/controller OwnWrites holds only writes in flight', () => {
  const EV: GVR = { group: '', version: 'v1', resource: 'events' };
  const obj = (i: number, rv: number) =>
    ({
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { namespace: 'default', name: `e${i}`, resourceVersion: String(rv) },
    }) as KubeObject;

  it('an answer goes after KEEP_ANSWER_MS and a write no pass reads back after FORGET_MS (10,000 writes: none left)', async () => {
    const clock = new FakeClock(1_000_000);
    const writes = new OwnWrites(clock);
    for (let i = 0; i < 10_000; i++) writes.record(EV, obj(i, i + 1), true);
    expect(writes.size).to.deep.equal({ writes: 10_000, answers: 10_000 });
    // Within the window the answer stands in for a lagging cache.
    expect(writes.newer(EV, obj(5, 1))?.metadata.resourceVersion).to.equal('6');
    await clock.advance(OwnWrites.KEEP_ANSWER_MS);
    expect(writes.size.answers, 'at the edge: kept').to.equal(10_000);
    await clock.advance(1);
    expect(writes.size).to.deep.equal({ writes: 10_000, answers: 0 });
    // Still remembered: the API must answer (null), not the stale copy.
    expect(writes.newer(EV, obj(5, 1))).to.equal(null);
    // A later write of one object moves it to the end: it outlives the others.
    writes.record(EV, obj(7, 20_000), true);
    await clock.advance(OwnWrites.FORGET_MS - OwnWrites.KEEP_ANSWER_MS - 1);
    expect(writes.size.writes, 'at the edge: remembered').to.equal(10_000);
    await clock.advance(1);
    expect(writes.size).to.deep.equal({ writes: 1, answers: 0 });
    expect(writes.newer(EV, obj(5, 1)), 'forgotten').to.equal(undefined);
    expect(writes.newer(EV, obj(7, 1))).to.equal(null);
    await clock.advance(OwnWrites.FORGET_MS);
    expect(writes.size).to.deep.equal({ writes: 0, answers: 0 });
  });

  it('a controller gone idle lets go of its answers too: nothing but the clock runs, and the answer is collected', async () => {
    const clock = new FakeClock(1_000_000);
    const writes = new OwnWrites(clock);
    // The answer is reachable only through OwnWrites (and the WeakRef, which does not hold it).
    const held = (() => {
      const answer = obj(1, 2);
      writes.record(EV, answer, true);
      return new WeakRef(answer);
    })();
    // A WeakRef's target stays alive until the end of the job that made or read it: the GC runs
    // in a job of its own, the check in the next.
    const tick = () => new Promise((r) => setImmediate(r));
    const collected = async () => {
      await tick();
      gc();
      await tick();
      return held.deref() === undefined;
    };
    expect(await collected(), 'kept while it may stand in for the cache').to.equal(false);
    await clock.advance(OwnWrites.KEEP_ANSWER_MS + 1);
    for (let n = 1; !(await collected()); n++) {
      if (n > 20) throw new Error('the answer is still held 10 s after its write, with no call since (20 GCs)');
    }
  });
});

/** A client whose API gets are listed (names), to tell cache answers from API reads. */
function countingGets(env: Env): { gets: string[]; counting: Env['client'] } {
  const gets: string[] = [];
  const counting = Object.create(env.client) as Env['client'];
  counting.get = (async (gvr: GVR, ns: string | undefined, name: string) => {
    gets.push(name);
    return env.client.get(gvr, ns, name);
  }) as Env['client']['get'];
  return { gets, counting };
}
