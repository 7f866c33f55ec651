// The diff worker pool: big diffs are computed off the event loop, each job is
// bounded (heap limit, deadline), the queue is bounded, and the pool survives a killed worker.
// Real worker threads (started through tsx here, as diff-worker.js when compiled).
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { DiffPool, DiffPoolBusy } from '../../../controllers/changeset/diffpool.js';
import { DIFF_LIMITS, fileDiff } from '../../../controllers/changeset/unidiff.js';
import { skipWith } from '../../skip.js';
import { lockFile, PeakRss, peakRssSkipReason, withLoopDelay } from './bigfiles.js';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const summary = (p: string, a: Buffer, b: Buffer) =>
  `diff --fluxvm a/${p} b/${p}\nFiles a/${p} and b/${p} differ (too many changes to show: ${a.length} bytes sha256:${sha(a)} -> ${b.length} bytes sha256:${sha(b)})\n`;
const reversed = (b: Buffer) => Buffer.from(b.toString().split('\n').slice(0, -1).reverse().join('\n') + '\n');
const oneEdit = (b: Buffer) => Buffer.from(b.toString().replace('"node_modules/pkg-500"', '"EDITED"'));

describe('changeset diff pool', function () {
  this.timeout(120_000);
  const pools: DiffPool[] = [];
  const pool = (o: ConstructorParameters<typeof DiffPool>[0] = {}) => {
    const p = new DiffPool(o);
    pools.push(p);
    return p;
  };
  afterEach(async () => {
    for (const p of pools.splice(0)) await p.close();
  });

  for (const [n, label] of [
    [20_000, 'a rewritten 20,000-line file'],
    [2000, '2,000 lines that differ everywhere'],
  ] as const) {
    it(`${label}: answered within 10 s and 200 MiB, the event loop never busy 300 ms meanwhile`, async function () {
      skipWith(this, peakRssSkipReason());
      const a = lockFile(n, 'old');
      const b = lockFile(n, 'new');
      const p = pool();
      const peak = new PeakRss();
      const t = performance.now();
      const { result, maxDelayMs, maxBusyMs } = await withLoopDelay(() => p.fileDiff('/work/package-lock.json', a, b));
      const ms = performance.now() - t;
      const mib = peak.growthMiB();
      console.log(
        `      ${label}: ${ms.toFixed(0)} ms (worker start included), event loop max delay ${maxDelayMs.toFixed(0)} ms, busy ${maxBusyMs.toFixed(0)} ms, peak RSS +${mib.toFixed(0)} MiB`,
      );
      expect(result).to.equal(summary('work/package-lock.json', a, b));
      expect(ms).to.be.below(10_000);
      expect(mib).to.be.below(200);
      // The loop's own work, not its wall-clock delay: at load 16 the host left an idle loop
      // unscheduled for 308 and 412 ms while the worker diffed (two loaded runs).
      expect(maxBusyMs).to.be.below(300);
    });
  }

  it('a real diff comes back from the worker as fileDiff writes it', async () => {
    const a = lockFile(5000, 'x');
    const b = oneEdit(a);
    const text = await pool().fileDiff('/w/x', a, b);
    expect(text).to.equal(fileDiff('/w/x', a, b));
    expect(text).to.include('@@ -498,7 +498,7 @@\n');
  });

  it('a job past its deadline: the worker is killed, the file gets the summary, the next diff works', async () => {
    const p = pool({ workers: 1, jobTimeoutMs: 300, limits: { ...DIFF_LIMITS, maxEditLength: 1e9, timeoutMs: 1e9 } });
    const a = lockFile(20_000, 'x');
    // The diffs around the timed-out job are small (600 lines, not inline): the 300 ms deadline
    // must not catch them on a loaded machine too (a 20,000-line one took longer at load 20, and a
    // killed warm-up put a worker's start inside the timed call).
    const small = lockFile(600, 'y');
    await p.fileDiff('/w/warm', small, oneEdit(small)); // the worker is up (its start is not the job's)
    const t = performance.now();
    expect(await p.fileDiff('/w/r', a, reversed(a))).to.equal(summary('w/r', a, reversed(a)));
    expect(performance.now() - t).to.be.below(5000);
    expect(await p.fileDiff('/w/x', small, oneEdit(small))).to.include('@@ -498,7 +498,7 @@\n');
  });

  it('a worker past its heap limit dies: the file gets the summary, the next diff works', async () => {
    // Every line shared in another order, allowed past maxLines: the search needs far more than 16 MiB
    // (a small cap and input: the worker reaches it in a second, not in ten).
    const p = pool({
      workers: 1,
      heapMb: 16,
      limits: { ...DIFF_LIMITS, maxLines: 1e9, maxEditLength: 1e9, timeoutMs: 1e9 },
    });
    const a = lockFile(100_000, 'x');
    const t = performance.now();
    expect(await p.fileDiff('/w/huge', a, reversed(a))).to.equal(summary('w/huge', a, reversed(a)));
    console.log(`      heap limit hit after ${(performance.now() - t).toFixed(0)} ms`);
    const small = lockFile(5000, 'y');
    expect(await p.fileDiff('/w/x', small, oneEdit(small))).to.include('@@ -498,7 +498,7 @@\n');
  });

  it('the queue limit at its edge: with the worker busy, maxQueue jobs wait, one more is refused (DiffPoolBusy)', async () => {
    const p = pool({ workers: 1, maxQueue: 2 });
    const a = lockFile(20_000, 'x');
    await p.fileDiff('/w/warm', a, oneEdit(a));
    const running = p.fileDiff('/w/1', a, reversed(a)); // taken by the idle worker at once
    const waiting = [p.fileDiff('/w/2', a, oneEdit(a)), p.fileDiff('/w/3', a, oneEdit(a))];
    let refused: unknown;
    await p.fileDiff('/w/4', a, oneEdit(a)).catch((e: unknown) => (refused = e));
    expect(refused).to.be.instanceOf(DiffPoolBusy);
    expect((refused as Error).message).to.equal('too many file diffs are being computed (2 waiting); retry later');
    // With a scope (what the diff subresource passes): refused before its sides are hashed (the
    // hashing yields to the event loop first, so a refusal after it would come after this turn)
    const order: string[] = [];
    const scoped = p.fileDiff('/w/5', a, oneEdit(a), 'cs-1').catch((e: unknown) => (order.push('refused'), e));
    setImmediate(() => order.push('next turn'));
    expect(await scoped).to.be.instanceOf(DiffPoolBusy);
    await new Promise((r) => setImmediate(r));
    expect(order).to.deep.equal(['refused', 'next turn']);
    expect(await running).to.equal(summary('w/1', a, reversed(a)));
    for (const w of waiting) expect(await w).to.include('@@ -498,7 +498,7 @@\n');
  });

  it('close() ends every worker; the next diff starts one again', async () => {
    const p = pool({ workers: 2 });
    const a = lockFile(5000, 'x');
    await Promise.all([p.fileDiff('/w/1', a, oneEdit(a)), p.fileDiff('/w/2', a, oneEdit(a))]);
    expect(p.size).to.equal(2);
    await p.close();
    expect(p.size).to.equal(0);
    expect(await p.fileDiff('/w/3', a, oneEdit(a))).to.include('@@ -498,7 +498,7 @@\n');
    expect(p.size).to.equal(1);
  });

  it('tiny inputs are diffed inline (no worker)', async () => {
    const p = pool();
    expect(await p.fileDiff('/w/t', Buffer.from('a\n'), Buffer.from('b\n'))).to.equal(
      'diff --fluxvm a/w/t b/w/t\n--- a/w/t\n+++ b/w/t\n@@ -1 +1 @@\n-a\n+b\n',
    );
    expect(p.size).to.equal(0);
  });

  it('a scope keeps its finished diffs: the same sides again need no worker; other sides, another scope or a failure do', async () => {
    const a = lockFile(1000, 'old');
    const b = oneEdit(a);
    const p = pool();
    const first = await p.fileDiff('/w/x', a, b, 'cs-1');
    expect(first).to.include('@@ -498,7 +498,7 @@\n');
    await p.close(); // no worker left: an answer without one is what was kept
    expect(await p.fileDiff('/w/x', Buffer.from(a), Buffer.from(b), 'cs-1')).to.equal(first);
    expect(p.size).to.equal(0);
    // the old side changed in the sandbox since: computed again
    const c = Buffer.from(a.toString().replace('"node_modules/pkg-10"', '"MOVED"'));
    expect(await p.fileDiff('/w/x', c, b, 'cs-1')).to.not.equal(first);
    expect(p.size).to.equal(1);
    await p.close();
    // another changeset with the very same files: its own diff, not the kept one
    expect(await p.fileDiff('/w/x', a, b, 'cs-2')).to.equal(first);
    expect(p.size).to.equal(1);
    await p.close();
  });

  it('a summary made because a job passed its deadline is not kept: the same request runs again', async () => {
    const p = pool({ workers: 1, jobTimeoutMs: 300, limits: { ...DIFF_LIMITS, maxEditLength: 1e9, timeoutMs: 1e9 } });
    const a = lockFile(20_000, 'x');
    const small = lockFile(600, 'y');
    await p.fileDiff('/w/warm', small, oneEdit(small)); // the worker is up (its start is not the job's)
    for (const run of ['first', 'again']) {
      const t = performance.now();
      expect(await p.fileDiff('/w/r', a, reversed(a), 'cs-1'), run).to.equal(summary('w/r', a, reversed(a)));
      // run again, not kept: it waited for the deadline (a lower bound; load only makes it later)
      expect(performance.now() - t, run).to.be.at.least(300);
    }
  });

  it('what is kept stays within cacheChars: the least recently used diff goes first; one longer than the cap is not kept', async () => {
    const a = lockFile(1000, 'old');
    const b = oneEdit(a);
    const one = (await pool().fileDiff('/w/1', a, b)).length;
    const p = pool({ cacheChars: 2 * one + 2 }); // room for two of them (paths of the same length)
    for (const f of ['/w/1', '/w/2', '/w/3']) await p.fileDiff(f, a, b, 's');
    await p.close();
    expect(await p.fileDiff('/w/3', a, b, 's')).to.include('/w/3');
    expect(await p.fileDiff('/w/2', a, b, 's')).to.include('/w/2');
    expect(p.size, 'kept: /w/2 and /w/3').to.equal(0);
    await p.fileDiff('/w/1', a, b, 's'); // evicted as the least recently used: computed
    expect(p.size).to.equal(1);
    await p.close();
    // now /w/3 is the least recently used and went out for /w/1
    expect(await p.fileDiff('/w/2', a, b, 's')).to.include('/w/2');
    expect(p.size).to.equal(0);
    await p.fileDiff('/w/3', a, b, 's');
    expect(p.size).to.equal(1);
    await p.close();
    const tiny = pool({ cacheChars: one - 1 });
    await tiny.fileDiff('/w/1', a, b, 's');
    await tiny.close();
    await tiny.fileDiff('/w/1', a, b, 's');
    expect(tiny.size, 'one diff longer than the cap is not kept').to.equal(1);
  });
});
