import { parse } from '@bufbuild/cel';
import { expect } from 'chai';
import { allKinds, fluxKinds, kindByApiVersion, kindByResource, resolveKind } from '../../apis/registry.js';
import type { Schema } from '../../apis/types.js';

function walk(s: Schema, path: string, visit: (s: Schema, path: string) => void): void {
  visit(s, path);
  for (const [k, v] of Object.entries(s.properties ?? {})) walk(v, `${path}.${k}`, visit);
  if (s.items) walk(s.items, `${path}[]`, visit);
  if (s.additionalProperties && typeof s.additionalProperties === 'object')
    walk(s.additionalProperties, `${path}{}`, visit);
}

describe('apis: kind definitions', () => {
  it('lists the eight fluxvm.dev kinds with their short names and the fluxvm category', () => {
    expect(fluxKinds.map((k) => [k.plural, k.shortNames[0] ?? ''])).to.deep.equal([
      ['sandboxes', 'sbx'],
      ['changesets', 'cs'],
      ['checkpoints', 'ckpt'],
      ['agentsessions', 'ags'],
      ['approvals', 'apr'],
      ['grants', ''],
      ['nodes', 'fnode'],
      ['volumes', 'vol'],
    ]);
    for (const k of fluxKinds) {
      expect(k.group).to.equal('fluxvm.dev');
      expect(k.version).to.equal('v1alpha1');
      // Node is cluster-scoped, as kube's core nodes.
      expect(k.namespaced).to.equal(k.kind !== 'Node');
      // `kubectl get all` lists the kinds that run (as kube's pods, deployments, jobs); the rest stay out.
      // Node (cluster-scoped infrastructure) is in no category, as kube's core nodes.
      const want = ['Sandbox', 'Changeset', 'AgentSession'].includes(k.kind) ? ['fluxvm', 'all'] : ['fluxvm'];
      expect(k.categories, k.kind).to.deep.equal(k.kind === 'Node' ? [] : want);
      expect(k.statusSubresource).to.equal(true);
    }
  });

  it('gives every property a description (kubectl explain)', () => {
    const missing: string[] = [];
    for (const k of allKinds) walk(k.schema, k.kind, (s, p) => void (s.description ? 0 : missing.push(p)));
    // additionalProperties value schemas (Secret data) are not properties.
    expect(missing.filter((p) => !p.endsWith('{}'))).to.deep.equal([]);
  });

  it('ends printer columns with Age; wide-only columns have priority 1', () => {
    for (const k of fluxKinds) {
      const last = k.printerColumns[k.printerColumns.length - 1];
      expect(last.name, k.kind).to.equal('Age');
      expect(last.jsonPath).to.equal('.metadata.creationTimestamp');
      for (const c of k.printerColumns) expect([undefined, 0, 1]).to.include(c.priority);
    }
  });

  it('parses every CEL rule, and keys every map list by required fields', () => {
    for (const k of allKinds)
      walk(k.schema, k.kind, (s, p) => {
        for (const r of s['x-kubernetes-validations'] ?? [])
          expect(() => parse(r.rule), `${p}: ${r.rule}`).not.to.throw();
        // kube turns date-time strings into CEL timestamps, our evaluator keeps strings: no
        // rule may sit on (or compare) a date-time field, or the two would disagree.
        if (s.format === 'date-time') expect(s['x-kubernetes-validations'] ?? [], p).to.deep.equal([]);
        if (s['x-kubernetes-list-type'] === 'map') {
          const keys = s['x-kubernetes-list-map-keys'] ?? [];
          expect(keys.length, p).to.be.greaterThan(0);
          for (const key of keys) expect(s.items?.required ?? [], `${p} key ${key}`).to.include(key);
        }
      });
  });

  it('resolves names the way kubectl does', () => {
    expect(resolveKind('sbx')?.kind).to.equal('Sandbox');
    expect(resolveKind('Changesets')?.kind).to.equal('Changeset');
    expect(resolveKind('ags')?.kind).to.equal('AgentSession');
    expect(resolveKind('grants.fluxvm.dev')?.kind).to.equal('Grant');
    expect(resolveKind('ns')?.kind).to.equal('Namespace');
    expect(resolveKind('leases.coordination.k8s.io')?.kind).to.equal('Lease');
    expect(resolveKind('nope')).to.equal(undefined);
    expect(kindByApiVersion('v1', 'Event')?.plural).to.equal('events');
    expect(kindByResource('fluxvm.dev', 'v1alpha1', 'checkpoints')?.kind).to.equal('Checkpoint');
  });
});
