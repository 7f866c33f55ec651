// The state directory's certificate authority: one self-signed CA (`ca.crt`, `ca.key`), the
// serving certificate it signs (`serving.crt`, `serving.key`, SANs 127.0.0.1, ::1, localhost and
// the listen host), and client certificates for users (CN = user, O = groups, as kube reads
// them). Keys are RSA 2048 made by node:crypto; certificates are built and signed with
// node-forge. Private keys are written 0600 (fsync + rename); an existing CA and serving
// certificate are reused, the serving certificate is re-issued when it lacks a SAN the listen
// address needs or is within 30 days of expiry.
import { generateKeyPairSync, randomBytes, X509Certificate } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import forge from 'node-forge';

export interface KeyPair {
  cert: string;
  key: string;
}

const DAY = 24 * 3600 * 1000;

function writeAtomic(file: string, data: string, mode: number): void {
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, 'w', mode);
  try {
    fs.writeSync(fd, data);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.chmodSync(tmp, mode);
  fs.renameSync(tmp, file);
}

function newKey(): { pem: string; forgeKey: forge.pki.rsa.PrivateKey; forgePub: forge.pki.rsa.PublicKey } {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const pem = privateKey.export({ type: 'pkcs1', format: 'pem' }).toString();
  const forgeKey = forge.pki.privateKeyFromPem(pem) as forge.pki.rsa.PrivateKey;
  return { pem, forgeKey, forgePub: forge.pki.setRsaPublicKey(forgeKey.n, forgeKey.e) };
}

function serial(): string {
  const b = randomBytes(16);
  b[0] &= 0x7f; // a positive integer
  return b.toString('hex');
}

interface IssueOptions {
  subject: forge.pki.CertificateField[];
  days: number;
  ca?: { cert: forge.pki.Certificate; key: forge.pki.rsa.PrivateKey };
  extensions: object[];
}

function issue(o: IssueOptions): KeyPair {
  const k = newKey();
  const c = forge.pki.createCertificate();
  c.publicKey = k.forgePub;
  c.serialNumber = serial();
  const now = Date.now();
  c.validity.notBefore = new Date(now - 5 * 60 * 1000); // clock skew between processes
  c.validity.notAfter = new Date(now + o.days * DAY);
  // UTF8String values: Go's x509 (kubectl) refuses '@' and the like in a PrintableString.
  const subject = o.subject.map((f) => ({ ...f, valueTagClass: forge.asn1.Type.UTF8 as any }));
  c.setSubject(subject);
  c.setIssuer(o.ca ? o.ca.cert.subject.attributes : subject);
  c.setExtensions(o.extensions);
  c.sign(o.ca ? o.ca.key : k.forgeKey, forge.md.sha256.create());
  return { cert: forge.pki.certificateToPem(c), key: k.pem };
}

export class StateCA {
  private constructor(
    readonly dir: string,
    readonly certPem: string,
    private readonly keyPem: string,
  ) {}

  /** Path of the CA certificate (what clients trust). */
  get certFile(): string {
    return path.join(this.dir, 'ca.crt');
  }

  /**
   * Loads `<dir>/ca.crt` and `ca.key`, creating both on first use (10 years). Throws Error when
   * one exists without the other or either does not parse (never overwrites a CA it cannot read).
   */
  static ensure(dir: string): StateCA {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const certFile = path.join(dir, 'ca.crt');
    const keyFile = path.join(dir, 'ca.key');
    const haveCert = fs.existsSync(certFile);
    const haveKey = fs.existsSync(keyFile);
    if (haveCert !== haveKey) throw new Error(`${haveCert ? keyFile : certFile} is missing beside ${haveCert ? certFile : keyFile}: remove both to make a new CA`);
    if (!haveCert) {
      const kp = issue({
        subject: [{ name: 'commonName', value: `fluxvm-ca@${Math.floor(Date.now() / 1000)}` }],
        days: 3650,
        extensions: [
          { name: 'basicConstraints', cA: true, critical: true },
          { name: 'keyUsage', keyCertSign: true, cRLSign: true, digitalSignature: true, critical: true },
          { name: 'subjectKeyIdentifier' },
        ],
      });
      writeAtomic(keyFile, kp.key, 0o600);
      writeAtomic(certFile, kp.cert, 0o644);
    }
    const certPem = fs.readFileSync(certFile, 'utf8');
    const keyPem = fs.readFileSync(keyFile, 'utf8');
    new X509Certificate(certPem); // throws on a broken file
    return new StateCA(dir, certPem, keyPem);
  }

  private signer() {
    return { cert: forge.pki.certificateFromPem(this.certPem), key: forge.pki.privateKeyFromPem(this.keyPem) as forge.pki.rsa.PrivateKey };
  }

  /**
   * `<dir>/serving.crt` and `serving.key` for `host` (plus 127.0.0.1, ::1, localhost), reused
   * while they cover the host, are signed by this CA, and are valid for 30 more days.
   */
  servingCert(host: string): KeyPair {
    const certFile = path.join(this.dir, 'serving.crt');
    const keyFile = path.join(this.dir, 'serving.key');
    const ips = new Set(['127.0.0.1', '::1']);
    const dns = new Set(['localhost']);
    if (host && host !== '0.0.0.0' && host !== '::') (net.isIP(host) ? ips : dns).add(host);
    if (fs.existsSync(certFile) && fs.existsSync(keyFile)) {
      const cert = fs.readFileSync(certFile, 'utf8');
      try {
        const x = new X509Certificate(cert);
        const san = x.subjectAltName ?? '';
        const covers = [...ips].every((ip) => san.includes(`IP Address:${ip === '::1' ? '0:0:0:0:0:0:0:1' : ip}`) || san.includes(`IP Address:${ip}`)) && [...dns].every((d) => san.includes(`DNS:${d}`));
        const fresh = Date.parse(x.validTo) - Date.now() > 30 * DAY;
        if (covers && fresh && x.verify(new X509Certificate(this.certPem).publicKey)) return { cert, key: fs.readFileSync(keyFile, 'utf8') };
      } catch {
        // unreadable: issue a new one below
      }
    }
    const kp = issue({
      subject: [{ name: 'commonName', value: 'fluxvm-apiserver' }],
      days: 365,
      ca: this.signer(),
      extensions: [
        { name: 'basicConstraints', cA: false },
        { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
        { name: 'extKeyUsage', serverAuth: true },
        { name: 'subjectAltName', altNames: [...[...dns].map((value) => ({ type: 2, value })), ...[...ips].map((ip) => ({ type: 7, ip }))] },
      ],
    });
    writeAtomic(keyFile, kp.key, 0o600);
    writeAtomic(certFile, kp.cert, 0o644);
    return kp;
  }

  /** A client certificate for `user` in `groups` (CN and O), valid `days` (default 365). Nothing is written. */
  clientCert(user: string, groups: string[], days = 365): KeyPair {
    return issue({
      subject: [{ name: 'commonName', value: user }, ...groups.map((g) => ({ name: 'organizationName', value: g }))],
      days,
      ca: this.signer(),
      extensions: [
        { name: 'basicConstraints', cA: false },
        { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
        { name: 'extKeyUsage', clientAuth: true },
      ],
    });
  }
}
