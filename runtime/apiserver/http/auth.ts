// Authentication and authorization for the aggregated mode (docs/reference/kubernetes-api.md
// section 6), as pluggable functions the server calls per request. Standalone (embedded) mode
// passes none and trusts its loopback listener.
//   authenticators: request-header (front proxy, mTLS-verified), client certificate, bearer
//                   token via TokenReview; chained, first answer wins; else anonymous.
//   authorizer:     SubjectAccessReview with a 10 s allow/deny cache; system:masters skips it.
import { X509Certificate } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { StatusError } from '../../meta/errors.js';
import { qualifiedResource } from '../../meta/errors.js';
import type { UserInfo } from '../registry-types.js';

/**
 * Returns the user a request authenticates as, undefined when this authenticator does not
 * apply (the next one is tried), or throws StatusError 401 when credentials are present but bad.
 */
export type Authenticator = (req: IncomingMessage) => Promise<UserInfo | undefined> | UserInfo | undefined;

export interface ResourceAttributes {
  verb: string;
  namespace?: string;
  group: string;
  version: string;
  resource: string;
  subresource?: string;
  name?: string;
}

export interface NonResourceAttributes {
  verb: string;
  path: string;
}

export type Attributes = { user: UserInfo } & (
  { resource: ResourceAttributes } | { nonResource: NonResourceAttributes }
);

export interface Decision {
  allowed: boolean;
  reason?: string;
}

/** Decides one request; throwing is a 500 (the authorizer is broken), never a deny. */
export type Authorizer = (attrs: Attributes) => Promise<Decision> | Decision;

export const ANONYMOUS: UserInfo = { name: 'system:anonymous', groups: ['system:unauthenticated'] };

export function unauthorized(): StatusError {
  return new StatusError(401, 'Unauthorized', 'Unauthorized');
}

/**
 * The kube-apiserver wording of a denial, e.g. `sandboxes.fluxvm.dev "x" is forbidden: User "u" cannot get resource
 * ...`.
 */
export function forbidden(attrs: Attributes, reason?: string): StatusError {
  const suffix = reason ? `: ${reason}` : '';
  if ('nonResource' in attrs) {
    return new StatusError(
      403,
      'Forbidden',
      `forbidden: User "${attrs.user.name}" cannot ${attrs.nonResource.verb} path "${attrs.nonResource.path}"${suffix}`,
      {},
    );
  }
  const r = attrs.resource;
  const qr = qualifiedResource(r.resource, r.group);
  const what = r.name ? `${qr} "${r.name}"` : qr;
  const res = r.subresource ? `${r.resource}/${r.subresource}` : r.resource;
  const scope = r.namespace ? `in the namespace "${r.namespace}"` : 'at the cluster scope';
  return new StatusError(
    403,
    'Forbidden',
    `${what} is forbidden: User "${attrs.user.name}" cannot ${r.verb} resource "${res}" in API group "${r.group}" ${scope}${suffix}`,
    { name: r.name, group: r.group, kind: r.resource },
  );
}

/** Tries each authenticator in order; the first user found wins; none: anonymous. */
export function chainAuthenticators(...list: Authenticator[]): Authenticator {
  return async (req) => {
    for (const a of list) {
      const u = await a(req);
      if (u) return u;
    }
    return ANONYMOUS;
  };
}

function peerChain(req: IncomingMessage): X509Certificate[] {
  const sock = req.socket as TLSSocket;
  if (typeof sock.getPeerCertificate !== 'function') return [];
  const out: X509Certificate[] = [];
  let c = sock.getPeerCertificate(true) as { raw?: Buffer; issuerCertificate?: unknown } | undefined;
  const seen = new Set<unknown>();
  while (c && c.raw && !seen.has(c)) {
    seen.add(c);
    out.push(new X509Certificate(c.raw));
    c = c.issuerCertificate as typeof c;
  }
  return out;
}

/** True when the leaf certificate is signed by one of the CAs and currently valid. */
function verifiedBy(chain: X509Certificate[], cas: X509Certificate[]): boolean {
  const leaf = chain[0];
  if (!leaf) return false;
  const now = Date.now();
  if (Date.parse(leaf.validFrom) > now || Date.parse(leaf.validTo) < now) return false;
  return cas.some((ca) => {
    try {
      return leaf.checkIssued(ca) && leaf.verify(ca.publicKey);
    } catch {
      return false;
    }
  });
}

function parseCAs(pem: string | string[]): X509Certificate[] {
  const blocks = [pem]
    .flat()
    .join('\n')
    .match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g);
  return (blocks ?? []).map((b) => new X509Certificate(b));
}

function subjectField(subject: string, key: string): string[] {
  return subject
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.startsWith(`${key}=`))
    .map((l) => l.slice(key.length + 1));
}

export interface RequestHeaderOptions {
  /** PEM of `requestheader-client-ca-file` (the front proxy's CA). */
  clientCA: string | string[];
  /** `requestheader-allowed-names`: allowed CNs of the proxy certificate; empty allows any. */
  allowedNames?: string[];
  usernameHeaders?: string[];
  groupHeaders?: string[];
  extraHeaderPrefixes?: string[];
}

/**
 * Trusts X-Remote-User / X-Remote-Group / X-Remote-Extra-* only from a client certificate
 * signed by the request-header CA with an allowed CN (kube's headerrequest authenticator).
 * Then removes those headers so nothing downstream reads them unverified.
 */
export function requestHeaderAuthenticator(opts: RequestHeaderOptions): Authenticator {
  const cas = parseCAs(opts.clientCA);
  const userHeaders = (opts.usernameHeaders ?? ['X-Remote-User']).map((h) => h.toLowerCase());
  const groupHeaders = (opts.groupHeaders ?? ['X-Remote-Group']).map((h) => h.toLowerCase());
  const extraPrefixes = (opts.extraHeaderPrefixes ?? ['X-Remote-Extra-']).map((h) => h.toLowerCase());
  const allowed = opts.allowedNames ?? [];
  const strip = (req: IncomingMessage) => {
    for (const h of Object.keys(req.headers)) {
      if (userHeaders.includes(h) || groupHeaders.includes(h) || extraPrefixes.some((p) => h.startsWith(p)))
        delete req.headers[h];
    }
  };
  return (req) => {
    const chain = peerChain(req);
    if (!verifiedBy(chain, cas)) return undefined;
    const cn = subjectField(chain[0].subject, 'CN')[0] ?? '';
    if (allowed.length && !allowed.includes(cn)) {
      strip(req);
      return undefined;
    }
    const raw = req.headersDistinct;
    const name = userHeaders.map((h) => raw[h]?.find((v) => v !== '')).find((v) => v !== undefined);
    if (!name) {
      strip(req);
      return undefined;
    }
    const groups = groupHeaders.flatMap((h) => raw[h] ?? []);
    const extra: Record<string, string[]> = {};
    for (const [h, vs] of Object.entries(raw)) {
      const p = extraPrefixes.find((x) => h.startsWith(x));
      if (!p || !vs) continue;
      const key = decodeURIComponent(h.slice(p.length)).toLowerCase();
      extra[key] = [...(extra[key] ?? []), ...vs];
    }
    strip(req);
    return { name, groups, ...(Object.keys(extra).length ? { extra } : {}) };
  };
}

/** A client certificate signed by `client-ca-file`: CN is the user, O the groups. */
export function clientCertAuthenticator(clientCA: string | string[]): Authenticator {
  const cas = parseCAs(clientCA);
  return (req) => {
    const chain = peerChain(req);
    if (!verifiedBy(chain, cas)) return undefined;
    const name = subjectField(chain[0].subject, 'CN')[0];
    if (!name) return undefined;
    return { name, groups: [...subjectField(chain[0].subject, 'O'), 'system:authenticated'] };
  };
}

/** The status of a TokenReview or SubjectAccessReview answer, as far as the authenticators read it. */
export interface ReviewResponse {
  status?: {
    authenticated?: boolean;
    user?: { username?: string; groups?: string[]; extra?: Record<string, string[]> };
    allowed?: boolean;
    reason?: string;
  };
}

/** Posts a review object to the cluster and returns the response body (the caller wires a client). */
export type ReviewPoster = (path: string, body: Record<string, unknown>) => Promise<ReviewResponse>;

/** `Authorization: Bearer` tokens checked with a TokenReview (cached for `ttlMs`, default 10 s). */
export function tokenReviewAuthenticator(
  post: ReviewPoster,
  ttlMs = 10_000,
  now: () => number = Date.now,
): Authenticator {
  const cache = new Map<string, { user?: UserInfo; until: number }>();
  return async (req) => {
    const h = req.headers.authorization;
    if (!h || !/^bearer /i.test(h)) return undefined;
    const token = h.slice(7).trim();
    const hit = cache.get(token);
    if (hit && hit.until > now()) {
      if (!hit.user) throw unauthorized();
      return hit.user;
    }
    const res = await post('/apis/authentication.k8s.io/v1/tokenreviews', {
      apiVersion: 'authentication.k8s.io/v1',
      kind: 'TokenReview',
      spec: { token },
    });
    const st = res?.status ?? {};
    const user: UserInfo | undefined = st.authenticated
      ? {
          name: st.user?.username ?? '',
          groups: st.user?.groups ?? [],
          ...(st.user?.extra ? { extra: st.user.extra } : {}),
        }
      : undefined;
    if (cache.size > 10_000) cache.clear();
    cache.set(token, { user, until: now() + ttlMs });
    if (!user) throw unauthorized();
    return user;
  };
}

const ALWAYS_ALLOWED = new Set(['/healthz', '/readyz', '/livez']);

/**
 * SubjectAccessReview authorizer with kube's delegating defaults: allow and deny cached for
 * `ttlMs` (10 s), group system:masters always allowed, health paths always allowed.
 */
export function subjectAccessReviewAuthorizer(
  post: ReviewPoster,
  ttlMs = 10_000,
  now: () => number = Date.now,
): Authorizer {
  const cache = new Map<string, { d: Decision; until: number }>();
  return async (attrs) => {
    if (attrs.user.groups.includes('system:masters')) return { allowed: true };
    if ('nonResource' in attrs && ALWAYS_ALLOWED.has(attrs.nonResource.path.split('/').slice(0, 2).join('/')))
      return { allowed: true };
    const key = JSON.stringify(attrs);
    const hit = cache.get(key);
    if (hit && hit.until > now()) return hit.d;
    const spec: Record<string, unknown> = { user: attrs.user.name, groups: attrs.user.groups };
    if (attrs.user.extra) spec.extra = attrs.user.extra;
    if ('resource' in attrs) spec.resourceAttributes = attrs.resource;
    else spec.nonResourceAttributes = attrs.nonResource;
    const res = await post('/apis/authorization.k8s.io/v1/subjectaccessreviews', {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SubjectAccessReview',
      spec,
    });
    const d: Decision = { allowed: res?.status?.allowed === true, reason: res?.status?.reason || undefined };
    if (cache.size > 10_000) cache.clear();
    cache.set(key, { d, until: now() + ttlMs });
    return d;
  };
}

/**
 * The delegated authentication and authorization of an aggregated API server, from the data
 * of ConfigMap kube-system/extension-apiserver-authentication (keys `client-ca-file`,
 * `requestheader-client-ca-file`, and the JSON-array keys `requestheader-allowed-names`,
 * `requestheader-username-headers`, `requestheader-group-headers`,
 * `requestheader-extra-headers-prefix`). Order as kube-apiserver: request header, client
 * certificate, bearer token, anonymous. Throws Error on a malformed JSON array.
 */
export function delegatingAuth(
  data: Record<string, string>,
  post: ReviewPoster,
): { authenticate: Authenticator; authorize: Authorizer } {
  const arr = (k: string): string[] | undefined => {
    const v = data[k];
    if (v === undefined || v === '') return undefined;
    const parsed = JSON.parse(v) as unknown;
    if (!Array.isArray(parsed) || parsed.some((x) => typeof x !== 'string'))
      throw new Error(`${k} is not a JSON array of strings`);
    return parsed as string[];
  };
  const chain: Authenticator[] = [];
  if (data['requestheader-client-ca-file']) {
    chain.push(
      requestHeaderAuthenticator({
        clientCA: data['requestheader-client-ca-file'],
        allowedNames: arr('requestheader-allowed-names'),
        usernameHeaders: arr('requestheader-username-headers'),
        groupHeaders: arr('requestheader-group-headers'),
        extraHeaderPrefixes: arr('requestheader-extra-headers-prefix'),
      }),
    );
  }
  if (data['client-ca-file']) chain.push(clientCertAuthenticator(data['client-ca-file']));
  chain.push(tokenReviewAuthenticator(post));
  return { authenticate: chainAuthenticators(...chain), authorize: subjectAccessReviewAuthorizer(post) };
}
