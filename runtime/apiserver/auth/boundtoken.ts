// Bound tokens, kind-agnostic: bearer tokens bound to one API object (as kube's ServiceAccount tokens
// are bound to a Pod or Secret), good only while that object lives. A kind mints them (only their
// SHA-256 is kept) and registers each here with the user it stands for; this authenticator maps a
// presented token to that user when the token has the kind's prefix, is known, has not expired, and
// its object still exists with the same uid, is not being deleted, and passes the kind's own check
// (`live`, e.g. an AgentSession that has not expired). Anything else is undefined: the next
// authenticator of the chain (authn.ts), or a 401 at its end. Users: controllers/agentsession/tokens.ts.
import { createHash } from 'node:crypto';
import type { UserInfo } from '../registry-types.js';
import type { TokenAuthenticator } from './authn.js';

/** The hex SHA-256 of a token: what a store of bound tokens keeps and looks tokens up by. */
export const tokenHash = (token: string): string => createHash('sha256').update(token).digest('hex');

/** What a bound token stands for. */
export interface BoundToken {
  /** The object it is bound to. */
  namespace: string;
  name: string;
  uid: string;
  /** Milliseconds since the epoch; the token is refused from then on. */
  expiresMs: number;
  user: UserInfo;
}

/** The parts of the bound object the check reads. */
export interface BoundObject {
  metadata: { uid?: string; deletionTimestamp?: string };
}

/** The bound object now (the informer's cache, or a read while it has not synced), or undefined when gone. */
export type BoundObjectLookup<O extends BoundObject> = (
  namespace: string,
  name: string,
) => O | undefined | Promise<O | undefined>;

export interface BoundTokenOptions<O extends BoundObject> {
  /** The prefix every token of this kind starts with (others are not looked up). */
  prefix: string;
  now?: () => number;
  /** The kind's own check of a live object (default: every object that exists and is not being deleted). */
  live?: (obj: O) => boolean;
}

/** The bound tokens of one kind, indexed by hash. No token is accepted until `attach` gives it a lookup. */
export class BoundTokenAuthenticator<O extends BoundObject> {
  private readonly byHash = new Map<string, BoundToken>();
  private lookup: BoundObjectLookup<O> | undefined;
  private readonly now: () => number;

  constructor(private readonly opts: BoundTokenOptions<O>) {
    this.now = opts.now ?? Date.now;
  }

  /** Gives the authenticator its view of the bound objects. */
  attach(lookup: BoundObjectLookup<O>): void {
    this.lookup = lookup;
  }

  /** Registers (or replaces) the token whose hash is `hash`. */
  set(hash: string, bound: BoundToken): void {
    this.byHash.set(hash, bound);
  }

  /** Forgets a token (revoked, or its object's state removed). Safe twice. */
  delete(hash: string): void {
    this.byHash.delete(hash);
  }

  readonly authenticate: TokenAuthenticator = (token) => {
    if (!token.startsWith(this.opts.prefix)) return undefined;
    const b = this.byHash.get(tokenHash(token));
    if (!b || this.now() >= b.expiresMs || !this.lookup) return undefined;
    const o = this.lookup(b.namespace, b.name);
    return o instanceof Promise
      ? o.then(
          (v) => this.userIfLive(b, v),
          () => undefined,
        )
      : this.userIfLive(b, o);
  };

  private userIfLive(b: BoundToken, o: O | undefined): UserInfo | undefined {
    if (!o || o.metadata.uid !== b.uid || o.metadata.deletionTimestamp) return undefined;
    if (this.opts.live && !this.opts.live(o)) return undefined;
    return b.user;
  }
}
