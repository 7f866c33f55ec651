// RBAC escalation prevention, kube's rules (pkg/registry/rbac/{role,clusterrole,rolebinding,
// clusterrolebinding}/policybased and pkg/registry/rbac/validation), as a WriteGuard on the four
// RBAC kinds (create, update, patch, apply: every write that goes through the registry):
// - a Role or ClusterRole may be written only by a user who already holds every permission in
//   it (in the Role's namespace; cluster-wide for a ClusterRole), or who may `escalate` it
//   (verb escalate on roles/clusterroles, resourceNames respected). A ClusterRole with an
//   aggregationRule needs full authority (kube: "must have cluster-admin privileges to use the
//   aggregationRule"), since its rules come from whatever is labelled;
// - a RoleBinding or ClusterRoleBinding may be written only by a user who holds the permissions
//   of the role it references (in the binding's namespace; cluster-wide for a
//   ClusterRoleBinding), or who may `bind` it (verb bind on roles/clusterroles named by roleRef).
//   A referenced role that does not exist is a 404, unless the user may bind it.
// system:masters and in-process writes (no user: bootstrap, the aggregation controller) are not
// checked. Refusals are 403 Forbidden with kube's wording:
//   roles.rbac.authorization.k8s.io "r" is forbidden: user "alice" (groups=["g" "system:authenticated"])
//   is attempting to grant RBAC permissions not currently held:
//   {APIGroups:[""], Resources:["secrets"], Verbs:["get"]}
// Deletes are not checked (as in kube). A ClusterRole's aggregationRule is validated here too
// (kube's LabelSelector rules; 422 naming the field), for every writer.
import type { KindDefinition } from '../../../apis/types.js';
import { StatusError, errors, qualifiedResource } from '../../meta/errors.js';
import type { KubeObject } from '../../meta/types.js';
import type { UserInfo } from '../registry-types.js';
import type { WriteGuard } from '../registry.js';
import type { Authorizer } from '../http/auth.js';
import { aggregationRuleCauses } from './aggregation.js';
import { MASTERS } from './authn.js';
import type { PolicyRule, RbacAuthorizer } from './rbac.js';

const RBAC = 'rbac.authorization.k8s.io';

const has = (l: string[] | undefined, v: string) => !!l && l.includes(v);

// kube's resourceCoversAll for one resource: a star, exact, or star-slash-sub for a subresource.
function resourceCovers(owner: string[] | undefined, r: string): boolean {
  if (has(owner, '*') || has(owner, r)) return true;
  const slash = r.indexOf('/');
  return slash > 0 && has(owner, `*/${r.slice(slash + 1)}`);
}

function urlCovers(owner: string[] | undefined, u: string): boolean {
  return (owner ?? []).some((o) => o === u || (o.endsWith('*') && u.startsWith(o.replace(/\*+$/, ''))));
}

/** One atomic permission of a rule (kube's BreakdownRule). */
type Atom = { verb: string; group: string; resource: string; name?: string } | { verb: string; url: string };

function breakdown(rule: PolicyRule): Atom[] {
  const out: Atom[] = [];
  const verbs = rule.verbs ?? [];
  for (const group of rule.apiGroups ?? [])
    for (const resource of rule.resources ?? []) {
      if (rule.resourceNames?.length)
        for (const name of rule.resourceNames) for (const verb of verbs) out.push({ verb, group, resource, name });
      else for (const verb of verbs) out.push({ verb, group, resource });
    }
  for (const url of rule.nonResourceURLs ?? []) for (const verb of verbs) out.push({ verb, url });
  return out;
}

/** kube's ruleCovers for one atom. A `*` in the atom is covered only by a `*` in the owner. */
function covers(owner: PolicyRule, a: Atom): boolean {
  if (!has(owner.verbs, '*') && !has(owner.verbs, a.verb)) return false;
  if ('url' in a) return urlCovers(owner.nonResourceURLs, a.url);
  if (!has(owner.apiGroups, '*') && !has(owner.apiGroups, a.group)) return false;
  if (!resourceCovers(owner.resources, a.resource)) return false;
  const names = owner.resourceNames ?? [];
  return names.length === 0 || (a.name !== undefined && names.includes(a.name));
}

/** The rules of `wanted` that `held` does not cover, compacted as kube prints them (verbs merged). Pure. */
export function missingRules(held: PolicyRule[], wanted: PolicyRule[]): PolicyRule[] {
  const merged = new Map<string, PolicyRule>();
  for (const rule of wanted)
    for (const a of breakdown(rule)) {
      if (held.some((h) => covers(h, a))) continue;
      const k = 'url' in a ? `url\u0000${a.url}` : `res\u0000${a.group}\u0000${a.resource}\u0000${a.name ?? ''}`;
      const m = merged.get(k);
      if (m) {
        if (!m.verbs.includes(a.verb)) m.verbs.push(a.verb);
        continue;
      }
      merged.set(
        k,
        'url' in a
          ? { verbs: [a.verb], nonResourceURLs: [a.url] }
          : {
              verbs: [a.verb],
              apiGroups: [a.group],
              resources: [a.resource],
              ...(a.name !== undefined ? { resourceNames: [a.name] } : {}),
            },
      );
    }
  return [...merged.values()];
}

/** Go's %q of a []string: ["a" "b"]. */
const q = (l: string[]) => `[${l.map((s) => JSON.stringify(s)).join(' ')}]`;

/** kube's rbacv1helpers.CompactString. */
export function compactString(r: PolicyRule): string {
  const parts: string[] = [];
  if (r.apiGroups?.length) parts.push(`APIGroups:${q(r.apiGroups)}`);
  if (r.resources?.length) parts.push(`Resources:${q(r.resources)}`);
  if (r.nonResourceURLs?.length) parts.push(`NonResourceURLs:${q(r.nonResourceURLs)}`);
  if (r.resourceNames?.length) parts.push(`ResourceNames:${q(r.resourceNames)}`);
  if (r.verbs?.length) parts.push(`Verbs:${q(r.verbs)}`);
  return `{${parts.join(', ')}}`;
}

const FULL_AUTHORITY: PolicyRule[] = [
  { verbs: ['*'], apiGroups: ['*'], resources: ['*'] },
  { verbs: ['*'], nonResourceURLs: ['*'] },
];

export interface EscalationDeps {
  rbac: Pick<RbacAuthorizer, 'rulesFor' | 'roleRules'>;
  authorize: Authorizer;
}

/** The guard described in the file comment; other kinds pass through. */
export function escalationGuard(deps: EscalationDeps): WriteGuard {
  return async (def, old, next, ctx) => {
    if (def.group !== RBAC) return;
    // Before anything else, for everyone: the schema keeps aggregationRule as given.
    if (def.kind === 'ClusterRole') {
      const causes = aggregationRuleCauses(next);
      if (causes.length) throw errors.invalid(def.kind, RBAC, next.metadata?.name ?? '', causes);
    }
    if (!ctx.user || ctx.user.groups.includes(MASTERS)) return;
    const user = ctx.user;
    const ns = next.metadata?.namespace ?? '';
    const name = next.metadata?.name ?? '';
    const scope = def.namespaced ? ns : '';
    if (def.kind === 'Role' || def.kind === 'ClusterRole') {
      if (old && onlyGCFieldsChanged(old, next)) return;
      if (await allowedVerb(deps.authorize, user, 'escalate', def.plural, scope, name)) return;
      const aggregated = def.kind === 'ClusterRole' && isAggregated(next);
      const wanted = aggregated ? FULL_AUTHORITY : (((next as { rules?: PolicyRule[] }).rules ?? []) as PolicyRule[]);
      const missing = missingRules(deps.rbac.rulesFor(user, scope), wanted);
      if (!missing.length) return;
      if (aggregated) throw forbidden(def, name, 'must have cluster-admin privileges to use the aggregationRule');
      throw forbidden(def, name, notHeld(user, missing));
    }
    if (def.kind === 'RoleBinding' || def.kind === 'ClusterRoleBinding') {
      const ref = ((next as { roleRef?: { kind?: string; name?: string } }).roleRef ?? {}) as {
        kind?: string;
        name?: string;
      };
      if (old && onlyGCFieldsChanged(old, next)) return;
      const refKind = ref.kind === 'Role' ? 'Role' : 'ClusterRole';
      const refName = String(ref.name ?? '');
      if (
        await allowedVerb(deps.authorize, user, 'bind', refKind === 'Role' ? 'roles' : 'clusterroles', scope, refName)
      )
        return;
      const rules = deps.rbac.roleRules(refKind, refKind === 'Role' ? ns : '', refName);
      if (!rules) throw errors.notFound(refKind === 'Role' ? 'roles' : 'clusterroles', RBAC, refName);
      const missing = missingRules(deps.rbac.rulesFor(user, scope), rules);
      if (missing.length) throw forbidden(def, name, notHeld(user, missing));
    }
  };
}

function isAggregated(o: KubeObject): boolean {
  const sel = (o as { aggregationRule?: { clusterRoleSelectors?: unknown[] } }).aggregationRule?.clusterRoleSelectors;
  return Array.isArray(sel) && sel.length > 0;
}

/**
 * kube's IsOnlyMutatingGCFields: only finalizers or ownerReferences changed (the garbage
 * collector's writes). Anything else, labels included (a label can aggregate a role into
 * another), is checked.
 */
function onlyGCFieldsChanged(old: KubeObject, next: KubeObject): boolean {
  const strip = (o: KubeObject) => {
    const {
      finalizers: _f,
      ownerReferences: _o,
      managedFields: _m,
      resourceVersion: _r,
      generation: _g,
      ...meta
    } = (o.metadata ?? {}) as Record<string, unknown>;
    return JSON.stringify(sortKeys({ ...o, metadata: meta }));
  };
  return strip(old) === strip(next);
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (!v || typeof v !== 'object') return v;
  return Object.fromEntries(
    Object.keys(v)
      .sort()
      .map((k) => [k, sortKeys((v as Record<string, unknown>)[k])]),
  );
}

async function allowedVerb(
  authorize: Authorizer,
  user: UserInfo,
  verb: 'escalate' | 'bind',
  resource: string,
  namespace: string,
  name: string,
): Promise<boolean> {
  const d = await authorize({
    user,
    resource: {
      verb,
      group: RBAC,
      version: 'v1',
      resource,
      ...(namespace ? { namespace } : {}),
      ...(name ? { name } : {}),
    },
  });
  return d.allowed;
}

function notHeld(user: UserInfo, missing: PolicyRule[]): string {
  return `user ${JSON.stringify(user.name)} (groups=${q(user.groups)}) is attempting to grant RBAC permissions not currently held:\n${missing.map(compactString).join('\n')}`;
}

function forbidden(def: KindDefinition, name: string, why: string): StatusError {
  return new StatusError(
    403,
    'Forbidden',
    `${qualifiedResource(def.plural, RBAC)} ${JSON.stringify(name)} is forbidden: ${why}`,
    { name, group: RBAC, kind: def.plural },
  );
}
