// The certificates of the node-agent link (docs/scale-out.md, "Agent TLS"): the cluster CA of the
// node agents (made by the signer on first start, or supplied by the operator), each agent's
// serving certificate (the kubelet-serving pattern: the agent makes its key and a PKCS#10 request
// for its node name and advertised address; the signer checks the request against the Node and
// signs it), and the client certificates of the agents' callers (controller, API server) that an
// agent checks (mTLS). ECDSA P-256 keys made with WebCrypto; X.509 and PKCS#10 by @peculiar/x509
// (loaded on first use). The pure checks (reviewServingRequest, nodeIdentityMismatch,
// isAgentClient) are what the signer, the agents' clients and the agents enforce.
import type * as X509 from '@peculiar/x509';
import { createPrivateKey, webcrypto, X509Certificate as NodeX509 } from 'node:crypto';
import net from 'node:net';
import { AGENT_CLIENT_ORG, NODE_ORG, nodeCommonName } from '../../native/agent/identity.js';
import { loadX509 } from '../../native/egress/ca.js';

const crypto = webcrypto as unknown as Crypto;

export { AGENT_CLIENT_ORG, NODE_ORG, nodeCommonName };
/** The field a request lives in, named by every refusal. */
export const REQUEST_FIELD = 'status.servingCertificate.request';

const EC = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const DAY = 24 * 3600_000;

export interface ClusterCA {
  certPem: string;
  keyPem: string;
}

export interface KeyPairPem {
  cert: string;
  key: string;
}

function pemOf(label: string, der: ArrayBuffer): string {
  const b64 = Buffer.from(der)
    .toString('base64')
    .replace(/.{1,64}/g, '$&\n');
  return `-----BEGIN ${label}-----\n${b64}-----END ${label}-----\n`;
}

function serial(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[0] = (b[0]! & 0x7f) | 0x01; // a positive INTEGER with no leading zero byte
  return Buffer.from(b).toString('hex');
}

/** Throws Error when the CA's certificate and key do not parse, do not pair or the certificate is no CA. */
export function checkClusterCA(ca: ClusterCA): void {
  const cert = new NodeX509(ca.certPem);
  const key = createPrivateKey(ca.keyPem);
  if (!cert.ca) throw new Error('the cluster CA certificate is not a CA (basicConstraints cA false)');
  if (!cert.checkPrivateKey(key)) throw new Error('the cluster CA key is not the key of its certificate');
}

/** The CA key as a WebCrypto signing key and its algorithm (ECDSA P-256 or RSA). */
async function caSigner(ca: ClusterCA): Promise<{ key: CryptoKey; alg: Algorithm | EcdsaParams }> {
  const k = createPrivateKey(ca.keyPem);
  const der = k.export({ type: 'pkcs8', format: 'der' });
  if (k.asymmetricKeyType === 'ec' && k.asymmetricKeyDetails?.namedCurve === 'prime256v1')
    return { key: await crypto.subtle.importKey('pkcs8', der, EC, false, ['sign']), alg: EC };
  if (k.asymmetricKeyType === 'rsa') {
    const alg = { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' };
    return { key: await crypto.subtle.importKey('pkcs8', der, alg, false, ['sign']), alg };
  }
  throw new Error(`the cluster CA key is ${k.asymmetricKeyType}: only ECDSA P-256 and RSA are supported`);
}

/** A new self-signed cluster CA (ECDSA P-256, `days` long, default 10 years). */
export async function makeClusterCA(days = 3650): Promise<ClusterCA> {
  const x509 = await loadX509();
  const keys = (await crypto.subtle.generateKey(EC, true, ['sign', 'verify'])) as CryptoKeyPair;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: [{ CN: [`fluxvm-node-ca@${Math.floor(now / 1000)}`] }],
    notBefore: new Date(now - 5 * 60_000),
    notAfter: new Date(now + days * DAY),
    signingAlgorithm: EC,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return {
    certPem: cert.toString('pem') + '\n',
    keyPem: pemOf('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', keys.privateKey)),
  };
}

/** The SANs of `host`: an IP address or a DNS name. */
function hostName(host: string): X509.JsonGeneralName {
  const h = host.replace(/^\[|\]$/g, '');
  return net.isIP(h) ? { type: 'ip', value: h } : { type: 'dns', value: h.toLowerCase() };
}

/**
 * A new key (PKCS#8 PEM) and a PEM PKCS#10 request for node `node` reached at `host` (the
 * AgentURL's host): CN system:fluxvm-node:<node>, O fluxvm:nodes, SANs DNS <node> and the host.
 */
export async function makeServingRequest(node: string, host: string): Promise<{ request: string; key: string }> {
  const x509 = await loadX509();
  const keys = (await crypto.subtle.generateKey(EC, true, ['sign', 'verify'])) as CryptoKeyPair;
  const names: X509.JsonGeneralName[] = [{ type: 'dns', value: node }];
  const h = hostName(host);
  if (h.value !== node) names.push(h);
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name: [{ CN: [nodeCommonName(node)] }, { O: [NODE_ORG] }],
    keys,
    signingAlgorithm: EC,
    extensions: [new x509.SubjectAlternativeNameExtension(names)],
  });
  return {
    request: csr.toString('pem') + '\n',
    key: pemOf('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', keys.privateKey)),
  };
}

/** The request's SANs (by OID: the class of a dynamic import may not be the one the parser used). */
function sanOf(x509: typeof X509, csr: X509.Pkcs10CertificateRequest): X509.JsonGeneralName[] {
  const e = csr.extensions.find((x) => x.type === '2.5.29.17');
  return e ? new x509.SubjectAlternativeNameExtension(e.rawData).names.toJSON() : [];
}

export interface Denial {
  field: string;
  message: string;
}

/** IPv6 written one way (so ::1 and 0:0:...:1 compare equal). */
function normalIP(ip: string): string {
  if (net.isIPv4(ip)) return ip;
  const sock = new net.SocketAddress({ address: ip, family: 'ipv6' });
  return sock.address;
}

/**
 * Whether the signer may sign `request` for Node `node` whose AgentURL host is `agentHost`: the
 * signature verifies; the subject is exactly CN system:fluxvm-node:<node>, O fluxvm:nodes; the key
 * is ECDSA P-256; the SANs are DNS <node> and at most the AgentURL host (an IP or a DNS name),
 * nothing else. Returns the denial naming the field, or undefined. Never throws.
 */
export async function reviewServingRequest(
  request: string,
  node: string,
  agentHost: string | undefined,
): Promise<Denial | undefined> {
  const deny = (message: string): Denial => ({ field: REQUEST_FIELD, message: `${REQUEST_FIELD}: ${message}` });
  const x509 = await loadX509();
  let csr: X509.Pkcs10CertificateRequest;
  try {
    csr = new x509.Pkcs10CertificateRequest(request);
  } catch (e) {
    return deny(`not a PEM PKCS#10 certificate request (${(e as Error).message})`);
  }
  try {
    if (!(await csr.verify())) return deny('the request is not signed by its own key');
  } catch (e) {
    return deny(`the request's signature cannot be checked (${(e as Error).message})`);
  }
  const alg = csr.publicKey.algorithm as EcKeyAlgorithm;
  if (alg.name !== 'ECDSA' || alg.namedCurve !== 'P-256')
    return deny(`the key is ${alg.name} ${alg.namedCurve ?? ''}; only ECDSA P-256 is signed`);
  const want = `CN=${nodeCommonName(node)}, O=${NODE_ORG}`;
  if (csr.subject !== want) return deny(`subject "${csr.subject}" is not "${want}" (this Node's name)`);
  const names = sanOf(x509, csr);
  const host = agentHost ? hostName(agentHost) : undefined;
  let hasNode = false;
  for (const n of names) {
    if (n.type === 'dns' && n.value === node) hasNode = true;
    else if (n.type === 'dns') {
      if (host?.type !== 'dns' || host.value !== n.value.toLowerCase())
        return deny(`DNS name "${n.value}" is neither this Node's name "${node}" nor its AgentURL host`);
    } else if (n.type === 'ip') {
      if (host?.type !== 'ip' || normalIP(host.value) !== normalIP(n.value))
        return deny(
          `IP address "${n.value}" is not this Node's AgentURL address${host ? ` "${host.value}"` : ' (none registered)'}`,
        );
    } else return deny(`a ${n.type} name ("${n.value}") is not signed: only DNS names and IP addresses`);
  }
  if (!hasNode) return deny(`the DNS name "${node}" (this Node's name) is missing`);
  return undefined;
}

/** Signs a request reviewServingRequest admitted: a serving certificate (serverAuth), `days` long (default 365). */
export async function signServing(ca: ClusterCA, request: string, days = 365): Promise<string> {
  const x509 = await loadX509();
  const csr = new x509.Pkcs10CertificateRequest(request);
  const caCert = new x509.X509Certificate(ca.certPem);
  const { key, alg } = await caSigner(ca);
  const now = Date.now();
  const names = sanOf(x509, csr);
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: csr.subjectName,
    issuer: caCert.subjectName,
    notBefore: new Date(now - 5 * 60_000),
    notAfter: new Date(Math.min(now + days * DAY, caCert.notAfter.getTime())),
    signingAlgorithm: alg,
    publicKey: csr.publicKey,
    signingKey: key,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(names),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
    ],
  });
  return cert.toString('pem') + '\n';
}

/** A client certificate (clientAuth, O fluxvm:node-agent-clients, CN `cn`) and its new key, `days` (365) long. */
export async function issueAgentClient(ca: ClusterCA, cn: string, days = 365): Promise<KeyPairPem> {
  const x509 = await loadX509();
  const caCert = new x509.X509Certificate(ca.certPem);
  const { key, alg } = await caSigner(ca);
  const keys = (await crypto.subtle.generateKey(EC, true, ['sign', 'verify'])) as CryptoKeyPair;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: [{ CN: [cn] }, { O: [AGENT_CLIENT_ORG] }],
    issuer: caCert.subjectName,
    notBefore: new Date(now - 5 * 60_000),
    notAfter: new Date(Math.min(now + days * DAY, caCert.notAfter.getTime())),
    signingAlgorithm: alg,
    publicKey: keys.publicKey,
    signingKey: key,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth]),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
    ],
  });
  return {
    cert: cert.toString('pem') + '\n',
    key: pemOf('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', keys.privateKey)),
  };
}

/** Whether `certPem` is signed by `caPem`, names `node` and `host`, and is valid `minMs` more (an agent reusing it). */
export function servingCertUsable(certPem: string, caPem: string, node: string, host: string, minMs: number): boolean {
  try {
    const c = new NodeX509(certPem);
    const ca = new NodeX509(caPem);
    if (!c.verify(ca.publicKey) || Date.parse(c.validTo) - Date.now() < minMs) return false;
    const h = host.replace(/^\[|\]$/g, '');
    const hostOk = net.isIP(h) ? c.checkIP(h) !== undefined : c.checkHost(h) !== undefined;
    return hostOk && c.checkHost(node) !== undefined;
  } catch {
    return false;
  }
}

/** Whether `certPem` certifies the key of `request` (answered already) and, given `caPem`, is signed by it. */
export async function servingCertMatches(certPem: string, request: string, caPem?: string): Promise<boolean> {
  try {
    const x509 = await loadX509();
    const c = new NodeX509(certPem);
    if (caPem && !c.verify(new NodeX509(caPem).publicKey)) return false;
    const csr = new x509.Pkcs10CertificateRequest(request);
    const spki = c.publicKey.export({ type: 'spki', format: 'der' });
    return Buffer.from(csr.publicKey.rawData).equals(spki);
  } catch {
    return false;
  }
}
