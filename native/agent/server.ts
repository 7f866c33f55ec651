// The node agent's server: serves one started Runtime over HTTP (optionally HTTPS) to remote
// controllers and API servers, with the wire format of wire.ts. Every request but /healthz
// must carry the bearer token (compared in constant time); anything else is 401 before a
// body is read. The agent does not start or close the runtime: its owner does.
import { timingSafeEqual, createHash } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { AGENT_CLIENT_ORG, isAgentClient } from './identity.js';
import { WebSocketServer, type WebSocket } from 'ws';
import { RuntimeError, type Capabilities, type ExecStream, type Runtime } from '../runtime.js';
import {
  CALLS,
  CH_CONTROL,
  CH_STDERR,
  CH_STDIN,
  CH_STDOUT,
  decode,
  encode,
  errorBody,
  frame,
  httpStatusOf,
  NODE_HEADER,
  ttySizeOf,
  type CallName,
} from './wire.js';

/** How long the agent keeps an idle kept-alive connection open. */
export const AGENT_KEEPALIVE_MS = 65_000;

export interface AgentLogger {
  error(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
}

export interface AgentServerOptions {
  runtime: Runtime;
  /**
   * The bearer token clients must present. Optional with clientCA (mTLS alone); at least one of
   * the two is required.
   */
  token?: string;
  /**
   * mTLS (docs/scale-out.md, "Agent TLS"): PEM CA of the callers' client certificates. Every
   * request but /healthz must then come with a certificate it verifies carrying O
   * fluxvm:node-agent-clients (identity.ts), besides the token when one is set. Needs tls.
   */
  clientCA?: string | Buffer;
  /** The node this agent runs on, reported by GET /v1/info (status.nodeName of its sandboxes). */
  nodeName?: string;
  /** Serve HTTPS with this key pair (PEM). */
  tls?: { cert: string | Buffer; key: string | Buffer };
  /**
   * Admission of the calls that make an instance (`create`; `fork` children and restores act on
   * instances that exist here already): resolves, or throws a RuntimeError (Conflict: the
   * sandbox is bound to another node) that the client gets with its code. The node agent's
   * command checks the id against the Sandboxes bound to its node (cmd/fluxctl/nodeagent.ts).
   */
  admitCreate?(id: string): Promise<void>;
  /**
   * The node whose Sandbox has runtime instance `id` (undefined: none known). Asked only when
   * this runtime answers NotFound for a call naming an instance: an instance bound to another
   * node is then refused (Conflict naming that node), as a request routed for another node is,
   * instead of a NotFound that says the sandbox is gone (cmd/fluxctl/nodeagent-owner.ts).
   */
  holderOf?(id: string): Promise<string | undefined>;
  /** Largest request body (bytes); default 160 MiB (a 64 MiB file as base64 JSON, with room). */
  maxBodyBytes?: number;
  log?: AgentLogger;
}

export interface AgentServer {
  /** Resolves with the bound address; port 0 picks a free port. */
  listen(host: string, port: number): Promise<{ host: string; port: number; url: string }>;
  /** Serves new connections with this key pair (a certificate issued after listen; HTTPS only). */
  setServingCertificate(cert: string | Buffer, key: string | Buffer): void;
  /** Stops accepting, kills running exec streams, closes connections. Safe twice. */
  close(): Promise<void>;
}

const BACKENDS: Array<Capabilities['backend']> = ['procbox', 'vm'];

const silent: AgentLogger = { error() {}, info() {} };

const digest = (s: string) => createHash('sha256').update(s).digest();

/** Creates the agent server (not listening yet). Throws with neither a token nor a client CA (anyone would get in). */
export function createAgentServer(o: AgentServerOptions): AgentServer {
  if (!o.token && !o.clientCA) throw new Error('node agent: with neither a token nor a client CA anyone would get in');
  if (o.clientCA && !o.tls) throw new Error('node agent: client certificates (clientCA) need TLS');
  const log = o.log ?? silent;
  const want = o.token ? digest(o.token) : undefined;
  const maxBody = o.maxBodyBytes ?? 160 * 1024 * 1024;
  const rt = o.runtime;
  const streams = new Set<ExecStream>();

  // Hashing both sides gives equal lengths, so timingSafeEqual never throws or leaks length.
  const authorized = (req: IncomingMessage): boolean => {
    if (o.clientCA) {
      const sock = req.socket as TLSSocket;
      if (!sock.authorized || !isAgentClient(sock.getPeerCertificate())) return false;
    }
    if (!want) return true;
    const h = req.headers.authorization ?? '';
    if (!/^bearer /i.test(h)) return false;
    return timingSafeEqual(digest(h.slice(7).trim()), want);
  };

  const send = (res: ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  };

  const readBody = (req: IncomingMessage): Promise<Buffer> =>
    new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let n = 0;
      req.on('data', (c: Buffer) => {
        n += c.length;
        if (n > maxBody) {
          reject(new RuntimeError('LimitExceeded', `request body over ${maxBody} bytes`));
          req.destroy();
          return;
        }
        chunks.push(c);
      });
      req.on('end', () => resolve(Buffer.concat(chunks)));
      req.on('error', reject);
    });

  // The default backend's capabilities and those of every backend this runtime has (a router
  // over procbox and vm answers for both; capabilities(b).backend !== b means b is absent).
  const info = () => {
    const backends: Partial<Record<Capabilities['backend'], Capabilities>> = {};
    for (const b of BACKENDS) {
      const c = rt.capabilities(b);
      if (c.backend === b) backends[b] = c;
    }
    return { nodeName: o.nodeName ?? '', capabilities: rt.capabilities(), backends };
  };

  /** A request routed for another node (X-Fluxvm-Node): the RuntimeError that refuses it, else undefined. */
  const misrouted = (req: IncomingMessage): RuntimeError | undefined => {
    const want = req.headers[NODE_HEADER];
    if (typeof want !== 'string' || !o.nodeName || want === o.nodeName) return undefined;
    return new RuntimeError(
      'Conflict',
      `this is the node agent of node "${o.nodeName}"; the request was routed for node "${want}" (a sandbox bound to another node is served by that node's agent)`,
    );
  };

  /** A NotFound for instance `id` becomes a Conflict naming the node its Sandbox is bound to, when that is another. */
  const heldElsewhere = async (e: unknown, id: unknown): Promise<unknown> => {
    if (!(e instanceof RuntimeError) || e.code !== 'NotFound' || !o.holderOf || typeof id !== 'string' || !id) return e;
    const node = await o.holderOf(id).catch(() => undefined);
    if (!node || node === o.nodeName) return e;
    return new RuntimeError(
      'Conflict',
      `runtime instance "${id}" is a Sandbox bound to node "${node}"; this is the node agent of node "${o.nodeName ?? ''}" (a sandbox bound to another node is served by that node's agent)`,
    );
  };

  const call = async (method: CallName, args: unknown[]): Promise<unknown> => {
    if (method === 'create' && o.admitCreate) {
      const id = (args[0] as { id?: unknown } | undefined)?.id;
      await o.admitCreate(typeof id === 'string' ? id : '');
    }
    const fn = (rt as unknown as Record<string, ((...a: unknown[]) => Promise<unknown>) | undefined>)[method];
    if (!fn) throw new RuntimeError('Unsupported', `this node's runtime has no ${method}`); // optional methods (freeze, thaw)
    try {
      return await fn.apply(rt, args);
    } catch (e) {
      // Every call but create, list and deleteCheckpoint names an instance first (fork: the parent).
      throw method === 'create' || method === 'list' || method === 'deleteCheckpoint'
        ? e
        : await heldElsewhere(e, args[0]);
    }
  };

  const onRequest = async (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? '/', 'http://agent');
    if (url.pathname === '/healthz' && req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
      return;
    }
    if (!authorized(req)) {
      send(res, 401, {
        error: {
          code: 'Unauthorized',
          message: o.clientCA
            ? `a client certificate of the cluster CA (O ${AGENT_CLIENT_ORG})${want ? ' and a valid bearer token are' : ' is'} required`
            : 'a valid bearer token is required',
        },
      });
      req.resume();
      return;
    }
    try {
      const wrong = misrouted(req);
      if (wrong) {
        req.resume();
        throw wrong;
      }
      if (url.pathname === '/v1/capabilities' && req.method === 'GET') {
        const b = url.searchParams.get('backend') as Capabilities['backend'] | null;
        return send(res, 200, { result: b ? rt.capabilities(b) : rt.capabilities() });
      }
      if (url.pathname === '/v1/info' && req.method === 'GET') return send(res, 200, { result: info() });
      const m = /^\/v1\/call\/([A-Za-z]+)$/.exec(url.pathname);
      if (!m || req.method !== 'POST' || !(CALLS as readonly string[]).includes(m[1])) {
        req.resume();
        return send(res, 404, {
          error: { code: 'NotFound', message: `no such agent call ${req.method} ${url.pathname}` },
        });
      }
      const body = await readBody(req);
      let args: unknown;
      try {
        args = decode((JSON.parse(body.toString('utf8') || '{}') as { args?: unknown }).args ?? []);
      } catch (e) {
        throw new RuntimeError('InvalidArgument', `request body is not JSON: ${(e as Error).message}`);
      }
      if (!Array.isArray(args)) throw new RuntimeError('InvalidArgument', 'args must be an array');
      const result = await call(m[1] as CallName, args);
      send(res, 200, { result: encode(result) ?? null });
    } catch (e) {
      const b = errorBody(e);
      if (b.code === 'Internal')
        log.error('agent call failed', { url: req.url, error: String((e as Error)?.stack ?? e) });
      if (!res.headersSent) send(res, httpStatusOf(b.code), { error: b });
    }
  };

  // mTLS: the certificate is asked for and verified here, refused in `authorized` (a handshake
  // refusal would also fail the kubelet's /healthz probe, which has no client certificate).
  const server = o.tls
    ? https.createServer({
        cert: o.tls.cert,
        key: o.tls.key,
        ...(o.clientCA ? { ca: o.clientCA, requestCert: true, rejectUnauthorized: false } : {}),
      })
    : http.createServer();
  server.requestTimeout = 0; // exec and manifests can run long; the runtime bounds them
  // Idle kept-alive connections stay 65 s (Node's default is 5 s): the callers (API server,
  // controller) come back every few seconds, and every close of an idle connection races a
  // request sent on it (the client's retry in client.ts covers the race that is left).
  server.keepAliveTimeout = AGENT_KEEPALIVE_MS;
  server.headersTimeout = AGENT_KEEPALIVE_MS + 5000;
  server.on('request', (req, res) => void onRequest(req, res));

  const wss = new WebSocketServer({ noServer: true, maxPayload: 16 * 1024 * 1024 });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    const path = (req.url ?? '/').split('?')[0];
    if (!authorized(req))
      return void socket.end('HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    if (path !== '/v1/exec')
      return void socket.end('HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    const wrong = misrouted(req);
    if (wrong) {
      const text = JSON.stringify({ error: errorBody(wrong) });
      return void socket.end(
        `HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`,
      );
    }
    wss.handleUpgrade(req, socket, head, (ws) => serveExec(ws));
  });

  const serveExec = (ws: WebSocket) => {
    let stream: ExecStream | undefined;
    let ended = false;
    const control = (m: Record<string, unknown>) =>
      ws.readyState === ws.OPEN && ws.send(frame(CH_CONTROL, JSON.stringify(m)));
    const pending: Buffer[] = []; // stdin that arrived before the command started
    let eofPending = false;
    ws.on('message', (data: Buffer, isBinary) => {
      if (!isBinary || data.length === 0) return;
      const ch = data[0];
      const payload = data.subarray(1);
      if (ch === CH_STDIN) {
        if (!stream) {
          if (payload.length) pending.push(Buffer.from(payload));
          else eofPending = true;
        } else if (payload.length) stream.stdin.write(Buffer.from(payload));
        else stream.stdin.end();
        return;
      }
      if (ch !== CH_CONTROL) return;
      let msg: { op?: string; id?: unknown; req?: unknown; rows?: unknown; cols?: unknown };
      try {
        msg = JSON.parse(payload.toString('utf8'));
      } catch {
        return void ws.close(1003, 'bad control message');
      }
      if (msg.op === 'kill') return void stream?.kill();
      if (msg.op === 'resize') {
        const size = ttySizeOf(msg);
        return void (size && stream?.resize?.(size));
      }
      if (msg.op !== 'start' || stream || ended) return;
      ended = true; // one command per connection
      void (async () => {
        try {
          stream = await rt.execStream(String(msg.id), decode(msg.req) as Parameters<Runtime['execStream']>[1]);
        } catch (e) {
          control({ op: 'error', ...errorBody(await heldElsewhere(e, msg.id)) });
          return void ws.close(1000);
        }
        const s = stream;
        streams.add(s);
        control({ op: 'started' });
        s.stdin.on('error', () => {}); // the command may exit before reading its input
        for (const p of pending) s.stdin.write(p);
        if (eofPending) s.stdin.end();
        const pipe = (from: NodeJS.ReadableStream, ch: number) =>
          new Promise<void>((resolve) => {
            from.on('data', (d: Buffer) => {
              if (ws.readyState !== ws.OPEN) return;
              ws.send(frame(ch, d));
              // Backpressure: stop reading the command while the socket has a lot unsent.
              if (ws.bufferedAmount > 4 * 1024 * 1024) {
                from.pause();
                const t = setInterval(() => {
                  if (ws.readyState !== ws.OPEN || ws.bufferedAmount < 1024 * 1024) {
                    clearInterval(t);
                    from.resume();
                  }
                }, 10);
              }
            });
            from.on('end', resolve);
            from.on('error', () => resolve());
            from.on('close', resolve);
          });
        const drained = Promise.all([pipe(s.stdout, CH_STDOUT), pipe(s.stderr, CH_STDERR)]);
        try {
          const r = await s.exit;
          await drained;
          control({
            op: 'exit',
            exitCode: r.exitCode,
            ...(r.signal ? { signal: r.signal } : {}),
            timedOut: r.timedOut,
          });
        } catch (e) {
          control({ op: 'error', ...errorBody(e) });
        } finally {
          streams.delete(s);
          ws.close(1000);
        }
      })();
    });
    // A client that goes away kills its command: nobody can read the rest or its exit.
    ws.on('close', () => {
      if (stream && streams.has(stream)) stream.kill();
    });
    ws.on('error', () => {});
  };

  let closing: Promise<void> | undefined;
  return {
    listen(host, port) {
      return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          const a = server.address() as AddressInfo;
          const h = a.family === 'IPv6' ? `[${a.address}]` : a.address;
          log.info('node agent listening', { address: `${h}:${a.port}`, tls: !!o.tls });
          resolve({ host: a.address, port: a.port, url: `${o.tls ? 'https' : 'http'}://${h}:${a.port}` });
        });
      });
    },
    setServingCertificate(cert, key) {
      if (!(server instanceof https.Server)) throw new Error('node agent: serving HTTP, not HTTPS');
      server.setSecureContext({ cert, key, ...(o.clientCA ? { ca: o.clientCA } : {}) });
    },
    close() {
      closing ??= new Promise<void>((resolve) => {
        for (const s of streams) s.kill();
        for (const c of wss.clients) c.terminate();
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
