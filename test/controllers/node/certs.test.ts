// The signer's review of a node agent's serving-certificate request (controllers/node/certs.ts):
// what it signs and every way a request for another node's name or address is refused, each
// refusal naming status.servingCertificate.request; what it signs chains to the CA and carries
// only the names reviewed; the client certificates carry the callers' O; identity checks.
import { expect } from 'chai';
import { webcrypto, X509Certificate } from 'node:crypto';
import {
  issueAgentClient,
  makeClusterCA,
  makeServingRequest,
  reviewServingRequest,
  servingCertMatches,
  signServing,
  type ClusterCA,
} from '../../../controllers/node/certs.js';
import { isAgentClient, nodeIdentityMismatch } from '../../../native/agent/identity.js';

const FIELD = 'status.servingCertificate.request';

/** A request with any subject and SANs (what a forger would post), signed by its own P-256 key. */
async function forged(subject: string, names: Array<{ type: string; value: string }>): Promise<string> {
  await import('reflect-metadata');
  const x509 = await import('@peculiar/x509');
  x509.cryptoProvider.set(webcrypto as unknown as Crypto);
  const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
  const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as CryptoKeyPair;
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name: subject,
    keys,
    signingAlgorithm: alg,
    extensions: names.length ? [new x509.SubjectAlternativeNameExtension(names as never)] : [],
  });
  return csr.toString('pem');
}

describe("controllers/node/certs: the signer reviews a node agent's request", function () {
  this.timeout(30_000);
  let ca: ClusterCA;
  before(async () => {
    ca = await makeClusterCA();
  });

  it("signs the agent's own request: its name and AgentURL address, chained to the CA, serverAuth", async () => {
    const { request, key } = await makeServingRequest('node-a', '10.0.0.5');
    expect(await reviewServingRequest(request, 'node-a', '10.0.0.5')).to.equal(undefined);
    const pem = await signServing(ca, request);
    const c = new X509Certificate(pem);
    expect(c.verify(new X509Certificate(ca.certPem).publicKey)).to.equal(true);
    expect(c.subject).to.equal('CN=system:fluxvm-node:node-a\nO=fluxvm:nodes');
    expect(c.subjectAltName).to.equal('DNS:node-a, IP Address:10.0.0.5');
    expect(c.ca).to.equal(false);
    expect(c.keyUsage).to.deep.equal(['1.3.6.1.5.5.7.3.1']); // serverAuth only
    expect(c.checkPrivateKey((await import('node:crypto')).createPrivateKey(key))).to.equal(true);
    expect(await servingCertMatches(pem, request, ca.certPem)).to.equal(true);
    // A DNS AgentURL host and an IPv6 one, written another way.
    const dns = await makeServingRequest('node-b', 'agent-b.example');
    expect(await reviewServingRequest(dns.request, 'node-b', 'agent-b.example')).to.equal(undefined);
    const v6 = await makeServingRequest('node-c', '::1');
    expect(await reviewServingRequest(v6.request, 'node-c', '0:0:0:0:0:0:0:1')).to.equal(undefined);
  });

  const cases: Array<[string, () => Promise<string>, string, string | undefined, RegExp]> = [
    [
      "another node's name (subject)",
      () => makeServingRequest('node-b', '10.0.0.5').then((r) => r.request),
      'node-a',
      '10.0.0.5',
      /subject .*system:fluxvm-node:node-b/,
    ],
    [
      'an address the Node does not advertise',
      () => makeServingRequest('node-a', '10.0.0.6').then((r) => r.request),
      'node-a',
      '10.0.0.5',
      /IP address "10\.0\.0\.6"/,
    ],
    [
      'an address while the Node advertises none',
      () => makeServingRequest('node-a', '10.0.0.5').then((r) => r.request),
      'node-a',
      undefined,
      /none registered/,
    ],
    [
      "another node's DNS name beside its own",
      () =>
        forged('CN=system:fluxvm-node:node-a, O=fluxvm:nodes', [
          { type: 'dns', value: 'node-a' },
          { type: 'dns', value: 'node-b' },
        ]),
      'node-a',
      '10.0.0.5',
      /DNS name "node-b"/,
    ],
    [
      'no DNS name of its own',
      () => forged('CN=system:fluxvm-node:node-a, O=fluxvm:nodes', [{ type: 'ip', value: '10.0.0.5' }]),
      'node-a',
      '10.0.0.5',
      /"node-a" \(this Node's name\) is missing/,
    ],
    [
      'an email name',
      () =>
        forged('CN=system:fluxvm-node:node-a, O=fluxvm:nodes', [
          { type: 'dns', value: 'node-a' },
          { type: 'email', value: 'a@b.c' },
        ]),
      'node-a',
      '10.0.0.5',
      /email/,
    ],
    [
      "the callers' organization (a client identity)",
      () => forged('CN=system:fluxvm-node:node-a, O=fluxvm:node-agent-clients', [{ type: 'dns', value: 'node-a' }]),
      'node-a',
      '10.0.0.5',
      /subject/,
    ],
    [
      'an extra subject attribute',
      () => forged('CN=system:fluxvm-node:node-a, O=fluxvm:nodes, OU=x', [{ type: 'dns', value: 'node-a' }]),
      'node-a',
      '10.0.0.5',
      /subject/,
    ],
    [
      'not a PKCS#10 request',
      async () => '-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n',
      'node-a',
      '10.0.0.5',
      /not a PEM PKCS#10/,
    ],
    [
      'a request whose signature does not verify (a name swapped in)',
      async () => {
        const r = await makeServingRequest('node-a', '10.0.0.5');
        const der = Buffer.from(r.request.replace(/-----[^-]+-----|\s/g, ''), 'base64');
        const i = der.indexOf(Buffer.from('10.0.0.5'.split('.').map(Number)));
        if (i >= 0) der[i + 3] ^= 1; // 10.0.0.4 in the signed bytes
        return `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
      },
      'node-a',
      '10.0.0.4',
      /signed|signature/,
    ],
  ];
  for (const [what, make, node, host, msg] of cases)
    it(`refuses ${what}, naming the field`, async () => {
      const d = await reviewServingRequest(await make(), node, host);
      expect(d, 'refused').to.not.equal(undefined);
      expect(d!.field).to.equal(FIELD);
      expect(d!.message.startsWith(`${FIELD}: `), d!.message).to.equal(true);
      expect(d!.message).to.match(msg);
    });

  it('refuses an RSA key (only ECDSA P-256 is signed)', async () => {
    await import('reflect-metadata');
    const x509 = await import('@peculiar/x509');
    x509.cryptoProvider.set(webcrypto as unknown as Crypto);
    const alg = {
      name: 'RSASSA-PKCS1-v1_5',
      hash: 'SHA-256',
      publicExponent: new Uint8Array([1, 0, 1]),
      modulusLength: 2048,
    };
    const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as CryptoKeyPair;
    const csr = await x509.Pkcs10CertificateRequestGenerator.create({
      name: 'CN=system:fluxvm-node:node-a, O=fluxvm:nodes',
      keys,
      signingAlgorithm: alg,
      extensions: [new x509.SubjectAlternativeNameExtension([{ type: 'dns', value: 'node-a' }])],
    });
    const d = await reviewServingRequest(csr.toString('pem'), 'node-a', '10.0.0.5');
    expect(d?.message).to.match(/RSASSA-PKCS1-v1_5.*only ECDSA P-256/);
  });

  it('a certificate for another request or of another CA does not answer this request', async () => {
    const a = await makeServingRequest('node-a', '10.0.0.5');
    const b = await makeServingRequest('node-a', '10.0.0.5');
    const pem = await signServing(ca, a.request);
    expect(await servingCertMatches(pem, b.request, ca.certPem)).to.equal(false);
    expect(await servingCertMatches(pem, a.request, (await makeClusterCA()).certPem)).to.equal(false);
  });

  it("client certificates carry the callers' O; identity checks of the node and the caller", async () => {
    const c = await issueAgentClient(ca, 'fluxvm-controller:x');
    const x = new X509Certificate(c.cert);
    expect(x.subject).to.equal('CN=fluxvm-controller:x\nO=fluxvm:node-agent-clients');
    expect(x.keyUsage).to.deep.equal(['1.3.6.1.5.5.7.3.2']); // clientAuth only
    expect(isAgentClient({ subject: { O: 'fluxvm:node-agent-clients' } as never })).to.equal(true);
    expect(isAgentClient({ subject: { O: 'fluxvm:nodes' } as never })).to.equal(false);
    expect(isAgentClient(undefined)).to.equal(false);
    const peer = (cn: string, san?: string) => ({ subject: { CN: cn } as never, subjectaltname: san });
    expect(nodeIdentityMismatch(peer('system:fluxvm-node:node-a'), 'node-a')).to.equal(undefined);
    expect(nodeIdentityMismatch(peer('x', 'DNS:node-a, IP Address:1.2.3.4'), 'node-a')).to.equal(undefined);
    expect(nodeIdentityMismatch(peer('system:fluxvm-node:node-b', 'DNS:node-b'), 'node-a')).to.match(
      /not node "node-a"'s/,
    );
    // A prefix is not a match.
    expect(nodeIdentityMismatch(peer('x', 'DNS:node-ab'), 'node-a')).to.match(/not node/);
  });
});
