// The RBAC authorizer: kube's rule matching as table tests, bindings fed from a real registry
// (a new RoleBinding takes effect for the next request, a deleted one stops), and the decision
// cost with 1000 bindings.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { allKinds } from '../../../../apis/registry.js';
import { admit } from '../../../../runtime/apiserver/admission/index.js';
import type { Attributes } from '../../../../runtime/apiserver/http/auth.js';
import { ensureBootstrapPolicy } from '../../../../runtime/apiserver/auth/bootstrap.js';
import { RBAC_GVRS, RbacAuthorizer, ruleAllows, type PolicyRule } from '../../../../runtime/apiserver/auth/rbac.js';
import { Registry } from '../../../../runtime/apiserver/registry.js';
import type { KubeObject } from '../../../../runtime/meta/types.js';
import { Store } from '../../../../runtime/store/store.js';

const U = { name: 'alice', groups: ['devs', 'system:authenticated'] };
const res = (
  verb: string,
  resource: string,
  o: { ns?: string; sub?: string; name?: string; group?: string } = {},
): Attributes => ({
  user: U,
  resource: {
    verb,
    group: o.group ?? 'fluxvm.dev',
    version: 'v1alpha1',
    resource,
    ...(o.ns ? { namespace: o.ns } : {}),
    ...(o.sub ? { subresource: o.sub } : {}),
    ...(o.name ? { name: o.name } : {}),
  },
});
const url = (verb: string, p: string): Attributes => ({ user: U, nonResource: { verb, path: p } });

describe('rbac: rule matching (kube rules)', () => {
  const cases: Array<[string, PolicyRule, Attributes, boolean]> = [
    [
      'exact verb, group, resource',
      { verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] },
      res('get', 'sandboxes'),
      true,
    ],
    [
      'other verb',
      { verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] },
      res('list', 'sandboxes'),
      false,
    ],
    [
      'verb *',
      { verbs: ['*'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] },
      res('deletecollection', 'sandboxes'),
      true,
    ],
    ['other group', { verbs: ['get'], apiGroups: [''], resources: ['sandboxes'] }, res('get', 'sandboxes'), false],
    ['group *', { verbs: ['get'], apiGroups: ['*'], resources: ['sandboxes'] }, res('get', 'sandboxes'), true],
    ['no apiGroups matches nothing', { verbs: ['get'], resources: ['sandboxes'] }, res('get', 'sandboxes'), false],
    [
      'resource does not cover its subresource',
      { verbs: ['create'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] },
      res('create', 'sandboxes', { sub: 'exec' }),
      false,
    ],
    [
      'resource/subresource',
      { verbs: ['create'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes/exec'] },
      res('create', 'sandboxes', { sub: 'exec' }),
      true,
    ],
    [
      'subresource does not cover the resource',
      { verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes/exec'] },
      res('get', 'sandboxes'),
      false,
    ],
    [
      '*/subresource',
      { verbs: ['patch'], apiGroups: ['fluxvm.dev'], resources: ['*/approval'] },
      res('patch', 'changesets', { sub: 'approval' }),
      true,
    ],
    [
      '* covers subresources',
      { verbs: ['create'], apiGroups: ['*'], resources: ['*'] },
      res('create', 'sandboxes', { sub: 'exec' }),
      true,
    ],
    [
      'resourceNames match the name',
      { verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'], resourceNames: ['a'] },
      res('get', 'sandboxes', { name: 'a' }),
      true,
    ],
    [
      'resourceNames refuse another name',
      { verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'], resourceNames: ['a'] },
      res('get', 'sandboxes', { name: 'b' }),
      false,
    ],
    [
      'resourceNames never match a list',
      { verbs: ['list'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'], resourceNames: ['a'] },
      res('list', 'sandboxes'),
      false,
    ],
    ['nonResourceURLs exact', { verbs: ['get'], nonResourceURLs: ['/version'] }, url('get', '/version'), true],
    [
      'nonResourceURLs prefix *',
      { verbs: ['get'], nonResourceURLs: ['/apis/*'] },
      url('get', '/apis/fluxvm.dev/v1alpha1'),
      true,
    ],
    [
      'nonResourceURLs no prefix without *',
      { verbs: ['get'], nonResourceURLs: ['/apis'] },
      url('get', '/apis/fluxvm.dev'),
      false,
    ],
    ['nonResourceURLs verb', { verbs: ['get'], nonResourceURLs: ['/metrics'] }, url('post', '/metrics'), false],
    [
      'resource rule never matches a URL',
      { verbs: ['*'], apiGroups: ['*'], resources: ['*'] },
      url('get', '/metrics'),
      false,
    ],
  ];
  for (const [what, rule, attrs, want] of cases) {
    it(`${what}: ${want ? 'allowed' : 'denied'}`, () => expect(ruleAllows(rule, attrs)).to.equal(want));
  }
});

function binding(
  kind: 'RoleBinding' | 'ClusterRoleBinding',
  name: string,
  ns: string | undefined,
  role: { kind: string; name: string },
  subjects: Array<{ kind: string; name: string }>,
): KubeObject {
  return {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind,
    metadata: { name, ...(ns ? { namespace: ns } : {}) },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', ...role },
    subjects,
  } as unknown as KubeObject;
}

describe('rbac: authorizer over a real registry', () => {
  let dir: string;
  let store: Store;
  let registry: Registry;
  let rbac: RbacAuthorizer;
  let stop: () => void;

  beforeEach(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-rbac-'));
    store = new Store({ dir });
    registry = new Registry({
      store,
      kinds: allKinds,
      admit: (d, o, old, opts) => admit(d, o, old, { fieldValidation: 'Strict', subresource: opts.subresource }),
    });
    await ensureBootstrapPolicy(registry, allKinds);
    rbac = new RbacAuthorizer();
    stop = await rbac.attach(registry);
  });
  afterEach(() => {
    stop();
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a RoleBinding grants in its namespace only; a deleted one stops granting at once', async () => {
    for (const ns of ['team-a', 'team-b'])
      await registry.create(
        { group: '', version: 'v1', resource: 'namespaces' },
        undefined,
        { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } } as KubeObject,
        {},
        {},
      );
    expect(rbac.authorize(res('create', 'sandboxes', { ns: 'team-a' })).allowed).to.equal(false);
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      binding('RoleBinding', 'devs', 'team-a', { kind: 'ClusterRole', name: 'fluxvm-edit' }, [
        { kind: 'Group', name: 'devs' },
      ]),
      {},
      {},
    );
    expect(rbac.authorize(res('create', 'sandboxes', { ns: 'team-a' })).allowed).to.equal(true);
    expect(rbac.authorize(res('create', 'sandboxes', { ns: 'team-a', sub: 'exec', name: 'x' })).allowed).to.equal(true);
    expect(rbac.authorize(res('patch', 'changesets', { ns: 'team-a', sub: 'approval', name: 'x' })).allowed).to.equal(
      false,
    );
    expect(rbac.authorize(res('create', 'sandboxes', { ns: 'team-b' })).allowed).to.equal(false);
    expect(rbac.authorize(res('list', 'sandboxes')).allowed).to.equal(false);
    expect(
      rbac.authorize(res('create', 'rolebindings', { ns: 'team-a', group: 'rbac.authorization.k8s.io' })).allowed,
    ).to.equal(false);
    await registry.delete(RBAC_GVRS.rolebindings, 'team-a', 'devs', {}, {});
    expect(rbac.authorize(res('create', 'sandboxes', { ns: 'team-a' })).allowed).to.equal(false);
  });

  it('a Role binds in its own namespace; a binding to a missing role grants nothing; system:masters bypasses', async () => {
    await registry.create(
      { group: '', version: 'v1', resource: 'namespaces' },
      undefined,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'team-a' } } as KubeObject,
      {},
      {},
    );
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      binding('RoleBinding', 'ghost', 'team-a', { kind: 'Role', name: 'missing' }, [{ kind: 'User', name: 'alice' }]),
      {},
      {},
    );
    expect(rbac.authorize(res('get', 'sandboxes', { ns: 'team-a', name: 'x' })).allowed).to.equal(false);
    await registry.create(
      RBAC_GVRS.roles,
      'team-a',
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'missing', namespace: 'team-a' },
        rules: [{ verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'], resourceNames: ['x'] }],
      } as unknown as KubeObject,
      {},
      {},
    );
    expect(rbac.authorize(res('get', 'sandboxes', { ns: 'team-a', name: 'x' })).allowed).to.equal(true);
    expect(rbac.authorize(res('get', 'sandboxes', { ns: 'team-a', name: 'y' })).allowed).to.equal(false);
    expect(
      rbac.authorize({
        user: { name: 'root', groups: ['system:masters'] },
        nonResource: { verb: 'get', path: '/metrics' },
      }).allowed,
    ).to.equal(true);
  });

  it('bootstrap roles: view has no exec and no secrets, approver only decides, discovery for every authenticated user', () => {
    const viewer = { name: 'v', groups: ['system:authenticated'] };
    rbac.upsert(
      binding('RoleBinding', 'v', 'team-a', { kind: 'ClusterRole', name: 'fluxvm-view' }, [
        { kind: 'User', name: 'v' },
      ]),
    );
    rbac.upsert(
      binding('RoleBinding', 'ap', 'team-a', { kind: 'ClusterRole', name: 'fluxvm-approver' }, [
        { kind: 'User', name: 'ap' },
      ]),
    );
    const as = (name: string, a: Attributes): boolean => rbac.authorize({ ...a, user: { ...viewer, name } }).allowed;
    expect(as('v', res('get', 'sandboxes', { ns: 'team-a', name: 'x' }))).to.equal(true);
    expect(as('v', res('create', 'sandboxes', { ns: 'team-a', sub: 'exec', name: 'x' }))).to.equal(false);
    expect(as('v', res('get', 'sandboxes', { ns: 'team-a', sub: 'exec', name: 'x' }))).to.equal(false);
    expect(as('v', res('get', 'secrets', { ns: 'team-a', name: 's', group: '' }))).to.equal(false);
    expect(as('ap', res('patch', 'changesets', { ns: 'team-a', sub: 'approval', name: 'c' }))).to.equal(true);
    expect(as('ap', res('create', 'changesets', { ns: 'team-a' }))).to.equal(false);
    expect(as('nobody', url('get', '/apis/fluxvm.dev/v1alpha1'))).to.equal(true);
    expect(as('nobody', url('get', '/metrics'))).to.equal(false);
    expect(as('nobody', res('create', 'selfsubjectreviews', { group: 'authentication.k8s.io' }))).to.equal(true);
    expect(as('nobody', res('create', 'subjectaccessreviews', { group: 'authorization.k8s.io' }))).to.equal(false);
  });

  it('decides in under 50 us with 1000 bindings (indexed by subject, compiled per user)', () => {
    for (let i = 0; i < 1000; i++) {
      rbac.upsert(
        binding(
          'RoleBinding',
          `b${i}`,
          `ns-${i % 50}`,
          { kind: 'ClusterRole', name: i % 2 ? 'fluxvm-edit' : 'fluxvm-view' },
          [
            { kind: 'User', name: `user-${i}` },
            { kind: 'Group', name: `group-${i % 20}` },
          ],
        ),
      );
    }
    const user = { name: 'user-7', groups: ['group-7', 'system:authenticated'] };
    const attrs: Attributes = {
      user,
      resource: {
        verb: 'create',
        namespace: 'ns-7',
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        resource: 'sandboxes',
        subresource: 'exec',
        name: 'x',
      },
    };
    expect(rbac.authorize(attrs).allowed).to.equal(true);
    expect(rbac.authorize({ ...attrs, resource: { ...attrs.resource, namespace: 'ns-8' } }).allowed).to.equal(false);
    const n = 20_000;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) rbac.authorize(attrs);
    const perDecisionUs = Number(process.hrtime.bigint() - t0) / 1000 / n;
    console.log(`      rbac decision with 1000 bindings: ${perDecisionUs.toFixed(2)} us`);
    expect(perDecisionUs).to.be.lessThan(50);
  });
});
