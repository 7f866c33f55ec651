import { expect } from 'chai';
import { RuntimeError } from '../../../native/runtime.js';
import { checkDrift, diffManifests } from '../../../native/workspace/diff.js';
import type { Manifest } from '../../../native/workspace/types.js';

const A = 'sha256:' + 'a'.repeat(64);
const B = 'sha256:' + 'b'.repeat(64);

function m(files: Record<string, string>, paths = ['/work'], mode: 'sha256' = 'sha256'): Manifest {
  return { mode, paths, files, takenAt: '2026-01-01T00:00:00.000Z' };
}

describe('workspace/diff', () => {
  it('added, modified, deleted, unchanged; a rename is delete + add', () => {
    const base = m({ '/work/keep': A, '/work/edit': A, '/work/old': A, '/work/gone': B });
    const cur = m({ '/work/keep': A, '/work/edit': B, '/work/new': A, '/work/renamed': B });
    expect(diffManifests(base, cur)).to.deep.equal({
      added: ['/work/new', '/work/renamed'],
      modified: ['/work/edit'],
      deleted: ['/work/gone', '/work/old'],
      unchanged: 1,
    });
  });

  const table: [string, string, string, 'modified' | 'unchanged'][] = [
    ['unreadable -> readable', 'unreadable', A, 'modified'],
    ['readable -> unreadable', A, 'unreadable', 'modified'],
    ['unreadable -> unreadable', 'unreadable', 'unreadable', 'unchanged'],
    ['same hash', A, A, 'unchanged'],
    ['other hash', A, B, 'modified'],
  ];
  for (const [name, before, after, want] of table) {
    it(name, () => {
      const d = diffManifests(m({ '/work/f': before }), m({ '/work/f': after }));
      expect(want === 'modified' ? d.modified : d.unchanged).to.deep.equal(want === 'modified' ? ['/work/f'] : 1);
    });
  }

  it('sorts by UTF-8 byte order of the path strings', () => {
    const names = [
      '/work/b',
      '/work/B',
      '/work/a b',
      '/work/a/b',
      '/work/é',
      '/work/\uffff',
      '/work/😀',
      '/work/a\\\\x',
      '/work/a\\xff',
    ];
    const d = diffManifests(m({}), m(Object.fromEntries(names.map((n) => [n, A]))));
    expect(d.added).to.deep.equal([...names].sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y))));
    expect(d.added.indexOf('/work/😀')).to.be.greaterThan(d.added.indexOf('/work/\uffff'));
  });

  it('narrows to a subset of the baseline paths', () => {
    const base = m({ '/work/a/x': A, '/work/ab': A, '/home/agent/y': A }, ['/home/agent', '/work']);
    const cur = m({ '/work/a/x': B, '/work/ab': B, '/home/agent/y': B }, ['/home/agent', '/work']);
    expect(diffManifests(base, cur, ['/work/a']).modified).to.deep.equal(['/work/a/x']);
    expect(diffManifests(base, cur, ['/home/agent/']).modified).to.deep.equal(['/home/agent/y']);
    expect(diffManifests(base, cur).modified).to.have.length(3);
    expect(() => diffManifests(base, cur, ['/etc']))
      .to.throw(RuntimeError)
      .with.property('code', 'InvalidArgument');
    expect(() => diffManifests(base, cur, ['rel']))
      .to.throw(RuntimeError)
      .with.property('code', 'InvalidPath');
  });

  it('different fingerprint modes are a Conflict', () => {
    const other = { ...m({}), mode: 'stat' } as unknown as Manifest;
    expect(() => diffManifests(m({}), other))
      .to.throw(RuntimeError)
      .with.property('code', 'Conflict');
  });

  it('checkDrift: first ten differing paths and the count', () => {
    const base = m(
      Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`/work/f${String(i).padStart(2, '0')}`, A])),
    );
    const cur = { ...base, files: { ...base.files } };
    expect(checkDrift(base, cur)).to.deep.equal({ paths: [], count: 0 });
    for (let i = 0; i < 12; i++) cur.files[`/work/f${String(i).padStart(2, '0')}`] = B;
    delete cur.files['/work/f29'];
    cur.files['/work/new'] = A;
    const d = checkDrift(base, cur);
    expect(d.count).to.equal(14);
    expect(d.paths).to.deep.equal([
      '/work/f00',
      '/work/f01',
      '/work/f02',
      '/work/f03',
      '/work/f04',
      '/work/f05',
      '/work/f06',
      '/work/f07',
      '/work/f08',
      '/work/f09',
    ]);
  });
});
