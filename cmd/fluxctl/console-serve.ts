// The review console's server side: serve's raw route /console/ (registerConsole,
// one hook line in serve.ts). It holds no resource logic of its own:
//   GET  /console/                the single-page app (console/, built into dist/console by
//                                 `make build`) with a strict Content-Security-Policy
//   GET  /console/assets/<file>   its script and styles: chunk-<hash>.js (content-named) cached
//                                 for a year (immutable); app.js and app.css revalidated (ETag,
//                                 304), so the browser keeps them and their compiled code
//   POST /console/auth/login      {token}: a bearer token is checked against the API
//                                 (SelfSubjectReview, as the user) and exchanged for a session
//                                 cookie (HttpOnly, Secure, SameSite=Strict, Path=/console/)
//   POST /console/auth/links      Authorization: Bearer: a single-use 30 s sign-in code for
//                                 `fluxctl console` (console.ts); the page redeems it:
//   POST /console/auth/redeem     {code}
//   GET  /console/auth/whoami     the session's user and CSRF token, or 401
//   POST /console/auth/logout
//   ANY  /console/api/<path>      proxied to the API's /<path> (only /api and /apis) with the
//                                 session's bearer token: the API's own authentication, RBAC,
//                                 admission and audit decide, exactly as for the user's kubectl.
//                                 Watches, event streams and the exec WebSocket (terminal) pass
//                                 through as streams.
// CSRF: the cookie is SameSite=Strict; every state-changing call (any method but GET/HEAD, and
// every WebSocket) must come from this origin (Origin header) and carry the session's CSRF
// token (X-CSRF-Token, or ?csrf= on a WebSocket, which cannot set headers).
// The cookie is scoped to /console/, so it is never sent to /preview/<token>/ (a sandbox's
// page); the preview proxy drops a cookie of this name all the same (preview-proxy.ts).
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { CONSOLE_COOKIE } from '../../controllers/agentsession/preview-proxy.js';
import type { ApiServer } from '../../runtime/apiserver/http/server.js';
import {
  ConsoleSessions,
  type ConsoleSession,
  type ConsoleSessionsOptions,
  type ConsoleUser,
} from './console-sessions.js';

export const CONSOLE_PREFIX = '/console/';
const MAX_AUTH_BODY = 16 * 1024;

/** The page's policy: scripts and styles only from the console's own files, never framed. */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  // xterm.js writes its theme as a <style> element; no script can be inlined.
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

export const PAGE_HEADERS: Record<string, string> = {
  'content-security-policy': CONSOLE_CSP,
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-resource-policy': 'same-origin',
  'cache-control': 'no-store',
};

/** API answers (they may carry sandbox bytes) never run as a page of this origin. */
const API_HEADERS: Record<string, string> = {
  'content-security-policy': "default-src 'none'; sandbox; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-store',
};

const HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'host',
  'cookie',
  'authorization',
  'proxy-authorization',
  'origin',
  'referer',
  'x-csrf-token',
  'content-length',
  'impersonate-user',
  'impersonate-group',
  'impersonate-uid',
]);

const MIME: Record<string, string> = {
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.html': 'text/html; charset=utf-8',
  '.woff2': 'font/woff2',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

export interface ConsoleOptions {
  /** The API's own URL (https://127.0.0.1:PORT): where console API calls go, as the user. */
  apiUrl: string;
  /** The CA that signed the API's certificate (embedded mode). */
  caPem?: string | Buffer;
  /** Where the built console is (default: the repository's dist/console). */
  assetsDir?: string;
  sessions?: ConsoleSessionsOptions;
  log?: { error(msg: string, fields?: Record<string, unknown>): void };
}

/** The built console: dist/console beside this checkout's sources (tsx) or its dist (node). */
export function defaultAssetsDir(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const candidates = [path.resolve(here, '..', '..', 'console'), path.resolve(here, '..', '..', 'dist', 'console')];
  // console/ in a checkout holds the sources (index.html too): the built one has assets/ (content-named files).
  return (
    candidates.find((d) => fs.existsSync(path.join(d, 'assets')) && fs.existsSync(path.join(d, 'index.html'))) ??
    candidates[1]!
  );
}

/** The value of one cookie in a Cookie header. Pure. */
export function cookieValue(header: string | undefined, name: string): string | undefined {
  for (const part of (header ?? '').split(';')) {
    const i = part.indexOf('=');
    if (i > 0 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim();
  }
  return undefined;
}

export function sessionCookie(id: string, maxAgeSeconds: number): string {
  return `${CONSOLE_COOKIE}=${id}; Path=${CONSOLE_PREFIX}; HttpOnly; Secure; SameSite=Strict; Max-Age=${maxAgeSeconds}`;
}

const CLEAR_COOKIE = `${CONSOLE_COOKIE}=; Path=${CONSOLE_PREFIX}; HttpOnly; Secure; SameSite=Strict; Max-Age=0`;

function send(res: ServerResponse, code: number, body: unknown, headers: Record<string, string | string[]> = {}): void {
  const b = Buffer.from(JSON.stringify(body));
  res.writeHead(code, { ...API_HEADERS, 'content-type': 'application/json', 'content-length': b.length, ...headers });
  res.end(b);
}

function status(res: ServerResponse, code: number, reason: string, message: string, headers = {}): void {
  send(
    res,
    code,
    { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code },
    headers,
  );
}

function readBody(req: IncomingMessage, max: number): Promise<Buffer | undefined> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let n = 0;
    req.on('data', (c: Buffer) => {
      n += c.length;
      if (n > max) {
        resolve(undefined);
        req.destroy();
      } else chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', () => resolve(undefined));
  });
}

/** Whether a browser request comes from this origin (Origin matches Host; absent Origin: not a browser POST). */
export function sameOrigin(req: IncomingMessage): boolean {
  const origin = req.headers.origin;
  const host = req.headers.host;
  if (!origin || !host) return false;
  try {
    return new URL(origin).host === host;
  } catch {
    return false;
  }
}

export class ConsoleServer {
  readonly sessions: ConsoleSessions;
  private readonly api: URL;
  private readonly agent: http.Agent;
  private readonly assets: string;

  constructor(private readonly o: ConsoleOptions) {
    this.sessions = new ConsoleSessions(o.sessions);
    this.api = new URL(o.apiUrl);
    this.agent =
      this.api.protocol === 'https:'
        ? new https.Agent({ keepAlive: true, ca: o.caPem, maxSockets: 64 })
        : new http.Agent({ keepAlive: true, maxSockets: 64 });
    this.assets = o.assetsDir ?? defaultAssetsDir();
  }

  close(): void {
    this.agent.destroy();
  }

  private upstream(method: string, p: string, headers: http.OutgoingHttpHeaders): http.ClientRequest {
    const mod = this.api.protocol === 'https:' ? https : http;
    return mod.request({
      protocol: this.api.protocol,
      hostname: this.api.hostname,
      port: this.api.port,
      method,
      path: p,
      headers,
      agent: this.agent,
      ...(this.o.caPem ? { ca: this.o.caPem } : {}),
    });
  }

  /** Who a bearer token is, as the API says (a SelfSubjectReview made with it); undefined: not a valid token. */
  async whoIs(token: string): Promise<ConsoleUser | undefined> {
    const body = Buffer.from(
      JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview', metadata: {} }),
    );
    return new Promise((resolve) => {
      const r = this.upstream('POST', '/apis/authentication.k8s.io/v1/selfsubjectreviews', {
        authorization: `Bearer ${token}`,
        'content-type': 'application/json',
        'content-length': body.length,
      });
      r.on('response', (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          if (res.statusCode !== 201 && res.statusCode !== 200) return resolve(undefined);
          try {
            const j = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
              status?: { userInfo?: { username?: string; groups?: string[] } };
            };
            const u = j.status?.userInfo;
            if (!u?.username || u.username === 'system:anonymous') return resolve(undefined);
            resolve({ username: u.username, groups: u.groups ?? [] });
          } catch {
            resolve(undefined);
          }
        });
      });
      r.on('error', () => resolve(undefined));
      r.end(body);
    });
  }

  private session(req: IncomingMessage): ConsoleSession | undefined {
    return this.sessions.get(cookieValue(req.headers.cookie, CONSOLE_COOKIE));
  }

  private signedIn(res: ServerResponse, user: ConsoleUser, token: string): void {
    const { id, session } = this.sessions.create(user, token);
    send(
      res,
      200,
      { user: session.user, csrf: session.csrf, expiresAt: new Date(session.expiresAt).toISOString() },
      { 'set-cookie': sessionCookie(id, Math.floor((session.expiresAt - session.createdAt) / 1000)) },
    );
  }

  request(req: IncomingMessage, res: ServerResponse): void {
    const url = req.url ?? '/';
    const [pathname, query] = [url.split('?')[0]!, url.includes('?') ? url.slice(url.indexOf('?')) : ''];
    const rest = pathname.slice(CONSOLE_PREFIX.length);
    const method = req.method ?? 'GET';
    if (rest.startsWith('api/')) return void this.proxy(req, res, `/${rest.slice(4)}${query}`);
    if (rest.startsWith('auth/')) return void this.auth(req, res, rest.slice(5), method);
    if (method !== 'GET' && method !== 'HEAD') return status(res, 405, 'MethodNotAllowed', 'method not allowed');
    if (rest.startsWith('assets/')) return this.asset(req, res, rest.slice(7));
    if (rest === '' || rest === 'index.html') return this.asset(req, res, 'index.html', true);
    return status(res, 404, 'NotFound', 'not found');
  }

  /** A built file, read once per change (size and mtime) with its ETag. */
  private readonly files = new Map<string, { mtimeMs: number; size: number; body: Buffer; etag: string }>();

  private readAsset(file: string): { body: Buffer; etag: string } {
    const st = fs.statSync(file);
    const c = this.files.get(file);
    if (c && c.mtimeMs === st.mtimeMs && c.size === st.size) return c;
    const body = fs.readFileSync(file);
    const e = {
      mtimeMs: st.mtimeMs,
      size: st.size,
      body,
      etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 27)}"`,
    };
    this.files.set(file, e);
    return e;
  }

  private asset(req: IncomingMessage, res: ServerResponse, name: string, page = false): void {
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(name)) return status(res, 404, 'NotFound', 'not found');
    const file = path.join(this.assets, page ? name : path.join('assets', name));
    let f: { body: Buffer; etag: string };
    try {
      f = this.readAsset(file);
    } catch {
      if (page)
        return status(
          res,
          503,
          'ServiceUnavailable',
          'the console is not built: run `make build` (it bundles console/ into dist/console)',
        );
      return status(res, 404, 'NotFound', 'not found');
    }
    // The page: never cached (it names the assets of this build). An asset's name carries its
    // content's hash (chunk-, app-, boot-<hash>): cached for good. Any other file: revalidated.
    const cache = page
      ? 'no-store'
      : /^(chunk|app|boot)-[A-Z0-9]+\.(js|css)$/.test(name)
        ? 'public, max-age=31536000, immutable'
        : 'no-cache';
    const headers = {
      ...PAGE_HEADERS,
      'content-type': MIME[path.extname(name)] ?? 'application/octet-stream',
      'cache-control': cache,
      ...(page ? {} : { etag: f.etag }),
    };
    if (!page && req.headers['if-none-match'] === f.etag) {
      res.writeHead(304, headers);
      return void res.end();
    }
    res.writeHead(200, { ...headers, 'content-length': f.body.length });
    res.end(req.method === 'HEAD' ? undefined : f.body);
  }

  private async auth(req: IncomingMessage, res: ServerResponse, what: string, method: string): Promise<void> {
    try {
      if (what === 'whoami' && method === 'GET') {
        const s = this.session(req);
        if (!s) return status(res, 401, 'Unauthorized', 'not signed in');
        return send(res, 200, { user: s.user, csrf: s.csrf, expiresAt: new Date(s.expiresAt).toISOString() });
      }
      if (method !== 'POST') return status(res, 405, 'MethodNotAllowed', 'method not allowed');
      if (what === 'links') {
        // fluxctl console: a bearer token, no browser (a browser never sends Authorization here).
        const m = /^Bearer (\S+)$/.exec(String(req.headers.authorization ?? ''));
        if (!m) return status(res, 401, 'Unauthorized', 'a bearer token is required');
        const user = await this.whoIs(m[1]!);
        if (!user) return status(res, 401, 'Unauthorized', 'Unauthorized');
        const l = this.sessions.link(user, m[1]!);
        return send(res, 201, {
          code: l.code,
          path: `${CONSOLE_PREFIX}#signin=${l.code}`,
          expiresAt: new Date(l.expiresAt).toISOString(),
        });
      }
      // Browser calls: from this origin only (a cross-site page cannot sign a victim in or out).
      if (!sameOrigin(req)) return status(res, 403, 'Forbidden', 'cross-origin request refused');
      if (what === 'logout') {
        const s = this.session(req);
        if (s && req.headers['x-csrf-token'] !== s.csrf)
          return status(res, 403, 'Forbidden', 'missing or wrong CSRF token');
        this.sessions.delete(cookieValue(req.headers.cookie, CONSOLE_COOKIE));
        return send(res, 200, { signedOut: true }, { 'set-cookie': CLEAR_COOKIE });
      }
      if (what !== 'login' && what !== 'redeem') return status(res, 404, 'NotFound', 'not found');
      if (!String(req.headers['content-type'] ?? '').startsWith('application/json'))
        return status(res, 415, 'UnsupportedMediaType', 'application/json is required');
      const raw = await readBody(req, MAX_AUTH_BODY);
      if (!raw) return status(res, 413, 'RequestEntityTooLarge', `the body is limited to ${MAX_AUTH_BODY} bytes`);
      let body: { token?: unknown; code?: unknown };
      try {
        body = JSON.parse(raw.toString('utf8')) as typeof body;
      } catch {
        return status(res, 400, 'BadRequest', 'the body is not JSON');
      }
      if (what === 'redeem') {
        if (typeof body.code !== 'string') return status(res, 400, 'BadRequest', 'code: a string is required');
        const l = this.sessions.redeem(body.code);
        if (!l) return status(res, 401, 'Unauthorized', 'the sign-in link is unknown, used or expired (30 s)');
        return this.signedIn(res, l.user, l.token);
      }
      if (typeof body.token !== 'string' || !body.token.trim() || /\s/.test(body.token.trim()))
        return status(res, 400, 'BadRequest', 'token: a bearer token is required');
      const token = body.token.trim();
      const user = await this.whoIs(token);
      if (!user) return status(res, 401, 'Unauthorized', 'the API does not accept this token');
      return this.signedIn(res, user, token);
    } catch (e) {
      this.o.log?.error('console auth failed', { err: String(e) });
      if (!res.headersSent) status(res, 500, 'InternalError', 'internal error');
    }
  }

  /** The checks of a proxied call: a live session, and for a state change the origin and the CSRF token. */
  private admit(
    req: IncomingMessage,
    csrf: string | undefined,
    stateChanging: boolean,
  ): { session: ConsoleSession } | { code: number; reason: string; message: string } {
    const s = this.session(req);
    if (!s) return { code: 401, reason: 'Unauthorized', message: 'not signed in to the console' };
    if (stateChanging && (!sameOrigin(req) || csrf !== s.csrf))
      return { code: 403, reason: 'Forbidden', message: 'missing or wrong CSRF token, or a cross-origin request' };
    return { session: s };
  }

  private proxy(req: IncomingMessage, res: ServerResponse, target: string): void {
    const method = req.method ?? 'GET';
    const a = this.admit(req, String(req.headers['x-csrf-token'] ?? ''), method !== 'GET' && method !== 'HEAD');
    if ('code' in a) {
      req.resume();
      return status(res, a.code, a.reason, a.message, a.code === 401 ? { 'set-cookie': CLEAR_COOKIE } : {});
    }
    if (!/^\/apis?(\/|\?|$)/.test(target)) return (req.resume(), status(res, 404, 'NotFound', 'not found'));
    const headers: http.OutgoingHttpHeaders = { authorization: `Bearer ${a.session.token}` };
    for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && v !== undefined) headers[k] = v;
    if (req.headers['content-length']) headers['content-length'] = req.headers['content-length'];
    const up = this.upstream(method, target, headers);
    up.on('response', (r) => {
      const out: Record<string, string | string[]> = {};
      for (const [k, v] of Object.entries(r.headers))
        if (v !== undefined && !HOP.has(k) && k !== 'set-cookie' && k !== 'content-security-policy') out[k] = v;
      res.writeHead(r.statusCode ?? 502, { ...out, ...API_HEADERS });
      r.pipe(res);
      res.on('close', () => r.destroy());
    });
    up.on('error', (e) => {
      if (!res.headersSent) status(res, 502, 'BadGateway', `the API did not answer: ${e.message}`);
      else res.destroy();
    });
    res.on('close', () => up.destroy());
    req.pipe(up);
  }

  /** WebSocket (the terminal's exec): the same checks, the CSRF token as ?csrf=, then a byte pipe to the API. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const u = new URL(req.url ?? '/', 'http://x');
    const refuse = (code: number, reason: string, message: string) => {
      const body = JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', message, reason, code });
      socket.end(
        `HTTP/1.1 ${code} ${reason}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
    };
    if (!u.pathname.startsWith(`${CONSOLE_PREFIX}api/`)) return refuse(404, 'NotFound', 'not found');
    const a = this.admit(req, u.searchParams.get('csrf') ?? undefined, true);
    if ('code' in a) return refuse(a.code, a.reason, a.message);
    u.searchParams.delete('csrf');
    const target = `/${u.pathname.slice(CONSOLE_PREFIX.length + 4)}${u.search}`;
    if (!/^\/apis?\//.test(target)) return refuse(404, 'NotFound', 'not found');
    const headers: http.OutgoingHttpHeaders = {
      authorization: `Bearer ${a.session.token}`,
      connection: 'Upgrade',
      upgrade: String(req.headers.upgrade ?? 'websocket'),
    };
    for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && v !== undefined) headers[k] = v;
    const mod = this.api.protocol === 'https:' ? https : http;
    const up = mod.request({
      protocol: this.api.protocol,
      hostname: this.api.hostname,
      port: this.api.port,
      method: 'GET',
      path: target,
      headers,
      ...(this.o.caPem ? { ca: this.o.caPem } : {}),
    });
    up.on('upgrade', (r, upSocket, upHead) => {
      const lines = [`HTTP/1.1 ${r.statusCode ?? 101} ${r.statusMessage ?? 'Switching Protocols'}`];
      for (let i = 0; i < r.rawHeaders.length; i += 2) lines.push(`${r.rawHeaders[i]}: ${r.rawHeaders[i + 1]}`);
      socket.write(lines.join('\r\n') + '\r\n\r\n');
      if (upHead.length) socket.write(upHead);
      if (head.length) upSocket.write(head);
      upSocket.pipe(socket).pipe(upSocket);
      const end = () => (upSocket.destroy(), socket.destroy());
      upSocket.on('error', end).on('close', end);
      socket.on('error', end).on('close', end);
    });
    up.on('response', (r) => {
      const chunks: Buffer[] = [];
      r.on('data', (c: Buffer) => chunks.push(c));
      r.on('end', () => {
        const body = Buffer.concat(chunks);
        socket.end(
          `HTTP/1.1 ${r.statusCode} ${r.statusMessage ?? ''}\r\nConnection: close\r\nContent-Type: ${r.headers['content-type'] ?? 'application/json'}\r\nContent-Length: ${body.length}\r\n\r\n${body.toString('utf8')}`,
        );
      });
    });
    up.on('error', () => refuse(502, 'BadGateway', 'the API did not answer'));
    socket.on('error', () => up.destroy());
    up.end();
  }
}

/** Serves the console at /console/ on `server` (serve.ts's hook). */
export function registerConsole(server: ApiServer, o: ConsoleOptions): ConsoleServer {
  const c = new ConsoleServer(o);
  server.registerRawRoute(CONSOLE_PREFIX, {
    request: (req, res) => c.request(req, res),
    upgrade: (req, socket, head) => c.upgrade(req, socket, head),
  });
  return c;
}
