// The state directory's certificate authority: one self-signed CA (`ca.crt`, `ca.key`), the
// serving certificate it signs (`serving.crt`, `serving.key`, SANs 127.0.0.1, ::1, localhost and
// the listen host), and client certificates for users (CN = user, O = groups, as kube reads
// them). New keys are ECDSA P-256 (WebCrypto; a P-256 key takes well under a millisecond where
// RSA 2048 took 0.1-1 s), certificates are built and signed with @peculiar/x509, loaded only
// when something is issued (a restart with valid certificates needs neither). A CA made before
// (RSA 2048, PKCS#1 PEM) keeps loading and signing: the new certificates carry its subject as
// their issuer byte for byte and an RSA signature. Private keys are PKCS#8 PEM written 0600
// (fsync + rename); an existing CA and serving certificate are reused, the serving certificate
// is re-issued when it lacks a SAN the listen address needs or is within 30 days of expiry.
import { createPrivateKey, randomBytes, webcrypto, X509Certificate } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type * as X509 from '@peculiar/x509';

export interface KeyPair {
  cert: string;
  key: string;
}

const DAY = 24 * 3600 * 1000;
const subtle = webcrypto.subtle as unknown as SubtleCrypto;
const EC = { name: 'ECDSA', namedCurve: 'P-256' } as const;

let x509Module: Promise<typeof X509> | undefined;
/** @peculiar/x509, loaded on first issue (its dependency injection needs reflect-metadata first). */
function x509(): Promise<typeof X509> {
  return (x509Module ??= import('reflect-metadata').then(() => import('@peculiar/x509')));
}

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
  // The rename itself is durable once the directory is synced.
  const dfd = fs.openSync(path.dirname(file), 'r');
  try {
    fs.fsyncSync(dfd);
  } finally {
    fs.closeSync(dfd);
  }
}

function pem(label: string, der: ArrayBuffer): string {
  return `-----BEGIN ${label}-----\n${Buffer.from(der).toString('base64').replace(/.{1,64}/g, '$&\n')}-----END ${label}-----\n`;
}

function serial(): string {
  const b = randomBytes(16);
  b[0] &= 0x7f; // a positive integer
  b[0] |= 0x01; // and no leading zero byte to strip
  return b.toString('hex');
}

/** The signing key of a CA key PEM (PKCS#1 RSA of older state dirs, PKCS#8 EC or RSA, SEC1 EC). */
async function signingKey(keyPem: string): Promise<CryptoKey> {
  const k = createPrivateKey(keyPem);
  const der = k.export({ type: 'pkcs8', format: 'der' });
  if (k.asymmetricKeyType === 'rsa') return subtle.importKey('pkcs8', der, { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' }, false, ['sign']);
  if (k.asymmetricKeyType === 'ec' && k.asymmetricKeyDetails?.namedCurve === 'prime256v1') return subtle.importKey('pkcs8', der, EC, false, ['sign']);
  throw new Error(`the CA key is ${k.asymmetricKeyType} ${k.asymmetricKeyDetails?.namedCurve ?? ''}: only RSA and ECDSA P-256 CA keys are supported`);
}

/** One RDN per attribute, UTF8String values: Go's x509 (kubectl) refuses '@' and the like in a PrintableString. */
type Rdn = { type: 'CN' | 'O'; value: string };

interface IssueOptions {
  subject: Rdn[];
  days: number;
  /** The issuing CA; absent: self-signed. */
  ca?: { certPem: string; keyPem: string };
  extensions: (x: typeof X509, publicKey: CryptoKey) => Promise<X509.Extension[]>;
}

async function issue(o: IssueOptions): Promise<KeyPair> {
  const x = await x509();
  const keys = (await subtle.generateKey(EC, true, ['sign', 'verify'])) as CryptoKeyPair;
  const subject = new x.Name(o.subject.map((r) => ({ [r.type]: [{ utf8String: r.value }] })) as unknown as X509.JsonName);
  const caCert = o.ca ? new x.X509Certificate(o.ca.certPem) : undefined;
  const extensions = await o.extensions(x, keys.publicKey);
  if (caCert) extensions.push(await x.AuthorityKeyIdentifierExtension.create(caCert, false, webcrypto as unknown as Crypto));
  const now = Date.now();
  const cert = await x.X509CertificateGenerator.create(
    {
      serialNumber: serial(),
      subject,
      // The CA's subject as it is encoded (a chain is found by comparing these bytes).
      issuer: caCert ? new x.Name(caCert.subjectName.toArrayBuffer()) : subject,
      notBefore: new Date(now - 5 * 60 * 1000), // clock skew between processes
      notAfter: new Date(now + o.days * DAY),
      publicKey: keys.publicKey,
      signingKey: o.ca ? await signingKey(o.ca.keyPem) : keys.privateKey, // SHA-256: the library's default hash
      extensions,
    },
    webcrypto as unknown as Crypto,
  );
  return { cert: cert.toString('pem') + '\n', key: pem('PRIVATE KEY', await subtle.exportKey('pkcs8', keys.privateKey)) };
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
  static async ensure(dir: string): Promise<StateCA> {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const certFile = path.join(dir, 'ca.crt');
    const keyFile = path.join(dir, 'ca.key');
    const haveCert = fs.existsSync(certFile);
    const haveKey = fs.existsSync(keyFile);
    if (haveCert !== haveKey) throw new Error(`${haveCert ? keyFile : certFile} is missing beside ${haveCert ? certFile : keyFile}: remove both to make a new CA`);
    if (!haveCert) {
      const kp = await issue({
        subject: [{ type: 'CN', value: `fluxvm-ca@${Math.floor(Date.now() / 1000)}` }],
        days: 3650,
        extensions: async (x, publicKey) => [
          new x.BasicConstraintsExtension(true, undefined, true),
          new x.KeyUsagesExtension(x.KeyUsageFlags.keyCertSign | x.KeyUsageFlags.cRLSign | x.KeyUsageFlags.digitalSignature, true),
          await x.SubjectKeyIdentifierExtension.create(publicKey, false, webcrypto as unknown as Crypto),
        ],
      });
      writeAtomic(keyFile, kp.key, 0o600);
      writeAtomic(certFile, kp.cert, 0o644);
    }
    const certPem = fs.readFileSync(certFile, 'utf8');
    const keyPem = fs.readFileSync(keyFile, 'utf8');
    const cert = new X509Certificate(certPem); // throws on a broken file
    const key = createPrivateKey(keyPem); // and on a broken key
    if (!cert.checkPrivateKey(key)) throw new Error(`${keyFile} is not the key of ${certFile}`);
    return new StateCA(dir, certPem, keyPem);
  }

  /**
   * `<dir>/serving.crt` and `serving.key` for `host` (plus 127.0.0.1, ::1, localhost), reused
   * while they cover the host, are signed by this CA, and are valid for 30 more days.
   */
  async servingCert(host: string): Promise<KeyPair> {
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
    const kp = await issue({
      subject: [{ type: 'CN', value: 'fluxvm-apiserver' }],
      days: 365,
      ca: { certPem: this.certPem, keyPem: this.keyPem },
      extensions: async (x) => [
        new x.BasicConstraintsExtension(false),
        new x.KeyUsagesExtension(x.KeyUsageFlags.digitalSignature, true),
        new x.ExtendedKeyUsageExtension([x.ExtendedKeyUsage.serverAuth]),
        new x.SubjectAlternativeNameExtension([...[...dns].map((value) => ({ type: 'dns' as const, value })), ...[...ips].map((value) => ({ type: 'ip' as const, value }))]),
      ],
    });
    writeAtomic(keyFile, kp.key, 0o600);
    writeAtomic(certFile, kp.cert, 0o644);
    return kp;
  }

  /** A client certificate for `user` in `groups` (CN and O), valid `days` (default 365). Nothing is written. */
  clientCert(user: string, groups: string[], days = 365): Promise<KeyPair> {
    return issue({
      subject: [{ type: 'CN', value: user }, ...groups.map((value) => ({ type: 'O' as const, value }))],
      days,
      ca: { certPem: this.certPem, keyPem: this.keyPem },
      extensions: async (x) => [
        new x.BasicConstraintsExtension(false),
        new x.KeyUsagesExtension(x.KeyUsageFlags.digitalSignature, true),
        new x.ExtendedKeyUsageExtension([x.ExtendedKeyUsage.clientAuth]),
      ],
    });
  }
}
