// Identities on the node-agent link (docs/scale-out.md, "Agent TLS"), checked on both ends:
// the agent's serving certificate names its node (CN system:fluxvm-node:<node> as the signer
// issues it; CN <node> or the DNS name <node> in a certificate the operator made), and a
// caller's client certificate carries O fluxvm:node-agent-clients. The chain to the cluster CA
// and the address are checked by TLS itself; these are the names on top, so a valid
// certificate of another node (or a node's serving certificate used as a client) is refused.
import type { PeerCertificate } from 'node:tls';

/** O of every node agent's serving certificate (as kube's system:nodes). */
export const NODE_ORG = 'fluxvm:nodes';
/** O of the client certificates a node agent accepts (the controller's, the API server's). */
export const AGENT_CLIENT_ORG = 'fluxvm:node-agent-clients';
/** CN of node `node`'s serving certificate (as kube's system:node:<name>). */
export const nodeCommonName = (node: string): string => `system:fluxvm-node:${node}`;

const values = (v: string | string[] | undefined): string[] => (Array.isArray(v) ? v : v ? [v] : []);

/** Why `cert` is not node `node`'s serving certificate; undefined when it is. */
export function nodeIdentityMismatch(
  cert: Pick<PeerCertificate, 'subject' | 'subjectaltname'>,
  node: string,
): string | undefined {
  const cns = values(cert.subject?.CN);
  // The signer's CN, or an operator's certificate whose CN (or a DNS name) is the node's name.
  if (cns.includes(nodeCommonName(node)) || cns.includes(node)) return undefined;
  if ((cert.subjectaltname ?? '').split(/,\s*/).includes(`DNS:${node}`)) return undefined;
  return `the agent's certificate is not node "${node}"'s (CN ${cns.join(',') || 'none'}; ${cert.subjectaltname ?? 'no SAN'})`;
}

/** Whether a verified client certificate is one of the agents' callers (O fluxvm:node-agent-clients). */
export function isAgentClient(cert: Pick<PeerCertificate, 'subject'> | undefined): boolean {
  return values(cert?.subject?.O).includes(AGENT_CLIENT_ORG);
}
