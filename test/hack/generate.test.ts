import { parse } from '@bufbuild/cel';
import { expect } from 'chai';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import yaml from 'js-yaml';
import { buildOpenAPIv3, openapiHash } from '../../apis/openapi.js';
import { fluxKinds } from '../../apis/registry.js';
import type { Schema } from '../../apis/types.js';
import {
  controllerRbacRules,
  generateAll,
  RBAC_FILE,
  ROOT,
  SDK_TYPES_FILE,
  staleFiles,
  withRbacRegion,
} from '../../hack/generate.js';
import { toAjvSchema } from '../../runtime/apiserver/admission/validate.js';
import _Ajv from 'ajv';

const AjvCtor = ((_Ajv as unknown as { default?: unknown }).default ?? _Ajv) as new (o: object) => {
  validate(s: object, d: unknown): boolean;
};

/** Every violation of the structural-schema rules of apiextensions.k8s.io/v1, as messages. */
function structuralProblems(s: Schema, path: string, underArray: boolean, out: string[]): string[] {
  const bad = (m: string) => out.push(`${path}: ${m}`);
  const anyS = s as Record<string, unknown>;
  for (const k of [
    '$ref',
    'definitions',
    'dependencies',
    'additionalItems',
    'patternProperties',
    'allOf',
    'anyOf',
    'oneOf',
    'not',
  ])
    if (k in anyS) bad(`${k} is not allowed here`);
  if (anyS.uniqueItems === true) bad('uniqueItems: true is forbidden in CRDs');
  if (s['x-kubernetes-int-or-string']) {
    if (s.type) bad('int-or-string must not have a type');
  } else if (!s.type && !s['x-kubernetes-preserve-unknown-fields']) bad('missing type');
  if (s.properties && s.additionalProperties !== undefined) bad('properties and additionalProperties together');
  if (s.properties && s.type !== 'object') bad('properties on a non-object');
  if (s.items && s.type !== 'array') bad('items on a non-array');
  if (s.type === 'array' && !s.items) bad('array without items');
  if (s.enum)
    for (const v of s.enum)
      if (s.type && typeof v !== (s.type === 'integer' ? 'number' : s.type)) bad(`enum value ${v} of wrong type`);
  if (s.default !== undefined) {
    const ajv = new AjvCtor({ strict: false, validateFormats: false, logger: false });
    if (!ajv.validate(toAjvSchema(s), s.default)) bad('default does not validate against its own schema');
  }
  const lt = s['x-kubernetes-list-type'];
  if (lt && s.type !== 'array') bad('list-type on a non-array');
  if (lt === 'map') {
    if (s.items?.type !== 'object') bad('map list items must be objects');
    for (const k of s['x-kubernetes-list-map-keys'] ?? []) {
      const ks = s.items?.properties?.[k];
      if (!ks) bad(`map key ${k} is not a property`);
      else if (!(s.items?.required ?? []).includes(k) && ks.default === undefined)
        bad(`map key ${k} must be required or defaulted`);
      else if (!['string', 'integer', 'boolean'].includes(ks.type ?? '')) bad(`map key ${k} must be a scalar`);
    }
  }
  if (lt === 'set' && s.items && !['string', 'integer', 'boolean', 'number'].includes(s.items.type ?? ''))
    bad('set items must be scalars');
  for (const r of s['x-kubernetes-validations'] ?? []) {
    try {
      parse(r.rule);
    } catch (e) {
      bad(`rule does not parse: ${r.rule}`);
    }
    if (/\boldSelf\b/.test(r.rule) && underArray)
      bad(`transition rule under a list that does not correlate: ${r.rule}`);
  }
  for (const [k, v] of Object.entries(s.properties ?? {})) structuralProblems(v, `${path}.${k}`, underArray, out);
  if (s.items) structuralProblems(s.items, `${path}[]`, underArray || lt !== 'map', out);
  if (typeof s.additionalProperties === 'object')
    structuralProblems(s.additionalProperties, `${path}{}`, underArray, out);
  return out;
}

describe('hack/generate', function () {
  this.timeout(60000);
  let files: Map<string, string>;
  before(async () => {
    files = await generateAll();
  });

  it('--verify passes on a clean tree (generated files are committed and current)', () => {
    expect(staleFiles(files)).to.deep.equal([]);
  });

  it('--verify names a stale file and a leftover CRD', () => {
    const root = mkdtempSync(join(tmpdir(), 'fluxvm-gen-'));
    try {
      for (const [p, c] of files) {
        mkdirSync(dirname(join(root, p)), { recursive: true });
        writeFileSync(join(root, p), c);
      }
      expect(staleFiles(files, root)).to.deep.equal([]);
      writeFileSync(join(root, 'crds/grants.fluxvm.dev.yaml'), 'edited by hand\n');
      writeFileSync(join(root, 'crds/old.fluxvm.dev.yaml'), 'a kind that is gone\n');
      rmSync(join(root, 'apis/zz_generated.types.ts'));
      expect(staleFiles(files, root)).to.deep.equal([
        'apis/zz_generated.types.ts',
        'crds/grants.fluxvm.dev.yaml',
        'crds/old.fluxvm.dev.yaml',
      ]);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });

  it("the SDK's types (sdk/src/zz_generated.types.ts) are generated with the API's: a schema change leaves them stale", () => {
    const sdk = files.get(SDK_TYPES_FILE)!;
    expect(sdk.split('\n')[0]).to.match(/generated by hack\/generate\.ts/);
    for (const def of fluxKinds) expect(sdk, def.kind).to.include(`export interface ${def.kind} {\n`);
    // The same declarations as apis/ (no import of the server's code).
    const body = (t: string) => t.slice(t.indexOf('export '));
    expect(body(sdk)).to.equal(body(files.get('apis/zz_generated.types.ts')!));
    const root = mkdtempSync(join(tmpdir(), 'fluxvm-gen-'));
    try {
      for (const [p, c] of files) {
        mkdirSync(dirname(join(root, p)), { recursive: true });
        writeFileSync(join(root, p), c);
      }
      // What the file holds after a field was added to a schema without `make generate`.
      writeFileSync(
        join(root, SDK_TYPES_FILE),
        sdk.replace('export interface SandboxSpec {\n', 'export interface SandboxSpec {\n  gone?: string;\n'),
      );
      expect(staleFiles(files, root)).to.deep.equal([SDK_TYPES_FILE]);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });

  it('every generated kind is a KubeObject: an index signature and managedFields typed as runtime/meta does', () => {
    const types = files.get('apis/zz_generated.types.ts')!;
    for (const def of fluxKinds)
      expect(types, def.kind).to.include(`export interface ${def.kind} {\n  [key: string]: unknown;\n`);
    expect(types).to.match(/managedFields\?: \{\n    manager: string;\n    operation: 'Apply' \| 'Update';/);
  });

  it("the controller's RBAC rules come from the kinds: a new kind is in them, a hand edit is stale", () => {
    const rbac = files.get(RBAC_FILE)!;
    const role = (yaml.loadAll(rbac) as any[]).find(
      (d) => d?.kind === 'ClusterRole' && d.metadata.name === 'fluxvm-controller',
    );
    const flux = role.rules.filter((r: any) => r.apiGroups.includes('fluxvm.dev'));
    expect(flux[0].resources).to.deep.equal(fluxKinds.map((k) => k.plural));
    expect(flux[1].resources).to.deep.equal(
      fluxKinds.filter((k) => k.statusSubresource).map((k) => `${k.plural}/status`),
    );
    expect(flux[2].resources).to.deep.equal(fluxKinds.map((k) => `${k.plural}/finalizers`));
    // A kind added to the registry shows up in the generated rules (so the file goes stale).
    const widget = { ...fluxKinds[0], plural: 'widgets', kind: 'Widget' };
    const more = withRbacRegion(rbac, controllerRbacRules([...fluxKinds, widget]));
    expect(more).to.not.equal(rbac);
    expect(more).to.include('agentsessions, approvals, grants, nodes, volumes, widgets]');
    expect(more).to.include('volumes/finalizers, widgets/finalizers]');
    // --verify names a hand-edited rbac.yaml.
    const root = mkdtempSync(join(tmpdir(), 'fluxvm-gen-'));
    try {
      for (const [p, c] of files) {
        mkdirSync(dirname(join(root, p)), { recursive: true });
        writeFileSync(join(root, p), c);
      }
      writeFileSync(
        join(root, RBAC_FILE),
        rbac.replace('agentsessions, approvals, grants, nodes, volumes]', 'agentsessions]'),
      );
      expect(staleFiles(files, root)).to.deep.equal([RBAC_FILE]);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
    expect(() => withRbacRegion('rules: []\n', 'x')).to.throw(/markers are missing/);
  });

  it('says generated in the first line of the types file and of every CRD', () => {
    expect(files.get('apis/zz_generated.types.ts')!.split('\n')[0]).to.match(
      /^\/\/ Code generated by hack\/generate\.ts.*DO NOT EDIT\.$/,
    );
    for (const def of fluxKinds)
      expect(files.get(`crds/${def.plural}.fluxvm.dev.yaml`)!.split('\n')[0]).to.match(
        /^# Code generated .*DO NOT EDIT\.$/,
      );
  });

  for (const def of fluxKinds) {
    it(`crds/${def.plural}.fluxvm.dev.yaml is a valid structural CRD`, () => {
      const crd = yaml.load(readFileSync(join(ROOT, `crds/${def.plural}.fluxvm.dev.yaml`), 'utf8')) as any;
      expect(crd.apiVersion).to.equal('apiextensions.k8s.io/v1');
      expect(crd.kind).to.equal('CustomResourceDefinition');
      expect(crd.metadata.name).to.equal(`${crd.spec.names.plural}.${crd.spec.group}`);
      expect(crd.spec.scope).to.equal(def.namespaced ? 'Namespaced' : 'Cluster');
      expect(crd.spec.names).to.include({
        kind: def.kind,
        listKind: def.listKind,
        plural: def.plural,
        singular: def.singular,
      });
      expect(crd.spec.names.categories ?? []).to.deep.equal(def.categories);
      if (def.namespaced) expect(crd.spec.names.categories).to.include('fluxvm');
      expect(crd.spec.versions).to.have.length(1);
      const v = crd.spec.versions[0];
      expect(v).to.include({ name: 'v1alpha1', served: true, storage: true });
      expect(v.subresources).to.deep.equal({ status: {} });
      const schema = v.schema.openAPIV3Schema as Schema;
      expect(schema.type).to.equal('object');
      // metadata may only be `type: object` (name/generateName restrictions aside).
      expect(schema.properties!.metadata).to.deep.equal({ type: 'object' });
      expect(structuralProblems(schema, def.kind, false, [])).to.deep.equal([]);
      for (const c of v.additionalPrinterColumns) {
        expect(['string', 'integer', 'number', 'boolean', 'date']).to.include(c.type);
        // A simple path, or a path through one list filtered by type (the Ready condition, as
        // cert-manager's and agent-sandbox's CRDs print it).
        expect(c.jsonPath).to.match(/^\.[A-Za-z.]+(\[\?\(@\.type=="[A-Za-z]+"\)\]\.[A-Za-z]+)?$/);
      }
      expect(v.additionalPrinterColumns.at(-1)).to.deep.include({
        name: 'Age',
        type: 'date',
        jsonPath: '.metadata.creationTimestamp',
      });
      expect(v.selectableFields.length).to.be.within(1, 8);
      for (const f of v.selectableFields) {
        // A selectable field must name a scalar field of the schema.
        let node: Schema | undefined = schema;
        for (const seg of f.jsonPath.slice(1).split('.')) node = node?.properties?.[seg];
        expect(['string', 'integer', 'boolean'], f.jsonPath).to.include(node?.type);
      }
    });
  }

  it('writes the OpenAPI document apis/openapi.ts builds, byte for byte', () => {
    const onDisk = readFileSync(join(ROOT, 'apis/zz_generated.openapi.json'), 'utf8');
    expect(onDisk).to.equal(JSON.stringify(buildOpenAPIv3(fluxKinds), null, 2) + '\n');
    expect(openapiHash(JSON.parse(onDisk))).to.equal(openapiHash(buildOpenAPIv3(fluxKinds)));
  });

  it('OpenAPI: patch operations kubectl accepts, every $ref resolvable, no strategic merge patch', () => {
    const doc = buildOpenAPIv3(fluxKinds) as any;
    expect(doc.openapi).to.equal('3.0.0');
    const text = JSON.stringify(doc);
    expect(text).to.not.include('strategic-merge-patch');
    for (const m of text.matchAll(/"\$ref":"#\/components\/schemas\/([^"]+)"/g))
      expect(doc.components.schemas, m[1]).to.have.property(m[1]);
    for (const def of fluxKinds) {
      const coll = def.namespaced
        ? `/apis/fluxvm.dev/v1alpha1/namespaces/{namespace}/${def.plural}`
        : `/apis/fluxvm.dev/v1alpha1/${def.plural}`;
      const item = `${coll}/{name}`;
      expect(Object.keys(doc.paths[coll])).to.have.members(['get', 'post', 'delete']);
      expect(Object.keys(doc.paths[item])).to.have.members(['get', 'put', 'delete', 'patch']);
      expect(Object.keys(doc.paths[`${item}/status`])).to.have.members(['get', 'put', 'patch']);
      expect(doc.paths[`/apis/fluxvm.dev/v1alpha1/${def.plural}`].get['x-kubernetes-action']).to.equal('list');
      const patch = doc.paths[item].patch;
      expect(patch['x-kubernetes-group-version-kind']).to.deep.equal({
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        kind: def.kind,
      });
      expect(patch.parameters.find((p: any) => p.name === 'fieldValidation')).to.deep.include({ in: 'query' });
      for (const p of patch.parameters) expect(p).to.not.have.property('$ref');
      expect(Object.keys(patch.requestBody.content)).to.deep.equal([
        'application/json-patch+json',
        'application/merge-patch+json',
        'application/apply-patch+yaml',
      ]);
      const ks = doc.components.schemas[`dev.fluxvm.v1alpha1.${def.kind}`];
      expect(ks['x-kubernetes-group-version-kind']).to.deep.equal([
        { group: 'fluxvm.dev', kind: def.kind, version: 'v1alpha1' },
      ]);
      expect(ks.properties.metadata.allOf).to.deep.equal([
        { $ref: '#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta' },
      ]);
      expect(ks.properties.spec.description).to.be.a('string');
      expect(doc.components.schemas[`dev.fluxvm.v1alpha1.${def.listKind}`].properties.items.items).to.deep.equal({
        $ref: `#/components/schemas/dev.fluxvm.v1alpha1.${def.kind}`,
      });
    }
  });

  it('the hash changes when a schema changes', () => {
    const a = openapiHash(buildOpenAPIv3(fluxKinds));
    const changed = fluxKinds.map((k) =>
      k.kind === 'Grant' ? { ...k, description: 'x', schema: { ...k.schema, description: 'changed' } } : k,
    );
    expect(openapiHash(buildOpenAPIv3(changed))).to.not.equal(a);
    expect(openapiHash(buildOpenAPIv3(fluxKinds))).to.equal(a);
  });

  it('install manifests: APIService, auth delegation, controller with leader election, node agent', () => {
    const docs: any[] = [];
    const dir = join(ROOT, 'crds/install');
    for (const f of [
      ...readdirSync(dir)
        .filter((f) => f.endsWith('.yaml'))
        .map((f) => join(dir, f)),
      join(dir, 'aggregated/apiservice.yaml'),
    ])
      for (const d of yaml.loadAll(readFileSync(f, 'utf8'))) if (d) docs.push(d);
    const find = (kind: string, name: string) => docs.find((d) => d.kind === kind && d.metadata.name === name);
    expect(find('APIService', 'v1alpha1.fluxvm.dev').spec).to.include({ group: 'fluxvm.dev', version: 'v1alpha1' });
    expect(find('ClusterRoleBinding', 'fluxvm-apiserver:system:auth-delegator').roleRef.name).to.equal(
      'system:auth-delegator',
    );
    const rb = find('RoleBinding', 'fluxvm-apiserver-auth-reader');
    expect(rb.metadata.namespace).to.equal('kube-system');
    expect(rb.roleRef.name).to.equal('extension-apiserver-authentication-reader');
    const dep = find('Deployment', 'fluxvm-controller');
    expect(dep.spec.template.spec.containers[0].args).to.include('--leader-elect');
    expect(find('Role', 'fluxvm-leader-election').rules[0].resources).to.deep.equal(['leases']);
    const ds = find('DaemonSet', 'fluxvm-node-agent');
    expect(ds.spec.template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath).to.equal('spec.nodeName');
    for (const d of docs)
      // fluxvm-node-lease: the node agents' heartbeat Leases (their RoleBinding lives there).
      if (d.metadata.namespace)
        expect(['fluxvm-system', 'kube-system', 'fluxvm-node-lease']).to.include(d.metadata.namespace);
  });
});
