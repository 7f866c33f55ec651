// Preview URLs (spec/agent-sessions.md "Preview URLs"): an expiring URL on
// serve that reaches one TCP port inside the session's sandbox (preview-proxy.ts serves it).
//   POST   agentsessions/<name>/previews {port 1-65535, ttlSeconds 1-86400 (default 3600)}
//          -> 201 {id, port, url, path, expiresAt}: the URL carries the token (256
//          bits of HMAC, below, 64 hex); op `preview`
//   GET    agentsessions/<name>/previews          the live ones: id, port, times (op `read`); the url and
//          path too, only to a user the authorizer lets `create` agentsessions/previews on that
//          session (who could mint one anyway; a session token: its own session with op `preview`)
//   DELETE agentsessions/<name>/previews/<id>     (or ?id=) revokes one; op `preview`
// Only the token's SHA-256 is kept, in `<dir>/<session uid>/previews.json` (fsync + rename
// before the answer), so no token is written anywhere; the file survives a serve restart and goes
// with the session's state dir (finalizer). The token is HMAC-SHA256(<dir>/.url-key, uid, id): the
// server can give the URL again (GET above) without keeping it; the key (32 random bytes, 0600,
// beside the CA and signing keys of the state dir) is made at the first start. Previews minted
// before the key existed (random tokens, no `keyed` mark) are listed without a URL. Expiry is
// capped at the session's. At most MAX_LIVE_PREVIEWS live per session (the next is 409).
// Ledgered as preview.expose / preview.revoke {id, port, expirationTimestamp}, never the token.
import { createHash, createHmac, randomBytes } from 'node:crypto';
import fs, { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import { RuntimeError } from '../../native/runtime.js';
import {
  respond,
  type SubresourceHandler,
  type SubresourceRequest,
} from '../../runtime/apiserver/http/subresources.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import type { StatusCause } from '../../runtime/meta/types.js';
import { jsonBody, queryParam } from '../sandbox/subresources.js';
import { GROUP, resolveSession, type AgentSessionSubresourceDeps } from './common.js';
import { expiryMs } from './desired.js';
import { writeFileAtomic } from '../../native/workspace/atomic.js';
import { KeyedLock } from '../common/keyedlock.js';

export const MAX_LIVE_PREVIEWS = 16;
export const DEFAULT_PREVIEW_TTL_SECONDS = 3600;
export const MIN_PREVIEW_TTL_SECONDS = 1;
export const MAX_PREVIEW_TTL_SECONDS = 86400;
/** Where previews are served on the API server (outside /apis; no bearer token). */
export const PREVIEW_PREFIX = '/preview/';
/** A preview token: 256 random bits as lower-case hex. */
export const PREVIEW_TOKEN_RE = /^[0-9a-f]{64}$/;

export interface StoredPreview {
  id: string;
  /** hex SHA-256 of the token; the token itself is never stored. */
  sha256: string;
  port: number;
  creationTimestamp: string;
  expirationTimestamp: string;
  /** The token is HMAC(url key, uid, id): the URL can be given again. */
  keyed?: boolean;
}

interface PreviewFile {
  session: { namespace: string; name: string; uid: string };
  previews: StoredPreview[];
}

/** A live preview as the proxy sees it. */
export interface PreviewEntry {
  uid: string;
  namespace: string;
  name: string;
  preview: StoredPreview;
  expiresMs: number;
}

export const previewHash = (token: string) => createHash('sha256').update(token).digest('hex');
const publicView = (p: StoredPreview) => ({
  id: p.id,
  port: p.port,
  creationTimestamp: p.creationTimestamp,
  expirationTimestamp: p.expirationTimestamp,
});

/** `{port, ttlSeconds?}` checked: 422 with one cause per bad field (port, ttlSeconds). Pure. */
export function parsePreviewRequest(
  body: Record<string, unknown>,
  session: string,
): { port: number; ttlSeconds: number } {
  const causes: StatusCause[] = [];
  const p = body.port;
  if (p === undefined)
    causes.push({
      reason: 'FieldValueRequired',
      field: 'port',
      message: 'Required value: the TCP port inside the sandbox (1-65535)',
    });
  else if (typeof p !== 'number' || !Number.isInteger(p) || p < 1 || p > 65535)
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'port',
      message: `Invalid value: ${JSON.stringify(p)}: must be an integer from 1 to 65535`,
    });
  let ttlSeconds = DEFAULT_PREVIEW_TTL_SECONDS;
  const t = body.ttlSeconds;
  if (t !== undefined) {
    if (typeof t !== 'number' || !Number.isInteger(t) || t < MIN_PREVIEW_TTL_SECONDS || t > MAX_PREVIEW_TTL_SECONDS) {
      causes.push({
        reason: 'FieldValueInvalid',
        field: 'ttlSeconds',
        message: `Invalid value: ${JSON.stringify(t)}: must be an integer from ${MIN_PREVIEW_TTL_SECONDS} to ${MAX_PREVIEW_TTL_SECONDS}`,
      });
    } else ttlSeconds = t;
  }
  for (const k of Object.keys(body)) {
    if (k !== 'port' && k !== 'ttlSeconds')
      causes.push({
        reason: 'FieldValueNotSupported',
        field: k,
        message: 'Unsupported field: a preview takes port and ttlSeconds',
      });
  }
  if (causes.length) throw errors.invalid('AgentSessionPreview', GROUP, session, causes);
  return { port: p as number, ttlSeconds };
}

/** What the proxy needs to know of a session at request time (informer caches; the store before they synced). */
export interface PreviewTargets {
  session(namespace: string, name: string): AgentSession | undefined | Promise<AgentSession | undefined>;
  sandbox(namespace: string, name: string): Sandbox | undefined | Promise<Sandbox | undefined>;
}

/**
 * The previews of one state dir, indexed by token hash in memory, loaded from the session dirs
 * at construction. Mint/revoke of one session are serialized; each writes previews.json with
 * fsync + rename before resolving. `onRevoke` listeners (the proxy) end what a revoked or
 * forgotten preview still has open (WebSockets).
 */
export class PreviewStore {
  private readonly byHash = new Map<string, PreviewEntry>();
  private readonly bySession = new Map<string, PreviewFile>();
  private readonly locks = new KeyedLock();
  private readonly revokeListeners: Array<(hashes: string[]) => void> = [];
  targets: PreviewTargets | undefined;

  private readonly urlKey: Buffer;

  constructor(
    private readonly dir: string,
    readonly now: () => number = Date.now,
  ) {
    this.urlKey = loadUrlKey(dir);
    this.load();
  }

  /** The token of a keyed preview of session `uid`. */
  private tokenOf(uid: string, id: string): string {
    return createHmac('sha256', this.urlKey).update(`fluxvm-preview\0${uid}\0${id}`).digest('hex');
  }

  private load(): void {
    let uids: string[];
    try {
      uids = fs.readdirSync(this.dir);
    } catch {
      return;
    }
    for (const uid of uids) {
      try {
        const f = JSON.parse(fs.readFileSync(join(this.dir, uid, 'previews.json'), 'utf8')) as PreviewFile;
        if (f?.session?.uid === uid && Array.isArray(f.previews)) this.index(f);
      } catch {
        // no previews file: none
      }
    }
  }

  private index(f: PreviewFile): void {
    const old = this.bySession.get(f.session.uid);
    const kept = new Set(f.previews.map((p) => p.sha256));
    const gone = (old?.previews ?? []).map((p) => p.sha256).filter((h) => !kept.has(h));
    for (const h of gone) this.byHash.delete(h);
    this.bySession.set(f.session.uid, f);
    const { namespace, name, uid } = f.session;
    for (const p of f.previews)
      this.byHash.set(p.sha256, { uid, namespace, name, preview: p, expiresMs: Date.parse(p.expirationTimestamp) });
    if (gone.length) this.revoked(gone);
  }

  private revoked(hashes: string[]): void {
    for (const l of this.revokeListeners) l(hashes);
  }

  /** Gives the proxy its view of sessions and sandboxes. */
  attach(t: PreviewTargets): void {
    this.targets = t;
  }

  onRevoke(l: (hashes: string[]) => void): void {
    this.revokeListeners.push(l);
  }

  /** The live preview of a token (64 hex), undefined for any other string, an unknown, revoked or expired one. */
  lookup(token: string): PreviewEntry | undefined {
    if (!PREVIEW_TOKEN_RE.test(token)) return undefined;
    const e = this.byHash.get(previewHash(token));
    return e && this.now() < e.expiresMs ? e : undefined;
  }

  private async write(f: PreviewFile): Promise<void> {
    const d = join(this.dir, f.session.uid);
    await fsp.mkdir(d, { recursive: true, mode: 0o700 });
    await writeFileAtomic(join(d, 'previews.json'), JSON.stringify(f), 0o600);
  }

  private liveOf(uid: string): StoredPreview[] {
    const t = this.now();
    return (this.bySession.get(uid)?.previews ?? []).filter((x) => Date.parse(x.expirationTimestamp) > t);
  }

  list(uid: string): Array<Omit<StoredPreview, 'sha256'>> {
    return this.liveOf(uid).map(publicView);
  }

  /**
   * The live previews with each one's path (`/preview/<token>/`) when the server can make it
   * again (a keyed preview whose token still hashes to the stored hash). Only for a caller allowed
   * to mint previews of the session (previewsHandler checks).
   */
  listWithPaths(uid: string): Array<Omit<StoredPreview, 'sha256'> & { path?: string }> {
    return this.liveOf(uid).map((p) => {
      const token = p.keyed ? this.tokenOf(uid, p.id) : undefined;
      return token && previewHash(token) === p.sha256
        ? { ...publicView(p), path: `${PREVIEW_PREFIX}${token}/` }
        : publicView(p);
    });
  }

  /** Mints a preview: 409 at MAX_LIVE_PREVIEWS live ones. The token exists only in the answer. */
  mint(
    session: { namespace: string; name: string; uid: string },
    port: number,
    ttlSeconds: number,
    sessionExpiryMs: number | undefined,
  ): Promise<{ token: string; record: Omit<StoredPreview, 'sha256'> }> {
    return this.locks.run(session.uid, async () => {
      const live = this.liveOf(session.uid);
      if (live.length >= MAX_LIVE_PREVIEWS) {
        throw errors.conflict(
          'agentsessions',
          GROUP,
          session.name,
          `the session has ${live.length} live previews, the limit is ${MAX_LIVE_PREVIEWS}: revoke one first (fluxctl agent unexpose ${session.name} <id>)`,
        );
      }
      const now = this.now();
      const id = randomBytes(6).toString('hex');
      const token = this.tokenOf(session.uid, id);
      const p: StoredPreview = {
        id,
        sha256: previewHash(token),
        port,
        creationTimestamp: new Date(now).toISOString(),
        expirationTimestamp: new Date(Math.min(now + ttlSeconds * 1000, sessionExpiryMs ?? Infinity)).toISOString(),
        keyed: true,
      };
      const f: PreviewFile = { session: { ...session }, previews: [...live, p] };
      await this.write(f);
      this.index(f);
      return { token, record: publicView(p) };
    });
  }

  /** Revokes one preview (undefined when the session has no live one with that id). Durable before it resolves. */
  revoke(uid: string, id: string): Promise<Omit<StoredPreview, 'sha256'> | undefined> {
    return this.locks.run(uid, async () => {
      const f = this.bySession.get(uid);
      const p = this.liveOf(uid).find((x) => x.id === id);
      if (!f || !p) return undefined;
      const next: PreviewFile = { session: f.session, previews: this.liveOf(uid).filter((x) => x.id !== id) };
      await this.write(next);
      this.index(next);
      return publicView(p);
    });
  }

  /** Forgets every preview of a session in memory (it is being deleted; its state dir goes). Safe twice. */
  forget(uid: string): void {
    const hashes = (this.bySession.get(uid)?.previews ?? []).map((p) => p.sha256);
    for (const h of hashes) this.byHash.delete(h);
    this.bySession.delete(uid);
    if (hashes.length) this.revoked(hashes);
  }
}

/**
 * The key preview tokens are made with (`<dir>/.url-key`, 32 random bytes, 0600): read, or made
 * once (written to a temporary file, fsynced, renamed) so a restart makes the same tokens.
 */
function loadUrlKey(dir: string): Buffer {
  const file = join(dir, '.url-key');
  try {
    const k = fs.readFileSync(file);
    if (k.length === 32) return k;
  } catch {
    // none yet
  }
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const k = randomBytes(32);
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, 'w', 0o600);
  try {
    fs.writeSync(fd, k);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  // link, not rename: of two servers starting together on one state dir, the second finds the
  // first one's key (EEXIST) and uses it, so both make the same tokens.
  // A file there that is not a key (not 32 bytes) is replaced.
  let theirs: Buffer | undefined;
  try {
    fs.linkSync(tmp, file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    theirs = fs.readFileSync(file);
    if (theirs.length !== 32) {
      theirs = undefined;
      fs.renameSync(tmp, file);
    }
  }
  fs.rmSync(tmp, { force: true });
  if (theirs) return theirs;
  const dfd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(dfd);
  } finally {
    fs.closeSync(dfd);
  }
  return k;
}

/** Whether the caller may mint previews of the session (then it may see their URLs again). */
async function mayMint(d: AgentSessionSubresourceDeps, r: SubresourceRequest): Promise<boolean> {
  const user = r.ctx?.user;
  if (!d.authorize) return true; // no authorizer (--insecure-http): every caller may mint
  if (!user) return false;
  const dec = await d.authorize({
    user,
    resource: {
      verb: 'create',
      namespace: r.namespace,
      group: GROUP,
      version: r.gvr.version,
      resource: 'agentsessions',
      subresource: 'previews',
      name: r.name,
    },
  });
  return dec.allowed;
}

/** The URL of a preview as the client reached this server (scheme from the connection, host from the request). */
function previewUrl(r: SubresourceRequest, path: string): string {
  const tls = !!(r.req?.socket as { encrypted?: boolean } | undefined)?.encrypted;
  const host =
    typeof r.headers.host === 'string' && /^[A-Za-z0-9.:[\]-]+$/.test(r.headers.host) ? r.headers.host : 'localhost';
  return `${tls ? 'https' : 'http'}://${host}${path}`;
}

/** The `agentsessions/<name>/previews` subresource over `store` (see the head of this file). */
export function previewsHandler(d: AgentSessionSubresourceDeps, store: PreviewStore): SubresourceHandler {
  return {
    verbs: ['create', 'get', 'delete'],
    subpaths: true,
    async handle(r) {
      if (r.method === 'GET') {
        if (r.subpath !== undefined) throw errors.notFound('agentsessions/previews', GROUP, r.subpath);
        const { uid } = await resolveSession(d, r, { running: false });
        const list = {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'AgentSessionPreviewList',
          metadata: {},
          session: r.name,
        };
        if (!(await mayMint(d, r))) return { ...list, items: store.list(uid) };
        const items = store.listWithPaths(uid).map((p) => (p.path ? { ...p, url: previewUrl(r, p.path) } : p));
        return respond({
          headers: { 'content-type': 'application/json', 'cache-control': 'no-store' },
          body: JSON.stringify({ ...list, items }),
        });
      }
      if (r.method === 'DELETE') {
        const id = r.subpath ?? queryParam(r, 'id');
        if (!id)
          throw errors.badRequest(
            'DELETE agentsessions/<name>/previews/<id> (or ?id=) names the preview to revoke (fluxctl agent previews lists them)',
          );
        const { uid } = await resolveSession(d, r, { running: false });
        const p = await store.revoke(uid, id);
        if (!p)
          throw new StatusError(404, 'NotFound', `preview "${id}" of agentsessions.fluxvm.dev "${r.name}" not found`, {
            name: id,
            group: GROUP,
            kind: 'agentsessions/previews',
          });
        await d.ledger.append(uid, 'preview.revoke', {
          id: p.id,
          port: p.port,
          expirationTimestamp: p.expirationTimestamp,
        });
        return {
          kind: 'Status',
          apiVersion: 'v1',
          metadata: {},
          status: 'Success',
          code: 200,
          details: { name: p.id, group: GROUP, kind: 'agentsessions/previews' },
        };
      }
      if (r.method !== 'POST')
        throw errors.methodNotAllowed(
          `previews takes POST (expose), GET (list) or DELETE previews/<id> (revoke), not ${r.method}`,
        );
      if (r.subpath !== undefined)
        throw errors.methodNotAllowed(
          'POST agentsessions/<name>/previews mints a preview; a path below it is not a resource to create',
        );
      const { port, ttlSeconds } = parsePreviewRequest(jsonBody(r), r.name);
      const t = await resolveSession(d, r);
      const backend = t.s.spec.runtime?.backend ?? 'procbox';
      if (!d.runtime.connectPort)
        throw new RuntimeError(
          'Unsupported',
          `the ${backend} backend of this node cannot reach a port inside a sandbox: no preview can be served`,
        );
      const expires = expiryMs(t.s);
      const { token, record } = await store.mint(
        { namespace: r.namespace!, name: r.name, uid: t.uid },
        port,
        ttlSeconds,
        expires,
      );
      await d.ledger.append(t.uid, 'preview.expose', {
        id: record.id,
        port: record.port,
        expirationTimestamp: record.expirationTimestamp,
      });
      const path = `${PREVIEW_PREFIX}${token}/`;
      const answer = {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSessionPreview',
        session: r.name,
        ...record,
        expiresAt: record.expirationTimestamp,
        url: previewUrl(r, path),
        path,
      };
      return respond({
        status: 201,
        headers: { 'content-type': 'application/json', 'cache-control': 'no-store' },
        body: JSON.stringify(answer),
      });
    },
  };
}
