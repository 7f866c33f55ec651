// The bounded unified diff: whatever two files hold, fileDiff answers in bounded
// time and memory, with a real diff or the `too many changes to show` summary (sizes and
// sha256 of both sides). The bounds are tested at their edges; patch(1) checks the hunks.
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DIFF_LIMITS, fileDiff, unifiedHunks } from '../../../controllers/changeset/unidiff.js';
import { skipWith } from '../../skip.js';
import { lockFile, PeakRss, peakRssSkipReason } from './bigfiles.js';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const summary = (p: string, a: Buffer, b: Buffer) =>
  `diff --fluxvm a/${p} b/${p}\nFiles a/${p} and b/${p} differ (too many changes to show: ${a.length} bytes sha256:${sha(a)} -> ${b.length} bytes sha256:${sha(b)})\n`;
const lines = (xs: (string | number)[]) => xs.map((x) => `${x}\n`).join('');
const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => i + from);

function timed<T>(fn: () => T): { result: T; ms: number } {
  const t = performance.now();
  const result = fn();
  return { result, ms: performance.now() - t };
}

describe('changeset unified diff: bounds', function () {
  this.timeout(120_000);

  it('a rewritten 20,000-line file: the summary with both sizes and sha256, within 10 s and 200 MiB', function () {
    skipWith(this, peakRssSkipReason());
    const a = lockFile(20_000, 'old');
    const b = lockFile(20_000, 'new');
    const peak = new PeakRss();
    const { result, ms } = timed(() => fileDiff('/work/package-lock.json', a, b));
    const mib = peak.growthMiB();
    console.log(`      20,000-line rewrite (${a.length} bytes): ${ms.toFixed(0)} ms, peak RSS +${mib.toFixed(0)} MiB`);
    expect(result).to.equal(summary('work/package-lock.json', a, b));
    expect(ms).to.be.below(10_000);
    expect(mib).to.be.below(200);
  });

  it('2,000 lines that differ everywhere (122 MiB before): the summary, within 2 s and 64 MiB', function () {
    skipWith(this, peakRssSkipReason());
    const a = lockFile(2000, 'old');
    const b = lockFile(2000, 'new');
    const peak = new PeakRss();
    const { result, ms } = timed(() => fileDiff('/work/f', a, b));
    const mib = peak.growthMiB();
    console.log(`      2,000 lines differing everywhere: ${ms.toFixed(0)} ms, peak RSS +${mib.toFixed(0)} MiB`);
    expect(result).to.equal(summary('work/f', a, b));
    expect(ms).to.be.below(2000);
    expect(mib).to.be.below(64);
  });

  it('a reordered 20,000-line file (every line shared: the search runs to maxEditLength): bounded', () => {
    const a = lockFile(20_000, 'x');
    const b = Buffer.from(a.toString().split('\n').slice(0, -1).reverse().join('\n') + '\n');
    const { result, ms } = timed(() => fileDiff('/w/r', a, b));
    console.log(`      reversed 20,000 lines: ${ms.toFixed(0)} ms`);
    expect(result).to.equal(summary('w/r', a, b));
    expect(ms).to.be.below(10_000);
  });

  it('the timeout stops a search that maxEditLength would allow', () => {
    const a = lockFile(20_000, 'x');
    const b = Buffer.from(a.toString().split('\n').slice(0, -1).reverse().join('\n') + '\n');
    const { result, ms } = timed(() =>
      unifiedHunks(a.toString(), b.toString(), { ...DIFF_LIMITS, maxEditLength: 1e9, timeoutMs: 300 }),
    );
    expect(result).to.equal(undefined);
    expect(ms).to.be.below(5000);
  });

  it('maxEditLength at its edge: an edit distance of exactly the limit is shown, one more is summarized', () => {
    const limits = { ...DIFF_LIMITS, maxEditLength: 10 };
    // Lines that differ everywhere (the linear lower bound decides): 5 + 5 = 10 edits, then 11.
    expect(unifiedHunks(lines(['a', 'b', 'c', 'd', 'e']), lines([1, 2, 3, 4, 5]), limits)).to.equal(
      '@@ -1,5 +1,5 @@\n-a\n-b\n-c\n-d\n-e\n+1\n+2\n+3\n+4\n+5\n',
    );
    expect(unifiedHunks(lines(['a', 'b', 'c', 'd', 'e']), lines([1, 2, 3, 4, 5, 6]), limits)).to.equal(undefined);
    // Shared lines in another order (jsdiff's maxEditLength decides): 1..6 reversed is 10 edits.
    const fwd = lines(range(6, 1));
    const rev = lines(range(6, 1).reverse());
    expect(unifiedHunks(fwd, rev, limits))
      .to.be.a('string')
      .and.match(/^@@ -1,6 \+1,6 @@\n/);
    expect(unifiedHunks(fwd, rev + 'x\n', limits)).to.equal(undefined);
    // A pure insertion is never searched: any size is shown.
    expect(unifiedHunks('', lines(range(50)), limits)).to.match(/^@@ -0,0 \+1,50 @@\n\+0\n/);
  });

  it('maxLines at its edge: counted over both middles (the common lines around them are cut off first)', () => {
    const limits = { ...DIFF_LIMITS, maxLines: 10 };
    const common = lines(range(100, 1000));
    const mid = (t: string, n: number) => lines(range(n).map((i) => t + i));
    const shown = unifiedHunks(common + mid('a', 5) + common, common + mid('b', 5) + common, limits);
    expect(shown).to.equal(
      `@@ -98,11 +98,11 @@\n 1097\n 1098\n 1099\n${range(5)
        .map((i) => `-a${i}\n`)
        .join('')}${range(5)
        .map((i) => `+b${i}\n`)
        .join('')} 1000\n 1001\n 1002\n`,
    );
    expect(unifiedHunks(common + mid('a', 5) + common, common + mid('b', 6) + common, limits)).to.equal(undefined);
  });

  it('small edits of a 16 MiB file are diffed with their real line numbers (the common lines are not searched)', () => {
    const a = lockFile(172_000, 'x');
    expect(a.length).to.be.above(15 << 20);
    const at = (i: number) => `"node_modules/pkg-${i}"`;
    const b = Buffer.from(
      a.toString().replace(at(100_000), '"CHANGED-100000"').replace(at(100_010), '"CHANGED-100010"'),
    );
    const { result, ms } = timed(() => fileDiff('/w/big', a, b));
    console.log(`      two edits in ${a.length} bytes: ${ms.toFixed(0)} ms`);
    expect(result.match(/^@@ .* @@$/gm)).to.deep.equal(['@@ -99998,7 +99998,7 @@', '@@ -100008,7 +100008,7 @@']);
    expect(result).to.include('\n-    "node_modules/pkg-100000": {').and.include('\n+    "CHANGED-100000": {');
    expect(ms).to.be.below(10_000);
    // Edits at both ends leave 172,000 lines a side between them: past maxLines, the summary.
    const ends = Buffer.from(a.toString().replace(at(7), '"CHANGED-7"').replace(at(171_990), '"CHANGED-171990"'));
    expect(fileDiff('/w/big', a, ends)).to.equal(summary('w/big', a, ends));
  });

  it('a new or deleted file of 200,000 lines is written out without a search', () => {
    const big = lockFile(200_000, 'n');
    const { result, ms } = timed(() => fileDiff('/w/new', undefined, big));
    expect(
      result.startsWith(
        'diff --fluxvm a/w/new b/w/new\n--- /dev/null\n+++ b/w/new\n@@ -0,0 +1,200000 @@\n+    "node_modules/pkg-0"',
      ),
    ).to.equal(true);
    expect(result.length).to.equal(
      big.length +
        200_000 +
        '@@ -0,0 +1,200000 @@\n'.length +
        'diff --fluxvm a/w/new b/w/new\n--- /dev/null\n+++ b/w/new\n'.length,
    );
    expect(fileDiff('/w/new', big, undefined)).to.match(
      /^diff --fluxvm a\/w\/new b\/w\/new\n--- a\/w\/new\n\+\+\+ \/dev\/null\n@@ -1,200000 \+0,0 @@\n-/,
    );
    expect(ms).to.be.below(10_000);
  });

  it('patch(1) turns the old text into the new one (random edits of longer texts: common lines, CRLF, missing newlines)', function () {
    try {
      execFileSync('patch', ['--version'], { stdio: 'pipe' });
    } catch {
      return skipWith(this, 'no patch binary');
    }
    const dir = mkdtempSync(join(tmpdir(), 'unidiff-'));
    try {
      let seed = 21;
      const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
      const word = () => ['a', 'b', 'c', 'd', 'x\r', '', '\r'][rand(7)];
      const text = (n: number) => Array.from({ length: n }, word).join('\n');
      // 200 cases, each its own file; one patch(1) run applies them all (one file section each).
      const cases: { name: string; a: string; b: string; h: string }[] = [];
      for (let i = 0; i < 200; i++) {
        const a = text(rand(60)) + (rand(4) ? '\n' : '');
        // Edits at random places of a: replaced, inserted, deleted runs.
        let b = a;
        for (let k = rand(4); k >= 0; k--) {
          const at = rand(b.length + 1);
          b = b.slice(0, at) + text(rand(5)) + b.slice(Math.min(b.length, at + rand(12)));
        }
        if (a === b) continue;
        const h = unifiedHunks(a, b) ?? expect.fail(`no hunks for ${JSON.stringify([a, b])}`);
        cases.push({ name: `f${i}`, a, b, h });
        writeFileSync(join(dir, `f${i}`), a);
      }
      expect(cases.length).to.be.greaterThan(150);
      writeFileSync(join(dir, 'p'), cases.map((c) => `--- ${c.name}\n+++ ${c.name}\n${c.h}`).join(''));
      const r = spawnSync('patch', ['-s', '-p0', '-d', dir, '-i', join(dir, 'p')], { encoding: 'utf8' });
      for (const { name, a, b, h } of cases)
        expect(readFileSync(join(dir, name), 'utf8'), JSON.stringify([a, b, h, r.stdout, r.stderr])).to.equal(b);
      expect(r.status, r.stdout + r.stderr).to.equal(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
