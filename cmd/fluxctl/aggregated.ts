// `fluxctl serve --aggregated`: the options of an aggregated API server behind kube-apiserver
// (docs/reference/kubernetes-api.md section 6), named as kube's generic apiserver names them,
// turned into the `https` + `authenticate` + `authorize` options of createApiServer with the
// authenticators of runtime/apiserver/http/auth.ts:
//   request header (front-proxy certificate verified against --requestheader-client-ca-file,
//   CN in --requestheader-allowed-names) -> client certificate (--client-ca-file) -> bearer
//   token by TokenReview -> anonymous.
// TokenReview and SubjectAccessReview go to the cluster of --authentication-kubeconfig /
// --authorization-kubeconfig, else the in-cluster service account when running in a pod.
// Without either (kube's behaviour with no authorization kubeconfig): only group
// system:masters and the health paths are allowed, every other request is 403.
import fs from 'node:fs';
import {
  chainAuthenticators,
  clientCertAuthenticator,
  requestHeaderAuthenticator,
  subjectAccessReviewAuthorizer,
  tokenReviewAuthenticator,
  type Authenticator,
  type Authorizer,
  type ReviewPoster,
  type ReviewResponse,
} from '../../runtime/apiserver/http/auth.js';
import { ClientNodeClient, clientNode } from '../../runtime/client/clientnode.js';
import type { Logger } from '../../runtime/controller/index.js';
import { CliError } from './util.js';

export interface AggregatedOptions {
  /** Serving certificate and key (PEM files). */
  tlsCert: string;
  tlsKey: string;
  /** The front proxy's CA (PEM file); without it request headers are never trusted. */
  requestheaderClientCA?: string;
  /** Allowed CNs of the front-proxy certificate; empty, every certificate the CA signed. */
  requestheaderAllowedNames?: string[];
  requestheaderUsernameHeaders?: string[];
  requestheaderGroupHeaders?: string[];
  requestheaderExtraHeadersPrefix?: string[];
  /** CA of client certificates (PEM file): CN is the user, O the groups. */
  clientCA?: string;
  authenticationKubeconfig?: string;
  authorizationKubeconfig?: string;
}

const HEALTH = new Set(['/healthz', '/readyz', '/livez']);

function readPem(file: string, flag: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new CliError(`error: cannot read ${flag} ${file}: ${(e as Error).message}`);
  }
}

/** A ReviewPoster on the cluster of `file`, else in-cluster, else undefined. */
function reviewPoster(file: string | undefined, flag: string): ReviewPoster | undefined {
  const kc = new (clientNode().KubeConfig)();
  try {
    if (file) kc.loadFromFile(file);
    else if (process.env.KUBERNETES_SERVICE_HOST) kc.loadFromCluster();
    else return undefined;
  } catch (e) {
    throw new CliError(`error: cannot load ${flag} ${file ?? '(in-cluster)'}: ${(e as Error).message}`);
  }
  const client = new ClientNodeClient(kc, { userAgent: 'fluxvm-apiserver' });
  return (path, body) =>
    client.request<ReviewResponse>(path, { method: 'POST', body, contentType: 'application/json' });
}

/** The https, authenticate and authorize options of createApiServer. Throws CliError on unreadable files. */
export async function aggregatedAuth(
  o: AggregatedOptions,
  log: Logger,
): Promise<{ https: { cert: string; key: string }; authenticate: Authenticator; authorize: Authorizer }> {
  if (!o.tlsCert || !o.tlsKey) throw new CliError('error: --aggregated needs --tls-cert and --tls-key');
  const https = { cert: readPem(o.tlsCert, '--tls-cert'), key: readPem(o.tlsKey, '--tls-key') };
  const chain: Authenticator[] = [];
  if (o.requestheaderClientCA) {
    chain.push(
      requestHeaderAuthenticator({
        clientCA: readPem(o.requestheaderClientCA, '--requestheader-client-ca-file'),
        allowedNames: o.requestheaderAllowedNames?.filter(Boolean),
        usernameHeaders: o.requestheaderUsernameHeaders,
        groupHeaders: o.requestheaderGroupHeaders,
        extraHeaderPrefixes: o.requestheaderExtraHeadersPrefix,
      }),
    );
  } else {
    log.error('no --requestheader-client-ca-file: requests proxied by kube-apiserver will be anonymous');
  }
  if (o.clientCA) chain.push(clientCertAuthenticator(readPem(o.clientCA, '--client-ca-file')));
  const authn = reviewPoster(o.authenticationKubeconfig, '--authentication-kubeconfig');
  if (authn) chain.push(tokenReviewAuthenticator(authn));
  const authz = reviewPoster(o.authorizationKubeconfig, '--authorization-kubeconfig');
  let authorize: Authorizer;
  if (authz) {
    authorize = subjectAccessReviewAuthorizer(authz);
  } else {
    log.error('no --authorization-kubeconfig and not in a cluster: only system:masters is authorized');
    authorize = (a) => {
      if (a.user.groups.includes('system:masters')) return { allowed: true };
      if ('nonResource' in a && HEALTH.has(a.nonResource.path.split('/').slice(0, 2).join('/')))
        return { allowed: true };
      return { allowed: false, reason: 'no authorization-kubeconfig: only system:masters is authorized' };
    };
  }
  return { https, authenticate: chainAuthenticators(...chain), authorize };
}
