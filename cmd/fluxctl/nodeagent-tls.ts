// The node agent's side of agent TLS (docs/scale-out.md, "Agent TLS"), `fluxctl node-agent
// --tls-bootstrap`: the kubelet-serving pattern. The agent makes its own key (written 0600 to
// --cert-dir with the certificate: it never leaves the node), serves HTTPS at once with a
// placeholder certificate that no caller trusts, registers its Node, posts a PKCS#10 request for
// its node name and advertised address on the Node (status.servingCertificate.request), and
// switches to the certificate the signer in the controller writes back. A certificate in
// --cert-dir that the cluster CA (--client-ca-file) signed, that names this node and address and
// has 30 days left is reused without a request. A refused request (ServingCertificate=False) stops
// the agent with the signer's message.
import fs from 'node:fs';
import path from 'node:path';
import type { Node } from '../../apis/zz_generated.types.js';
import {
  makeClusterCA,
  makeServingRequest,
  servingCertMatches,
  servingCertUsable,
} from '../../controllers/node/certs.js';
import { nodesGVR } from '../../controllers/node/heartbeat.js';
import { SERVING_CERTIFICATE } from '../../controllers/node/signer.js';
import type { Client } from '../../runtime/client/client.js';
import { writeStatus, type Logger } from '../../runtime/controller/index.js';
import { CliError } from './util.js';

const DAY = 24 * 3600_000;

export interface ServingKeyPair {
  cert: string;
  key: string;
}

/**
 * The address an agent's certificate names: --advertise-address, else a concrete listen host.
 * Throws CliError on a wildcard.
 */
export function certificateHost(listenHost: string, advertise?: string): string {
  const h = (advertise || listenHost).replace(/^\[|\]$/g, '');
  if (!h || h === '0.0.0.0' || h === '::')
    throw new CliError('error: --tls-bootstrap needs --advertise-address (or a --listen host that is not a wildcard)');
  return h;
}

function writePrivate(file: string, data: string, mode: number): void {
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, data, { mode });
  fs.renameSync(tmp, file);
}

/** The usable certificate of --cert-dir (signed by `caPem`, this node and host, 30 days left), or undefined. */
export function storedServingCert(
  certDir: string,
  caPem: string | undefined,
  node: string,
  host: string,
): ServingKeyPair | undefined {
  const certFile = path.join(certDir, 'agent.crt');
  const keyFile = path.join(certDir, 'agent.key');
  if (!caPem || !fs.existsSync(certFile) || !fs.existsSync(keyFile)) return undefined;
  const cert = fs.readFileSync(certFile, 'utf8');
  return servingCertUsable(cert, caPem, node, host, 30 * DAY)
    ? { cert, key: fs.readFileSync(keyFile, 'utf8') }
    : undefined;
}

/** A self-signed certificate to serve until the signed one arrives: no caller pinned to the cluster CA accepts it. */
export async function placeholderCert(): Promise<ServingKeyPair> {
  const ca = await makeClusterCA(1);
  return { cert: ca.certPem, key: ca.keyPem };
}

export interface BootstrapOptions {
  client: Client;
  node: string;
  host: string;
  certDir: string;
  log: Logger;
  signal: AbortSignal;
  /** The cluster CA (--client-ca-file): the issued certificate must chain to it. */
  caPem?: string;
  /** How often the Node is read while waiting (default 500 ms). */
  pollMs?: number;
}

/**
 * Posts a serving-certificate request on the Node and resolves with the signed key pair (also
 * written to certDir). Rejects with CliError naming the signer's reason when it is refused, and
 * when `signal` aborts.
 */
export async function bootstrapServingCert(o: BootstrapOptions): Promise<ServingKeyPair> {
  fs.mkdirSync(o.certDir, { recursive: true, mode: 0o700 });
  const { request, key } = await makeServingRequest(o.node, o.host);
  const cur = await o.client.get<Node>(nodesGVR, undefined, o.node);
  // The request replaces any earlier one and its answer (an old certificate, an old refusal).
  await writeStatus(o.client, nodesGVR, cur, (c) => ({
    ...c.status,
    servingCertificate: { request },
    conditions: (c.status?.conditions ?? []).filter((x) => x.type !== SERVING_CERTIFICATE),
  }));
  o.log.info('posted a serving certificate request', { node: o.node, host: o.host });
  const pollMs = o.pollMs ?? 500;
  let lastLog = Date.now();
  for (;;) {
    if (o.signal.aborted) throw new CliError('error: stopped before the serving certificate was issued');
    const n = await o.client.get<Node>(nodesGVR, undefined, o.node).catch(() => undefined);
    const st = n?.status;
    if (st?.servingCertificate?.request === request) {
      const cert = st.servingCertificate.certificate;
      // The CA is checked by every caller; here, that it is the answer to this request's key.
      if (cert && (await servingCertMatches(cert, request, o.caPem))) {
        writePrivate(path.join(o.certDir, 'agent.key'), key, 0o600);
        writePrivate(path.join(o.certDir, 'agent.crt'), cert, 0o644);
        return { cert, key };
      }
      const denied = st.conditions?.find((c) => c.type === SERVING_CERTIFICATE && c.status === 'False');
      if (denied)
        throw new CliError(
          `error: the signer refused this node's serving certificate: ${denied.message ?? denied.reason}`,
        );
    } else if (st?.servingCertificate?.request) {
      throw new CliError("error: another writer replaced this node's serving certificate request");
    }
    if (Date.now() - lastLog > 30_000) {
      lastLog = Date.now();
      o.log.info('waiting for the signer (fluxctl controller --node-ca-secret) to issue the serving certificate', {
        node: o.node,
      });
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}
