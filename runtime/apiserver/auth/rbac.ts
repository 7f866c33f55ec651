// The RBAC authorizer with kube's rules (plugin/pkg/auth/authorizer/rbac): a request is allowed
// when a rule of a role bound to the user (by name or one of its groups) matches it:
//   ClusterRoleBindings -> ClusterRole rules, everywhere (cluster scope and every namespace);
//   RoleBindings in the request's namespace -> Role (same namespace) or ClusterRole rules.
// A rule matches when verbs has the verb or `*`; apiGroups the group or `*`; resources the
// resource, `resource/subresource`, `*` (everything, subresources included) or `*/subresource`;
// resourceNames is empty or has the name (so create and list match only rules without names);
// nonResourceURLs the path exactly or by a trailing `*` prefix (ClusterRoles only).
// Group system:masters is allowed everything without a lookup, as in kube.
//
// The objects are held in memory (fed from the registry: `RbacAuthorizer.attach`), indexed by
// subject, and the rules a user gets in a namespace are compiled once per RBAC generation and
// user: a decision is a map lookup plus a scan of that user's rules, whatever the number of
// bindings (bench/apiserver.ts measures it with 1000).
import type { KubeObject } from '../../meta/types.js';
import type { RegistryApi, UserInfo, WatchStream } from '../registry-types.js';
import type { Attributes, Decision } from '../http/auth.js';
import { MASTERS } from './authn.js';

export interface PolicyRule {
  verbs: string[];
  apiGroups?: string[];
  resources?: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
}

interface Binding {
  namespace: string; // '' for ClusterRoleBindings
  roleKind: 'Role' | 'ClusterRole';
  roleName: string;
}

const RBAC = 'rbac.authorization.k8s.io';
export const RBAC_GVRS = {
  roles: { group: RBAC, version: 'v1', resource: 'roles' },
  clusterroles: { group: RBAC, version: 'v1', resource: 'clusterroles' },
  rolebindings: { group: RBAC, version: 'v1', resource: 'rolebindings' },
  clusterrolebindings: { group: RBAC, version: 'v1', resource: 'clusterrolebindings' },
};

function has(list: string[] | undefined, v: string): boolean {
  return !!list && (list.includes('*') || list.includes(v));
}

function resourceMatches(rule: PolicyRule, resource: string, sub: string | undefined): boolean {
  const rs = rule.resources ?? [];
  const combined = sub ? `${resource}/${sub}` : resource;
  for (const r of rs) {
    if (r === '*' || r === combined) return true;
    if (sub && r === `*/${sub}`) return true;
  }
  return false;
}

function urlMatches(rule: PolicyRule, path: string): boolean {
  for (const u of rule.nonResourceURLs ?? []) {
    if (u === '*' || u === path) return true;
    if (u.endsWith('*') && path.startsWith(u.slice(0, -1))) return true;
  }
  return false;
}

/** True when `rule` allows the request described by `attrs` (without the user). Pure. */
export function ruleAllows(rule: PolicyRule, attrs: Attributes): boolean {
  if ('nonResource' in attrs)
    return has(rule.verbs, attrs.nonResource.verb) && urlMatches(rule, attrs.nonResource.path);
  const r = attrs.resource;
  if (!has(rule.verbs, r.verb) || !has(rule.apiGroups, r.group) || !resourceMatches(rule, r.resource, r.subresource))
    return false;
  const names = rule.resourceNames ?? [];
  return names.length === 0 || (!!r.name && names.includes(r.name));
}

/** A rule with its lists as sets, for the hot path (same semantics as ruleAllows). */
interface Compiled {
  verbs: Set<string>;
  groups: Set<string>;
  resources: Set<string>;
  names?: Set<string>;
  urls?: string[];
}

function compile(r: PolicyRule): Compiled {
  return {
    verbs: new Set(r.verbs ?? []),
    groups: new Set(r.apiGroups ?? []),
    resources: new Set(r.resources ?? []),
    ...(r.resourceNames?.length ? { names: new Set(r.resourceNames) } : {}),
    ...(r.nonResourceURLs?.length ? { urls: r.nonResourceURLs } : {}),
  };
}

function compiledAllows(c: Compiled, attrs: Attributes): boolean {
  if ('nonResource' in attrs) {
    const a = attrs.nonResource;
    return (
      !!c.urls &&
      (c.verbs.has('*') || c.verbs.has(a.verb)) &&
      urlMatches({ verbs: [], nonResourceURLs: c.urls }, a.path)
    );
  }
  const r = attrs.resource;
  if (!(c.verbs.has(r.verb) || c.verbs.has('*'))) return false;
  if (!(c.groups.has(r.group) || c.groups.has('*'))) return false;
  const rs = c.resources;
  if (!(
    rs.has('*') ||
    rs.has(r.subresource ? `${r.resource}/${r.subresource}` : r.resource) ||
    (r.subresource !== undefined && rs.has(`*/${r.subresource}`))
  ))
    return false;
  return !c.names || (!!r.name && c.names.has(r.name));
}

function subjectKeys(u: UserInfo): string[] {
  const keys = [`User:${u.name}`, ...u.groups.map((g) => `Group:${g}`)];
  const sa = /^system:serviceaccount:([^:]+):([^:]+)$/.exec(u.name);
  if (sa) keys.push(`ServiceAccount:${sa[1]}:${sa[2]}`);
  return keys;
}

type Subject = { kind?: string; name?: string; namespace?: string };

function keyOfSubject(s: Subject, bindingNs: string): string | undefined {
  if (!s?.name) return undefined;
  if (s.kind === 'User') return `User:${s.name}`;
  if (s.kind === 'Group') return `Group:${s.name}`;
  if (s.kind === 'ServiceAccount') return `ServiceAccount:${s.namespace || bindingNs}:${s.name}`;
  return undefined;
}

export class RbacAuthorizer {
  /** `ns/name` (ns '' for ClusterRoles) -> rules, as given and compiled. */
  private readonly roles = new Map<string, { rules: PolicyRule[]; compiled: Compiled[] }>();
  /** object key -> the subject keys it was indexed under, and the binding. */
  private readonly bindings = new Map<string, { keys: string[]; b: Binding }>();
  /** subject key -> bindings of that subject. */
  private readonly bySubject = new Map<string, Set<Binding>>();
  /** Compiled rules per user and namespace, valid for one generation. */
  private cache = new Map<string, { rules: PolicyRule[]; compiled: Compiled[] }>();
  private gen = 0;
  private cacheGen = 0;

  /** Bumps on every RBAC change (cached compilations are dropped). */
  get generation(): number {
    return this.gen;
  }

  /** Adds or replaces an RBAC object (any of the four kinds). Idempotent. */
  upsert(obj: KubeObject): void {
    const kind = obj.kind;
    const ns = obj.metadata?.namespace ?? '';
    const name = obj.metadata?.name ?? '';
    // Roles and bindings carry rules, roleRef and subjects at the top level, beside metadata.
    const rbac = obj as KubeObject & {
      rules?: PolicyRule[];
      roleRef?: { kind?: string; name?: string };
      subjects?: Subject[];
    };
    if (kind === 'Role' || kind === 'ClusterRole') {
      const rules = rbac.rules ?? [];
      this.roles.set(`${kind === 'Role' ? ns : ''}/${name}`, { rules, compiled: rules.map(compile) });
    } else if (kind === 'RoleBinding' || kind === 'ClusterRoleBinding') {
      this.removeBinding(`${kind}/${ns}/${name}`);
      const ref = rbac.roleRef ?? {};
      const b: Binding = {
        namespace: kind === 'RoleBinding' ? ns : '',
        roleKind: ref.kind === 'Role' ? 'Role' : 'ClusterRole',
        roleName: String(ref.name ?? ''),
      };
      const keys = [...new Set((rbac.subjects ?? []).map((s) => keyOfSubject(s, ns)).filter((k) => k !== undefined))];
      for (const k of keys) {
        let set = this.bySubject.get(k);
        if (!set) this.bySubject.set(k, (set = new Set()));
        set.add(b);
      }
      this.bindings.set(`${kind}/${ns}/${name}`, { keys, b });
    } else return;
    this.gen++;
  }

  remove(obj: KubeObject): void {
    const kind = obj.kind;
    const ns = obj.metadata?.namespace ?? '';
    const name = obj.metadata?.name ?? '';
    if (kind === 'Role' || kind === 'ClusterRole') this.roles.delete(`${kind === 'Role' ? ns : ''}/${name}`);
    else if (kind === 'RoleBinding' || kind === 'ClusterRoleBinding') this.removeBinding(`${kind}/${ns}/${name}`);
    else return;
    this.gen++;
  }

  private removeBinding(key: string): void {
    const old = this.bindings.get(key);
    if (!old) return;
    for (const k of old.keys) {
      const set = this.bySubject.get(k);
      set?.delete(old.b);
      if (set && set.size === 0) this.bySubject.delete(k);
    }
    this.bindings.delete(key);
  }

  /** The rules of one role (kind Role in `namespace`, or a ClusterRole: namespace ''), undefined when missing. */
  roleRules(kind: 'Role' | 'ClusterRole', namespace: string, name: string): PolicyRule[] | undefined {
    return this.roles.get(`${kind === 'Role' ? namespace : ''}/${name}`)?.rules;
  }

  /**
   * Every rule that applies to `user` in `namespace` ('' = cluster scope only): the rules of
   * ClusterRoleBindings plus those of RoleBindings in the namespace. A binding to a missing
   * role contributes nothing (kube's behaviour). Cached per generation.
   */
  rulesFor(user: UserInfo, namespace: string): PolicyRule[] {
    return this.applicable(user, namespace).rules;
  }

  private applicable(user: UserInfo, namespace: string): { rules: PolicyRule[]; compiled: Compiled[] } {
    if (this.cacheGen !== this.gen || this.cache.size > 10_000) {
      this.cache = new Map();
      this.cacheGen = this.gen;
    }
    const ck = `${namespace}\u0000${user.name}\u0000${user.groups.join('\u0000')}`;
    const hit = this.cache.get(ck);
    if (hit) return hit;
    const out: PolicyRule[] = [];
    const compiled: Compiled[] = [];
    const seen = new Set<Binding>();
    for (const k of subjectKeys(user)) {
      for (const b of this.bySubject.get(k) ?? []) {
        if (seen.has(b)) continue;
        seen.add(b);
        if (b.namespace !== '' && b.namespace !== namespace) continue;
        const roleKey = b.roleKind === 'Role' ? `${b.namespace}/${b.roleName}` : `/${b.roleName}`;
        const role = this.roles.get(roleKey);
        if (role) {
          out.push(...role.rules);
          compiled.push(...role.compiled);
        }
      }
    }
    const entry = { rules: out, compiled };
    this.cache.set(ck, entry);
    return entry;
  }

  /** The decision for one request. Never throws. */
  readonly authorize = (attrs: Attributes): Decision => {
    if (attrs.user.groups.includes(MASTERS)) return { allowed: true };
    const ns = 'resource' in attrs ? (attrs.resource.namespace ?? '') : '';
    for (const c of this.applicable(attrs.user, ns).compiled) if (compiledAllows(c, attrs)) return { allowed: true };
    return { allowed: false };
  };

  /**
   * Loads every RBAC object from the registry and keeps them current with a watch per kind.
   * Resolves once the initial lists are in. A watch the registry ends (compaction, say) makes
   * it load everything again. The returned stop() ends the watches (safe twice).
   */
  async attach(registry: RegistryApi): Promise<() => void> {
    const streams: WatchStream[] = [];
    let stopped = false;
    const load = async (): Promise<void> => {
      const lists = [];
      for (const gvr of Object.values(RBAC_GVRS))
        lists.push({ gvr, list: await registry.list(gvr, undefined, {}, {}) });
      this.roles.clear();
      this.bindings.clear();
      this.bySubject.clear();
      this.gen++;
      for (const { list } of lists) for (const o of list.items) this.upsert(o);
      for (const { gvr, list } of lists) {
        const w = registry.watch(gvr, undefined, { resourceVersion: list.metadata.resourceVersion }, {});
        w.onEvent((ev) => {
          if (ev.type === 'ADDED' || ev.type === 'MODIFIED') this.upsert(ev.object);
          else if (ev.type === 'DELETED') this.remove(ev.object);
        });
        w.onClose(() => {
          if (stopped || !streams.includes(w)) return;
          for (const s of streams.splice(0)) if (s !== w) s.close();
          void load().catch(() => undefined); // a store that cannot list is closing
        });
        streams.push(w);
      }
    };
    await load();
    return () => {
      stopped = true;
      for (const s of streams.splice(0)) s.close();
    };
  }
}
