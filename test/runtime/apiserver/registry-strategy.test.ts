// The per-kind write strategies (runtime/apiserver/registry-strategy.ts): each strategy on its
// own (pure), then through the registry, so a rule that the registry stops calling fails here.
import { expect } from 'chai';
import { fluxKinds } from '../../../apis/registry.js';
import type { KindDefinition } from '../../../apis/types.js';
import { strategyFor } from '../../../runtime/apiserver/registry-strategy.js';
import { NAMESPACE_KIND } from '../../../runtime/apiserver/registry-meta.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { ctx, EV, EVENT, makeEnv, NS, statusOf, W, WIDGET, widget, type Env } from './registry-fixtures.js';
import { loose } from '../../support/objects.js';

const SECRET_KIND: KindDefinition = {
  ...EVENT,
  kind: 'Secret',
  listKind: 'SecretList',
  plural: 'secrets',
  singular: 'secret',
  shortNames: [],
};
const ROLE_KIND: KindDefinition = {
  ...WIDGET,
  group: 'rbac.authorization.k8s.io',
  kind: 'ClusterRole',
  listKind: 'ClusterRoleList',
  plural: 'clusterroles',
  singular: 'clusterrole',
  namespaced: false,
  statusSubresource: false,
  builtin: true,
};
const SECRETS = { group: '', version: 'v1', resource: 'secrets' };
const ROLES = { group: 'rbac.authorization.k8s.io', version: 'v1', resource: 'clusterroles' };
const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');
const obj = (o: Record<string, unknown>): KubeObject =>
  ({ apiVersion: 'v1', kind: 'X', metadata: { name: 'n' }, ...o }) as KubeObject;

describe('registry strategies (pure)', () => {
  it('default: names are DNS-1123 subdomains of at most 253 characters; only built-in kinds allow an update without resourceVersion', () => {
    const s = strategyFor(WIDGET);
    expect(s.validateName('a.b-c')).to.equal(undefined);
    expect(s.validateName('a'.repeat(253))).to.equal(undefined);
    expect(s.validateName('a'.repeat(254))).to.match(/RFC 1123 subdomain/);
    expect(s.validateName('Upper')).to.match(/^Invalid value: "Upper": a lowercase RFC 1123 subdomain/);
    expect(s.validateName(7)).to.match(/^Invalid value: 7:/);
    expect(s.allowUnconditionalUpdate).to.equal(false);
    expect(strategyFor(EVENT).allowUnconditionalUpdate).to.equal(true);
    expect(Object.keys(s.subresources)).to.deep.equal([]);
    expect(s.nameRule).to.equal('subdomain');
    expect(strategyFor(NAMESPACE_KIND).nameRule).to.equal('label');
    expect(strategyFor(ROLE_KIND).nameRule).to.equal('pathSegment');
    expect(strategyFor(WIDGET)).to.equal(s);
    expect(s.holdsDeletion(obj({ spec: { finalizers: ['kubernetes'] } }))).to.equal(false);
  });

  it('namespace: create sets the kubernetes finalizer (once) and phase Active; every write keeps the name label', () => {
    const s = strategyFor(NAMESPACE_KIND);
    const o = obj({
      metadata: { name: 'team', labels: { a: 'b' } },
      spec: { finalizers: ['x'] },
      status: { phase: 'Terminating' },
    });
    s.prepareForCreate(o);
    s.canonicalize(o);
    expect(o.spec).to.deep.equal({ finalizers: ['x', 'kubernetes'] });
    expect(o.status).to.deep.equal({ phase: 'Active' });
    expect(o.metadata.labels).to.deep.equal({ a: 'b', 'kubernetes.io/metadata.name': 'team' });
    const again = obj({ metadata: { name: 'team' }, spec: { finalizers: ['kubernetes'] } });
    s.prepareForCreate(again);
    expect(loose(again).spec.finalizers).to.deep.equal(['kubernetes']);
  });

  it('namespace: an update keeps the stored spec.finalizers; namespaces/finalize changes only them', () => {
    const s = strategyFor(NAMESPACE_KIND);
    const old = obj({
      metadata: { name: 'team' },
      spec: { finalizers: ['kubernetes'], other: 1 },
      status: { phase: 'Active' },
    });
    const next = obj({ metadata: { name: 'team' }, spec: { finalizers: [], other: 2 } });
    s.prepareForUpdate(next, old);
    expect(next.spec).to.deep.equal({ finalizers: ['kubernetes'], other: 2 });
    const fin = s.subresources.finalize(
      old,
      obj({ metadata: { name: 'team', labels: { x: 'y' } }, spec: { finalizers: ['z'], other: 3 } }),
    );
    expect(fin.spec).to.deep.equal({ finalizers: ['z'], other: 1 });
    expect(fin.metadata.labels).to.equal(undefined);
    expect(loose(old).spec.finalizers).to.deep.equal(['kubernetes']);
    expect(loose(s.subresources.finalize(old, obj({}))).spec.finalizers).to.deep.equal([]);
  });

  it('namespace: names are DNS-1123 labels of at most 63; default may not be deleted; spec.finalizers hold a deletion, which sets Terminating', () => {
    const s = strategyFor(NAMESPACE_KIND);
    expect(s.validateName('a'.repeat(63))).to.equal(undefined);
    expect(s.validateName('a'.repeat(64))).to.match(/RFC 1123 label/);
    expect(s.validateName('a.b')).to.match(/RFC 1123 label/);
    expect(() => s.validateDelete('default')).to.throw(
      'namespaces "default" is forbidden: this namespace may not be deleted',
    );
    expect(() => s.validateDelete('team')).to.not.throw();
    expect(s.holdsDeletion(obj({ spec: { finalizers: ['kubernetes'] } }))).to.equal(true);
    expect(s.holdsDeletion(obj({ spec: { finalizers: [] } }))).to.equal(false);
    expect(s.holdsDeletion(obj({}))).to.equal(false);
    const o = obj({ status: { phase: 'Active', conditions: [] } });
    s.prepareForDelete(o);
    expect(o.status).to.deep.equal({ phase: 'Terminating', conditions: [] });
  });

  it('secret: stringData is merged into data as base64 (winning over data) and dropped; type defaults to Opaque', () => {
    const s = strategyFor(SECRET_KIND);
    const o = obj({ data: { keep: b64('k'), a: b64('old') }, stringData: { a: 'neu', u: 'grüße' }, type: '' });
    s.canonicalize(o);
    expect(o).to.not.have.property('stringData');
    expect(loose(o).data).to.deep.equal({ keep: b64('k'), a: b64('neu'), u: b64('grüße') });
    expect(loose(o).type).to.equal('Opaque');
    const typed = obj({ stringData: null, type: 'kubernetes.io/tls' });
    s.canonicalize(typed);
    expect(typed).to.not.have.property('stringData');
    expect(typed).to.not.have.property('data');
    expect(loose(typed).type).to.equal('kubernetes.io/tls');
    // Not a map of strings: left for admission to refuse, naming the field.
    const bad = obj({ stringData: { n: 1 } });
    s.canonicalize(bad);
    expect(loose(bad).stringData).to.deep.equal({ n: 1 });
    // Idempotent.
    const twice = obj({ stringData: { a: 'x' } });
    s.canonicalize(twice);
    s.canonicalize(twice);
    expect(loose(twice).data).to.deep.equal({ a: b64('x') });
  });

  it('rbac: names are path segments (system:discovery is valid; ".", "..", "/" and "%" are not)', () => {
    const s = strategyFor(ROLE_KIND);
    expect(s.validateName('system:discovery')).to.equal(undefined);
    expect(s.validateName('Mixed_Case')).to.equal(undefined);
    for (const bad of ['', '.', '..', 'a/b', 'a%b'])
      expect(s.validateName(bad)).to.equal(
        `Invalid value: ${JSON.stringify(bad)}: may not be '.' or '..' and may not contain '/' or '%'`,
      );
  });
});

describe('registry strategies through the registry', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv({ kinds: [WIDGET, EVENT, SECRET_KIND, ROLE_KIND] })));
  afterEach(() => env.close());

  it('a namespace is created with the kubernetes finalizer, phase Active and the name label, whatever the body says; the label stays on update', async () => {
    const made = await env.registry.create(
      NS,
      undefined,
      {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name: 'team' },
        spec: { finalizers: ['x'] },
        status: { phase: 'Terminating' },
      },
      {},
      ctx,
    );
    expect(made.object.spec).to.deep.equal({ finalizers: ['x', 'kubernetes'] });
    expect(made.object.status).to.deep.equal({ phase: 'Active' });
    expect(made.object.metadata.labels).to.deep.equal({ 'kubernetes.io/metadata.name': 'team' });
    const patched = await env.registry.patch(
      NS,
      undefined,
      'team',
      'merge',
      { metadata: { labels: { 'kubernetes.io/metadata.name': null, a: 'b' } } },
      {},
      ctx,
    );
    expect(patched.object.metadata.labels).to.deep.equal({ 'kubernetes.io/metadata.name': 'team', a: 'b' });
    expect((await env.registry.get(NS, undefined, 'default', ctx)).metadata.labels).to.deep.equal({
      'kubernetes.io/metadata.name': 'default',
    });
  });

  it('finalize is a subresource of namespaces only (404 elsewhere); a namespace name of 64 characters is 422', async () => {
    await env.registry.create(W, 'default', widget('w') as any, {}, ctx);
    const st = await statusOf(() =>
      env.registry.patch(W, 'default', 'w', 'merge', { spec: {} }, { subresource: 'finalize' }, ctx),
    );
    expect(st.code).to.equal(404);
    const long = await statusOf(() =>
      env.registry.create(
        NS,
        undefined,
        { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'a'.repeat(64) } },
        {},
        ctx,
      ),
    );
    expect(long.code).to.equal(422);
    expect(long.details.causes.map((c: any) => c.field)).to.deep.equal(['metadata.name']);
    await env.registry.create(
      NS,
      undefined,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'a'.repeat(63) } },
      {},
      ctx,
    );
  });

  it('a Secret written with stringData is stored with data only, on create and on update', async () => {
    const made = await env.registry.create(
      SECRETS,
      'default',
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 's' }, stringData: { k: 'v' } } as any,
      {},
      ctx,
    );
    expect(loose(made.object).data).to.deep.equal({ k: b64('v') });
    expect(made.object).to.not.have.property('stringData');
    const upd = await env.registry.update(
      SECRETS,
      'default',
      's',
      { ...made.object, stringData: { k: 'w' } } as any,
      {},
      ctx,
    );
    expect(loose(upd.object).data).to.deep.equal({ k: b64('w') });
    expect(await env.registry.get(SECRETS, 'default', 's', ctx)).to.not.have.property('stringData');
  });

  it('a ClusterRole may be named system:discovery; a Widget may not; a Widget PUT needs a resourceVersion, an Event PUT does not', async () => {
    await env.registry.create(
      ROLES,
      undefined,
      { apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'ClusterRole', metadata: { name: 'system:x' } },
      {},
      ctx,
    );
    const w = await statusOf(() => env.registry.create(W, 'default', widget('system:x') as any, {}, ctx));
    expect(w.code).to.equal(422);
    await env.registry.create(W, 'default', widget('w') as any, {}, ctx);
    const put = await statusOf(() =>
      env.registry.update(W, 'default', 'w', widget('w', { color: 'b' }) as any, {}, ctx),
    );
    expect(put.details.causes).to.deep.equal([
      {
        reason: 'FieldValueInvalid',
        field: 'metadata.resourceVersion',
        message: 'Invalid value: 0x0: must be specified for an update',
      },
    ]);
    const ev = { apiVersion: 'v1', kind: 'Event', metadata: { name: 'e' }, reason: 'A' };
    await env.registry.create(EV, 'default', ev as any, {}, ctx);
    const evPut = await env.registry.update(EV, 'default', 'e', { ...ev, reason: 'B' } as any, {}, ctx);
    expect(loose(evPut.object).reason).to.equal('B');
  });

  it('a custom resource with status conditions is created Reconciling (kstatus InProgress), whatever status the body carries; one without kstatus conditions gets none', async () => {
    const cenv = makeEnv({ kinds: fluxKinds });
    try {
      for (const def of fluxKinds.filter((k) =>
        ['sandboxes', 'changesets', 'checkpoints', 'agentsessions', 'grants'].includes(k.plural),
      )) {
        const strategy = strategyFor(def);
        const o = obj({ metadata: { name: 'n', creationTimestamp: '2026-12-01T00:00:00Z', generation: 1 } });
        strategy.prepareForCreate(o);
        expect((o as any).status, def.plural).to.deep.equal({
          conditions: [
            {
              type: 'Reconciling',
              status: 'True',
              reason: 'Created',
              message: 'waiting for the controller to reconcile it',
              lastTransitionTime: '2026-12-01T00:00:00Z',
              observedGeneration: 1,
            },
          ],
        });
      }
      const CS = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'changesets' };
      const made = await cenv.registry.create(
        CS,
        'default',
        {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'Changeset',
          metadata: { name: 'c' },
          spec: { sandboxRef: { name: 'x' }, command: ['true'] },
          status: { phase: 'Applied' },
        } as any,
        {},
        ctx,
      );
      expect(made.object.status).to.deep.equal({
        conditions: [
          {
            type: 'Reconciling',
            status: 'True',
            reason: 'Created',
            message: 'waiting for the controller to reconcile it',
            lastTransitionTime: made.object.metadata.creationTimestamp,
            observedGeneration: 1,
          },
        ],
      });
    } finally {
      cenv.close();
    }
    const w = await env.registry.create(W, 'default', { ...widget('w'), status: { phase: 'X' } } as any, {}, ctx);
    expect(w.object.status).to.equal(undefined);
    // Approval's conditions are decisions (Approved/Denied), not kstatus conditions: none at create.
    const approvalKind = fluxKinds.find((k) => k.plural === 'approvals')!;
    const a = obj({ metadata: { name: 'n', creationTimestamp: '2026-12-01T00:00:00Z', generation: 1 } });
    strategyFor(approvalKind).prepareForCreate(a);
    expect((a as any).status).to.equal(undefined);
  });
});
