// The Statement of an applied changeset, built from its meta and base.json (pure): the base
// digests are listed in code-unit order whatever order base.json has them in, each as a digest
// set when it is `sha256:<64 hex>` and as an annotated fingerprint otherwise, and the subjects
// are the files written in the same order.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { statementOf } from '../../support/changeset-statement.js';

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
});
