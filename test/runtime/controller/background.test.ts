// BackgroundWork (runtime/controller/background.ts): tracked background work by uid, whose end
// enqueues the key; outcomes handed to the next pass once; drain() and drainOnStop for a stop.
import { expect } from 'chai';
import { BackgroundWork, drainOnStop, type ObjectKey } from '../../../runtime/controller/index.js';

/** A promise the test settles by hand. */
function deferred<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

describe('BackgroundWork', () => {
  const key: ObjectKey = { namespace: 'default', name: 'a' };

  it('one work per uid; its end enqueues the key; the value is kept (keepValues) and taken once', async () => {
    const settled: ObjectKey[] = [];
    let notify!: () => void;
    const w = new BackgroundWork<number>((k) => (settled.push(k), notify?.()), { keepValues: true });
    const d = deferred<number>();
    expect(w.start('u1', key, () => d.promise)).to.equal(true);
    expect(
      w.start('u1', key, () => Promise.resolve(2)),
      'a second start for a running uid',
    ).to.equal(false);
    expect(w.has('u1')).to.equal(true);
    expect(w.size).to.equal(1);
    expect(w.take('u1'), 'nothing while it runs').to.equal(undefined);
    const ended = new Promise<void>((r) => (notify = r));
    d.resolve(7);
    await ended;
    expect(settled).to.deep.equal([key]);
    expect(w.has('u1')).to.equal(false);
    expect(w.take('u1')).to.deep.equal({ ok: true, value: 7 });
    expect(w.take('u1'), 'taken once').to.equal(undefined);
  });

  it('a thrown error is kept for the next pass (takeError), a value is not without keepValues; forget drops an outcome', async () => {
    const w = new BackgroundWork<unknown>();
    w.start('bad', key, () => Promise.reject(new Error('boom')));
    w.start('good', key, async () => 42);
    await w.drain();
    expect(w.take('good')).to.equal(undefined);
    const e = w.takeError('bad');
    expect((e?.error as Error).message).to.equal('boom');
    expect(w.takeError('bad')).to.equal(undefined);
    w.start('gone', key, () => Promise.reject(new Error('x')));
    await w.drain();
    w.forget('gone');
    expect(w.take('gone')).to.equal(undefined);
    // A new start drops the outcome the last work of that uid left.
    const kept = new BackgroundWork<number>(undefined, { keepValues: true });
    kept.start('u', key, async () => 1);
    await kept.drain();
    const d = deferred<number>();
    kept.start('u', key, () => d.promise);
    d.resolve(2);
    await kept.drain();
    expect(kept.take('u')).to.deep.equal({ ok: true, value: 2 });
  });

  it('drain() waits for the work in flight, work started meanwhile included; drainOnStop waits for the stop, then drains', async () => {
    const w = new BackgroundWork<void>();
    const first = deferred();
    const second = deferred();
    w.start('a', key, () => first.promise);
    let drained = false;
    const draining = w.drain().then(() => (drained = true));
    // The first work starts a second one before it ends: drain waits for that too.
    first.promise.then(() => w.start('b', key, () => second.promise));
    first.resolve();
    while (w.has('a')) await Promise.resolve();
    await new Promise((r) => setImmediate(r)); // every microtask of a's end has run
    expect(w.has('b')).to.equal(true);
    expect(drained, 'b still runs').to.equal(false);
    second.resolve();
    await draining;
    expect(w.size).to.equal(0);

    const held = deferred();
    w.start('c', key, () => held.promise);
    const ac = new AbortController();
    let stopped = false;
    const r = drainOnStop('work', () => w.drain());
    expect(r.name).to.equal('work');
    const run = r.start(ac.signal).then(() => (stopped = true));
    await new Promise((res) => setImmediate(res));
    expect(stopped, 'runs until the stop').to.equal(false);
    ac.abort();
    await new Promise((r) => setImmediate(r));
    expect(stopped, 'waits for the work after the stop').to.equal(false);
    held.resolve();
    await run;
    expect(stopped).to.equal(true);
  });
});
