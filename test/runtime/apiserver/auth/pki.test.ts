// The state CA (runtime/apiserver/auth/pki.ts) on real files: new keys are ECDSA P-256, the
// certificates chain to the CA for node:tls and for kubectl (Go's x509), and a state dir whose
// CA was made before (RSA 2048 with a PKCS#1 key, as the node-forge code wrote it) keeps
// loading, signing and serving.
import { execFile, execFileSync, spawnSync } from 'node:child_process';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { promisify } from 'node:util';
import { expect } from 'chai';
import { StateCA, type KeyPair } from '../../../../runtime/apiserver/auth/pki.js';
import { kubeconfigFor, writeKubeconfig } from '../../../../cmd/fluxctl/kubeconfig.js';
import { skipWith } from '../../../skip.js';

const hasTool = (cmd: string, ...args: string[]) => spawnSync(cmd, args, { stdio: 'ignore' }).status === 0;

/**
 * An HTTPS server with `serving` that asks for a client certificate of `caPem` and answers
 * GET /healthz with the client certificate's subject CN (or "anonymous"). Closed by the caller.
 */
async function tlsServer(serving: KeyPair, caPem: string): Promise<{ url: string; close: () => Promise<void> }> {
  const server = https.createServer(
    { cert: serving.cert, key: serving.key, ca: caPem, requestCert: true, rejectUnauthorized: false },
    (req, res) => {
      const sock = req.socket as TLSSocket;
      const peer = sock.getPeerCertificate();
      res.end(sock.authorized && peer?.subject ? `ok ${peer.subject.CN}` : 'ok anonymous');
    },
  );
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

/** GET url/healthz with node's https, trusting only caPem, presenting `client` when given. */
function nodeGet(url: string, caPem: string, client?: KeyPair): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = https.get(
      `${url}/healthz`,
      { ca: caPem, ...(client ? { cert: client.cert, key: client.key } : {}), agent: false },
      (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve(body));
      },
    );
    req.on('error', reject);
  });
}

/**
 * kubectl get --raw /healthz with a kubeconfig of the CA and the client certificate (async: the server is in this
 * process).
 */
async function kubectlGet(dir: string, url: string, caPem: string, client: KeyPair): Promise<string> {
  const kc = path.join(dir, `kubeconfig-${Math.random().toString(36).slice(2)}`);
  writeKubeconfig(kc, kubeconfigFor(url, { caPem, clientCert: client.cert, clientKey: client.key }, { user: 'u' }));
  return (
    await promisify(execFile)(
      'kubectl',
      ['--kubeconfig', kc, '--cache-dir', path.join(dir, 'kcache'), 'get', '--raw', '/healthz'],
      { encoding: 'utf8' },
    )
  ).stdout;
}

describe('auth: the state CA (pki.ts)', function () {
  this.timeout(60_000);
  let dir: string;
  beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-pki-'))));
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('mints ECDSA P-256 keys (PKCS#8, 0600) for the CA, the serving and the client certificates, chained to the CA', async () => {
    const ca = await StateCA.ensure(dir);
    const serving = await ca.servingCert('fluxvm.example');
    const client = await ca.clientCert('alice@example.com', ['team-a', 'devs']);
    const caX = new X509Certificate(ca.certPem);
    expect(caX.ca).to.equal(true);
    for (const [name, kp] of [
      ['ca', { cert: ca.certPem, key: fs.readFileSync(path.join(dir, 'ca.key'), 'utf8') }],
      ['serving', serving],
      ['client', client],
    ] as const) {
      const x = new X509Certificate(kp.cert);
      expect(x.publicKey.asymmetricKeyType, name).to.equal('ec');
      expect(x.publicKey.asymmetricKeyDetails?.namedCurve, name).to.equal('prime256v1');
      expect(kp.key, name).to.match(/^-----BEGIN PRIVATE KEY-----\n/);
      expect(x.checkPrivateKey(createPrivateKey(kp.key)), name).to.equal(true);
      expect(x.checkIssued(caX) && x.verify(caX.publicKey), name).to.equal(true);
    }
    expect(new X509Certificate(serving.cert).subjectAltName).to.equal(
      'DNS:localhost, DNS:fluxvm.example, IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1',
    );
    expect(new X509Certificate(client.cert).subject).to.equal('CN=alice@example.com\nO=team-a\nO=devs');
    for (const f of ['ca.key', 'serving.key']) expect(fs.statSync(path.join(dir, f)).mode & 0o777, f).to.equal(0o600);
    expect(fs.readdirSync(dir).filter((f) => f.includes('.tmp-'))).to.deep.equal([]);
    // A TLS client trusting only the CA reaches the server and is known by its certificate.
    const srv = await tlsServer(serving, ca.certPem);
    try {
      expect(await nodeGet(srv.url, ca.certPem, client)).to.equal('ok alice@example.com');
      // kubectl (Go's x509) accepts the ECDSA chain both ways, where it is installed.
      if (hasTool('kubectl', 'version', '--client'))
        expect(await kubectlGet(dir, srv.url, ca.certPem, client)).to.equal('ok alice@example.com');
      else console.log('      (kubectl not installed: its half of this check did not run)');
    } finally {
      await srv.close();
    }
  });

  it("a key that is not the CA certificate's, or one file of the two, is refused and nothing is overwritten", async () => {
    await StateCA.ensure(path.join(dir, 'a'));
    await StateCA.ensure(path.join(dir, 'b'));
    fs.copyFileSync(path.join(dir, 'b', 'ca.key'), path.join(dir, 'a', 'ca.key'));
    const before = fs.readFileSync(path.join(dir, 'a', 'ca.crt'), 'utf8');
    await StateCA.ensure(path.join(dir, 'a')).then(
      () => expect.fail('a foreign key was taken'),
      (e) => expect(String(e)).to.contain('is not the key of'),
    );
    fs.rmSync(path.join(dir, 'b', 'ca.key'));
    await StateCA.ensure(path.join(dir, 'b')).then(
      () => expect.fail('a CA without its key was taken'),
      (e) => expect(String(e)).to.match(/ca\.key is missing beside .*ca\.crt/),
    );
    expect(fs.readFileSync(path.join(dir, 'a', 'ca.crt'), 'utf8')).to.equal(before);
    expect(fs.existsSync(path.join(dir, 'b', 'ca.key'))).to.equal(false);
  });

  it('an RSA CA of an older state dir keeps working: reused, signs new ECDSA certificates with RSA, its RSA serving certificate is kept', async function () {
    skipWith(
      this,
      hasTool('openssl', 'version') ? undefined : 'no openssl to make an RSA CA the way the earlier code did',
    );
    // What the node-forge code wrote: RSA 2048, PKCS#1 PEM keys, UTF8String CN, a serving
    // certificate for localhost, 127.0.0.1 and ::1.
    const ssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
    ssl('genrsa', '-traditional', '-out', 'ca.key', '2048');
    ssl(
      'req',
      '-x509',
      '-new',
      '-key',
      'ca.key',
      '-out',
      'ca.crt',
      '-days',
      '3650',
      '-utf8',
      '-subj',
      '/CN=fluxvm-ca@1700000000',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign,digitalSignature',
    );
    ssl('genrsa', '-traditional', '-out', 'serving.key', '2048');
    ssl('req', '-new', '-key', 'serving.key', '-out', 'serving.csr', '-utf8', '-subj', '/CN=fluxvm-apiserver');
    fs.writeFileSync(
      path.join(dir, 'ext.cnf'),
      'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n',
    );
    ssl(
      'x509',
      '-req',
      '-in',
      'serving.csr',
      '-CA',
      'ca.crt',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      'serving.crt',
      '-days',
      '365',
      '-extfile',
      'ext.cnf',
    );
    expect(fs.readFileSync(path.join(dir, 'ca.key'), 'utf8')).to.match(/^-----BEGIN RSA PRIVATE KEY-----/);
    const oldCa = fs.readFileSync(path.join(dir, 'ca.crt'), 'utf8');
    const oldServing = fs.readFileSync(path.join(dir, 'serving.crt'), 'utf8');

    const ca = await StateCA.ensure(dir);
    expect(ca.certPem).to.equal(oldCa);
    expect((await ca.servingCert('127.0.0.1')).cert).to.equal(oldServing); // still covers 127.0.0.1: kept
    const caX = new X509Certificate(oldCa);
    const serving = await ca.servingCert('fluxvm.example'); // a new SAN: re-issued by the RSA CA
    const client = await ca.clientCert('bob', ['team-b']);
    for (const [name, kp] of [
      ['serving', serving],
      ['client', client],
    ] as const) {
      const x = new X509Certificate(kp.cert);
      expect(x.publicKey.asymmetricKeyType, name).to.equal('ec');
      // Chained by the issuer's bytes (Go finds parents so) and the RSA signature.
      expect(x.checkIssued(caX) && x.verify(caX.publicKey), name).to.equal(true);
    }
    fs.writeFileSync(path.join(dir, 'client.crt'), client.cert);
    expect(
      execFileSync('openssl', ['verify', '-CAfile', 'ca.crt', 'serving.crt', 'client.crt'], {
        cwd: dir,
        encoding: 'utf8',
      }),
    ).to.equal('serving.crt: OK\nclient.crt: OK\n');
    expect(
      execFileSync('openssl', ['x509', '-noout', '-text', '-in', 'serving.crt'], { cwd: dir, encoding: 'utf8' }),
    ).to.contain('Signature Algorithm: sha256WithRSAEncryption');
    expect(fs.statSync(path.join(dir, 'serving.key')).mode & 0o777).to.equal(0o600);
    const srv = await tlsServer(serving, ca.certPem);
    try {
      expect(await nodeGet(srv.url, ca.certPem, client)).to.equal('ok bob');
      if (hasTool('kubectl', 'version', '--client'))
        expect(await kubectlGet(dir, srv.url, ca.certPem, client)).to.equal('ok bob');
      else console.log('      (kubectl not installed: its half of this check did not run)');
    } finally {
      await srv.close();
    }
  });
});
