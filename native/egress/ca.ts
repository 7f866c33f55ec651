// Per-sandbox certificate authorities for TLS interception (README.md, "Interception").
// Each sandbox gets its own short-lived ECDSA P-256 CA; its private key is a non-extractable
// WebCrypto key held only in this process's memory (never written anywhere: after a restart
// a new CA is minted and the sandbox's trust store rewritten). Leaf certificates are minted
// per SNI host, signed by the sandbox's current CA, and cached (bounded LRU of TLS contexts).
// A CA is re-minted when less than half its life is left; the previous one stays in the
// trust bundle until it expires, so leaves already handed out keep verifying.
import type * as X509 from '@peculiar/x509';
import { webcrypto } from 'node:crypto';
import tls from 'node:tls';

const crypto = webcrypto as unknown as Crypto;

let x509Lib: Promise<typeof X509> | undefined;
/**
 * @peculiar/x509, loaded when the first CA is minted (its ~300 module files are a good part of
 * a server's start-up, which needs none of them); reflect-metadata, which its dependency
 * injection needs, goes first.
 */
export function loadX509(): Promise<typeof X509> {
  return (x509Lib ??= import('reflect-metadata').then(async () => {
    const mod = await import('@peculiar/x509');
    // A CommonJS package: node gives its exports both as named exports and as `default`; the
    // bundle's import() (hack/bundle-fluxctl.mjs) gives them only as `default`.
    const x509 = (mod.default as typeof X509 | undefined) ?? mod;
    x509.cryptoProvider.set(crypto);
    return x509;
  }));
}

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const HOUR = 3600_000;

export interface CaOptions {
  /** Lifetime of a CA. Default 24 h. */
  caLifetimeMs?: number;
  /** Lifetime of a leaf (capped by its CA's end). Default 12 h. */
  leafLifetimeMs?: number;
  /** TLS contexts (host names) cached per sandbox. Default 256. */
  maxLeaves?: number;
  /** Sandboxes with a CA at once. Default 16384 (one per sandbox link). */
  maxSandboxes?: number;
  now?: () => number;
}

interface Authority {
  cert: X509.X509Certificate;
  pem: string;
  key: CryptoKey;
  notAfter: number;
  notBefore: number;
}

interface SandboxAuthorities {
  /** Newest last; every unexpired one is in the trust bundle. */
  cas: Authority[];
  leaves: Map<string, Promise<tls.SecureContext>>;
  minting?: Promise<Authority>;
}

function serial(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[0] &= 0x7f; // a positive INTEGER
  return Buffer.from(b).toString('hex');
}

function pemOf(label: string, der: ArrayBuffer): string {
  const b64 = Buffer.from(der)
    .toString('base64')
    .replace(/.{1,64}/g, '$&\n');
  return `-----BEGIN ${label}-----\n${b64}-----END ${label}-----\n`;
}

export class CaStore {
  private readonly byId = new Map<string, SandboxAuthorities>();
  /** One leaf key pair per process: every leaf of every sandbox CA shares it (only the CA signature differs). */
  private leafKey?: Promise<{ publicKey: CryptoKey; pem: string }>;
  private readonly now: () => number;

  constructor(private readonly o: CaOptions = {}) {
    this.now = o.now ?? Date.now;
  }

  private get caLife(): number {
    return this.o.caLifetimeMs ?? 24 * HOUR;
  }

  private entry(id: string): SandboxAuthorities {
    let e = this.byId.get(id);
    if (e) {
      this.byId.delete(id); // LRU order: most recently used last
      this.byId.set(id, e);
      return e;
    }
    e = { cas: [], leaves: new Map() };
    this.byId.set(id, e);
    const max = this.o.maxSandboxes ?? 16384;
    while (this.byId.size > max) this.byId.delete(this.byId.keys().next().value as string);
    return e;
  }

  private async mintCa(id: string): Promise<Authority> {
    const x509 = await loadX509();
    const keys = (await crypto.subtle.generateKey(ALG, false, ['sign', 'verify'])) as CryptoKeyPair;
    const now = this.now();
    // clock skew between the proxy and the sandbox's clients: none, same host; a little anyway
    const notBefore = now - 5 * 60_000;
    const notAfter = now + this.caLife;
    const cert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber: serial(),
      name: `CN=FluxVM egress CA ${id.slice(0, 36)}, O=FluxVM sandbox egress interception`,
      notBefore: new Date(notBefore),
      notAfter: new Date(notAfter),
      signingAlgorithm: ALG,
      keys,
      extensions: [
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
      ],
    });
    return { cert, pem: cert.toString('pem') + '\n', key: keys.privateKey, notBefore, notAfter };
  }

  /** The CA leaves are signed with now: minted on first use, re-minted past half its life. */
  private async current(id: string): Promise<Authority> {
    const e = this.entry(id);
    const now = this.now();
    e.cas = e.cas.filter((c) => c.notAfter > now);
    const last = e.cas[e.cas.length - 1];
    if (last && last.notAfter - now > this.caLife / 2) return last;
    if (!e.minting) {
      e.minting = this.mintCa(id).then(
        (ca) => {
          e.cas.push(ca);
          e.leaves.clear(); // new leaves from the new CA
          e.minting = undefined;
          return ca;
        },
        (err) => {
          e.minting = undefined;
          throw err;
        },
      );
    }
    return last && last.notAfter - now > 60_000 ? last : e.minting;
  }

  /**
   * PEM of every unexpired CA of the sandbox (mints the first): what its trust store adds
   * to the host bundle. Changes when a CA is re-minted or expires.
   */
  async trustPem(id: string): Promise<string> {
    await this.current(id);
    const e = this.entry(id);
    if (e.minting) await e.minting;
    return e.cas.map((c) => c.pem).join('');
  }

  /** The sandbox's CA certificates (newest last), e.g. for a test to verify against. */
  certificates(id: string): X509.X509Certificate[] {
    return this.byId.get(id)?.cas.map((c) => c.cert) ?? [];
  }

  private sharedLeafKey(): Promise<{ publicKey: CryptoKey; pem: string; privateKey: CryptoKey }> {
    this.leafKey ??= (async () => {
      const k = (await crypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as CryptoKeyPair;
      // Extractable because Node's TLS takes a PEM; it lives in this process's memory only.
      return {
        publicKey: k.publicKey,
        privateKey: k.privateKey,
        pem: pemOf('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', k.privateKey)),
      };
    })();
    return this.leafKey as Promise<{ publicKey: CryptoKey; pem: string; privateKey: CryptoKey }>;
  }

  /** A TLS server context presenting a leaf for `host` signed by the sandbox's CA (cached). */
  async contextFor(id: string, host: string): Promise<tls.SecureContext> {
    const ca = await this.current(id);
    const e = this.entry(id);
    const hit = e.leaves.get(host);
    if (hit) {
      e.leaves.delete(host);
      e.leaves.set(host, hit);
      return hit;
    }
    const p = this.mintLeaf(ca, host);
    e.leaves.set(host, p);
    p.catch(() => e.leaves.delete(host));
    while (e.leaves.size > (this.o.maxLeaves ?? 256)) e.leaves.delete(e.leaves.keys().next().value as string);
    return p;
  }

  private async mintLeaf(ca: Authority, host: string): Promise<tls.SecureContext> {
    const x509 = await loadX509();
    const leaf = await this.sharedLeafKey();
    const now = this.now();
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: serial(),
      subject: `CN=${host}`,
      issuer: ca.cert.subject,
      notBefore: new Date(Math.max(ca.notBefore, now - 5 * 60_000)),
      notAfter: new Date(Math.min(ca.notAfter, now + (this.o.leafLifetimeMs ?? 12 * HOUR))),
      signingAlgorithm: ALG,
      publicKey: leaf.publicKey,
      signingKey: ca.key,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        new x509.SubjectAlternativeNameExtension([{ type: 'dns', value: host }]),
        await x509.AuthorityKeyIdentifierExtension.create(ca.cert),
      ],
    });
    return tls.createSecureContext({
      key: leaf.pem,
      cert: cert.toString('pem') + '\n' + ca.pem,
      minVersion: 'TLSv1.2',
    });
  }

  /** Forgets a sandbox's CAs and leaves (its link went). Idempotent. */
  drop(id: string): void {
    this.byId.delete(id);
  }
}
