// The embedded server's authenticator chain (kube-apiserver's order):
//   client certificate signed by the state CA -> bearer token -> anonymous (restricted paths).
// Bearer tokens are resolved by a list of TokenAuthenticators, tried in order: the admin token
// (only its sha256 is stored), the static token file (--token-auth-file), and, in a later issue,
// session tokens. A token no kind recognises is a 401, never anonymous. A client certificate
// that is presented but not signed by the CA, or expired, is a 401 as well.
// Anonymous requests are allowed only on the health and version paths (kube 1.32's
// AuthenticationConfiguration `anonymous.conditions`); anywhere else no credentials is a 401.
import { createHash, randomBytes, timingSafeEqual, X509Certificate } from 'node:crypto';

/** The admin token's prefix (session tokens have fxst_). */
export const ADMIN_TOKEN_PREFIX = 'fxat_';
import fs from 'node:fs';
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import type { UserInfo } from '../registry-types.js';
import { ANONYMOUS, unauthorized, type Authenticator } from '../http/auth.js';

/** One kind of bearer token: returns the user, or undefined when the token is not of this kind. */
export type TokenAuthenticator = (token: string) => UserInfo | undefined | Promise<UserInfo | undefined>;

export const AUTHENTICATED = 'system:authenticated';
export const MASTERS = 'system:masters';

function sha256(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** Adds system:authenticated once, as kube's authenticators do. */
export function authenticated(u: UserInfo): UserInfo {
  return u.groups.includes(AUTHENTICATED) ? u : { ...u, groups: [...u.groups, AUTHENTICATED] };
}

/**
 * The admin token: `hashFile` holds the hex sha256 of the one admin token (0600). `ensure`
 * makes a token when there is no hash file (or `reuse` is given and matches nothing) and
 * returns it; the plain token exists only in the kubeconfig it is written to.
 */
export class AdminToken {
  /** The admin token once it has been presented and hashed (memory only): later requests skip the hash. */
  private seen?: Buffer;

  /** `length`: the token's length, known whenever ensure() returns (a token of another length is not it). */
  private constructor(
    private readonly hash: Buffer,
    private readonly length?: number,
  ) {}

  static readonly USER: UserInfo = { name: 'admin', groups: [MASTERS, AUTHENTICATED] };

  /**
   * Loads the hash; when `candidate` (the token of an existing kubeconfig) matches it, that
   * token is kept. Otherwise (first start, lost kubeconfig) a new token replaces the hash.
   * Returns the authenticator and the token to write, undefined when `candidate` was kept.
   */
  static ensure(hashFile: string, candidate?: string): { admin: AdminToken; token: string } {
    if (fs.existsSync(hashFile)) {
      const hash = Buffer.from(fs.readFileSync(hashFile, 'utf8').trim(), 'hex');
      if (candidate && new AdminToken(hash).matches(candidate))
        return { admin: new AdminToken(hash, candidate.length), token: candidate };
    }
    // The prefix names the token kind (for secret scanners and people) and keeps the token from
    // starting with '-' (base64url can), which YAML quotes and a command line takes for a flag.
    const token = ADMIN_TOKEN_PREFIX + randomBytes(32).toString('base64url');
    const tmp = `${hashFile}.tmp-${process.pid}`;
    const fd = fs.openSync(tmp, 'w', 0o600);
    try {
      fs.writeSync(fd, sha256(token).toString('hex') + '\n');
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, hashFile);
    return { admin: new AdminToken(sha256(token), token.length), token };
  }

  /** Hashes computed by matches() so far (tests count them). */
  hashes = 0;

  /**
   * Whether `token` is the admin token. A token of another length is not (no hash); the admin
   * token itself is hashed once, then compared in constant time with the remembered bytes.
   */
  matches(token: string): boolean {
    if (this.length !== undefined && token.length !== this.length) return false;
    if (this.seen) {
      const b = Buffer.from(token);
      return b.length === this.seen.length && timingSafeEqual(b, this.seen);
    }
    this.hashes++;
    const h = sha256(token);
    const ok = h.length === this.hash.length && timingSafeEqual(h, this.hash);
    if (ok) this.seen = Buffer.from(token);
    return ok;
  }

  readonly authenticate: TokenAuthenticator = (token) => (this.matches(token) ? AdminToken.USER : undefined);
}

/** Parses one CSV line (RFC 4180 quoting); throws Error on an unterminated quote. */
function csvFields(line: string): string[] {
  const out: string[] = [];
  let i = 0;
  for (;;) {
    let f = '';
    if (line[i] === '"') {
      i++;
      for (;;) {
        if (i >= line.length) throw new Error('unterminated quoted field');
        if (line[i] === '"') {
          if (line[i + 1] === '"') {
            f += '"';
            i += 2;
            continue;
          }
          i++;
          break;
        }
        f += line[i++];
      }
      if (i < line.length && line[i] !== ',') throw new Error('text after a closing quote');
    } else {
      const j = line.indexOf(',', i);
      f = line.slice(i, j < 0 ? line.length : j);
      i = j < 0 ? line.length : j;
    }
    out.push(f.trim());
    if (i >= line.length) return out;
    i++; // the comma
  }
}

/**
 * kube's --token-auth-file: `token,user,uid[,"group1,group2"]` per line; blank lines and
 * lines starting with # are skipped. Throws Error naming the file and line on a bad line
 * (fewer than 3 fields, an empty token or user, a duplicate token).
 */
export function parseTokenFile(text: string, file = 'token file'): Map<string, UserInfo> {
  const users = new Map<string, UserInfo>();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) return;
    const where = `${file}:${i + 1}`;
    let f: string[];
    try {
      f = csvFields(line);
    } catch (e) {
      throw new Error(`${where}: ${(e as Error).message}`);
    }
    if (f.length < 3) throw new Error(`${where}: want token,user,uid[,"groups"], got ${f.length} field(s)`);
    const [token, name, uid, groups = ''] = f;
    if (!token) throw new Error(`${where}: empty token`);
    if (!name) throw new Error(`${where}: empty user name`);
    if (users.has(token)) throw new Error(`${where}: duplicate token`);
    const gs = groups
      .split(',')
      .map((g) => g.trim())
      .filter(Boolean);
    users.set(token, { name, ...(uid ? { uid } : {}), groups: [...gs, AUTHENTICATED] });
  });
  return users;
}

/** A TokenAuthenticator over a parsed token file. */
export function staticTokens(users: Map<string, UserInfo>): TokenAuthenticator {
  return (token) => {
    const u = users.get(token);
    return u ? { name: u.name, groups: u.groups, ...(u.uid ? { uid: u.uid } : {}) } : undefined;
  };
}

/** `Authorization: Bearer <token>`: the first kind that knows it wins; a token none knows is a 401. */
export function bearerAuthenticator(kinds: TokenAuthenticator[]): Authenticator {
  return async (req) => {
    const h = req.headers.authorization;
    if (h === undefined) return undefined;
    const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
    if (!m) throw unauthorized();
    for (const k of kinds) {
      const u = await k(m[1]);
      if (u) return authenticated(u);
    }
    throw unauthorized();
  };
}

/**
 * A client certificate: signed by the CA and valid now -> CN is the user, O the groups. A
 * certificate that is presented but fails either check is a 401 (kube's x509 authenticator).
 */
export function strictClientCertAuthenticator(caPem: string, now: () => number = Date.now): Authenticator {
  const ca = new X509Certificate(caPem);
  return (req: IncomingMessage) => {
    const sock = req.socket as TLSSocket;
    if (typeof sock.getPeerCertificate !== 'function') return undefined;
    const peer = sock.getPeerCertificate() as { raw?: Buffer };
    if (!peer || !peer.raw) return undefined;
    const leaf = new X509Certificate(peer.raw);
    const t = now();
    let ok = false;
    try {
      ok =
        Date.parse(leaf.validFrom) <= t &&
        t <= Date.parse(leaf.validTo) &&
        leaf.checkIssued(ca) &&
        leaf.verify(ca.publicKey);
    } catch {
      ok = false;
    }
    if (!ok) throw unauthorized();
    const fields = leaf.subject.split('\n').map((l) => l.trim());
    const cn = fields.find((l) => l.startsWith('CN='))?.slice(3);
    if (!cn) throw unauthorized();
    return authenticated({ name: cn, groups: fields.filter((l) => l.startsWith('O=')).map((l) => l.slice(2)) });
  };
}

/** Paths anonymous requests may reach (kube 1.32 anonymous.conditions); elsewhere anonymous is a 401. */
export const ANONYMOUS_PATHS = ['/healthz', '/livez', '/readyz', '/version'];

export function anonymousAllowed(url: string | undefined): boolean {
  const p = (url ?? '/').split('?')[0];
  return ANONYMOUS_PATHS.some((a) => p === a || p.startsWith(`${a}/`));
}

/**
 * Chains authenticators in order; when none answers the request is system:anonymous on the
 * anonymous paths and a 401 anywhere else.
 */
export function embeddedAuthenticator(list: Authenticator[]): Authenticator {
  return async (req) => {
    for (const a of list) {
      const u = await a(req);
      if (u) return u;
    }
    if (anonymousAllowed(req.url)) return ANONYMOUS;
    throw unauthorized();
  };
}
