import { expect } from 'chai';
import { FakeClock, flushMicrotasks } from '../../../runtime/controller/clock.js';
import {
  BucketRateLimiter,
  ExponentialFailureRateLimiter,
  defaultControllerRateLimiter,
} from '../../../runtime/controller/ratelimiter.js';
import { WorkQueue } from '../../../runtime/controller/workqueue.js';

describe('runtime/controller workqueue', () => {
  it('de-duplicates a key while it waits', async () => {
    const q = new WorkQueue({ clock: new FakeClock() });
    q.add('a');
    q.add('b');
    q.add('a');
    expect(q.len()).to.equal(2);
    expect(await q.get()).to.equal('a');
    expect(await q.get()).to.equal('b');
    expect(q.len()).to.equal(0);
  });

  it('never hands out a key being processed; a re-add is processed after done()', async () => {
    const q = new WorkQueue({ clock: new FakeClock() });
    q.add('a');
    const k = await q.get();
    q.add('a');
    q.add('a');
    expect(q.len()).to.equal(0, 'not queued while processing');
    q.done(k!);
    expect(q.len()).to.equal(1);
    expect(await q.get()).to.equal('a');
    q.done('a');
    q.done('a'); // twice is harmless
    expect(q.len()).to.equal(0);
  });

  it('idle: nothing ready and nothing handed out; a delayed add is not counted until it is due', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ clock });
    expect(q.idle()).to.equal(true);
    q.add('a');
    expect(q.idle(), 'a key ready').to.equal(false);
    expect(await q.get()).to.equal('a');
    expect(q.idle(), 'a key handed out').to.equal(false);
    q.done('a');
    expect(q.idle()).to.equal(true);
    q.addAfter('b', 1000);
    expect(q.idle(), 'b not due yet').to.equal(true);
    await clock.advance(1000);
    expect(q.idle(), 'b due').to.equal(false);
  });

  it('addAfter delays, and the earliest deadline wins', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ clock });
    q.addAfter('a', 100);
    q.addAfter('a', 50);
    q.addAfter('a', 500);
    await clock.advance(49);
    expect(q.len()).to.equal(0);
    await clock.advance(1);
    expect(q.len()).to.equal(1);
    await clock.advance(1000);
    expect(q.len()).to.equal(1, 'later deadlines were dropped');
  });

  it('backs off per key exponentially from 5 ms to a 1000 s cap; forget resets', () => {
    const rl = new ExponentialFailureRateLimiter(5, 1000_000);
    const delays = Array.from({ length: 20 }, () => rl.when('a'));
    expect(delays.slice(0, 5)).to.deep.equal([5, 10, 20, 40, 80]);
    expect(delays[19]).to.equal(1000_000);
    expect(rl.when('b')).to.equal(5, 'per key');
    expect(rl.numRequeues('a')).to.equal(20);
    rl.forget('a');
    expect(rl.when('a')).to.equal(5);
    for (let i = 0; i < 200; i++) rl.when('c');
    expect(rl.when('c')).to.equal(1000_000, 'no overflow');
  });

  it('the global token bucket allows a burst of 100 then 10 per second', async () => {
    const clock = new FakeClock();
    const rl = new BucketRateLimiter(clock, 10, 100);
    const first = Array.from({ length: 100 }, (_, i) => rl.when(`k${i}`));
    expect(first.every((d) => d === 0)).to.equal(true);
    expect(rl.when('x')).to.equal(100);
    expect(rl.when('y')).to.equal(200);
    await clock.advance(1000);
    // 10 tokens refilled, 2 owed: 8 free before a delay again
    const after = Array.from({ length: 9 }, (_, i) => rl.when(`z${i}`));
    expect(after.slice(0, 8).every((d) => d === 0)).to.equal(true);
    expect(after[8]).to.equal(100);
  });

  it('addRateLimited uses the max of both limiters', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ clock, rateLimiter: defaultControllerRateLimiter(clock) });
    q.addRateLimited('a');
    expect(q.len()).to.equal(0);
    await clock.advance(5);
    expect(q.len()).to.equal(1);
    await q.get();
    q.done('a');
    q.addRateLimited('a');
    await clock.advance(9);
    expect(q.len()).to.equal(0);
    await clock.advance(1);
    expect(q.len()).to.equal(1);
    expect(q.numRequeues('a')).to.equal(2);
    q.forget('a');
    expect(q.numRequeues('a')).to.equal(0);
  });

  it('run() processes with bounded concurrency and never one key twice at once', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ clock });
    const ac = new AbortController();
    const active = new Set<string>();
    let maxActive = 0;
    let overlap = false;
    const processed: string[] = [];
    const gates: (() => void)[] = [];
    const run = q.run(
      async (k) => {
        if (active.has(k)) overlap = true;
        active.add(k);
        maxActive = Math.max(maxActive, active.size);
        await new Promise<void>((r) => gates.push(r));
        active.delete(k);
        processed.push(k);
      },
      { concurrency: 2, signal: ac.signal },
    );
    for (const k of ['a', 'b', 'c', 'a']) q.add(k);
    await flushMicrotasks();
    expect(active.size).to.equal(2);
    q.add('a'); // while a is in flight: processed again afterwards
    while (gates.length) {
      gates.shift()!();
      await flushMicrotasks();
    }
    await flushMicrotasks();
    while (gates.length) {
      gates.shift()!();
      await flushMicrotasks();
    }
    expect(overlap).to.equal(false);
    expect(maxActive).to.equal(2);
    expect(processed.sort()).to.deep.equal(['a', 'a', 'b', 'c']);
    ac.abort();
    await run;
    expect(q.isShuttingDown).to.equal(true);
  });

  it('shutDown wakes waiting getters and drops delayed adds', async () => {
    const clock = new FakeClock();
    const q = new WorkQueue({ clock });
    const p = q.get();
    q.addAfter('a', 10);
    q.shutDown();
    expect(await p).to.equal(undefined);
    await clock.advance(100);
    expect(q.len()).to.equal(0);
    q.add('b');
    expect(q.len()).to.equal(0);
  });

  it('a pass woken inside a microtask drain (a commit fanning out) starts after the process.nextTick work of that turn', async () => {
    // Node's HTTP layer flushes a response in process.nextTick (it uncorks the socket), which runs
    // only once the microtask drain is over. A store commit fans out to the informers inside
    // that drain: a pass started there ran its synchronous part before the response of the very
    // request whose write woke it left the server.
    const q = new WorkQueue({ clock: new FakeClock() });
    const ac = new AbortController();
    let tickRan = false;
    let tickRanAtStart: boolean | undefined;
    const started = new Promise<void>((resolve) => {
      void q.run(
        async () => {
          tickRanAtStart = tickRan;
          resolve();
        },
        { concurrency: 2, signal: ac.signal },
      );
    });
    await Promise.resolve().then(() => {
      q.add('woken');
      process.nextTick(() => (tickRan = true));
    });
    await started;
    ac.abort();
    expect(tickRanAtStart, 'the nextTick queued beside the add ran before the pass started').to.equal(true);
  });
});
