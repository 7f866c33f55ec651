// Authentication, authorization and audit of the embedded server, assembled from the parts in
// this folder for createApiServer and the Registry:
//   TLS       the state CA's serving certificate; client certificates are requested, not required
//   authn     client cert (state CA) -> bearer token (admin token, --token-auth-file, and
//             whatever `extraTokens` plugs in: session tokens) -> anonymous on health/version only
//   authz     RBAC over the served Role/ClusterRole/RoleBinding/ClusterRoleBinding objects, with
//             the bootstrap roles ensured at start; system:masters bypasses
//   reviews   SelfSubjectReview, SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReview
//   guard     fields owned by a field subresource need its permission (changesets/approval)
//   audit     <state>/audit.log
import fs from 'node:fs';
import path from 'node:path';
import type { KindDefinition } from '../../../apis/types.js';
import type { RegistryApi } from '../registry-types.js';
import type { WriteGuard } from '../registry.js';
import type { Authenticator, Authorizer } from '../http/auth.js';
import { AuditLog, type AuditRecord } from './audit.js';
import { AdminToken, bearerAuthenticator, embeddedAuthenticator, parseTokenFile, staticTokens, strictClientCertAuthenticator, type TokenAuthenticator } from './authn.js';
import { ensureBootstrapPolicy } from './bootstrap.js';
import { fieldGuard } from './guard.js';
import { StateCA, type KeyPair } from './pki.js';
import { RbacAuthorizer } from './rbac.js';
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
  /** Audit log rotation (bytes; default 100 MiB) and backups kept (default 5). */
  auditMaxBytes?: number;
  auditMaxBackups?: number;
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
export function embeddedAuth(o: EmbeddedAuthOptions): EmbeddedAuth {
  const ca = StateCA.ensure(o.stateDir);
  const serving = ca.servingCert(o.host);
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
  const authorize: Authorizer = rbac.authorize;
  const audit = new AuditLog({ file: path.join(o.stateDir, 'audit.log'), maxBytes: o.auditMaxBytes, maxBackups: o.auditMaxBackups });
  let stopWatch: (() => void) | undefined;
  return {
    https: { ...serving, ca: ca.certPem },
    ca,
    adminToken: token,
    authenticate: embeddedAuthenticator([strictClientCertAuthenticator(ca.certPem), bearerAuthenticator(kinds)]),
    authorize,
    rbac,
    virtual: reviewHandlers({ authorize, rulesFor: (u, ns) => rbac.rulesFor(u, ns) }),
    guard: fieldGuard(authorize),
    audit: (r) => audit.write(r),
    async start(registry, kindList) {
      await ensureBootstrapPolicy(registry, kindList);
      stopWatch = await rbac.attach(registry);
    },
    close() {
      stopWatch?.();
      stopWatch = undefined;
      audit.close();
    },
  };
}
