// End to end against a real `fluxctl serve` (procbox): a speculation that rewrites a
// 20,000-line package-lock.json and a 2,000-line file (every line differs) is reviewed
// through changesets/diff and `fluxctl sandbox diff`. Each answers within a time
// bound, the server's peak RSS stays bounded, and the server keeps answering other requests
// while the diff is computed (it runs in a worker thread).
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { lockFile, PeakRss, peakRssSkipReason } from '../controllers/changeset/bigfiles.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  apiSpeculate,
  fluxctlInProcess,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
  subPath,
} from './sandbox-helpers.js';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const summary = (p: string, a: Buffer, b: Buffer) =>
  `diff --fluxvm a/${p} b/${p}\nFiles a/${p} and b/${p} differ (too many changes to show: ${a.length} bytes sha256:${sha(a)} -> ${b.length} bytes sha256:${sha(b)})\n`;

async function put(fx: Fluxctl, sbx: string, path: string, data: Buffer): Promise<void> {
  const r = await api(fx, 'PUT', subPath('default', sbx, 'files'), { query: { path }, raw: data });
  expect(r.status, r.body.toString()).to.be.oneOf([200, 201]);
}

/**
 * Runs `work` while GET /version is sent again and again (one at a time, each answered before
 * the next; at most 5000 of them): the latencies seen while `work` ran.
 */
async function whileProbing<T>(fx: Fluxctl, work: Promise<T>): Promise<{ result: T; latencies: number[] }> {
  let done = false;
  const settled = work.finally(() => (done = true));
  const latencies: number[] = [];
  while (!done && latencies.length < 5000) {
    const t = performance.now();
    const r = await fx.request('GET', '/version');
    expect(r.status).to.equal(200);
    latencies.push(performance.now() - t);
  }
  return { result: await settled, latencies };
}

describe('e2e: reviewing a rewritten 20,000-line file (bounded diff)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  const lockOld = lockFile(20_000, 'old');
  const lockNew = lockFile(20_000, 'new');
  const smallOld = lockFile(2000, 'old');
  const smallNew = lockFile(2000, 'new');
  // fluxctl fetches files up to 1 MiB: 20,000 shorter lines for it (the lock file is named as too large).
  const list = (tag: string) => Buffer.from(Array.from({ length: 20_000 }, (_, i) => `item ${i} ${tag}\n`).join(''));

  before(async function () {
    skipWith(this, sandboxSkipReason() ?? peakRssSkipReason());
    fx = await startFluxctl();
    for (const [sbx, lock, small] of [
      ['big', lockOld, smallOld],
      ['big2', lockNew, smallNew],
    ] as const) {
      await makeSandbox(fx, sbx);
      await put(fx, sbx, '/work/package-lock.json', lock);
      await put(fx, sbx, '/work/small.json', small);
      await put(fx, sbx, '/work/list.txt', list(sbx));
      await put(fx, sbx, '/work/next/package-lock.json', lockNew);
      await put(fx, sbx, '/work/next/small.json', smallNew);
    }
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  it('changesets/diff: the summary with sizes and sha256 within 10 s, server peak RSS +200 MiB at most, /version answered within 1 s throughout', async () => {
    const cs = await apiSpeculate(
      fx,
      'big',
      'rw',
      'cat /work/next/package-lock.json > /work/package-lock.json && cat /work/next/small.json > /work/small.json',
    );
    expect(cs.status.phase).to.equal('Pending');
    expect(cs.status.changes.modified).to.deep.equal(['/work/package-lock.json', '/work/small.json']);
    const peak = new PeakRss(fx.child.pid!);
    const t = performance.now();
    const { result, latencies } = await whileProbing(
      fx,
      api(fx, 'GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets/rw/diff'),
    );
    const ms = performance.now() - t;
    const mib = peak.growthMiB();
    const worst = Math.max(...latencies);
    console.log(
      `      diff in ${ms.toFixed(0)} ms; server peak RSS +${mib.toFixed(0)} MiB; /version x${latencies.length} meanwhile, worst ${worst.toFixed(0)} ms`,
    );
    expect(result.status, result.body.toString()).to.equal(200);
    expect(result.body.toString()).to.equal(
      summary('work/package-lock.json', lockOld, lockNew) + summary('work/small.json', smallOld, smallNew),
    );
    expect(ms).to.be.below(10_000);
    expect(mib).to.be.below(200);
    expect(latencies.length).to.be.above(0);
    expect(worst).to.be.below(1000);
  });

  it('fluxctl sandbox diff: the summaries within 10 s, its peak RSS +200 MiB at most', async () => {
    // The first fluxctl run in this process loads its modules through tsx (seconds): not the diff's.
    const same = await fluxctlInProcess(fx, ['sandbox', 'diff', 'big', 'big2', '--path', '/work/next']);
    expect(same.code, same.stderr).to.equal(0);
    const peak = new PeakRss();
    const t = performance.now();
    const r = await fluxctlInProcess(fx, ['sandbox', 'diff', 'big', 'big2']);
    const ms = performance.now() - t;
    const mib = peak.growthMiB();
    console.log(
      `      fluxctl sandbox diff in ${ms.toFixed(0)} ms (in this process: diff worker start included); peak RSS +${mib.toFixed(0)} MiB`,
    );
    expect(r.code, r.stderr).to.equal(1);
    expect(r.stdout).to.equal(
      summary('work/list.txt', list('big'), list('big2')) +
        'diff --fluxvm a/work/package-lock.json b/work/package-lock.json\nFiles a/work/package-lock.json and b/work/package-lock.json differ (larger than 1 MiB: not shown)\n' +
        summary('work/small.json', smallOld, smallNew),
    );
    expect(ms).to.be.below(10_000);
    expect(mib).to.be.below(200);
  });
});
