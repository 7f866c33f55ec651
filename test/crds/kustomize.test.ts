// crds/kustomize, the kustomize Component of FluxVM's name references: every `{name}` reference
// a FluxVM spec declares is listed in fluxvm-references.yaml (found by walking the schemas in
// apis/, so a new reference field fails here until it is listed), and the real `kubectl
// kustomize` renames every one of them under a namePrefix and a nameSuffix.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import yaml from 'js-yaml';
import { fluxKinds } from '../../apis/registry.js';
import type { Schema } from '../../apis/types.js';
import { REPO } from '../e2e/harness.js';
import { haveKubectl, runProcess } from '../e2e/kubectl.js';
import { skipWith } from '../skip.js';

const DIR = join(REPO, 'crds', 'kustomize');

interface Ref {
  /** The kind holding the reference. */
  referral: string;
  /** kustomize's path to the name: `spec/sandboxRef/name` (lists are walked through). */
  path: string;
  /** The kind named. */
  target: string;
}

const key = (r: Ref) => `${r.referral} ${r.path} -> ${r.target}`;

/**
 * The references under `s`: objects whose `name` property is described "Name of the [parent]
 * <Kind> ..." (localRef, secretKeyRef, forkOf). `refKeys` collects every property called
 * `*Ref`, so a reference described some other way is noticed too.
 */
function walk(kind: string, s: Schema, path: string[], out: Ref[], refKeys: string[]): void {
  const m = /^Name of the (?:parent )?([A-Z][A-Za-z]+)\b/.exec(s.properties?.name?.description ?? '');
  if (m) out.push({ referral: kind, path: [...path, 'name'].join('/'), target: m[1] });
  for (const [k, v] of Object.entries(s.properties ?? {})) {
    if (/Ref$/.test(k)) refKeys.push(`${kind} ${[...path, k, 'name'].join('/')}`);
    walk(kind, v, [...path, k], out, refKeys);
  }
  if (s.items) walk(kind, s.items, path, out, refKeys);
}

function schemaReferences(): { refs: Ref[]; refKeys: string[] } {
  const refs: Ref[] = [];
  const refKeys: string[] = [];
  for (const def of fluxKinds) {
    const spec = def.schema.properties?.spec;
    if (spec) walk(def.kind, spec, ['spec'], refs, refKeys);
  }
  return { refs, refKeys };
}

interface FieldSpec {
  kind: string;
  group?: string;
  version?: string;
  path: string;
}

function configReferences(): Ref[] {
  const doc = yaml.load(readFileSync(join(DIR, 'fluxvm-references.yaml'), 'utf8')) as {
    nameReference: { kind: string; group?: string; version?: string; fieldSpecs: FieldSpec[] }[];
  };
  const out: Ref[] = [];
  for (const nr of doc.nameReference) {
    // A FluxVM kind is matched by its group, the Secret as core v1 (kustomize's own entries).
    if (nr.kind === 'Secret') expect(nr, 'Secret').to.deep.include({ version: 'v1' });
    else expect(nr.group, nr.kind).to.equal('fluxvm.dev');
    for (const fs of nr.fieldSpecs) {
      expect(fs.group, `${fs.kind} ${fs.path}`).to.equal('fluxvm.dev');
      out.push({ referral: fs.kind, path: fs.path, target: nr.kind });
    }
  }
  return out;
}

describe('crds/kustomize: the name references of every FluxVM kind', function () {
  this.timeout(60_000);

  it('fluxvm-references.yaml lists exactly the references the schemas declare', () => {
    const { refs, refKeys } = schemaReferences();
    // The walk finds what the issue names at least (sandboxRef, sessionRef, checkpointRef, secretRef).
    for (const f of ['sandboxRef', 'sessionRef', 'checkpointRef', 'secretRef']) expect(refs.map((r) => r.path).join(' ')).to.contain(`${f}/name`);
    expect(refKeys.filter((k) => !refs.some((r) => `${r.referral} ${r.path}` === k))).to.deep.equal([], 'a *Ref field whose name is not described "Name of the <Kind>"');
    const known = new Set([...fluxKinds.map((k) => k.kind), 'Secret']);
    for (const r of refs) expect(known.has(r.target), key(r)).to.equal(true);
    expect(configReferences().map(key).sort()).to.deep.equal(refs.map(key).sort());
  });

  it('kubectl kustomize renames every reference with namePrefix and nameSuffix', async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary (kubectl kustomize)');
    // Every reference the schemas declare (not only the listed ones): one left out fails here too.
    const { refs } = schemaReferences();
    const nameOf = (role: 'r' | 't', kind: string) => `${role}-${kind.toLowerCase()}`;
    type Manifest = { apiVersion: string; kind: string; metadata: { name: string }; spec?: Record<string, unknown> };
    const objects = new Map<string, Manifest>();
    const object = (role: 'r' | 't', kind: string) => {
      const name = nameOf(role, kind);
      if (!objects.has(name)) objects.set(name, { apiVersion: kind === 'Secret' ? 'v1' : 'fluxvm.dev/v1alpha1', kind, metadata: { name }, ...(kind === 'Secret' ? {} : { spec: {} }) });
      return objects.get(name)!;
    };
    for (const r of refs) {
      object('t', r.target);
      // Every reference of a kind set on one object: kustomize does not validate the spec.
      let at = object('r', r.referral) as unknown as Record<string, unknown>;
      const parts = r.path.split('/');
      for (const p of parts.slice(0, -1)) at = (at[p] ??= {}) as Record<string, unknown>;
      at[parts[parts.length - 1]] = nameOf('t', r.target);
    }
    const dir = mkdtempSync(join(tmpdir(), 'fluxvm-kustomize-'));
    try {
      writeFileSync(join(dir, 'objects.yaml'), [...objects.values()].map((o) => yaml.dump(o)).join('---\n'));
      writeFileSync(
        join(dir, 'kustomization.yaml'),
        yaml.dump({ namePrefix: 'p-', nameSuffix: '-s', resources: ['objects.yaml'], components: [relative(dir, DIR)] }),
      );
      const r = await runProcess(['kubectl', 'kustomize', dir], { timeoutMs: 30_000 });
      expect(r.code, r.stderr).to.equal(0);
      const docs = yaml.loadAll(r.stdout) as { metadata: { name: string } }[];
      const built = new Map(docs.map((o) => [o.metadata.name, o as unknown]));
      for (const ref of refs) {
        const o = built.get(`p-${nameOf('r', ref.referral)}-s`);
        expect(o, key(ref)).to.not.equal(undefined);
        const value = ref.path.split('/').reduce<unknown>((v, p) => (v as Record<string, unknown> | undefined)?.[p], o);
        expect(value, key(ref)).to.equal(`p-${nameOf('t', ref.target)}-s`);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
