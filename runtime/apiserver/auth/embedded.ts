// Authentication, authorization and audit of the embedded server, assembled from the parts in
// this folder for createApiServer and the Registry:
//   TLS       the state CA's serving certificate; client certificates are requested, not required
//   authn     client cert (state CA) -> bearer token (admin token, --token-auth-file, and
//             whatever `extraTokens` plugs in: session tokens) -> anonymous on health/version only
//   authz     `scopes` first (session tokens: their own session only), then RBAC over the served
//             Role/ClusterRole/RoleBinding/ClusterRoleBinding objects, with the bootstrap roles
//             ensured at start; system:masters bypasses RBAC
//   reviews   SelfSubjectReview, SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReview
//   guard     fields owned by a field subresource need its permission (changesets/approval);
//             RBAC writes may not grant what the writer does not hold (escalation.ts)
//   aggregation  aggregated ClusterRoles' rules kept current (aggregation.ts)
//   audit     <state>/audit.log
import fs from 'node:fs';
import path from 'node:path';
import type { KindDefinition } from '../../../apis/types.js';
import type { RegistryApi, UserInfo } from '../registry-types.js';
import type { WriteGuard } from '../registry.js';
import type { Attributes, Authenticator, Authorizer, Decision } from '../http/auth.js';
import { AuditLog, type AuditRecord } from './audit.js';
import {
  AdminToken,
  bearerAuthenticator,
  embeddedAuthenticator,
  parseTokenFile,
  staticTokens,
  strictClientCertAuthenticator,
  type TokenAuthenticator,
} from './authn.js';
import { attachAggregator } from './aggregation.js';
import { ensureBootstrapPolicy } from './bootstrap.js';
import { escalationGuard } from './escalation.js';
import { fieldGuard } from './guard.js';
import { StateCA, type KeyPair } from './pki.js';
import { RbacAuthorizer, type PolicyRule } from './rbac.js';
import { reviewHandlers, type VirtualCreate } from './reviews.js';

export interface EmbeddedAuthOptions {
  stateDir: string;
  /** The listen host (its name or address joins the serving certificate's SANs). */
  host: string;
  /** kube's --token-auth-file (CSV). */
  tokenAuthFile?: string;
  /** The admin token of the kubeconfig already in the state dir, kept when it still matches. */
  knownAdminToken?: string;
  /** More bearer token kinds, tried after the admin token and the token file. */
  extraTokens?: TokenAuthenticator[];
  /**
   * Rules tried before RBAC, in order: undefined leaves the request to the next (and RBAC);
   * a decision is final. Session tokens' scoping (controllers/agentsession/tokens.ts) is one.
   */
  scopes?: ScopeRule[];
  /**
   * The rules a scoped credential holds (SelfSubjectRulesReview), in the order of `scopes`:
   * undefined leaves the user to RBAC; a list replaces RBAC's resource rules for that user
   * (RBAC's non-resource rules and self reviews, which the scopes leave to RBAC, are kept).
   */
  scopeRules?: Array<(user: UserInfo, namespace: string) => PolicyRule[] | undefined>;
  /** Audit log rotation (bytes; default 100 MiB) and backups kept (default 5). */
  auditMaxBytes?: number;
  auditMaxBackups?: number;
}

/** An authorizer that decides only the requests it knows (a scoped credential's), undefined for the rest. */
export type ScopeRule = (attrs: Attributes) => Decision | undefined;

/** `scopes` in front of `next`: the first defined decision wins. Never throws when they do not. */
export function scopedAuthorizer(scopes: ScopeRule[], next: Authorizer): Authorizer {
  if (!scopes.length) return next;
  return (attrs) => {
    for (const s of scopes) {
      const d = s(attrs);
      if (d) return d;
    }
    return next(attrs);
  };
}

/** `scopeRules` in front of RBAC's rulesFor (see EmbeddedAuthOptions.scopeRules). Pure over its inputs. */
export function scopedRules(
  scopes: Array<(user: UserInfo, namespace: string) => PolicyRule[] | undefined>,
  next: (user: UserInfo, namespace: string) => PolicyRule[],
): (user: UserInfo, namespace: string) => PolicyRule[] {
  const leftToRbac = (r: PolicyRule) =>
    !!r.nonResourceURLs?.length || (!!r.resources?.length && r.resources.every((x) => x.startsWith('selfsubject')));
  return (u, ns) => {
    for (const s of scopes) {
      const own = s(u, ns);
      if (own) return [...own, ...next(u, ns).filter(leftToRbac)];
    }
    return next(u, ns);
  };
}

export interface EmbeddedAuth {
  https: KeyPair & { ca: string };
  ca: StateCA;
  adminToken: string;
  authenticate: Authenticator;
  authorize: Authorizer;
  rbac: RbacAuthorizer;
  virtual: Record<string, VirtualCreate>;
  guard: WriteGuard;
  audit: (r: AuditRecord) => void;
  /** Loads RBAC from the registry (after ensuring the bootstrap policy) and watches it. */
  start(registry: RegistryApi, kinds: KindDefinition[]): Promise<void>;
  /** Ends the RBAC watches and closes the audit log. Safe twice. */
  close(): void;
}

/**
 * Prepares the state directory's CA, serving certificate and admin token hash (creating them
 * on first start) and the token file. Throws Error on a bad token file line (naming the file
 * and line) or an unreadable CA; nothing is served until start().
 */
export async function embeddedAuth(o: EmbeddedAuthOptions): Promise<EmbeddedAuth> {
  const ca = await StateCA.ensure(o.stateDir);
  const serving = await ca.servingCert(o.host);
  const { admin, token } = AdminToken.ensure(path.join(o.stateDir, 'admin-token.sha256'), o.knownAdminToken);
  const kinds: TokenAuthenticator[] = [admin.authenticate];
  if (o.tokenAuthFile) {
    let text: string;
    try {
      text = fs.readFileSync(o.tokenAuthFile, 'utf8');
    } catch (e) {
      throw new Error(`cannot read --token-auth-file ${o.tokenAuthFile}: ${(e as Error).message}`);
    }
    kinds.push(staticTokens(parseTokenFile(text, o.tokenAuthFile)));
  }
  kinds.push(...(o.extraTokens ?? []));
  const rbac = new RbacAuthorizer();
  const authorize: Authorizer = scopedAuthorizer(o.scopes ?? [], rbac.authorize);
  const audit = new AuditLog({
    file: path.join(o.stateDir, 'audit.log'),
    maxBytes: o.auditMaxBytes,
    maxBackups: o.auditMaxBackups,
  });
  let stopWatch: (() => void) | undefined;
  return {
    https: { ...serving, ca: ca.certPem },
    ca,
    adminToken: token,
    authenticate: embeddedAuthenticator([strictClientCertAuthenticator(ca.certPem), bearerAuthenticator(kinds)]),
    authorize,
    rbac,
    virtual: reviewHandlers({ authorize, rulesFor: scopedRules(o.scopeRules ?? [], (u, ns) => rbac.rulesFor(u, ns)) }),
    guard: chainGuards(fieldGuard(authorize), escalationGuard({ rbac, authorize })),
    audit: (r) => audit.write(r),
    async start(registry, kindList) {
      await ensureBootstrapPolicy(registry, kindList);
      const stopAggregator = await attachAggregator(registry);
      const stopRbac = await rbac.attach(registry);
      stopWatch = () => {
        stopAggregator();
        stopRbac();
      };
    },
    close() {
      stopWatch?.();
      stopWatch = undefined;
      audit.close();
    },
  };
}

/** Guards run in order; the first refusal wins. */
function chainGuards(...guards: WriteGuard[]): WriteGuard {
  return async (...args) => {
    for (const g of guards) await g(...args);
  };
}
