// The preview proxy: `ANY /preview/<token>/<path>` on serve (outside /apis, no bearer token:
// the URL is the credential) relays HTTP (any method, bodies streamed both ways with
// backpressure) and WebSocket upgrades to the preview's port inside the session's sandbox,
// through Runtime.connectPort (procbox: the sandbox's network namespace, native/procbox/portfwd.ts).
//
// Every request is authorized on its own, also on a kept-alive client connection: the token
// (64 hex) must name a live preview (not expired, not revoked) of a session that still exists
// with that uid, is not being deleted and has not ended. Anything else is the same 404 (one
// constant body: no oracle between unknown, expired, revoked and deleted). A revoked or
// expired preview's open WebSockets are cut. The sandbox sees the path without the prefix.
//
// The page is served on the API's own origin and written by the sandbox (an adversary), so:
// - Content-Security-Policy: sandbox (scripts, forms, popups allowed; no allow-same-origin):
//   the document runs in an opaque origin, so its scripts cannot read the API's responses
//   (the API sends no CORS headers), nor serve's or another preview's storage or cookies;
// - request: Authorization and Proxy-Authorization are dropped (a browser or tool sending
//   serve's bearer token must not hand it to the sandbox), hop-by-hop headers dropped, Host is
//   127.0.0.1:PORT, no Forwarded headers (the sandbox never learns the token);
// - response: hop-by-hop, Clear-Site-Data and Service-Worker-Allowed dropped; Set-Cookie is
//   scoped to this preview's path (Domain removed, Path=/preview/<token>/), so a preview's
//   cookies never reach the API or another preview; Referrer-Policy: no-referrer,
//   Cache-Control: no-store, X-Content-Type-Options: nosniff.
// Limits: per sandbox port at most MAX_SOCKETS upstream connections (kept alive, MAX_FREE idle,
// reused across requests and tokens) and MAX_WAITING queued requests (503 past it); the
// upstream must connect (helper: 5 s) and send response headers within HEADERS_TIMEOUT_MS
// (504). Bodies are piped: a client or upstream that does not read stalls the other side.
import http, { type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Runtime } from '../../native/runtime.js';
import type { Logger } from '../../runtime/controller/index.js';
import { wakeForPreview, wakeFailure } from './preview-wake.js';
import { PREVIEW_PREFIX, PREVIEW_TOKEN_RE, type PreviewEntry, type PreviewStore } from './previews.js';

const MAX_SOCKETS = 32;
const MAX_FREE = 8;
const MAX_WAITING = 256;
const HEADERS_TIMEOUT_MS = 60_000;
/** An idle kept-alive upstream connection is closed after this long. */
const IDLE_MS = 30_000;
export const PREVIEW_CSP = 'sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads';
/**
 * The review console's session cookie (cmd/fluxctl/console-serve.ts). It is scoped to /console/, so a
 * browser does not send it here; should one arrive all the same, it is removed from the Cookie header
 * before the request goes to the sandbox.
 */
export const CONSOLE_COOKIE = 'fluxvm-console';

const HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'proxy-authorization',
  'proxy-authenticate',
  'http2-settings',
]);
const DROP_REQUEST = new Set([
  ...HOP,
  'authorization',
  'host',
  'referer',
  'forwarded',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
  'x-forwarded-prefix',
  'x-real-ip',
]);
const DROP_RESPONSE = new Set([
  ...HOP,
  'clear-site-data',
  'service-worker-allowed',
  'set-cookie',
  'referrer-policy',
  'cache-control',
  'x-content-type-options',
]);

const NOT_FOUND = JSON.stringify({
  kind: 'Status',
  apiVersion: 'v1',
  metadata: {},
  status: 'Failure',
  message: 'the preview does not exist',
  reason: 'NotFound',
  code: 404,
});

function statusBody(code: number, reason: string, message: string): string {
  return JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });
}

/**
 * The token and the rest of a /preview/ URL (the rest starts with '/', query kept); undefined
 * when it is not one. Pure.
 */
export function splitPreviewUrl(url: string): { token: string; rest: string } | undefined {
  if (!url.startsWith(PREVIEW_PREFIX)) return undefined;
  const after = url.slice(PREVIEW_PREFIX.length);
  const end = after.search(/[/?]/);
  const token = end < 0 ? after : after.slice(0, end);
  let rest = end < 0 ? '/' : after.slice(end);
  if (rest.startsWith('?')) rest = '/' + rest;
  return { token, rest };
}

/** Header names listed in a Connection header (also hop-by-hop). */
function connectionTokens(v: string | string[] | undefined): Set<string> {
  const s = new Set<string>();
  for (const x of Array.isArray(v) ? v : v ? [v] : [])
    for (const t of x.split(',')) if (t.trim()) s.add(t.trim().toLowerCase());
  return s;
}

/** A Cookie header without the console's session cookie; undefined when nothing else is left. Pure. */
export function withoutConsoleCookie(v: string): string | undefined {
  const kept = v.split(';').filter((c) => c.trim() && c.split('=')[0]!.trim() !== CONSOLE_COOKIE);
  return kept.length ? kept.map((c) => c.trim()).join('; ') : undefined;
}

/** The request headers sent upstream (rawHeaders, so repeated headers stay as they came). Pure. */
export function upstreamRequestHeaders(raw: string[], port: number, keep: Set<string> = new Set()): string[] {
  const conn = new Set<string>();
  for (let i = 0; i < raw.length; i += 2)
    if (raw[i]!.toLowerCase() === 'connection') for (const t of connectionTokens(raw[i + 1])) conn.add(t);
  const out: string[] = ['Host', `127.0.0.1:${port}`];
  for (let i = 0; i < raw.length; i += 2) {
    const k = raw[i]!.toLowerCase();
    if (!keep.has(k) && (DROP_REQUEST.has(k) || conn.has(k))) continue;
    const v = k === 'cookie' ? withoutConsoleCookie(raw[i + 1]!) : raw[i + 1]!;
    if (v !== undefined) out.push(raw[i]!, v);
  }
  return out;
}

/** A Set-Cookie value scoped to the preview's path: Domain and Path dropped, Path=<prefix> added. Pure. */
export function scopeCookie(v: string, path: string): string {
  const parts = v.split(';');
  const kept = parts.slice(1).filter((a) => !/^\s*(domain|path)\s*(=|$)/i.test(a));
  return [parts[0], ...kept.map((a) => a.trim()).filter(Boolean), `Path=${path}`].join('; ');
}

/** The response headers sent to the client. Pure. */
export function clientResponseHeaders(res: IncomingMessage, cookiePath: string): Record<string, string | string[]> {
  const conn = connectionTokens(res.headers.connection);
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(res.headers)) {
    if (v === undefined || DROP_RESPONSE.has(k) || conn.has(k)) continue;
    out[k] = v;
  }
  const csp = res.headers['content-security-policy'];
  out['content-security-policy'] = csp ? [...(Array.isArray(csp) ? csp : [csp]), PREVIEW_CSP] : PREVIEW_CSP;
  const cookies = res.headers['set-cookie'];
  if (cookies?.length) out['set-cookie'] = cookies.map((c) => scopeCookie(c, cookiePath));
  out['referrer-policy'] = 'no-referrer';
  out['cache-control'] = 'no-store';
  out['x-content-type-options'] = 'nosniff';
  return out;
}

/** An http.Agent whose connections are Runtime.connectPort streams into one sandbox port. */
class PortAgent extends http.Agent {
  waiting = 0;
  constructor(
    private readonly runtime: Runtime,
    private readonly sandboxId: string,
    private readonly port: number,
  ) {
    super({ keepAlive: true, maxSockets: MAX_SOCKETS, maxFreeSockets: MAX_FREE, timeout: IDLE_MS, scheduling: 'lifo' });
  }
  // http.Agent accepts an asynchronous createConnection (the callback form).
  override createConnection(_o: unknown, cb: (err: Error | null, s?: Duplex) => void): undefined {
    this.runtime.connectPort!(this.sandboxId, this.port).then(
      (s) => cb(null, s),
      (e: Error) => cb(e),
    );
    return undefined;
  }
}

export interface PreviewProxyOptions {
  store: PreviewStore;
  /** The node's runtime; until attachRuntime gives one, every preview is the 404. */
  runtime?: Runtime;
  log?: Logger;
}

/** Serves /preview/ (register on the API server as a raw route). */
export class PreviewProxy {
  private readonly agents = new Map<string, PortAgent>();
  /** Open WebSocket tunnels by token hash: cut when the preview is revoked, forgotten or expires. */
  private readonly tunnels = new Map<string, Set<Duplex>>();

  constructor(private readonly o: PreviewProxyOptions) {
    o.store.onRevoke((hashes) => {
      for (const h of hashes) this.cut(h);
    });
  }

  /** The runtime comes up after the API server listens (cmd/fluxctl/serve.ts). */
  attachRuntime(rt: Runtime): void {
    this.o.runtime = rt;
  }

  private cut(hash: string): void {
    for (const s of this.tunnels.get(hash) ?? []) s.destroy();
    this.tunnels.delete(hash);
  }

  /** The sandbox a live preview reaches now, or undefined (then the answer is the one 404). */
  private async target(token: string): Promise<{ e: PreviewEntry; sandboxId: string } | undefined> {
    const e = this.o.store.lookup(token);
    const t = this.o.store.targets;
    if (!e || !t || !this.o.runtime?.connectPort) return undefined;
    const s = await t.session(e.namespace, e.name);
    if (!s || s.metadata.uid !== e.uid || s.metadata.deletionTimestamp) return undefined;
    const ph = s.status?.phase;
    if (ph === 'Expired' || ph === 'Failed' || ph === 'Terminating') return undefined;
    const sbx = await t.sandbox(e.namespace, e.name);
    if (!sbx?.metadata?.uid || sbx.metadata.deletionTimestamp) return undefined;
    // Re-checked after the awaits: a revoke that landed meanwhile wins.
    if (this.o.store.lookup(token) !== e) return undefined;
    return wakeForPreview(this.o.runtime, { e, sandboxId: sbx.metadata.uid }); // held while it wakes from standby
  }

  private agent(sandboxId: string, port: number): PortAgent {
    const k = `${sandboxId}:${port}`;
    let a = this.agents.get(k);
    if (!a) {
      a = new PortAgent(this.o.runtime!, sandboxId, port);
      this.agents.set(k, a);
    }
    return a;
  }

  /** An HTTP request under /preview/. */
  request(req: IncomingMessage, res: ServerResponse): void {
    const fail = (code: number, reason: string, message: string) => {
      if (res.headersSent) return void res.destroy();
      res.writeHead(code, {
        'content-type': 'application/json',
        'cache-control': 'no-store',
        'referrer-policy': 'no-referrer',
      });
      res.end(code === 404 ? NOT_FOUND : statusBody(code, reason, message));
    };
    const parts = splitPreviewUrl(req.url ?? '/');
    if (!parts || !PREVIEW_TOKEN_RE.test(parts.token)) {
      req.resume();
      return fail(404, 'NotFound', '');
    }
    this.target(parts.token).then(
      (t) => {
        if (!t) {
          req.resume();
          return fail(404, 'NotFound', '');
        }
        if (req.url === `${PREVIEW_PREFIX}${parts.token}`) {
          // The preview's root needs the trailing slash for the page's relative URLs.
          req.resume();
          res.writeHead(308, {
            location: `${PREVIEW_PREFIX}${parts.token}/`,
            'cache-control': 'no-store',
            'referrer-policy': 'no-referrer',
          });
          return void res.end();
        }
        this.forward(req, res, t.sandboxId, t.e.preview.port, `${PREVIEW_PREFIX}${parts.token}/`, parts.rest, fail);
      },
      (e: unknown) => {
        this.o.log?.error('preview: resolving the session failed', { error: String(e) });
        req.resume();
        fail(503, 'ServiceUnavailable', wakeFailure(e) ?? 'the preview cannot be reached right now');
      },
    );
  }

  private forward(
    req: IncomingMessage,
    res: ServerResponse,
    sandboxId: string,
    port: number,
    cookiePath: string,
    path: string,
    fail: (code: number, reason: string, message: string) => void,
  ): void {
    const agent = this.agent(sandboxId, port);
    if (agent.waiting >= MAX_WAITING) {
      req.resume();
      return fail(503, 'ServiceUnavailable', `the preview has ${MAX_WAITING} requests in flight: try again`);
    }
    agent.waiting++;
    let settled = false;
    const done = () => {
      if (!settled) ((settled = true), agent.waiting--);
    };
    const up = http.request({
      agent,
      method: req.method,
      path,
      headers: upstreamRequestHeaders(req.rawHeaders, port) as unknown as OutgoingHttpHeaders,
      setHost: false,
    });
    const timer = setTimeout(() => {
      up.destroy();
      done();
      fail(
        504,
        'Timeout',
        `the server on port ${port} of the session sent no response headers within ${HEADERS_TIMEOUT_MS / 1000} s`,
      );
    }, HEADERS_TIMEOUT_MS);
    up.on('response', (ures) => {
      clearTimeout(timer);
      if (res.destroyed) {
        ures.destroy();
        return done();
      }
      res.writeHead(ures.statusCode ?? 502, ures.statusMessage, clientResponseHeaders(ures, cookiePath));
      ures.pipe(res);
      ures.on('end', done);
      ures.on('error', () => {
        done();
        res.destroy();
      });
    });
    up.on('error', (e: NodeJS.ErrnoException & { code?: string }) => {
      clearTimeout(timer);
      done();
      const why = e instanceof Error ? e.message : String(e);
      fail(502, 'BadGateway', `the preview's port ${port} in the session did not answer: ${why}`);
    });
    // The client left: the upstream request (and its connection) is dropped.
    res.on('close', () => {
      if (!res.writableFinished) {
        clearTimeout(timer);
        up.destroy();
        done();
      }
    });
    req.pipe(up);
  }

  /** A WebSocket (any Upgrade) under /preview/: bridged to the sandbox port after the same check. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on('error', () => undefined);
    const refuse = (code: number, reason: string, body: string) => {
      if (!socket.writable) return void socket.destroy();
      socket.end(
        `HTTP/1.1 ${code} ${reason}\r\nConnection: close\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
    };
    const parts = splitPreviewUrl(req.url ?? '/');
    if (!parts || !PREVIEW_TOKEN_RE.test(parts.token)) return refuse(404, 'Not Found', NOT_FOUND);
    this.target(parts.token).then(
      (t) => {
        if (!t) return refuse(404, 'Not Found', NOT_FOUND);
        const hash = t.e.preview.sha256;
        const port = t.e.preview.port;
        const keep = new Set(['upgrade', 'connection']);
        const up = http.request({
          method: req.method,
          path: parts.rest,
          headers: upstreamRequestHeaders(req.rawHeaders, port, keep) as unknown as OutgoingHttpHeaders,
          setHost: false,
          createConnection: ((_o: unknown, cb: (err: Error | null, s?: Duplex) => void) => {
            this.o.runtime!.connectPort!(t.sandboxId, port).then(
              (s) => cb(null, s),
              (e: Error) => cb(e),
            );
            return undefined;
          }) as unknown as http.RequestOptions['createConnection'],
        });
        const timer = setTimeout(() => {
          up.destroy();
          refuse(504, 'Gateway Timeout', statusBody(504, 'Timeout', 'the preview did not answer the upgrade in time'));
        }, HEADERS_TIMEOUT_MS);
        socket.once('close', () => {
          clearTimeout(timer);
          up.destroy();
        });
        up.on('upgrade', (ures, usock, uhead) => {
          clearTimeout(timer);
          if (socket.destroyed || !this.o.store.lookup(parts.token)) {
            usock.destroy();
            return void socket.destroy();
          }
          const lines = [`HTTP/1.1 101 ${ures.statusMessage || 'Switching Protocols'}`];
          for (let i = 0; i < ures.rawHeaders.length; i += 2) {
            const k = ures.rawHeaders[i]!.toLowerCase();
            if (k === 'set-cookie' || k === 'clear-site-data' || /[\r\n]/.test(ures.rawHeaders[i + 1]!)) continue;
            lines.push(`${ures.rawHeaders[i]}: ${ures.rawHeaders[i + 1]}`);
          }
          socket.write(lines.join('\r\n') + '\r\n\r\n');
          if (uhead.length) socket.write(uhead);
          if (head.length) usock.write(head);
          let set = this.tunnels.get(hash);
          if (!set) this.tunnels.set(hash, (set = new Set()));
          set.add(socket);
          const left = t.e.expiresMs - this.o.store.now();
          const expiry = setTimeout(() => socket.destroy(), Math.max(0, Math.min(left, 2 ** 31 - 1)));
          usock.on('error', () => socket.destroy());
          socket.once('close', () => {
            clearTimeout(expiry);
            usock.destroy();
            set!.delete(socket);
          });
          usock.once('close', () => socket.destroy());
          socket.pipe(usock);
          usock.pipe(socket);
        });
        up.on('response', (ures) => {
          clearTimeout(timer);
          ures.resume();
          refuse(
            502,
            'Bad Gateway',
            statusBody(
              502,
              'BadGateway',
              `the preview's port ${port} answered the upgrade with ${ures.statusCode}, not 101`,
            ),
          );
        });
        up.on('error', (e: Error) => {
          clearTimeout(timer);
          refuse(
            502,
            'Bad Gateway',
            statusBody(502, 'BadGateway', `the preview's port ${port} in the session did not answer: ${e.message}`),
          );
        });
        up.end();
      },
      (e: unknown) =>
        refuse(
          503,
          'Service Unavailable',
          statusBody(503, 'ServiceUnavailable', wakeFailure(e) ?? 'the preview cannot be reached right now'),
        ),
    );
  }

  /** Drops the kept-alive upstream connections and cuts every tunnel (server close). */
  close(): void {
    for (const a of this.agents.values()) a.destroy();
    this.agents.clear();
    for (const h of [...this.tunnels.keys()]) this.cut(h);
  }
}
