// The pure parts of the git verbs (controllers/agentsession/git-parse.ts): validation of what a
// request names and the parsers of git's machine formats, on real git output (a repository
// made here with the host's git) and on hostile records.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  cutAtCharBoundary,
  diffPaths,
  LOG_FORMAT,
  parseLog,
  parseStatus,
  refName,
  remoteName,
  repoPath,
} from '../../../controllers/agentsession/git-parse.js';
import { StatusError } from '../../../runtime/meta/errors.js';

const field = (f: () => unknown): string | undefined => {
  try {
    f();
  } catch (e) {
    if (e instanceof StatusError) return e.status.details?.causes?.[0]?.field;
    throw e;
  }
  return undefined;
};

describe('agentsession git-parse', () => {
  it('repoPath: inside the workspace only', () => {
    expect(repoPath(undefined, '/work')).to.equal('/work');
    expect(repoPath('/work/sub/', '/work')).to.equal('/work/sub');
    for (const bad of ['/etc', '/work/../etc', '/workx', 'work', '/work/a\nb'])
      expect(
        field(() => repoPath(bad, '/work')),
        bad,
      ).to.equal('repo');
  });

  it('diffPaths: options, climbing and outside paths are refused; absolute ones made relative', () => {
    expect(diffPaths(['a b', '/work/r/x', ':(top)x'], '/work/r')).to.deep.equal(['a b', 'x', ':(top)x']);
    expect(field(() => diffPaths('-R', '/work'))).to.equal('path');
    expect(field(() => diffPaths(['ok', '--output=/tmp/x'], '/work'))).to.equal('path[1]');
    expect(field(() => diffPaths('a/../../b', '/work'))).to.equal('path');
    expect(field(() => diffPaths('/work2/x', '/work'))).to.equal('path');
  });

  it('refName and remoteName: what git could read as an option or a revision is refused', () => {
    expect(refName('agent/try-1', 'name')).to.equal('agent/try-1');
    for (const bad of ['-x', '--upload-pack=x', 'a..b', 'a b', 'x.lock', 'a/.b', '@', 'a@{1}', 'a\x1b', '/a', 'a/'])
      expect(
        field(() => refName(bad, 'name')),
        bad,
      ).to.equal('name');
    expect(remoteName(undefined)).to.equal('origin');
    for (const bad of ['-o', '--upload-pack=x', '../x', 'a b'])
      expect(
        field(() => remoteName(bad)),
        bad,
      ).to.equal('remote');
  });

  it('parseStatus and parseLog on real output: renames, hostile names exact, messages with newlines', function () {
    const dir = mkdtempSync(join(tmpdir(), 'git-parse-'));
    try {
      const git = (...a: string[]) =>
        execFileSync('git', ['-C', dir, '-c', 'user.name=N\x1bame', '-c', 'user.email=e@x', ...a]);
      git('init', '-q', '-b', 'main');
      writeFileSync(join(dir, 'old name'), 'x\n');
      git('add', '-A');
      git('commit', '-q', '-m', 'one\n\ntwo lines');
      git('mv', 'old name', 'new\nname');
      writeFileSync(join(dir, Buffer.from([0x62, 0xff]).toString('latin1')), 'y');
      writeFileSync(Buffer.concat([Buffer.from(dir + '/'), Buffer.from([0x62, 0xfe])]), 'y');
      const st = parseStatus(git('status', '--porcelain=v2', '-z', '--branch', '--untracked-files=all'));
      expect(st.branch.head).to.equal('main');
      expect(st.entries.find((e) => e.kind === 'renamed')).to.include({
        path: 'new\nname',
        origPath: 'old name',
        index: 'R',
        worktree: '.',
        score: 'R100',
      });
      const raw = st.entries.find((e) => e.pathBase64 === Buffer.from([0x62, 0xfe]).toString('base64'));
      expect(raw?.kind).to.equal('untracked');
      const log = parseLog(git('log', '-z', LOG_FORMAT));
      expect(log).to.have.length(1);
      expect(log[0]).to.include({ author: 'N\x1bame', email: 'e@x', message: 'one\n\ntwo lines' });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('cutAtCharBoundary: a character cut in two is dropped, invalid bytes are kept', () => {
    const e = Buffer.from('a\u20ac'); // a, then 3 bytes
    expect(cutAtCharBoundary(e)).to.deep.equal(e);
    expect(cutAtCharBoundary(e.subarray(0, 3))).to.deep.equal(Buffer.from('a'));
    expect(cutAtCharBoundary(Buffer.from([0x61, 0xff, 0xfe]))).to.deep.equal(Buffer.from([0x61, 0xff, 0xfe]));
  });

  it('hostile output is an error, never a guess', () => {
    expect(() => parseStatus(Buffer.from('1 XY bad\0'))).to.throw(/malformed/);
    expect(() => parseStatus(Buffer.from('2 R. N... 100644 100644 100644 a b R100 new\0'))).to.throw(/original path/);
    expect(() => parseStatus(Buffer.from('Z junk\0'))).to.throw(/unknown type/);
    expect(() => parseLog(Buffer.from('nothex\0\0a\0b\0date\0msg\0'))).to.throw(/not a commit id/);
    expect(() => parseLog(Buffer.from(`${'a'.repeat(40)}\0\0a\0b\0date\0msg\0extra\0`))).to.throw(/do not divide/);
    // Cut output (truncated): the incomplete last record is dropped.
    expect(parseLog(Buffer.from(`${'a'.repeat(40)}\0\0a\0b\0date\0msg\0${'b'.repeat(40)}\0\0a`), true)).to.have.length(
      1,
    );
  });
});
