// The callers' side of the node-agent link (docs/scale-out.md, "Agent TLS"): what the controller,
// the API server (`serve --route-by-node`/`--node-agent`) and the aggregated API server present to
// an agent and verify it with. Files (--node-agent-ca-file, --node-agent-client-cert/-key) are
// read each time a connection to a new agent is made, so Secrets mounted after the start (the
// signer publishes them on its first start) are picked up. The controller with --node-ca-secret
// holds the cluster CA itself (clusterCALink): it verifies agents with its certificate and makes
// its own client certificate in memory.
import fs from 'node:fs';
import type { Client } from '../../runtime/client/client.js';
import type { Logger } from '../../runtime/controller/index.js';
import { issueAgentClient, type ClusterCA } from '../../controllers/node/certs.js';
import { ensureClusterCA, parseSecretRef, publishClusterCA } from '../../controllers/node/signer.js';
import { CliError } from './util.js';

export interface AgentLinkTLS {
  /** PEM CA that signed the agents' serving certificates (the cluster CA). */
  caFile?: string;
  /** mTLS: this caller's client certificate and key (PEM files). */
  clientCertFile?: string;
  clientKeyFile?: string;
  /** In memory (the controller's, from the CA Secret): before the files. */
  ca?: string;
  clientCert?: { cert: string; key: string };
}

export interface AgentTLSMaterial {
  ca?: string | Buffer;
  clientCert?: { cert: string | Buffer; key: string | Buffer };
}

const readIf = (f: string | undefined): Buffer | undefined => (f && fs.existsSync(f) ? fs.readFileSync(f) : undefined);

/** What a new connection to an agent uses now. */
export function agentTLSOf(r: AgentLinkTLS): AgentTLSMaterial {
  const ca = r.ca ?? readIf(r.caFile);
  const cert = readIf(r.clientCertFile);
  const key = readIf(r.clientKeyFile);
  const clientCert = r.clientCert ?? (cert && key ? { cert, key } : undefined);
  return { ...(ca ? { ca } : {}), ...(clientCert ? { clientCert } : {}) };
}

/**
 * The controller's link material from the cluster CA Secret `ref` (NS/NAME): the CA made when
 * absent, the public certificate and the API server's client key pair published, this
 * controller's own client certificate (CN fluxvm-controller:<identity>, in memory only).
 */
export async function clusterCALink(
  client: Client,
  ref: string,
  identity: string,
  log: Logger,
): Promise<{ ca: ClusterCA; link: AgentLinkTLS }> {
  let secret: { namespace: string; name: string };
  try {
    secret = parseSecretRef(ref);
  } catch (e) {
    throw new CliError(`error: --node-ca-secret: ${(e as Error).message}`);
  }
  const ca = await ensureClusterCA(client, secret, log);
  await publishClusterCA(client, secret, ca);
  const own = await issueAgentClient(ca, `fluxvm-controller:${identity}`);
  return { ca, link: { ca: ca.certPem, clientCert: own } };
}
