// The built-in ClusterRoles and ClusterRoleBindings the embedded server keeps at startup (kube's
// bootstrap policy, cut to what this server serves), labelled
// kubernetes.io/bootstrapping=rbac-defaults. A role whose annotation
// rbac.authorization.kubernetes.io/autoupdate is "false" is left as the operator edited it;
// otherwise its rules are reset to these on every start.
//   cluster-admin            everything; bound to group system:masters (which also bypasses)
//   fluxvm-edit              everything in a namespace on fluxvm.dev kinds and their subresources,
//                            Secrets and Events; not RBAC objects, not the approval subresource
//   fluxvm-view              read-only fluxvm.dev kinds (no exec or other imperative subresource
//                            that acts, no Secrets); edit and view also read ResourceQuotas,
//                            which only cluster-admin may change (as kube's edit and view)
//   fluxvm-approver          read Changesets and Approvals, decide them through changesets/approval
//                            and approvals/approval (the only roles besides cluster-admin that may)
//   fluxvm-node-agent        what a node agent needs (as kube's system:node): register and heartbeat its
//                            Node (nodes, nodes/status), run its Sandboxes (watch, finalizer patch,
//                            status), read checkpoints and volumes, Events
//   fluxvm-node-lease        its heartbeat Lease: bind with a RoleBinding in fluxvm-node-lease only
//   system:discovery         discovery, /openapi, /version for every authenticated user
//   system:basic-user        SelfSubjectReview, SelfSubjectAccessReview, SelfSubjectRulesReview
//   system:public-info-viewer  health and version paths, also for anonymous requests
// fluxvm-edit, fluxvm-view and fluxvm-approver are aggregated ClusterRoles (aggregation.ts):
// their rules above live in fluxvm:aggregate-to-edit|view|approver, and any ClusterRole
// labelled rbac.fluxvm.dev/aggregate-to-edit|view|approver: "true" adds to them.
import type { KindDefinition } from '../../../apis/types.js';
import { isStatusError } from '../../meta/errors.js';
import type { KubeObject } from '../../meta/types.js';
import type { RegistryApi } from '../registry-types.js';
import { AGGREGATE_LABELS } from './aggregation.js';
import { RBAC_GVRS, type PolicyRule } from './rbac.js';

const LABELS = { 'kubernetes.io/bootstrapping': 'rbac-defaults' };
const ANNOTATIONS = { 'rbac.authorization.kubernetes.io/autoupdate': 'true' };
const READ = ['get', 'list', 'watch'];
const WRITE = ['create', 'update', 'patch', 'delete', 'deletecollection'];

/**
 * Custom subresources that decide something that must not be self-served (approvals/approval): fluxvm-approver only.
 */
const DECISION_SUBRESOURCES = new Set(['approval']);

/** Subresources that only read (GET) and may be granted to viewers. */
const READ_ONLY_SUBRESOURCES = new Set(['diff', 'files', 'baseline', 'changes', 'ledger', 'artifacts', 'provenance']);

/**
 * What a node agent needs and no more (fluxvm-node-agent; crds/install/rbac.yaml grants the same;
 * cmd/fluxctl/permissions.ts nodeAgentPermissions lists where each verb is used): register and
 * heartbeat its Node, run the Sandboxes bound to it (watch them, patch their finalizer, write their
 * status), read restore sources (checkpoints) and volumes, record Events. Its heartbeat Lease is
 * fluxvm-node-lease's (NODE_LEASE_RULES), bound only in that namespace.
 */
export const NODE_AGENT_RULES: PolicyRule[] = [
  { verbs: ['get', 'watch', 'create', 'update'], apiGroups: ['fluxvm.dev'], resources: ['nodes'] },
  { verbs: ['update'], apiGroups: ['fluxvm.dev'], resources: ['nodes/status'] },
  { verbs: ['get', 'list', 'watch', 'patch'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes'] },
  { verbs: ['update'], apiGroups: ['fluxvm.dev'], resources: ['sandboxes/status'] },
  { verbs: ['get', 'list', 'watch'], apiGroups: ['fluxvm.dev'], resources: ['checkpoints'] },
  { verbs: ['get', 'list', 'watch', 'patch'], apiGroups: ['fluxvm.dev'], resources: ['volumes'] },
  { verbs: ['update'], apiGroups: ['fluxvm.dev'], resources: ['volumes/status'] },
  { verbs: ['create', 'patch'], apiGroups: [''], resources: ['events'] },
];

/**
 * The node heartbeat Lease (fluxvm-node-lease): bind this ClusterRole with a RoleBinding in that
 * namespace only, so a node agent cannot take the controllers' leader-election Lease.
 */
export const NODE_LEASE_RULES: PolicyRule[] = [
  { verbs: ['get', 'create', 'update'], apiGroups: ['coordination.k8s.io'], resources: ['leases'] },
];

/** The built-in ClusterRoles for the kinds served. Pure. */
export function bootstrapClusterRoles(kinds: KindDefinition[]): Array<{ name: string; rules: PolicyRule[] }> {
  // The tenant roles (edit, view, approver) cover namespaced kinds only: a cluster-scoped kind
  // (nodes.fluxvm.dev) is infrastructure, as kube's edit and view leave core nodes out.
  const flux = kinds.filter((k) => !k.builtin && k.namespaced);
  const groups = [...new Set(flux.map((k) => k.group))];
  const all: string[] = [];
  const viewable: string[] = [];
  const approval: string[] = [];
  for (const k of flux) {
    all.push(k.plural);
    viewable.push(k.plural);
    if (k.statusSubresource) viewable.push(`${k.plural}/status`);
    for (const s of k.customSubresources ?? []) {
      // A decision subresource (approvals/approval) is the approver's, never edit's.
      if (DECISION_SUBRESOURCES.has(s)) {
        approval.push(`${k.plural}/${s}`);
        continue;
      }
      all.push(`${k.plural}/${s}`);
      if (READ_ONLY_SUBRESOURCES.has(s)) viewable.push(`${k.plural}/${s}`);
    }
    for (const s of Object.keys(k.fieldSubresources ?? {})) approval.push(`${k.plural}/${s}`);
  }
  // As kube's edit and view: both read ResourceQuotas, neither changes them (cluster-admin does).
  const quotaRead: PolicyRule[] = kinds.some((k) => k.group === '' && k.plural === 'resourcequotas')
    ? [{ verbs: READ, apiGroups: [''], resources: ['resourcequotas', 'resourcequotas/status'] }]
    : [];
  return [
    {
      name: 'cluster-admin',
      rules: [
        { verbs: ['*'], apiGroups: ['*'], resources: ['*'] },
        { verbs: ['*'], nonResourceURLs: ['*'] },
      ],
    },
    {
      name: 'fluxvm-edit',
      rules: [
        { verbs: [...READ, ...WRITE], apiGroups: groups, resources: all },
        { verbs: READ, apiGroups: groups, resources: viewable.filter((r) => r.endsWith('/status')) },
        { verbs: [...READ, ...WRITE], apiGroups: [''], resources: ['secrets'] },
        { verbs: READ, apiGroups: [''], resources: ['events'] },
        ...quotaRead,
      ],
    },
    {
      name: 'fluxvm-view',
      rules: [
        { verbs: READ, apiGroups: groups, resources: viewable },
        { verbs: READ, apiGroups: [''], resources: ['events'] },
        ...quotaRead,
      ],
    },
    {
      name: 'fluxvm-approver',
      rules: [
        {
          verbs: READ,
          apiGroups: groups,
          resources: [
            'changesets',
            'changesets/diff',
            'changesets/files',
            'changesets/provenance',
            'changesets/status',
            ...(flux.some((k) => k.plural === 'approvals') ? ['approvals', 'approvals/status'] : []),
          ],
        },
        ...(approval.length ? [{ verbs: ['get', 'update', 'patch'], apiGroups: groups, resources: approval }] : []),
      ],
    },
    ...(kinds.some((k) => k.group === 'fluxvm.dev' && k.plural === 'nodes')
      ? [
          { name: 'fluxvm-node-agent', rules: NODE_AGENT_RULES },
          { name: 'fluxvm-node-lease', rules: NODE_LEASE_RULES },
        ]
      : []),
    {
      name: 'system:discovery',
      rules: [
        {
          verbs: ['get'],
          nonResourceURLs: [
            '/api',
            '/api/*',
            '/apis',
            '/apis/*',
            '/openapi',
            '/openapi/*',
            '/version',
            '/version/',
            '/healthz',
            '/livez',
            '/readyz',
          ],
        },
      ],
    },
    {
      name: 'system:basic-user',
      rules: [
        { verbs: ['create'], apiGroups: ['authentication.k8s.io'], resources: ['selfsubjectreviews'] },
        {
          verbs: ['create'],
          apiGroups: ['authorization.k8s.io'],
          resources: ['selfsubjectaccessreviews', 'selfsubjectrulesreviews'],
        },
      ],
    },
    {
      name: 'system:public-info-viewer',
      rules: [{ verbs: ['get'], nonResourceURLs: ['/healthz', '/livez', '/readyz', '/version', '/version/'] }],
    },
  ];
}

export const BOOTSTRAP_BINDINGS: Array<{ name: string; role: string; groups: string[] }> = [
  { name: 'cluster-admin', role: 'cluster-admin', groups: ['system:masters'] },
  { name: 'system:discovery', role: 'system:discovery', groups: ['system:authenticated'] },
  { name: 'system:basic-user', role: 'system:basic-user', groups: ['system:authenticated'] },
  {
    name: 'system:public-info-viewer',
    role: 'system:public-info-viewer',
    groups: ['system:authenticated', 'system:unauthenticated'],
  },
];

async function ensure(
  registry: RegistryApi,
  gvr: (typeof RBAC_GVRS)['clusterroles'],
  obj: KubeObject,
  field: 'rules' | 'subjects' | 'aggregationRule',
): Promise<void> {
  const name = obj.metadata.name!;
  try {
    const cur = await registry.get(gvr, undefined, name, {});
    if (cur.metadata.annotations?.['rbac.authorization.kubernetes.io/autoupdate'] === 'false') return;
    // RBAC objects carry rules/subjects/aggregationRule at the top level, beside metadata.
    const want = (obj as unknown as Record<string, unknown>)[field];
    if (JSON.stringify((cur as unknown as Record<string, unknown>)[field]) === JSON.stringify(want)) return;
    const next = { ...cur, [field]: want } as KubeObject;
    await registry.update(gvr, undefined, name, next, { fieldManager: 'fluxvm-bootstrap' }, {});
  } catch (e) {
    if (!isStatusError(e) || e.code !== 404) throw e;
    await registry.create(gvr, undefined, obj, { fieldManager: 'fluxvm-bootstrap' }, {});
  }
}

/** Creates or refreshes the built-in roles and bindings. Idempotent; throws on a store failure. */
export async function ensureBootstrapPolicy(registry: RegistryApi, kinds: KindDefinition[]): Promise<void> {
  const meta = (name: string) => ({ name, labels: { ...LABELS }, annotations: { ...ANNOTATIONS } });
  for (const r of bootstrapClusterRoles(kinds)) {
    const label = AGGREGATE_LABELS[r.name];
    if (!label) {
      await ensure(
        registry,
        RBAC_GVRS.clusterroles,
        {
          apiVersion: 'rbac.authorization.k8s.io/v1',
          kind: 'ClusterRole',
          metadata: meta(r.name),
          rules: r.rules,
        } as KubeObject,
        'rules',
      );
      continue;
    }
    // Aggregated (aggregation.ts): the base rules in fluxvm:aggregate-to-X, labelled; the role
    // itself carries the selector (its rules are the aggregation controller's to write).
    const base = { ...meta(`fluxvm:${label.split('/')[1]}`), labels: { ...LABELS, [label]: 'true' } };
    await ensure(
      registry,
      RBAC_GVRS.clusterroles,
      { apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'ClusterRole', metadata: base, rules: r.rules } as KubeObject,
      'rules',
    );
    const aggregationRule = { clusterRoleSelectors: [{ matchLabels: { [label]: 'true' } }] };
    await ensure(
      registry,
      RBAC_GVRS.clusterroles,
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRole',
        metadata: meta(r.name),
        aggregationRule,
        rules: r.rules,
      } as KubeObject,
      'aggregationRule',
    );
  }
  for (const b of BOOTSTRAP_BINDINGS) {
    await ensure(
      registry,
      RBAC_GVRS.clusterrolebindings,
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: meta(b.name),
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: b.role },
        subjects: b.groups.map((g) => ({ apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: g })),
      } as KubeObject,
      'subjects',
    );
  }
}
