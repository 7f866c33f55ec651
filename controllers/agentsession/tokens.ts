// Session tokens (spec/agent-sessions.md "Session tokens"), modelled on
// ServiceAccount TokenRequest: `POST agentsessions/<name>/token {ops, ttlSeconds?, label?}`
// answers the bearer token once (`fxst_` + 256 random bits, base64url); only its SHA-256 is
// kept, in `<dir>/<session uid>/tokens.json` (fsync + rename before the answer), so the
// finalizer's removal of the session's state dir revokes them all. The authenticator maps a
// token to the user `system:agentsession:<ns>:<name>` (groups system:agentsessions and
// system:agentsessions:<ns>), the granted ops in `extra`; `sessionTokenScope` (run before RBAC)
// lets that user reach only its session's paths and the subresources of its ops.
//   GET    agentsessions/<name>/token          the live tokens: id, label, ops, times; no secrets
//   DELETE agentsessions/<name>/token?id=<id>  revokes one (404 when unknown)
// Limits: ttlSeconds 60..86400 (default 3600), capped at the session's expiry; at most 32 live
// tokens per session (the 33rd is a 409 naming the limit); ops unknown or not grantable 422
// naming spec.ops[i]. Ledgered as token.mint / token.revoke (id, label, ops, expiry).
import { randomBytes } from 'node:crypto';
import fs, { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { Attributes, Decision } from '../../runtime/apiserver/http/auth.js';
import type { PolicyRule } from '../../runtime/apiserver/auth/rbac.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import type { UserInfo } from '../../runtime/apiserver/registry-types.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import type { StatusCause } from '../../runtime/meta/types.js';
import { jsonBody, queryParam } from '../sandbox/subresources.js';
import { GROUP, resolveSession, type AgentSessionSubresourceDeps } from './common.js';
import { expiryMs } from './desired.js';
import { writeFileAtomic } from '../../native/workspace/atomic.js';
import { KeyedLock } from '../common/keyedlock.js';
import { BoundTokenAuthenticator, tokenHash } from '../../runtime/apiserver/auth/boundtoken.js';

export const TOKEN_PREFIX = 'fxst_';
/**
 * `terminal` is exec with tty=true (an interactive shell): a token needs it beside `exec`, since a
 * shell runs whatever is typed into it, which no string rule sees (subresources.ts
 * terminalRefusal; a session with process rules or a filesystem policy refuses terminals to everyone).
 */
export const GRANTABLE_OPS = [
  'read',
  'exec',
  'terminal',
  'jobs',
  'files.read',
  'files.write',
  'git',
  'checkpoint',
  'preview',
  'screen',
] as const;
export type SessionOp = (typeof GRANTABLE_OPS)[number];
/** Operations a session token can never carry (admin-only): named so the 422 says why. */
export const NOT_GRANTABLE = ['create', 'list', 'delete', 'restore', 'fork', 'promote', 'token'] as const;
export const MAX_LIVE_TOKENS = 32;
export const DEFAULT_TTL_SECONDS = 3600;
export const MIN_TTL_SECONDS = 60;
export const MAX_TTL_SECONDS = 86400;
export const MAX_LABEL_LENGTH = 63;
export const SESSION_USER_PREFIX = 'system:agentsession:';
export const SESSION_GROUP = 'system:agentsessions';
/** user.extra keys: the granted ops, and the token id (kube's credential-id, as for ServiceAccount tokens). */
export const OPS_EXTRA = 'fluxvm.dev/agentsession-ops';
export const CREDENTIAL_EXTRA = 'authentication.kubernetes.io/credential-id';

export function sessionUserName(namespace: string, name: string): string {
  return `${SESSION_USER_PREFIX}${namespace}:${name}`;
}

/** A stored token: never the secret, only its hex SHA-256. */
export interface StoredToken {
  id: string;
  sha256: string;
  label: string;
  ops: SessionOp[];
  creationTimestamp: string;
  expirationTimestamp: string;
}

interface TokenFile {
  session: { namespace: string; name: string; uid: string };
  tokens: StoredToken[];
}

export interface TokenRequestSpec {
  ops: SessionOp[];
  ttlSeconds: number;
  label: string;
}

const sha256hex = tokenHash;

function invalid(name: string, causes: StatusCause[]) {
  return errors.invalid('AgentSessionTokenRequest', GROUP, name, causes);
}

/**
 * The request body (`{ops, ttlSeconds?, label?}`, or the same under `spec` as a TokenRequest
 * has it) checked: a 422 with one cause per bad field (spec.ops[i], spec.ttlSeconds,
 * spec.label). Pure.
 */
export function parseTokenRequest(body: Record<string, unknown>, session: string): TokenRequestSpec {
  const spec = (body.spec && typeof body.spec === 'object' && !Array.isArray(body.spec) ? body.spec : body) as Record<
    string,
    unknown
  >;
  const causes: StatusCause[] = [];
  const ops: SessionOp[] = [];
  if (spec.ops === undefined)
    causes.push({ reason: 'FieldValueRequired', field: 'spec.ops', message: 'Required value: at least one op' });
  else if (!Array.isArray(spec.ops) || spec.ops.length === 0)
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'spec.ops',
      message: 'Invalid value: must be a non-empty list of ops',
    });
  else
    spec.ops.forEach((op, i) => {
      const field = `spec.ops[${i}]`;
      if ((GRANTABLE_OPS as readonly unknown[]).includes(op)) {
        if (ops.includes(op as SessionOp))
          causes.push({ reason: 'FieldValueDuplicate', field, message: `Duplicate value: ${JSON.stringify(op)}` });
        else ops.push(op as SessionOp);
      } else if ((NOT_GRANTABLE as readonly unknown[]).includes(op)) {
        causes.push({
          reason: 'FieldValueForbidden',
          field,
          message: `Forbidden: ${JSON.stringify(op)} is not grantable to a session token (admin only)`,
        });
      } else {
        causes.push({
          reason: 'FieldValueNotSupported',
          field,
          message: `Unsupported value: ${JSON.stringify(op)}: supported values: ${GRANTABLE_OPS.map((o) => `"${o}"`).join(', ')}`,
        });
      }
    });
  let ttlSeconds = DEFAULT_TTL_SECONDS;
  if (spec.ttlSeconds !== undefined) {
    const t = spec.ttlSeconds;
    if (typeof t !== 'number' || !Number.isInteger(t) || t < MIN_TTL_SECONDS || t > MAX_TTL_SECONDS) {
      causes.push({
        reason: 'FieldValueInvalid',
        field: 'spec.ttlSeconds',
        message: `Invalid value: ${JSON.stringify(t)}: must be an integer from ${MIN_TTL_SECONDS} to ${MAX_TTL_SECONDS}`,
      });
    } else ttlSeconds = t;
  }
  let label = '';
  if (spec.label !== undefined) {
    const l = spec.label;
    // eslint-disable-next-line no-control-regex -- a label with a control character is refused
    const control = /[\u0000-\u001f\u007f]/;
    if (typeof l !== 'string' || l.length > MAX_LABEL_LENGTH || control.test(l)) {
      causes.push({
        reason: 'FieldValueInvalid',
        field: 'spec.label',
        message: `Invalid value: must be a string of at most ${MAX_LABEL_LENGTH} printable characters`,
      });
    } else label = l;
  }
  if (causes.length) throw invalid(session, causes);
  return { ops, ttlSeconds, label };
}

/** The token's expiry: now + ttl, capped at the session's own expiry. Pure. */
export function tokenExpiry(nowMs: number, ttlSeconds: number, sessionExpiryMs: number | undefined): number {
  return Math.min(nowMs + ttlSeconds * 1000, sessionExpiryMs ?? Infinity);
}

type SessionView = Pick<AgentSession, 'metadata' | 'status'> | undefined;
type LiveSession = NonNullable<SessionView>;
/**
 * What the authenticator needs to know of a session at request time: the informer's cache
 * (a map lookup), or a read of the store while that cache has not synced yet.
 */
export type SessionLookup = (namespace: string, name: string) => SessionView | Promise<SessionView>;

const publicView = (t: StoredToken) => ({
  id: t.id,
  label: t.label,
  ops: t.ops,
  creationTimestamp: t.creationTimestamp,
  expirationTimestamp: t.expirationTimestamp,
});

/**
 * The session tokens of one state dir, indexed by hash in memory, loaded from the session dirs
 * at construction. mint/revoke of one session are serialized; each writes tokens.json with
 * fsync + rename before resolving. Until `attach` gives it a session lookup, the authenticator
 * accepts no token (a token is good only while its session exists, is not being deleted and
 * has not expired).
 */
export class SessionTokens {
  /** The kind-agnostic part: the tokens by hash, bound to their session (runtime/apiserver/auth). */
  private readonly bound: BoundTokenAuthenticator<LiveSession>;
  private readonly bySession = new Map<string, TokenFile>();
  private readonly locks = new KeyedLock();

  constructor(
    private readonly dir: string,
    private readonly now: () => number = Date.now,
  ) {
    this.bound = new BoundTokenAuthenticator<LiveSession>({
      prefix: TOKEN_PREFIX,
      now,
      live: (s) => s.status?.phase !== 'Expired',
    });
    this.load();
  }

  private load(): void {
    let uids: string[];
    try {
      uids = fs.readdirSync(this.dir);
    } catch {
      return; // no sessions yet
    }
    for (const uid of uids) {
      try {
        const f = JSON.parse(fs.readFileSync(join(this.dir, uid, 'tokens.json'), 'utf8')) as TokenFile;
        if (f?.session?.uid === uid && Array.isArray(f.tokens)) this.index(f);
      } catch {
        // no tokens file (or a torn temporary one was never renamed): no tokens
      }
    }
  }

  private index(f: TokenFile): void {
    const old = this.bySession.get(f.session.uid);
    for (const t of old?.tokens ?? []) this.bound.delete(t.sha256);
    this.bySession.set(f.session.uid, f);
    const { namespace, name, uid } = f.session;
    for (const t of f.tokens) {
      const user: UserInfo = {
        name: sessionUserName(namespace, name),
        uid,
        groups: [SESSION_GROUP, `${SESSION_GROUP}:${namespace}`, 'system:authenticated'],
        extra: { [OPS_EXTRA]: [...t.ops], [CREDENTIAL_EXTRA]: [`fxst:${t.id}`] },
      };
      this.bound.set(t.sha256, { uid, namespace, name, user, expiresMs: Date.parse(t.expirationTimestamp) });
    }
  }

  /** Gives the authenticator its view of the sessions (the controller's informer cache). */
  attach(lookup: SessionLookup): void {
    this.bound.attach(lookup);
  }

  /**
   * A TokenAuthenticator: the session user of a live `fxst_` token; undefined (a 401 at the end
   * of the chain) for any other string, an unknown, revoked or expired token, or one whose
   * session is gone, being deleted, replaced by another of the same name, or expired.
   */
  readonly authenticate = (token: string): UserInfo | undefined | Promise<UserInfo | undefined> =>
    this.bound.authenticate(token);

  private async write(f: TokenFile): Promise<void> {
    const d = join(this.dir, f.session.uid);
    await fsp.mkdir(d, { recursive: true, mode: 0o700 });
    await writeFileAtomic(join(d, 'tokens.json'), JSON.stringify(f), 0o600);
  }

  private liveOf(uid: string): StoredToken[] {
    const t = this.now();
    return (this.bySession.get(uid)?.tokens ?? []).filter((x) => Date.parse(x.expirationTimestamp) > t);
  }

  /** The live tokens of a session, oldest first, without hashes. */
  list(uid: string): Array<Omit<StoredToken, 'sha256'>> {
    return this.liveOf(uid).map(publicView);
  }

  /**
   * Mints a token for the session: 409 at MAX_LIVE_TOKENS live ones. Resolves once tokens.json
   * is on disk; the plain token exists only in the answer. Expired tokens are dropped from the
   * file on the way.
   */
  mint(
    session: { namespace: string; name: string; uid: string },
    spec: TokenRequestSpec,
    sessionExpiryMs: number | undefined,
  ): Promise<{ token: string; record: Omit<StoredToken, 'sha256'> }> {
    return this.locks.run(session.uid, async () => {
      const live = this.liveOf(session.uid);
      if (live.length >= MAX_LIVE_TOKENS) {
        throw errors.conflict(
          'agentsessions',
          GROUP,
          session.name,
          `the session has ${live.length} live tokens, the limit is ${MAX_LIVE_TOKENS}: revoke one first (fluxctl agent untoken ${session.name} <id>)`,
        );
      }
      const now = this.now();
      const token = TOKEN_PREFIX + randomBytes(32).toString('base64url');
      const t: StoredToken = {
        id: randomBytes(6).toString('hex'),
        sha256: sha256hex(token),
        label: spec.label,
        ops: spec.ops,
        creationTimestamp: new Date(now).toISOString(),
        expirationTimestamp: new Date(tokenExpiry(now, spec.ttlSeconds, sessionExpiryMs)).toISOString(),
      };
      const f: TokenFile = {
        session: { namespace: session.namespace, name: session.name, uid: session.uid },
        tokens: [...live, t],
      };
      await this.write(f);
      this.index(f);
      return { token, record: publicView(t) };
    });
  }

  /** Revokes one token (undefined when the session has no live token with that id). Durable before it resolves. */
  revoke(uid: string, id: string): Promise<Omit<StoredToken, 'sha256'> | undefined> {
    return this.locks.run(uid, async () => {
      const f = this.bySession.get(uid);
      const t = this.liveOf(uid).find((x) => x.id === id);
      if (!f || !t) return undefined;
      const next: TokenFile = { session: f.session, tokens: this.liveOf(uid).filter((x) => x.id !== id) };
      await this.write(next);
      this.index(next);
      return publicView(t);
    });
  }

  /** Forgets every token of a session in memory (its state dir is being removed). Safe twice. */
  forget(uid: string): void {
    for (const t of this.bySession.get(uid)?.tokens ?? []) this.bound.delete(t.sha256);
    this.bySession.delete(uid);
  }
}

/**
 * The op a request on the session needs, by subresource ('' for the object itself) and verb;
 * undefined: not reachable with a session token at all (restore, fork, promote, token, delete,
 * update, list, watch of the collection, approvals). Pure; the table is in the README.
 */
const OP_TABLE: Record<string, Record<string, SessionOp>> = {
  '': { get: 'read' },
  status: { get: 'read' },
  ledger: { get: 'read', watch: 'read' },
  artifacts: { get: 'read' },
  events: { get: 'read' },
  exec: { create: 'exec', get: 'exec' },
  checkpoint: { create: 'checkpoint' },
  provenance: { get: 'read' }, // promote-provenance.ts
  replay: { create: 'exec' }, // replay.ts: the target's exec is checked again (a token reaches only its own session)
  rewind: { get: 'read', create: 'checkpoint' }, // rewind.ts: bisect also needs exec, branch is refused
  jobs: { get: 'jobs', create: 'jobs', delete: 'jobs' },
  files: {
    get: 'files.read',
    create: 'files.write',
    update: 'files.write',
    patch: 'files.write',
    delete: 'files.write',
  },
  uploads: { get: 'files.read', create: 'files.write', update: 'files.write', delete: 'files.write' },
  git: { get: 'git', create: 'git' },
  preview: { get: 'read', create: 'preview', delete: 'preview' },
  previews: { get: 'read', create: 'preview', delete: 'preview' },
  screen: { get: 'screen', create: 'screen' },
};

export function opFor(subresource: string | undefined, verb: string): SessionOp | undefined {
  return OP_TABLE[subresource ?? '']?.[verb];
}

/**
 * Why `user` may not use `op` on its session: a session token (user `system:agentsession:...`)
 * not granted it. Undefined for any other user (RBAC decided already) and for a token that has
 * it. For ops a request's path cannot show (terminal: the exec subresource with tty=true), which
 * the handler checks after the scope rule let the request through. Pure.
 */
export function sessionTokenLacks(user: UserInfo | undefined, op: SessionOp): string | undefined {
  if (!user?.name.startsWith(SESSION_USER_PREFIX)) return undefined;
  const ops = user.extra?.[OPS_EXTRA] ?? [];
  return ops.includes(op) ? undefined : `the session token was not granted ${op} (it has ${ops.join(', ') || 'none'})`;
}

/**
 * The resource rules a session user holds in `namespace`, as RBAC would list them (for
 * SelfSubjectRulesReview: `kubectl auth can-i --list`): one rule per verb over the
 * subresources its ops reach, resourceNames its session; [] in any other namespace;
 * undefined for any other user. Pure.
 */
export function sessionTokenRules(user: UserInfo, namespace: string): PolicyRule[] | undefined {
  if (!user.name.startsWith(SESSION_USER_PREFIX)) return undefined;
  const [ns, name] = user.name.slice(SESSION_USER_PREFIX.length).split(':');
  if (namespace !== ns || !name) return [];
  const ops = new Set(user.extra?.[OPS_EXTRA] ?? []);
  const byVerb = new Map<string, string[]>();
  for (const [sub, verbs] of Object.entries(OP_TABLE)) {
    for (const [verb, op] of Object.entries(verbs)) {
      if (!ops.has(op)) continue;
      const list = byVerb.get(verb) ?? [];
      list.push(sub ? `agentsessions/${sub}` : 'agentsessions');
      byVerb.set(verb, list);
    }
  }
  return [...byVerb].map(([verb, resources]) => ({
    verbs: [verb],
    apiGroups: [GROUP],
    resources,
    resourceNames: [name],
  }));
}

const SELF_REVIEWS = new Set([
  'authentication.k8s.io/selfsubjectreviews',
  'authorization.k8s.io/selfsubjectaccessreviews',
  'authorization.k8s.io/selfsubjectrulesreviews',
]);

/**
 * The authorizer rule for session users, tried before RBAC: undefined for any other user, for
 * non-resource paths (discovery, health: RBAC's system:discovery decides) and the self reviews
 * (`kubectl auth whoami|can-i`); otherwise the final decision: allowed only on its own
 * session (`agentsessions/<name>` in its namespace) with a granted op. Pure.
 */
export function sessionTokenScope(attrs: Attributes): Decision | undefined {
  const u = attrs.user;
  if (!u.name.startsWith(SESSION_USER_PREFIX)) return undefined;
  if ('nonResource' in attrs) return undefined;
  const r = attrs.resource;
  if (SELF_REVIEWS.has(`${r.group}/${r.resource}`)) return undefined;
  const [ns, name] = u.name.slice(SESSION_USER_PREFIX.length).split(':');
  if (r.group !== GROUP || r.resource !== 'agentsessions' || r.namespace !== ns || r.name !== name) {
    return { allowed: false, reason: `a session token reaches only agentsessions/${name} in the namespace "${ns}"` };
  }
  const need = opFor(r.subresource, r.verb);
  const what = r.subresource ? `agentsessions/${r.subresource}` : 'agentsessions';
  if (!need) return { allowed: false, reason: `${r.verb} ${what} is not available to a session token` };
  const ops = u.extra?.[OPS_EXTRA] ?? [];
  if (!ops.includes(need))
    return { allowed: false, reason: `the session token was not granted ${need} (it has ${ops.join(', ') || 'none'})` };
  return { allowed: true };
}

/** The `agentsessions/<name>/token` subresource over `tokens` (see the head of this file). */
export function tokenHandler(d: AgentSessionSubresourceDeps, tokens: SessionTokens): SubresourceHandler {
  return {
    verbs: ['create', 'get', 'delete'],
    async handle(r) {
      const { s, uid } = await resolveSession(d, r, { running: false });
      if (r.method === 'GET') {
        return {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'AgentSessionTokenList',
          metadata: {},
          session: r.name,
          items: tokens.list(uid),
        };
      }
      if (r.method === 'DELETE') {
        const id = queryParam(r, 'id');
        if (!id)
          throw errors.badRequest(
            'DELETE agentsessions/<name>/token needs ?id=<token id> (fluxctl agent tokens lists them)',
          );
        const t = await tokens.revoke(uid, id);
        if (!t)
          throw new StatusError(404, 'NotFound', `token "${id}" of agentsessions.fluxvm.dev "${r.name}" not found`, {
            name: id,
            group: GROUP,
            kind: 'agentsessions/token',
          });
        await d.ledger.append(uid, 'token.revoke', {
          id: t.id,
          label: t.label,
          ops: t.ops,
          expirationTimestamp: t.expirationTimestamp,
        });
        return {
          kind: 'Status',
          apiVersion: 'v1',
          metadata: {},
          status: 'Success',
          code: 200,
          details: { name: t.id, group: GROUP, kind: 'agentsessions/token' },
        };
      }
      if (r.method !== 'POST')
        throw errors.methodNotAllowed(`token takes POST (mint), GET (list) or DELETE ?id= (revoke), not ${r.method}`);
      const spec = parseTokenRequest(jsonBody(r), r.name);
      const ph = s.status?.phase ?? 'Pending';
      const expires = expiryMs(s);
      const ended = expires !== undefined && expires <= (d.now ?? Date.now)(); // before the reconciler marks it Expired
      if (s.metadata.deletionTimestamp || ended || ph === 'Expired' || ph === 'Failed' || ph === 'Terminating') {
        const why = s.metadata.deletionTimestamp ? 'being deleted' : ended ? 'Expired' : ph;
        throw errors.conflict('agentsessions', GROUP, r.name, `the session is ${why}: no token can be minted`);
      }
      const { token, record } = await tokens.mint({ namespace: r.namespace!, name: r.name, uid }, spec, expires);
      await d.ledger.append(uid, 'token.mint', {
        id: record.id,
        label: record.label,
        ops: record.ops,
        expirationTimestamp: record.expirationTimestamp,
      });
      const answer = {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSessionTokenRequest',
        metadata: { name: r.name, namespace: r.namespace },
        spec,
        status: { ...record, token, user: sessionUserName(r.namespace!, r.name) },
      };
      if (!r.reply) return answer; // an in-process caller without a reply (tests) takes the object
      r.reply
        .code(201)
        .header('content-type', 'application/json')
        .header('cache-control', 'no-store')
        .send(Buffer.from(JSON.stringify(answer)));
      return undefined;
    },
  };
}
