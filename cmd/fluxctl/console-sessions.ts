// The review console's sign-in state (console-serve.ts): browser sessions and single-use
// sign-in links, in memory (a restart of serve signs every browser out).
//
// A session binds a random cookie value to the bearer token the user signed in with: every
// console API call is made upstream with that token, so the API authenticates and authorizes
// it exactly as it would the user's own request (a revoked token stops working in the console
// at once). The maps are keyed by the SHA-256 of the secret, so a lookup compares hashes, not
// the secret itself. Sessions expire after ttlMs (absolute) or idleMs without a request;
// links after 30 s or their first use.
import { createHash, randomBytes } from 'node:crypto';

export interface ConsoleUser {
  username: string;
  groups: string[];
}

export interface ConsoleSession {
  user: ConsoleUser;
  /** The bearer token every upstream request of this session carries. */
  token: string;
  /** The per-session CSRF token state-changing calls must send (X-CSRF-Token). */
  csrf: string;
  createdAt: number;
  expiresAt: number;
  lastUsed: number;
}

export const SESSION_TTL_MS = 8 * 3600_000;
export const SESSION_IDLE_MS = 3600_000;
export const LINK_TTL_MS = 30_000;
/** Live sessions and links kept at most; past it the oldest is dropped (signed out). */
export const MAX_SESSIONS = 1000;
export const MAX_LINKS = 256;

const hash = (s: string) => createHash('sha256').update(s).digest('hex');
const secret = () => randomBytes(32).toString('base64url');

export interface ConsoleSessionsOptions {
  now?: () => number;
  ttlMs?: number;
  idleMs?: number;
  linkTtlMs?: number;
}

export class ConsoleSessions {
  private readonly sessions = new Map<string, ConsoleSession>();
  private readonly links = new Map<string, { user: ConsoleUser; token: string; expiresAt: number }>();
  private readonly now: () => number;
  private readonly ttlMs: number;
  private readonly idleMs: number;
  private readonly linkTtlMs: number;

  constructor(o: ConsoleSessionsOptions = {}) {
    this.now = o.now ?? Date.now;
    this.ttlMs = o.ttlMs ?? SESSION_TTL_MS;
    this.idleMs = o.idleMs ?? SESSION_IDLE_MS;
    this.linkTtlMs = o.linkTtlMs ?? LINK_TTL_MS;
  }

  /** A new session; returns the cookie value (the only copy of the secret). */
  create(user: ConsoleUser, token: string): { id: string; session: ConsoleSession } {
    this.sweep();
    while (this.sessions.size >= MAX_SESSIONS) this.sessions.delete(this.sessions.keys().next().value!);
    const id = secret();
    const t = this.now();
    const session = { user, token, csrf: secret(), createdAt: t, expiresAt: t + this.ttlMs, lastUsed: t };
    this.sessions.set(hash(id), session);
    return { id, session };
  }

  /** The live session of a cookie value (its idle clock restarts), or undefined. */
  get(id: string | undefined): ConsoleSession | undefined {
    if (!id) return undefined;
    const k = hash(id);
    const s = this.sessions.get(k);
    if (!s) return undefined;
    const t = this.now();
    if (t >= s.expiresAt || t - s.lastUsed >= this.idleMs) {
      this.sessions.delete(k);
      return undefined;
    }
    s.lastUsed = t;
    return s;
  }

  /** Signs a cookie value out; true when it was a live session. */
  delete(id: string | undefined): boolean {
    return id ? this.sessions.delete(hash(id)) : false;
  }

  /** A single-use sign-in code for `fluxctl console` (valid linkTtlMs). */
  link(user: ConsoleUser, token: string): { code: string; expiresAt: number } {
    this.sweep();
    while (this.links.size >= MAX_LINKS) this.links.delete(this.links.keys().next().value!);
    const code = secret();
    const expiresAt = this.now() + this.linkTtlMs;
    this.links.set(hash(code), { user, token, expiresAt });
    return { code, expiresAt };
  }

  /** Uses a sign-in code up (whether or not it is still valid); its user and token when it was. */
  redeem(code: string): { user: ConsoleUser; token: string } | undefined {
    const k = hash(code);
    const l = this.links.get(k);
    this.links.delete(k);
    if (!l || this.now() >= l.expiresAt) return undefined;
    return { user: l.user, token: l.token };
  }

  get size(): number {
    return this.sessions.size;
  }

  private sweep(): void {
    const t = this.now();
    for (const [k, s] of this.sessions) if (t >= s.expiresAt || t - s.lastUsed >= this.idleMs) this.sessions.delete(k);
    for (const [k, l] of this.links) if (t >= l.expiresAt) this.links.delete(k);
  }
}
