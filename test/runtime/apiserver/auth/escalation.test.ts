// RBAC escalation prevention and ClusterRole aggregation over a real registry and store: a
// namespace admin (fluxvm-edit + rights on roles and rolebindings) cannot write a Role with
// Secrets access they lack nor bind cluster-admin; with escalate / bind (resourceNames
// respected) they can; system:masters bypasses. Aggregation: a labelled ClusterRole's rules
// join fluxvm-edit, and leave it when it is deleted.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { allKinds } from '../../../../apis/registry.js';
import { admit } from '../../../../runtime/apiserver/admission/index.js';
import { attachAggregator, aggregatedRules, selectorString } from '../../../../runtime/apiserver/auth/aggregation.js';
import { ensureBootstrapPolicy } from '../../../../runtime/apiserver/auth/bootstrap.js';
import { compactString, escalationGuard, missingRules } from '../../../../runtime/apiserver/auth/escalation.js';
import { RBAC_GVRS, RbacAuthorizer, type PolicyRule } from '../../../../runtime/apiserver/auth/rbac.js';
import { Registry } from '../../../../runtime/apiserver/registry.js';
import type { UserInfo } from '../../../../runtime/apiserver/registry-types.js';
import type { KubeObject } from '../../../../runtime/meta/types.js';
import { Store } from '../../../../runtime/store/store.js';
import { loose } from '../../../support/objects.js';
import { eventually } from '../../../support/wait.js';

const RBAC = 'rbac.authorization.k8s.io';
const NS = { group: '', version: 'v1', resource: 'namespaces' };
const ALICE: UserInfo = { name: 'alice', groups: ['team-a-admins', 'system:authenticated'] };
const as = (user: UserInfo) => ({ user });

const role = (name: string, ns: string, rules: PolicyRule[]) =>
  ({ apiVersion: `${RBAC}/v1`, kind: 'Role', metadata: { name, namespace: ns }, rules }) as unknown as KubeObject;
const clusterRole = (name: string, rules: PolicyRule[], labels?: Record<string, string>) =>
  ({
    apiVersion: `${RBAC}/v1`,
    kind: 'ClusterRole',
    metadata: { name, ...(labels ? { labels } : {}) },
    rules,
  }) as unknown as KubeObject;
const roleBinding = (name: string, ns: string, ref: { kind: string; name: string }, user = 'alice') =>
  ({
    apiVersion: `${RBAC}/v1`,
    kind: 'RoleBinding',
    metadata: { name, namespace: ns },
    roleRef: { apiGroup: RBAC, ...ref },
    subjects: [{ kind: 'User', apiGroup: RBAC, name: user }],
  }) as unknown as KubeObject;

async function refused(p: Promise<unknown>): Promise<{ code: number; reason: string; message: string }> {
  try {
    await p;
  } catch (e: any) {
    return e.status;
  }
  throw new Error('expected the write to be refused');
}

describe('rbac: escalation check (pure)', () => {
  it('missingRules breaks rules down as kube does: * only by *, */sub covers subresources, names by names', () => {
    const held: PolicyRule[] = [
      { verbs: ['get', 'list'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes', '*/status'] },
      { verbs: ['get'], apiGroups: [''], resources: ['secrets'], resourceNames: ['one'] },
      { verbs: ['get'], nonResourceURLs: ['/apis/*'] },
    ];
    expect(
      missingRules(held, [{ verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes', 'sandboxes/status'] }]),
    ).to.deep.equal([]);
    expect(
      missingRules(held, [{ verbs: ['get'], apiGroups: [''], resources: ['secrets'], resourceNames: ['one'] }]),
    ).to.deep.equal([]);
    expect(missingRules(held, [{ verbs: ['get'], nonResourceURLs: ['/apis/fluxvm.dev'] }])).to.deep.equal([]);
    expect(missingRules(held, [{ verbs: ['*'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] }])).to.deep.equal([
      { verbs: ['*'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] },
    ]);
    expect(
      missingRules(held, [{ verbs: ['get', 'watch', 'delete'], apiGroups: [''], resources: ['secrets'] }]),
    ).to.deep.equal([{ verbs: ['get', 'watch', 'delete'], apiGroups: [''], resources: ['secrets'] }]);
    expect(
      missingRules(held, [{ verbs: ['get'], apiGroups: [''], resources: ['secrets'], resourceNames: ['one', 'two'] }]),
    ).to.deep.equal([{ verbs: ['get'], apiGroups: [''], resources: ['secrets'], resourceNames: ['two'] }]);
    expect(
      missingRules(held, [{ verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes/exec'] }]).length,
    ).to.equal(1);
    expect(compactString({ verbs: ['get', 'list'], apiGroups: [''], resources: ['secrets'] })).to.equal(
      '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list"]}',
    );
  });

  it('label selectors: matchLabels and matchExpressions; an aggregated role takes the matching rules in name order, once', () => {
    expect(
      selectorString({
        matchLabels: { a: 'b' },
        matchExpressions: [
          { key: 'c', operator: 'In', values: ['x', 'y'] },
          { key: 'd', operator: 'DoesNotExist' },
        ],
      }),
    ).to.equal('a=b,c in (x,y),!d');
    const agg = {
      ...clusterRole('agg', []),
      aggregationRule: { clusterRoleSelectors: [{ matchLabels: { 'x/agg': 'true' } }] },
    } as unknown as KubeObject;
    const r1: PolicyRule = { verbs: ['get'], apiGroups: [''], resources: ['secrets'] };
    const r2: PolicyRule = { verbs: ['list'], apiGroups: [''], resources: ['secrets'] };
    const all = [
      agg,
      clusterRole('zz', [r2, r1], { 'x/agg': 'true' }),
      clusterRole('aa', [r1], { 'x/agg': 'true' }),
      clusterRole('other', [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'] }]),
    ];
    expect(aggregatedRules(agg, all)).to.deep.equal([r1, r2]);
    expect(aggregatedRules(clusterRole('plain', []), all)).to.equal(undefined);
  });
});

describe('rbac: escalation prevention and aggregation over a real registry', () => {
  let dir: string;
  let store: Store;
  let registry: Registry;
  let rbac: RbacAuthorizer;
  const stops: (() => void)[] = [];

  beforeEach(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-escalation-'));
    store = new Store({ dir, compaction: { intervalMs: 0 } });
    rbac = new RbacAuthorizer();
    registry = new Registry({
      store,
      kinds: allKinds,
      guard: escalationGuard({ rbac, authorize: rbac.authorize }),
      admit: (d, o, old, opts) => admit(d, o, old, { fieldValidation: 'Strict', subresource: opts.subresource }),
    });
    await ensureBootstrapPolicy(registry, allKinds);
    stops.push(await attachAggregator(registry));
    stops.push(await rbac.attach(registry));
    for (const ns of ['team-a', 'team-b'])
      await registry.create(
        NS,
        undefined,
        { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } } as KubeObject,
        {},
        {},
      );
    // alice: a namespace admin of team-a: fluxvm-edit, plus full rights on roles and rolebindings there.
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      roleBinding('edit', 'team-a', { kind: 'ClusterRole', name: 'fluxvm-edit' }),
      {},
      {},
    );
    await registry.create(
      RBAC_GVRS.clusterroles,
      undefined,
      clusterRole('rbac-writer', [
        {
          verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'],
          apiGroups: [RBAC],
          resources: ['roles', 'rolebindings'],
        },
      ]),
      {},
      {},
    );
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      roleBinding('rbac', 'team-a', { kind: 'ClusterRole', name: 'rbac-writer' }),
      {},
      {},
    );
  });
  afterEach(() => {
    for (const s of stops.splice(0)) s();
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const podReader = () =>
    role('sandbox-reader', 'team-a', [{ verbs: ['get', 'list'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] }]);
  const secretsAll = () =>
    role('secrets-admin', 'team-a', [
      { verbs: ['get', 'list', 'escalate'], apiGroups: [''], resources: ['secrets', 'configmaps'] },
    ]);

  it('a namespace admin may create a Role within their rights, not one with permissions they lack (403, kube wording, nothing stored)', async () => {
    await registry.create(RBAC_GVRS.roles, 'team-a', podReader(), {}, as(ALICE));
    const st = await refused(registry.create(RBAC_GVRS.roles, 'team-a', secretsAll(), {}, as(ALICE)));
    expect(st.code).to.equal(403);
    expect(st.reason).to.equal('Forbidden');
    expect(st.message).to.equal(
      'roles.rbac.authorization.k8s.io "secrets-admin" is forbidden: user "alice" (groups=["team-a-admins" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n' +
        '{APIGroups:[""], Resources:["secrets"], Verbs:["escalate"]}\n{APIGroups:[""], Resources:["configmaps"], Verbs:["get" "list" "escalate"]}',
    );
    expect(store.get({ group: RBAC, resource: 'roles', namespace: 'team-a', name: 'secrets-admin' })).to.equal(
      undefined,
    );
    // Nor the same Role in a namespace where they hold nothing.
    expect(
      (
        await refused(
          registry.create(
            RBAC_GVRS.roles,
            'team-b',
            { ...podReader(), metadata: { name: 'r', namespace: 'team-b' } } as KubeObject,
            {},
            as(ALICE),
          ),
        )
      ).code,
    ).to.equal(403);
    // Widening an existing Role by update is checked as well; a label-only update of a role they hold is fine.
    const cur = await registry.get(RBAC_GVRS.roles, 'team-a', 'sandbox-reader', {});
    const wider = {
      ...cur,
      rules: [...(cur as any).rules, { verbs: ['get'], apiGroups: [''], resources: ['nodes'] }],
    } as KubeObject;
    expect(
      (await refused(registry.update(RBAC_GVRS.roles, 'team-a', 'sandbox-reader', wider, {}, as(ALICE)))).code,
    ).to.equal(403);
    await registry.update(
      RBAC_GVRS.roles,
      'team-a',
      'sandbox-reader',
      { ...cur, metadata: { ...cur.metadata, labels: { a: 'b' } } } as KubeObject,
      {},
      as(ALICE),
    );
  });

  it('with escalate on roles (resourceNames respected) the same Role is allowed', async () => {
    const esc = (names?: string[]) =>
      role('escalator', 'team-a', [
        { verbs: ['escalate'], apiGroups: [RBAC], resources: ['roles'], ...(names ? { resourceNames: names } : {}) },
      ]);
    await registry.create(RBAC_GVRS.roles, 'team-a', esc(['other-name']), {}, {});
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      roleBinding('esc', 'team-a', { kind: 'Role', name: 'escalator' }),
      {},
      {},
    );
    expect((await refused(registry.create(RBAC_GVRS.roles, 'team-a', secretsAll(), {}, as(ALICE)))).code).to.equal(403);
    const cur = await registry.get(RBAC_GVRS.roles, 'team-a', 'escalator', {});
    await registry.update(
      RBAC_GVRS.roles,
      'team-a',
      'escalator',
      { ...cur, rules: loose(esc(['secrets-admin'])).rules } as unknown as KubeObject,
      {},
      {},
    );
    await registry.create(RBAC_GVRS.roles, 'team-a', secretsAll(), {}, as(ALICE));
  });

  it('a namespace admin cannot bind cluster-admin (nor a role they do not hold); with bind on it they can; a missing role is 404', async () => {
    const st = await refused(
      registry.create(
        RBAC_GVRS.rolebindings,
        'team-a',
        roleBinding('root', 'team-a', { kind: 'ClusterRole', name: 'cluster-admin' }, 'bob'),
        {},
        as(ALICE),
      ),
    );
    expect(st.code).to.equal(403);
    expect(st.message).to.match(
      /^rolebindings\.rbac\.authorization\.k8s\.io "root" is forbidden: user "alice" \(groups=\["team-a-admins" "system:authenticated"\]\) is attempting to grant RBAC permissions not currently held:\n\{APIGroups:\["\*"\], Resources:\["\*"\], Verbs:\["\*"\]\}/,
    );
    expect(store.get({ group: RBAC, resource: 'rolebindings', namespace: 'team-a', name: 'root' })).to.equal(undefined);
    // Binding what they hold is fine: fluxvm-view is within fluxvm-edit.
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      roleBinding('viewer', 'team-a', { kind: 'ClusterRole', name: 'fluxvm-view' }, 'bob'),
      {},
      as(ALICE),
    );
    expect(
      (
        await refused(
          registry.create(
            RBAC_GVRS.rolebindings,
            'team-a',
            roleBinding('ghost', 'team-a', { kind: 'Role', name: 'nope' }, 'bob'),
            {},
            as(ALICE),
          ),
        )
      ).code,
    ).to.equal(404);
    // bind on clusterroles, named cluster-admin, in team-a.
    await registry.create(
      RBAC_GVRS.roles,
      'team-a',
      role('binder', 'team-a', [
        { verbs: ['bind'], apiGroups: [RBAC], resources: ['clusterroles'], resourceNames: ['cluster-admin'] },
      ]),
      {},
      {},
    );
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      roleBinding('binder', 'team-a', { kind: 'Role', name: 'binder' }),
      {},
      {},
    );
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-a',
      roleBinding('root', 'team-a', { kind: 'ClusterRole', name: 'cluster-admin' }, 'bob'),
      {},
      as(ALICE),
    );
    // Still only there: bind in team-a does not reach team-b.
    expect(
      (
        await refused(
          registry.create(
            RBAC_GVRS.rolebindings,
            'team-b',
            roleBinding('root', 'team-b', { kind: 'ClusterRole', name: 'cluster-admin' }, 'bob'),
            {},
            as(ALICE),
          ),
        )
      ).code,
    ).to.equal(403);
  });

  it('system:masters and in-process writes are not checked; an aggregated ClusterRole needs full authority', async () => {
    await registry.create(
      RBAC_GVRS.rolebindings,
      'team-b',
      roleBinding('root', 'team-b', { kind: 'ClusterRole', name: 'cluster-admin' }, 'bob'),
      {},
      as({ name: 'admin', groups: ['system:masters'] }),
    );
    // A user with every ClusterRole right except full authority cannot create an aggregated role.
    await registry.create(
      RBAC_GVRS.clusterrolebindings,
      undefined,
      {
        apiVersion: `${RBAC}/v1`,
        kind: 'ClusterRoleBinding',
        metadata: { name: 'carol' },
        roleRef: { apiGroup: RBAC, kind: 'ClusterRole', name: 'fluxvm-edit' },
        subjects: [{ kind: 'User', name: 'carol' }],
      } as unknown as KubeObject,
      {},
      {},
    );
    await registry.create(
      RBAC_GVRS.clusterroles,
      undefined,
      clusterRole('cr-writer', [
        { verbs: ['create', 'escalate'], apiGroups: [RBAC], resources: ['clusterroles'], resourceNames: ['plain'] },
        { verbs: ['create'], apiGroups: [RBAC], resources: ['clusterroles'] },
      ]),
      {},
      {},
    );
    const carol = { name: 'carol', groups: ['system:authenticated'] };
    const aggregated = {
      ...clusterRole('mine', []),
      aggregationRule: { clusterRoleSelectors: [{ matchLabels: { 'x/y': 'z' } }] },
    } as unknown as KubeObject;
    const st = await refused(registry.create(RBAC_GVRS.clusterroles, undefined, aggregated, {}, as(carol)));
    expect(st.code).to.equal(403);
    expect(st.message).to.equal(
      'clusterroles.rbac.authorization.k8s.io "mine" is forbidden: must have cluster-admin privileges to use the aggregationRule',
    );
  });

  it('a malformed aggregationRule is 422 naming the field, for admins too; nothing is stored', async () => {
    const admin = as({ name: 'admin', groups: ['system:masters'] });
    const withRule = (name: string, clusterRoleSelectors: unknown) =>
      ({ ...clusterRole(name, []), aggregationRule: { clusterRoleSelectors } }) as unknown as KubeObject;
    const cases: Array<[unknown, string]> = [
      [
        [{ matchExpressions: [{ key: 'a', operator: 'Foo' }] }],
        'aggregationRule.clusterRoleSelectors[0].matchExpressions[0].operator: Unsupported value: "Foo": supported values: "In", "NotIn", "Exists", "DoesNotExist"',
      ],
      [
        [{}, { matchExpressions: [{ key: 'a', operator: 'In' }] }],
        "aggregationRule.clusterRoleSelectors[1].matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
      ],
      [
        [{ matchExpressions: [{ key: 'a', operator: 'Exists', values: ['x'] }] }],
        "aggregationRule.clusterRoleSelectors[0].matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
      ],
      [
        [{ matchLabels: { a: 1 } }],
        'aggregationRule.clusterRoleSelectors[0].matchLabels: Invalid value: must be a map of strings',
      ],
      ['nope', 'aggregationRule.clusterRoleSelectors: Invalid value: must be a list of label selectors'],
    ];
    for (const [sel, message] of cases) {
      const st = await refused(registry.create(RBAC_GVRS.clusterroles, undefined, withRule('bad-agg', sel), {}, admin));
      expect(st.code, message).to.equal(422);
      expect(st.reason).to.equal('Invalid');
      expect(st.message).to.equal(`ClusterRole.rbac.authorization.k8s.io "bad-agg" is invalid: ${message}`);
      expect(store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'bad-agg' })).to.equal(undefined);
    }
    // A valid one with every operator is accepted.
    await registry.create(
      RBAC_GVRS.clusterroles,
      undefined,
      withRule('ok-agg', [
        {
          matchLabels: { a: 'b' },
          matchExpressions: [
            { key: 'c', operator: 'NotIn', values: ['d'] },
            { key: 'e', operator: 'DoesNotExist' },
          ],
        },
      ]),
      {},
      admin,
    );
  });

  it('aggregation: a ClusterRole labelled aggregate-to-edit adds its rules to fluxvm-edit and to its users; deleting it removes them', async () => {
    const secretsOfB = { name: 'alice', groups: ['system:authenticated'] };
    const attrs = {
      user: secretsOfB,
      resource: {
        verb: 'get',
        namespace: 'team-a',
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        resource: 'widgets-x',
        name: 'w',
      },
    };
    expect(rbac.authorize(attrs).allowed).to.equal(false);
    const extra: PolicyRule = { verbs: ['get'], apiGroups: ['fluxvm.dev'], resources: ['widgets-x'] };
    await registry.create(
      RBAC_GVRS.clusterroles,
      undefined,
      clusterRole('widgets-x-edit', [extra], { 'rbac.fluxvm.dev/aggregate-to-edit': 'true' }),
      {},
      {},
    );
    await store.idle();
    await eventually(
      () =>
        (
          (store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-edit' }) as any)?.rules ?? []
        ).some((r: PolicyRule) => r.resources?.includes('widgets-x')),
      10_000,
      'fluxvm-edit to aggregate the widgets-x rule',
    );
    const edit = store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-edit' }) as any;
    const base = store.get({
      group: RBAC,
      resource: 'clusterroles',
      namespace: '',
      name: 'fluxvm:aggregate-to-edit',
    }) as any;
    expect(edit.rules).to.deep.equal([...base.rules, extra]);
    expect(rbac.authorize(attrs).allowed).to.equal(true);
    await registry.delete(RBAC_GVRS.clusterroles, undefined, 'widgets-x-edit', {}, {});
    await eventually(
      () =>
        !(
          (store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-edit' }) as any)?.rules ?? []
        ).some((r: PolicyRule) => r.resources?.includes('widgets-x')),
      10_000,
      'fluxvm-edit to drop the widgets-x rule',
    );
    expect(
      (store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-edit' }) as any).rules,
    ).to.deep.equal(base.rules);
    expect(rbac.authorize(attrs).allowed).to.equal(false);
  });

  it('a restart keeps the aggregated rules and the bootstrap leaves them alone', async () => {
    await registry.create(
      RBAC_GVRS.clusterroles,
      undefined,
      clusterRole('extra-view', [{ verbs: ['get'], apiGroups: [''], resources: ['configmaps'] }], {
        'rbac.fluxvm.dev/aggregate-to-view': 'true',
      }),
      {},
      {},
    );
    const hasExtra = () =>
      (
        (store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-view' }) as any)?.rules ?? []
      ).some((r: PolicyRule) => r.resources?.includes('configmaps'));
    await eventually(hasExtra, 10_000, 'fluxvm-view to aggregate the configmaps rule');
    const rv = store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-view' })!.metadata
      .resourceVersion;
    await ensureBootstrapPolicy(registry, allKinds);
    expect(
      store.get({ group: RBAC, resource: 'clusterroles', namespace: '', name: 'fluxvm-view' })!.metadata
        .resourceVersion,
    ).to.equal(rv);
  });
});
