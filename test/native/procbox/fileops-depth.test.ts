// A sandbox's symlink chain that once overflowed the root fileops helper's heap (docs/decisions/0009).
// The tree is about 4,900 directories deep with a relative symlink every ~2,000 levels
// (l1 -> d/.../d/l2, l2 -> d/.../d/l3, l3 -> d/.../d/f; deep-chain.ts), built with plain mkdir/chdir/symlink
// (perl: mkdirat/symlinkat relative to the cwd, so no path is ever longer than PATH_MAX).
// Following it walked past FO_MAX_COMPS (4096) directories and resolve() appended past its
// `done` array: SIGABRT (munmap_chunk(): invalid pointer). The bound is now checked: the
// resolution fails with ENAMETOOLONG (InvalidPath, a 400 through the API) and the helper keeps
// serving. Limits at their edge: exactly 4096 directories passes, 4097 fails.
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaultHelperPath } from '../../../native/procbox/procbox.js';
import { FileOps, FileOpError, fileOpError, type Anchor } from '../../../native/procbox/fileops.js';
import { sandboxManifest } from '../../../native/procbox/manifest.js';
import type { RuntimeError } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { skipReason } from './fixture.js';
import { chainScript, dirs, EVERY, ISSUE_CHAIN, MAX_DEPTH } from './deep-chain.js';

describe('procbox fileops: a symlink chain deeper than the resolver allows', function () {
  this.timeout(120_000);
  let ops: FileOps;
  let tmp: string;
  let ws: string;
  let a: Anchor;
  const b = (s: string) => Buffer.from(s);

  before(function () {
    skipWith(this, skipReason());
    others = childHelpers();
    ops = new FileOps(defaultHelperPath(), 1);
    tmp = mkdtempSync(join(tmpdir(), 'fileops-depth-'));
    ws = join(tmp, 'work');
    mkdirSync(ws);
    a = { root: ws, view: '/work' };
    const [depth, issueLinks] = ISSUE_CHAIN;
    // Plus the edge: l3 also leads to f at exactly MAX_DEPTH (l3edge) and one past (l3over).
    const links: [number, string, string][] = [
      ...issueLinks,
      [2 * EVERY, 'l3edge', `${dirs(MAX_DEPTH - 2 * EVERY)}f`],
      [2 * EVERY, 'l3over', `${dirs(MAX_DEPTH + 1 - 2 * EVERY)}f`],
    ];
    execFileSync('perl', ['-e', chainScript(depth, [MAX_DEPTH, MAX_DEPTH + 1, depth], links)], { cwd: ws });
    // The edge entry points: a chain to l3edge / l3over through l1's way.
    execFileSync(
      'perl',
      [
        '-e',
        `chdir("${dirs(EVERY)}") or die; symlink("${dirs(EVERY)}l3edge", "l2edge") or die; symlink("${dirs(EVERY)}l3over", "l2over") or die;`,
      ],
      { cwd: ws },
    );
    execFileSync(
      'perl',
      ['-e', `symlink("${dirs(EVERY)}l2edge", "l1edge") or die; symlink("${dirs(EVERY)}l2over", "l1over") or die;`],
      { cwd: ws },
    );
  });
  after(() => {
    ops?.close();
    if (tmp) execFileSync('rm', ['-rf', tmp]); // coreutils rm handles trees deeper than PATH_MAX
  });

  const childHelpers = () => {
    // pgrep exits 1 when it finds none
    const r = spawnSync('pgrep', ['-P', String(process.pid), '-f', 'procbox fileops'], { encoding: 'utf8' });
    return r.stdout.trim().split('\n').filter(Boolean).map(Number);
  };
  // This file's helpers only: a mocha worker that ran another file first may still have its helpers.
  let others: number[] = [];
  const helperPids = () => childHelpers().filter((p) => !others.includes(p));

  async function failure(p: Promise<unknown>): Promise<FileOpError> {
    const e = await p.then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(e, `the call should fail with a FileOpError, got ${String(e)}`).to.be.instanceOf(FileOpError);
    return e as FileOpError;
  }

  it('reading /work/l1 fails with ENAMETOOLONG (InvalidPath) and the same helper serves the next request', async () => {
    await ops.stat(a, b('l1'));
    const before = helperPids();
    expect(before).to.have.length(1);
    for (const call of [
      () => ops.read(a, b('l1'), 1 << 20),
      () => ops.list(a, b('l1')),
      () => ops.walk(a, b('l1'), 10),
    ]) {
      const e = await failure(call());
      expect(e.errno, e.message).to.equal('ENAMETOOLONG');
      expect(fileOpError(e, '/work/l1').code).to.equal('InvalidPath');
    }
    // Not a new helper started after a crash: the very same process answers.
    expect(helperPids()).to.deep.equal(before);
    expect((await ops.stat(a, b('l1'))).type).to.equal('l');
    expect(helperPids()).to.deep.equal(before);
  });

  it('the manifest walk of the whole tree (nothing followed) stops with ENAMETOOLONG (InvalidPath), not a crash or EMFILE', async () => {
    const e = await failure(ops.walk(a, b(''), 1_000_000));
    expect(e.errno, e.message).to.equal('ENAMETOOLONG');
    const m = await sandboxManifest(ops, tmp, '/work', ['/work']).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect((m as RuntimeError).code, String(m)).to.equal('InvalidPath');
  });

  it('at the edge: a file below exactly 4096 directories is read, one directory more is ENAMETOOLONG', async () => {
    expect((await ops.read(a, b('l1edge'), 100)).toString()).to.equal(`deep ${MAX_DEPTH}`);
    expect((await failure(ops.read(a, b('l1over'), 100))).errno).to.equal('ENAMETOOLONG');
    // The same file through a path of its own (4097 components): refused by the splitter alike.
    expect((await failure(ops.read(a, b(`${dirs(MAX_DEPTH)}f`), 100))).errno).to.equal('ENAMETOOLONG');
  });

  it('.. climbs back up a deep chain: a link up through 1000 levels resolves', async () => {
    // d x 1000 / up -> ../ x 1000 then l1edge: back to the top, then the edge chain down to 4096.
    execFileSync(
      'perl',
      ['-e', `chdir("${dirs(1000)}") or die; symlink("${'../'.repeat(1000)}l1edge", "up") or die;`],
      { cwd: ws },
    );
    expect((await ops.read(a, b(`${dirs(1000)}up`), 100)).toString()).to.equal(`deep ${MAX_DEPTH}`);
    expect((await failure(ops.read(a, b(`${dirs(1000)}up/x`), 100))).errno).to.equal('ENOTDIR');
  });

  it('a loop that climbs 1300 levels per hop ends in ELOOP within a bound of time (each .. is O(1))', async () => {
    // down -> d x 1300 / up, up -> ../ x 1300 / down: 40 hops, 20 climbs of 1300 levels. When
    // each `..` re-walked every name from the root this read took 1300 x 1300 / 2 opens per
    // climb (about 17 million for the read), holding the helper (every sandbox's file calls).
    execFileSync(
      'perl',
      [
        '-e',
        `symlink("${dirs(1300)}up", "down") or die; chdir("${dirs(1300)}") or die; symlink("${'../'.repeat(1300)}down", "up") or die;`,
      ],
      { cwd: ws },
    );
    const t0 = Date.now();
    const e = await failure(ops.read(a, b('down'), 100));
    const ms = Date.now() - t0;
    expect(e.errno, e.message).to.equal('ELOOP');
    // The quadratic walk's 17 million opens take tens of seconds even on a quiet host; the linear
    // one took 3.4 s with three suites running at once (load 17), well under 1 s quiet.
    expect(ms, 'milliseconds for 40 hops').to.be.below(10_000);
  });
});
