// The Statement of an applied changeset, built from its meta and base.json (pure): the base
// digests are listed in code-unit order whatever order base.json has them in, each as a digest
// set when it is `sha256:<64 hex>` and as an annotated fingerprint otherwise, and the subjects
// are the files written in the same order. The long lists are written as text by hand
// (controllers/changeset/provenance.ts): their text is what JSON.stringify writes, for any name a
// sandbox can give a file and any value a damaged base.json can hold.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { statementJsonOf, statementOf } from '../../support/changeset-statement.js';

const hex = (c: string) => c.repeat(64);
const sha = (p: string) => createHash('sha256').update(p).digest('hex');

const statement = (paths: string[], fingerprints: Record<string, string>) =>
  statementOf({ staged: paths.map((path) => ({ path, sha256: `sha256:${sha(path)}` })), base: fingerprints });

describe('changeset provenance Statement', () => {
  it('base digests in code-unit order, sha256 ones as digest sets, anything else as an annotated fingerprint', () => {
    const st = statement(['/work/b', '/work/a'], {
      '/work/b': `sha256:${hex('b')}`,
      'rel/x': `sha256:${hex('c')}`,
      '/work/Z': 'stat:1:2',
      '/work/a': `sha256:${hex('a')}`,
      '/work/upper': `sha256:${hex('A')}`, // not lowercase hex
      '/work/short': `sha256:${hex('a').slice(1)}`,
    });
    const deps = (st.predicate as { buildDefinition: { resolvedDependencies: unknown[] } }).buildDefinition
      .resolvedDependencies;
    const uri = (p: string) => `fluxvm:team/sandboxes/dev${p}`;
    expect(deps).to.deep.equal([
      { name: '/work/Z', uri: uri('/work/Z'), annotations: { fingerprint: 'stat:1:2' } },
      { name: '/work/a', uri: uri('/work/a'), digest: { sha256: hex('a') } },
      { name: '/work/b', uri: uri('/work/b'), digest: { sha256: hex('b') } },
      { name: '/work/short', uri: uri('/work/short'), annotations: { fingerprint: `sha256:${hex('a').slice(1)}` } },
      { name: '/work/upper', uri: uri('/work/upper'), annotations: { fingerprint: `sha256:${hex('A')}` } },
      { name: 'rel/x', uri: uri('/rel/x'), digest: { sha256: hex('c') } },
      { name: 'runtime', uri: 'fluxvm:runtime/procbox', annotations: { runtime: 'procbox' } },
    ]);
    expect(st.subject).to.deep.equal([
      { name: '/work/a', digest: { sha256: sha('/work/a') } },
      { name: '/work/b', digest: { sha256: sha('/work/b') } },
    ]);
  });

  it('the same Statement whether base.json and the staged files come sorted or not', () => {
    const paths = Array.from({ length: 300 }, (_, i) => `/work/src/f-${(i * 7919) % 1000}.ts`);
    const fps = Object.fromEntries(paths.map((p, i) => [p, `sha256:${hex(String(i % 10))}`]));
    const sorted = [...paths].sort();
    const a = statement(paths, fps);
    const b = statement(sorted, Object.fromEntries(sorted.map((p) => [p, fps[p]!])));
    expect(JSON.stringify(a.subject)).to.equal(JSON.stringify(b.subject));
    expect(JSON.stringify(a.predicate)).to.equal(JSON.stringify(b.predicate));
    expect(a.subject.map((s) => s.name)).to.deep.equal(sorted);
  });

  it("the text is JSON.stringify's for hostile names (quotes, controls, lone surrogates, U+2028) and odd fingerprints", () => {
    const odd = [
      '"',
      '\\',
      '\n',
      '\u0000',
      '\u001f',
      '\u007f',
      '\ud800',
      '\udfff',
      '\ud83d\ude00',
      '\u2028',
      'é',
      '漢',
      '}',
      ',{"',
    ];
    const paths: string[] = [];
    for (let i = 0; i < 200; i++) {
      const p = `${i % 5 === 0 ? 'rel' : '/work'}/${odd[i % odd.length]}${i}${odd[(i * 7) % odd.length]}`;
      paths.push(i % 3 === 0 ? `${p}\ud800` : p);
    }
    // fingerprints: sha256 ones, and what is not one (malformed, another scheme, not a string at all)
    const fps: unknown[] = [
      `sha256:${hex('e')}`,
      'stat:1:2',
      `sha256:${hex('E')}`,
      7,
      null,
      { x: '\ud800' },
      ['a'],
      true,
    ];
    const base = Object.fromEntries(paths.map((p, i) => [p, fps[i % fps.length]]));
    const staged = paths.map((path) => ({ path, sha256: `sha256:${sha(path)}` }));
    const text = statementJsonOf({ staged, base }).toString('utf8');
    const st = JSON.parse(text) as ReturnType<typeof statementOf>;
    expect(text).to.equal(JSON.stringify(st)); // canonical: as JSON.stringify writes the parsed value
    const sorted = [...paths].sort();
    const deps = (st.predicate as { buildDefinition: { resolvedDependencies: unknown[] } }).buildDefinition
      .resolvedDependencies;
    expect(deps.slice(0, -1)).to.deep.equal(
      sorted.map((p) => {
        const fp = base[p];
        const uri = `fluxvm:team/sandboxes/dev${p.startsWith('/') ? '' : '/'}${p}`;
        return fp === fps[0]
          ? { name: p, uri, digest: { sha256: hex('e') } }
          : { name: p, uri, annotations: { fingerprint: fp } };
      }),
    );
    expect(st.subject).to.deep.equal(sorted.map((p) => ({ name: p, digest: { sha256: sha(p) } })));
  });

  it('deletions only: one subject, fluxvm:deleted, the sha256 of the sorted deleted paths', () => {
    const st = statementOf({ staged: [], deleted: ['/work/b', '/work/a'] });
    expect(st.subject).to.deep.equal([{ name: 'fluxvm:deleted', digest: { sha256: sha('["/work/a","/work/b"]') } }]);
  });
});
