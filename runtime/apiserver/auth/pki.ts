// The state directory's certificate authority: one self-signed CA (`ca.crt`, `ca.key`), the
// serving certificate it signs (`serving.crt`, `serving.key`, SANs 127.0.0.1, ::1, localhost and
// the listen host), and client certificates for users (CN = user, O = groups, as kube reads
// them). New keys are ECDSA P-256 from node:crypto (well under a millisecond, where RSA 2048
// took 0.1-1 s); certificates are X.509 structures of @peculiar/asn1-x509 (loaded only when
// something is issued: a restart with valid certificates needs none of it) signed with
// node:crypto. A CA made before (RSA 2048, PKCS#1 PEM) keeps loading and signing: new
// certificates carry its subject as their issuer, signed sha256WithRSAEncryption. Private keys
// are PKCS#8 PEM written 0600 (fsync + rename); an existing CA and serving certificate are
// reused, the serving certificate is re-issued when it lacks a SAN the listen address needs or
// is within 30 days of expiry.
import {
  createHash,
  createPrivateKey,
  generateKeyPairSync,
  randomBytes,
  sign,
  X509Certificate,
  type KeyObject,
} from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import type * as Asn1Schema from '@peculiar/asn1-schema';
import type * as Asn1X509 from '@peculiar/asn1-x509';

export interface KeyPair {
  cert: string;
  key: string;
}

const DAY = 24 * 3600 * 1000;
const OID = {
  commonName: '2.5.4.3',
  organizationName: '2.5.4.10',
  ecdsaWithSha256: '1.2.840.10045.4.3.2',
  sha256WithRsa: '1.2.840.113549.1.1.11',
};

let asn1Modules: { s: typeof Asn1Schema; x: typeof Asn1X509 } | undefined;
/** The ASN.1 schema and X.509 structures, loaded on first issue. */
function asn1(): { s: typeof Asn1Schema; x: typeof Asn1X509 } {
  const req = createRequire(import.meta.url);
  return (asn1Modules ??= {
    s: req('@peculiar/asn1-schema') as typeof Asn1Schema,
    x: req('@peculiar/asn1-x509') as typeof Asn1X509,
  });
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

function serial(): Buffer {
  const b = randomBytes(16);
  b[0] &= 0x7f; // a positive integer
  b[0] |= 0x01; // with no leading zero byte (DER's minimal form)
  return b;
}

/** One RDN per attribute, UTF8String values: Go's x509 (kubectl) refuses '@' and the like in a PrintableString. */
type Rdn = { type: 'commonName' | 'organizationName'; value: string };

type Ext = { id: string; critical?: boolean; value: object };

interface IssueOptions {
  subject: Rdn[];
  days: number;
  /** The issuing CA; absent: self-signed. */
  ca?: { certPem: string; keyPem: string };
  extensions: (x: typeof Asn1X509, spki: Asn1X509.SubjectPublicKeyInfo) => Ext[];
}

function issue(o: IssueOptions): KeyPair {
  const { s, x } = asn1();
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const spki = s.AsnConvert.parse(publicKey.export({ type: 'spki', format: 'der' }), x.SubjectPublicKeyInfo);
  const subject = new x.Name(
    o.subject.map(
      (r) =>
        new x.RelativeDistinguishedName([
          new x.AttributeTypeAndValue({ type: OID[r.type], value: new x.AttributeValue({ utf8String: r.value }) }),
        ]),
    ),
  );
  let issuer = subject;
  let signer: KeyObject = privateKey;
  if (o.ca) {
    // The CA's subject as it is encoded (Go chains by comparing these bytes).
    issuer = s.AsnConvert.parse(new X509Certificate(o.ca.certPem).raw, x.Certificate).tbsCertificate.subject;
    signer = createPrivateKey(o.ca.keyPem);
    if (
      signer.asymmetricKeyType !== 'rsa' &&
      !(signer.asymmetricKeyType === 'ec' && signer.asymmetricKeyDetails?.namedCurve === 'prime256v1')
    ) {
      throw new Error(
        `the CA key is ${signer.asymmetricKeyType} ${signer.asymmetricKeyDetails?.namedCurve ?? ''}: only RSA and ECDSA P-256 CA keys are supported`,
      );
    }
  }
  const rsa = signer.asymmetricKeyType === 'rsa';
  const algorithm = rsa
    ? new x.AlgorithmIdentifier({ algorithm: OID.sha256WithRsa, parameters: null })
    : new x.AlgorithmIdentifier({ algorithm: OID.ecdsaWithSha256 });
  const now = Date.now();
  const extension = (e: Ext) =>
    new x.Extension({
      extnID: e.id,
      critical: e.critical ?? false,
      extnValue: new s.OctetString(s.AsnConvert.serialize(e.value)),
    });
  // notBefore 5 min back: clock skew between processes.
  const tbs = new x.TBSCertificate({
    version: x.Version.v3,
    serialNumber: new Uint8Array(serial()).buffer,
    signature: algorithm,
    issuer,
    subject,
    validity: new x.Validity({ notBefore: new Date(now - 5 * 60 * 1000), notAfter: new Date(now + o.days * DAY) }),
    subjectPublicKeyInfo: spki,
    extensions: new x.Extensions(o.extensions(x, spki).map(extension)),
  });
  const tbsDer = Buffer.from(s.AsnConvert.serialize(tbs));
  const signature = sign('sha256', tbsDer, signer); // ECDSA: DER-encoded (r, s), as X.509 wants
  const der = s.AsnConvert.serialize(
    new x.Certificate({
      tbsCertificate: tbs,
      signatureAlgorithm: algorithm,
      signatureValue: new Uint8Array(signature).buffer,
    }),
  );
  const pem = `-----BEGIN CERTIFICATE-----\n${Buffer.from(der)
    .toString('base64')
    .replace(/.{1,64}/g, '$&\n')}-----END CERTIFICATE-----\n`;
  return { cert: pem, key: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString() };
}

/** A key identifier: SHA-1 of the subjectPublicKey bits (RFC 5280 4.2.1.2, method 1). */
function keyId(x: typeof Asn1X509, spki: Asn1X509.SubjectPublicKeyInfo): object {
  return new x.SubjectKeyIdentifier(createHash('sha1').update(Buffer.from(spki.subjectPublicKey)).digest());
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
    if (haveCert !== haveKey)
      throw new Error(
        `${haveCert ? keyFile : certFile} is missing beside ${haveCert ? certFile : keyFile}: remove both to make a new CA`,
      );
    if (!haveCert) {
      const kp = issue({
        subject: [{ type: 'commonName', value: `fluxvm-ca@${Math.floor(Date.now() / 1000)}` }],
        days: 3650,
        extensions: (x, spki) => [
          { id: x.id_ce_basicConstraints, critical: true, value: new x.BasicConstraints({ cA: true }) },
          {
            id: x.id_ce_keyUsage,
            critical: true,
            value: new x.KeyUsage(
              x.KeyUsageFlags.keyCertSign | x.KeyUsageFlags.cRLSign | x.KeyUsageFlags.digitalSignature,
            ),
          },
          { id: x.id_ce_subjectKeyIdentifier, value: keyId(x, spki) },
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
        const covers =
          [...ips].every(
            (ip) =>
              san.includes(`IP Address:${ip === '::1' ? '0:0:0:0:0:0:0:1' : ip}`) || san.includes(`IP Address:${ip}`),
          ) && [...dns].every((d) => san.includes(`DNS:${d}`));
        const fresh = Date.parse(x.validTo) - Date.now() > 30 * DAY;
        if (covers && fresh && x.verify(new X509Certificate(this.certPem).publicKey))
          return { cert, key: fs.readFileSync(keyFile, 'utf8') };
      } catch {
        // unreadable: issue a new one below
      }
    }
    const kp = issue({
      subject: [{ type: 'commonName', value: 'fluxvm-apiserver' }],
      days: 365,
      ca: { certPem: this.certPem, keyPem: this.keyPem },
      extensions: (x) => [
        { id: x.id_ce_basicConstraints, value: new x.BasicConstraints({ cA: false }) },
        { id: x.id_ce_keyUsage, critical: true, value: new x.KeyUsage(x.KeyUsageFlags.digitalSignature) },
        { id: x.id_ce_extKeyUsage, value: new x.ExtendedKeyUsage([x.id_kp_serverAuth]) },
        {
          id: x.id_ce_subjectAltName,
          value: new x.SubjectAlternativeName([
            ...[...dns].map((dNSName) => new x.GeneralName({ dNSName })),
            ...[...ips].map((iPAddress) => new x.GeneralName({ iPAddress })),
          ]),
        },
      ],
    });
    writeAtomic(keyFile, kp.key, 0o600);
    writeAtomic(certFile, kp.cert, 0o644);
    return kp;
  }

  /** A client certificate for `user` in `groups` (CN and O), valid `days` (default 365). Nothing is written. */
  async clientCert(user: string, groups: string[], days = 365): Promise<KeyPair> {
    return issue({
      subject: [
        { type: 'commonName', value: user },
        ...groups.map((value) => ({ type: 'organizationName' as const, value })),
      ],
      days,
      ca: { certPem: this.certPem, keyPem: this.keyPem },
      extensions: (x) => [
        { id: x.id_ce_basicConstraints, value: new x.BasicConstraints({ cA: false }) },
        { id: x.id_ce_keyUsage, critical: true, value: new x.KeyUsage(x.KeyUsageFlags.digitalSignature) },
        { id: x.id_ce_extKeyUsage, value: new x.ExtendedKeyUsage([x.id_kp_clientAuth]) },
      ],
    });
  }
}
