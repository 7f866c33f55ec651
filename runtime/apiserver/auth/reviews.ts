// The create-only review resources, answered from the authenticated user and the authorizer
// and never stored (kube's registry/authentication and registry/authorization):
//   authentication.k8s.io/v1 selfsubjectreviews        `kubectl auth whoami`
//   authorization.k8s.io/v1  selfsubjectaccessreviews  `kubectl auth can-i VERB RESOURCE`
//   authorization.k8s.io/v1  selfsubjectrulesreviews   `kubectl auth can-i --list`
//   authorization.k8s.io/v1  subjectaccessreviews      for admins: may user X do Y
// Creating one is itself authorized like any create (system:basic-user grants the self ones to
// every authenticated user; subjectaccessreviews only cluster-admin has).
import { errors } from '../../meta/errors.js';
import type { KubeObject } from '../../meta/types.js';
import type { RequestContext, UserInfo } from '../registry-types.js';
import type { Attributes, Authorizer } from '../http/auth.js';
import { MASTERS } from './authn.js';
import type { PolicyRule } from './rbac.js';

export type VirtualCreate = (body: KubeObject, ctx: RequestContext) => Promise<KubeObject> | KubeObject;

export interface ReviewDeps {
  authorize: Authorizer;
  /** The rules `user` has in `namespace` (SelfSubjectRulesReview). */
  rulesFor(user: UserInfo, namespace: string): PolicyRule[];
}

/** A review's attributes, read loosely: every field is checked or converted with String(). */
type Attrs = Record<string, unknown>;
interface ReviewSpec {
  resourceAttributes?: Attrs;
  nonResourceAttributes?: Attrs;
  user?: unknown;
  groups?: unknown;
  uid?: unknown;
  extra?: unknown;
  namespace?: unknown;
}
interface ReviewBody {
  metadata?: object;
  spec?: ReviewSpec;
}

function bodyOf(b: KubeObject, kind: string, group: string): ReviewBody {
  if (typeof b !== 'object' || b === null) throw errors.badRequest('the request body must be a JSON object');
  if (b.kind !== undefined && b.kind !== kind)
    throw errors.badRequest(`the body's kind "${String(b.kind)}" is not ${kind}`);
  void group;
  return b as ReviewBody;
}

function userOf(ctx: RequestContext): UserInfo {
  if (!ctx.user) throw errors.internal('review without an authenticated user');
  return ctx.user;
}

function attributesOf(kind: string, user: UserInfo, spec: ReviewSpec | undefined): Attributes {
  const ra = spec?.resourceAttributes;
  const nra = spec?.nonResourceAttributes;
  if ((ra && nra) || (!ra && !nra)) {
    throw errors.invalid(kind, 'authorization.k8s.io', '', [
      {
        reason: 'FieldValueRequired',
        field: 'spec.resourceAttributes',
        message: 'Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified',
      },
    ]);
  }
  if (nra) return { user, nonResource: { verb: String(nra.verb ?? ''), path: String(nra.path ?? '') } };
  if (!ra) throw errors.internal('unreachable: one of the attributes is set');
  return {
    user,
    resource: {
      verb: String(ra.verb ?? ''),
      ...(ra.namespace ? { namespace: String(ra.namespace) } : {}),
      group: String(ra.group ?? ''),
      version: String(ra.version ?? ''),
      resource: String(ra.resource ?? ''),
      ...(ra.subresource ? { subresource: String(ra.subresource) } : {}),
      ...(ra.name ? { name: String(ra.name) } : {}),
    },
  };
}

/** SubjectAccessReviewSpec.extra as UserInfo.extra: a map of string lists; anything else is ignored (undefined). */
function extraOf(v: unknown): Record<string, string[]> | undefined {
  if (!v || typeof v !== 'object' || Array.isArray(v)) return undefined;
  const out: Record<string, string[]> = {};
  for (const [k, xs] of Object.entries(v)) if (Array.isArray(xs)) out[k] = xs.map(String);
  return Object.keys(out).length ? out : undefined;
}

function answer(apiVersion: string, kind: string, body: ReviewBody, status: Record<string, unknown>): KubeObject {
  return {
    apiVersion,
    kind,
    metadata: { ...(body.metadata ?? {}), creationTimestamp: null },
    spec: body.spec ?? {},
    status,
  } as unknown as KubeObject;
}

/** Handlers keyed `group/resource`, for createApiServer's `virtual` option. */
export function reviewHandlers(d: ReviewDeps): Record<string, VirtualCreate> {
  return {
    'authentication.k8s.io/selfsubjectreviews': (b, ctx) => {
      const body = bodyOf(b, 'SelfSubjectReview', 'authentication.k8s.io');
      const u = userOf(ctx);
      const userInfo = {
        username: u.name,
        ...(u.uid ? { uid: u.uid } : {}),
        groups: u.groups,
        ...(u.extra ? { extra: u.extra } : {}),
      };
      const out = answer('authentication.k8s.io/v1', 'SelfSubjectReview', body, { userInfo });
      delete out.spec;
      return out;
    },
    'authorization.k8s.io/selfsubjectaccessreviews': async (b, ctx) => {
      const body = bodyOf(b, 'SelfSubjectAccessReview', 'authorization.k8s.io');
      const d0 = await d.authorize(attributesOf('SelfSubjectAccessReview', userOf(ctx), body.spec));
      return answer('authorization.k8s.io/v1', 'SelfSubjectAccessReview', body, {
        allowed: d0.allowed,
        ...(d0.reason ? { reason: d0.reason } : {}),
      });
    },
    'authorization.k8s.io/subjectaccessreviews': async (b) => {
      const body = bodyOf(b, 'SubjectAccessReview', 'authorization.k8s.io');
      const spec = body.spec ?? {};
      if (!spec.user && !(Array.isArray(spec.groups) && spec.groups.length)) {
        throw errors.invalid('SubjectAccessReview', 'authorization.k8s.io', '', [
          {
            reason: 'FieldValueRequired',
            field: 'spec.user',
            message: 'Required value: at least one of user or group must be specified',
          },
        ]);
      }
      const user: UserInfo = {
        name: String(spec.user ?? ''),
        groups: Array.isArray(spec.groups) ? spec.groups.map(String) : [],
        ...(spec.uid ? { uid: String(spec.uid) } : {}),
        ...(extraOf(spec.extra) ? { extra: extraOf(spec.extra) } : {}),
      };
      const d0 = await d.authorize(attributesOf('SubjectAccessReview', user, spec));
      return answer('authorization.k8s.io/v1', 'SubjectAccessReview', body, {
        allowed: d0.allowed,
        ...(d0.reason ? { reason: d0.reason } : {}),
      });
    },
    'authorization.k8s.io/selfsubjectrulesreviews': (b, ctx) => {
      const body = bodyOf(b, 'SelfSubjectRulesReview', 'authorization.k8s.io');
      const u = userOf(ctx);
      const ns = String(body.spec?.namespace ?? '');
      const rules: PolicyRule[] = u.groups.includes(MASTERS)
        ? [
            { verbs: ['*'], apiGroups: ['*'], resources: ['*'] },
            { verbs: ['*'], nonResourceURLs: ['*'] },
          ]
        : d.rulesFor(u, ns);
      const resourceRules = rules
        .filter((r) => (r.resources ?? []).length)
        .map((r) => ({
          verbs: r.verbs,
          apiGroups: r.apiGroups ?? [],
          resources: r.resources,
          ...(r.resourceNames?.length ? { resourceNames: r.resourceNames } : {}),
        }));
      const nonResourceRules = rules
        .filter((r) => (r.nonResourceURLs ?? []).length)
        .map((r) => ({ verbs: r.verbs, nonResourceURLs: r.nonResourceURLs }));
      return answer('authorization.k8s.io/v1', 'SelfSubjectRulesReview', body, {
        resourceRules,
        nonResourceRules,
        incomplete: false,
      });
    },
  };
}
