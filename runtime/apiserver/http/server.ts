// The API server's HTTP layer (fastify): routing, discovery, /openapi/v3, /version, health,
// metrics and the resource verbs. It decodes requests, calls the RegistryApi and encodes
// responses; every storage semantic lives in the registry. See
// docs/reference/kubernetes-api.md for the wire contract this follows.
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { KindDefinition } from '../../../apis/types.js';
import { errors, isStatusError } from '../../meta/errors.js';
import type { KubeObject } from '../../meta/types.js';
import type { AuditRecord } from '../auth/audit.js';
import type { RegistryApi, RequestContext, UserInfo } from '../registry-types.js';
import {
  ANONYMOUS,
  forbidden,
  type Attributes,
  type Authenticator,
  type Authorizer,
  type ResourceAttributes,
} from './auth.js';
import {
  aggregatedDiscovery,
  apiGroup,
  apiGroupList,
  apiResourceList,
  apiVersions,
  DEFAULT_SUBRESOURCE_VERBS,
  groupVersions,
  type GroupVersion,
  type SubresourceInfo,
} from './discovery.js';
import { Metrics, type RequestLabels } from '../../metrics/metrics.js';
import { aggregatedContentType, decodeBody, discoveryShape } from './negotiate.js';
import { OpenAPIServer, type OpenAPIBuilder } from './openapi.js';
import { parseApiPath, notFoundResource, type ApiPath } from './paths.js';
import { ResourceHandler, type Resolved } from './resources.js';
import { SubresourceRegistry, type SubresourceHandler } from './subresources.js';
import {
  armRequestDeadline,
  clientErrorHandler,
  installRawGuards,
  serverTimeoutOptions,
  type ConnectionTimeouts,
} from './hardening.js';
import { installAuditHooks } from './audit-hooks.js';
import { installAuthHook } from './authn-hook.js';
import { drainRequest } from './drain.js';
import { redactRawPath, type RawRoute } from './rawroutes.js';
import { DEFAULT_BODY_LIMIT, sendError, toStatusError, type Logger } from './status.js';
import { createUpgradeHandler } from './upgrade.js';

export type { SubresourceHandler, SubresourceRequest, SubresourceUpgradeRequest } from './subresources.js';
export { redactRawPath, type RawRoute } from './rawroutes.js';
export { DEFAULT_BODY_LIMIT, sendError, toStatusError, type Logger } from './status.js';

export interface ApiServerOptions extends ConnectionTimeouts {
  registry: RegistryApi;
  kinds: KindDefinition[];
  log?: Logger;
  /**
   * Where request, watch and error metrics go, and what /metrics serves (one registry per
   * process: the controllers of serve report into the same one). Default: a new one.
   */
  metrics?: Metrics;
  /** Request body limit in bytes; default 3 MiB (kube-apiserver's). Larger bodies get 413. */
  bodyLimit?: number;
  /** Subresource handlers registered at start; more can be added with registerSubresource. */
  subresources?: Array<{ plural: string; name: string; handler: SubresourceHandler }>;
  /** Builds the /openapi/v3 group-version documents; default apis/openapi.ts. */
  openapi?: OpenAPIBuilder;
  /** How long a watch without timeoutSeconds is held, in seconds: random in [min, max). Default 1800-3600. */
  watchHoldSeconds?: [number, number];
  /** Unsent bytes a watch may buffer for a client that does not read before it is ended; default 64 MiB. */
  maxWatchBuffer?: number;
  /** How long close() lets in-flight requests finish before destroying their sockets; default 5000 ms. */
  closeGraceMs?: number;
  /** Clock for Table ages; default Date.now. */
  now?: () => number;
  /**
   * Serve HTTPS (aggregated mode). Client certificates are requested but not required; the
   * authenticators decide what a certificate proves.
   */
  https?: { key: string | Buffer; cert: string | Buffer; ca?: string | Buffer | Array<string | Buffer> };
  /** Who a request is; absent: no authentication (embedded mode, loopback). */
  authenticate?: Authenticator;
  /** What a user may do; absent: everything. Called per request after authentication. */
  authorize?: Authorizer;
  /**
   * Create-only resources answered without storage (the access reviews), keyed
   * `group/resource`: POST returns the handler's object with 201; other verbs are 405.
   */
  virtual?: Record<string, (body: KubeObject, ctx: RequestContext) => Promise<KubeObject> | KubeObject>;
  /** Called once per request when its response is complete (the audit log). Must not throw. */
  audit?: (r: AuditRecord) => void;
  /**
   * Whether /readyz answers 200; false: 503 (the server is draining after SIGTERM, so load
   * balancers stop sending new work while the API still answers). Default: always ready.
   */
  ready?: () => boolean;
}

export interface ApiServer {
  app: FastifyInstance;
  metrics: Metrics;
  /** Serves `<plural>/<name>` with the handler (replacing an earlier one); shown in discovery. */
  registerSubresource(plural: string, name: string, handler: SubresourceHandler): void;
  /**
   * Serves every path under `prefix` (e.g. `/preview/`) with `route`, outside the API: no
   * authentication, authorization, audit or body parsing (the route does its own checks and
   * streams). The request log shows such a path as `<prefix><redacted>`: the segment after the
   * prefix may be a credential.
   */
  registerRawRoute(prefix: string, route: RawRoute): void;
  /** Starts listening; resolves with the bound address (port 0 picks a free port). */
  listen(host: string, port: number): Promise<{ host: string; port: number; url: string }>;
  /**
   * Graceful stop: ends every open watch, stops accepting, lets in-flight requests finish
   * for up to closeGraceMs, then destroys what is left. Safe to call twice.
   */
  close(): Promise<void>;
}

/** A handler of a path prefix outside the API (ApiServer.registerRawRoute). */

export const VERSION_INFO = {
  major: '1',
  minor: '32',
  gitVersion: 'v1.32.0-fluxvm',
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2026-01-01T00:00:00Z',
  goVersion: `node${process.versions.node}`,
  compiler: 'tsc',
  platform: `${process.platform}/${process.arch === 'x64' ? 'amd64' : process.arch}`,
};

declare module 'fastify' {
  interface FastifyRequest {
    fluxLabels?: RequestLabels;
    /** Set by authentication when the server has an authenticator. */
    fluxUser?: UserInfo;
    /** The authorization attributes of a resource request (audit objectRef). */
    fluxResource?: ResourceAttributes;
    /** The response body of a request audited at RequestResponse level. */
    fluxAuditResponse?: unknown;
  }
}

/**
 * Creates the API server. Nothing listens until `listen`; `app.inject` works at once.
 * Throws when a kind's printer column has an invalid JSONPath.
 */
export function createApiServer(opts: ApiServerOptions): ApiServer {
  const log: Logger = opts.log ?? { error: (m, f) => console.error(m, f ?? '') };
  const metrics = opts.metrics ?? new Metrics();
  const subs = new SubresourceRegistry();
  for (const s of opts.subresources ?? []) subs.register(s.plural, s.name, s.handler);
  const groups = groupVersions(opts.kinds);
  const coreVersions = groups.get('') ?? [];
  const openapi = new OpenAPIServer(groups, opts.openapi);

  const subLookup = (k: KindDefinition): Array<[string, SubresourceInfo]> => {
    const fields = Object.keys(k.fieldSubresources ?? {});
    const names = [...new Set([...fields, ...(k.customSubresources ?? []), ...subs.names(k.plural)])];
    return names.map((n) => {
      if (fields.includes(n)) return [n, { verbs: ['get', 'patch', 'update'] }];
      const h = subs.get(k.plural, n);
      return [n, { verbs: h?.verbs ?? DEFAULT_SUBRESOURCE_VERBS, responseKind: h?.responseKind }];
    });
  };

  const resources = new ResourceHandler({
    registry: opts.registry,
    kinds: opts.kinds,
    subresources: subs,
    metrics,
    watchHoldSeconds: opts.watchHoldSeconds ?? [1800, 3600],
    maxWatchBuffer: opts.maxWatchBuffer ?? 64 * 1024 * 1024,
    now: opts.now ?? Date.now,
  });

  // The timeouts bound how long a request takes to *arrive*: Node's for the head (slowloris
  // headers), armRequestDeadline's for the body (trickled, or a streamed one that stalls); a
  // response, such as a watch, is not limited by them.
  const timeouts = serverTimeoutOptions(opts);
  const fastifyOpts: Record<string, unknown> = {
    logger: false,
    bodyLimit: opts.bodyLimit ?? DEFAULT_BODY_LIMIT,
    requestTimeout: 0,
    keepAliveTimeout: timeouts.keepAliveTimeout,
    http: {
      headersTimeout: timeouts.headersTimeout,
      requestTimeout: 0,
      connectionsCheckingInterval: timeouts.connectionsCheckingInterval,
    },
    // A connection the server closes for a client error (a timeout, a malformed request) is
    // logged: without it a cut-off client saw ECONNRESET and the log said nothing.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket: Duplex) => {
      if (err.code !== 'ECONNRESET' && !socket.destroyed)
        log.warn?.('closing a connection: client error', {
          code: err.code,
          message: err.message,
          inRequest: !!(socket as Duplex & { _httpMessage?: unknown })._httpMessage,
          bytesRead: (socket as Duplex & { bytesRead?: number }).bytesRead,
        });
      clientErrorHandler(err, socket);
    },
    // Router-level refusals (a malformed URL) are Status bodies too.
    frameworkErrors: (err: unknown, req: FastifyRequest, reply: FastifyReply) => {
      const e = err as { code?: string; message?: string };
      sendError(
        reply,
        e?.code === 'FST_ERR_BAD_URL'
          ? errors.badRequest(`malformed path: ${e.message ?? ''}`)
          : toStatusError(err, req, log),
      );
    },
    // Idle keep-alive connections close at once on close(); in-flight requests get a grace
    // period (see close) before their sockets are destroyed.
    forceCloseConnections: 'idle',
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 2048 },
  };
  if (opts.https)
    fastifyOpts.https = {
      ...opts.https,
      requestCert: true,
      rejectUnauthorized: false,
      headersTimeout: timeouts.headersTimeout,
      requestTimeout: 0,
      connectionsCheckingInterval: timeouts.connectionsCheckingInterval,
    };
  // The https variant only changes the raw server type; the routes below are the same.
  const app = Fastify(fastifyOpts) as unknown as FastifyInstance;
  installRawGuards(app.server);
  // Raw routes (registerRawRoute) take their requests before fastify sees them.
  const rawRoutes = new Map<string, RawRoute>();
  const rawRouteOf = (url: string | undefined) => {
    for (const [p, r] of rawRoutes) if ((url ?? '').startsWith(p)) return { prefix: p, route: r };
    return undefined;
  };
  const fastifyListeners = app.server.listeners('request') as Array<
    (req: IncomingMessage, res: ServerResponse) => void
  >;
  app.server.removeAllListeners('request');
  app.server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    armRequestDeadline(req, timeouts.requestTimeout, (what) =>
      log.warn?.('request body not received in time: 408', {
        verb: (req.method ?? 'GET').toLowerCase(),
        path: redactRawPath(req.url ?? '/', rawRoutes.keys()),
        ...what,
      }),
    );
    // A body cut off before its end (the client went away, or the connection broke) is logged
    // with the bytes read and the socket's error: the request log has no line for a request that
    // never completed.
    req.once('close', () => {
      if (req.complete || res.headersSent) return;
      log.info?.('request body cut off: the connection closed before its end', {
        verb: (req.method ?? 'GET').toLowerCase(),
        path: redactRawPath(req.url ?? '/', rawRoutes.keys()),
        bytesRead: req.socket.bytesRead,
        socketError: (req.socket as { errored?: Error | null }).errored?.message,
      });
    });
    const raw = rawRouteOf(req.url);
    if (!raw) {
      for (const l of fastifyListeners) l.call(app.server, req, res);
      return;
    }
    const started = performance.now();
    res.once('close', () => {
      const seconds = (performance.now() - started) / 1000;
      metrics.observe(
        {
          verb: req.method ?? 'GET',
          group: '',
          version: '',
          resource: raw.prefix.replace(/\/$/, ''),
          subresource: '',
          scope: '',
        },
        res.statusCode,
        seconds,
      );
      log.info?.('request completed', {
        verb: (req.method ?? 'GET').toLowerCase(),
        path: `${raw.prefix}<redacted>`,
        code: res.statusCode,
        latencyMs: Math.round(seconds * 1e6) / 1000,
      });
    });
    try {
      raw.route.request(req, res);
    } catch (e) {
      log.error('raw route failed', { path: `${raw.prefix}<redacted>`, err: String(e) });
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end();
    }
  });

  const authorizeAttrs = async (attrs: Attributes) => {
    if (!opts.authorize) return;
    const d = await opts.authorize(attrs);
    if (!d.allowed) throw forbidden(attrs, d.reason);
  };
  const audit = opts.audit;
  if (audit)
    installAuditHooks(app, audit, (url) =>
      rawRouteOf(url) ? redactRawPath(url ?? '/', rawRoutes.keys()) : (url ?? '/'),
    );
  if (opts.authenticate || opts.authorize) installAuthHook(app, opts.authenticate, authorizeAttrs);

  // One raw parser for every media type (including none): the handlers decode by
  // Content-Type themselves, so a malformed body is a 400 Status and an unknown type a 415.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  // Archives stream (sandboxes/tar): not read here, so no body limit; the handler reads
  // req itself with backpressure and bounds what it accepts.
  app.addContentTypeParser('application/x-tar', (_req, _payload, done) => done(null, undefined));
  // Upload chunks (uploads/ID?offset=N, tus's media type) likewise: the handler streams the
  // body to its staging file and refuses past its own limit (4 MiB), above this server's.
  app.addContentTypeParser('application/offset+octet-stream', (_req, _payload, done) => done(null, undefined));

  app.addHook('onResponse', async (req, reply) => {
    const l = req.fluxLabels ?? nonResourceLabels(req);
    metrics.observe(l, reply.statusCode, reply.elapsedTime / 1000);
    // The request log: one line per finished request, after authentication set the user.
    log.info?.('request completed', {
      reqId: req.id,
      user: req.fluxUser?.name ?? (opts.authenticate ? ANONYMOUS.name : undefined),
      verb: req.fluxResource?.verb ?? l.verb.toLowerCase(),
      path: redactRawPath(req.raw.url ?? '/', rawRoutes.keys()),
      code: reply.statusCode,
      latencyMs: Math.round(reply.elapsedTime * 1000) / 1000,
    });
  });

  app.setErrorHandler((err: unknown, req, reply) => {
    const status = toStatusError(err, req, log);
    if (status.code === 500 && !isStatusError(err)) metrics.unexpectedError();
    // A body over the limit is refused before it is read: read (and drop) the rest first, so
    // a client still writing it (kubectl) gets the 413 instead of a broken pipe.
    if (status.code === 413 && !req.raw.complete && !req.raw.readableEnded && !req.raw.destroyed)
      return drainRequest(req.raw).then(() => sendError(reply, status));
    sendError(reply, status);
  });
  app.setNotFoundHandler((_req, reply) => {
    sendError(reply, notFoundResource());
  });

  const sendJSON = (reply: FastifyReply, code: number, body: unknown, contentType = 'application/json') =>
    reply
      .code(code)
      .header('content-type', contentType)
      .header('cache-control', 'no-cache, private')
      .send(Buffer.from(JSON.stringify(body)));

  // --- health, version, metrics -------------------------------------------------------------
  for (const p of ['/healthz', '/readyz', '/livez']) {
    const health = async (_req: unknown, reply: FastifyReply) =>
      p === '/readyz' && opts.ready && !opts.ready()
        ? reply
            .code(503)
            .header('content-type', 'text/plain; charset=utf-8')
            .send(Buffer.from('[-]shutdown: the server is shutting down\nreadyz check failed'))
        : reply.code(200).header('content-type', 'text/plain; charset=utf-8').send(Buffer.from('ok'));
    app.get(p, health);
    app.get(`${p}/*`, health);
  }
  app.get('/version', async (_req, reply) => sendJSON(reply, 200, VERSION_INFO));
  app.get('/metrics', async (_req, reply) =>
    reply
      .code(200)
      .header('content-type', metrics.contentType)
      .send(Buffer.from(await metrics.render())),
  );
  app.get('/', async (_req, reply) =>
    sendJSON(reply, 200, {
      paths: [
        '/api',
        '/api/v1',
        '/apis',
        ...[...groups.keys()].filter(Boolean).map((g) => `/apis/${g}`),
        '/healthz',
        '/livez',
        '/metrics',
        '/openapi/v2',
        '/openapi/v3',
        '/readyz',
        '/version',
      ],
    }),
  );

  // --- openapi -----------------------------------------------------------------------------
  app.get('/openapi/v3', async (_req, reply) => sendJSON(reply, 200, await openapi.index()));
  app.get('/openapi/v3/*', async (req, reply) => openapi.serve(req, reply));
  app.get('/openapi/v2', async (req, reply) => openapi.serveV2(req, reply));

  // --- discovery ---------------------------------------------------------------------------
  const discoveryCache = new Map<string, { body: Buffer; etag: string }>();
  let discoveryGen = -1;
  const cachedJSON = (key: string, build: () => unknown) => {
    if (discoveryGen !== subs.generation) {
      discoveryCache.clear();
      discoveryGen = subs.generation;
    }
    let c = discoveryCache.get(key);
    if (!c) {
      const body = Buffer.from(JSON.stringify(build()));
      c = { body, etag: `"${createHash('sha256').update(body).digest('hex').slice(0, 32)}"` };
      discoveryCache.set(key, c);
    }
    return c;
  };
  const serveDiscovery = (req: FastifyRequest, reply: FastifyReply, which: 'core' | 'named') => {
    const shape = discoveryShape(req.headers.accept);
    if (shape.kind === 'aggregated') {
      const c = cachedJSON(`agg/${which}/${shape.version}`, () =>
        aggregatedDiscovery(groups, which, shape.version, subLookup),
      );
      reply.header('etag', c.etag).header('vary', 'Accept');
      if (req.headers['if-none-match'] === c.etag) return reply.code(304).send();
      return reply.code(200).header('content-type', aggregatedContentType(shape.version)).send(c.body);
    }
    if (which === 'core') {
      if (coreVersions.length === 0) return sendError(reply, notFoundResource());
      return sendJSON(reply, 200, apiVersions(coreVersions, hostOf(req)));
    }
    return reply
      .code(200)
      .header('content-type', 'application/json')
      .send(cachedJSON('legacy/apis', () => apiGroupList(groups)).body);
  };

  const gvOf = (p: ApiPath): GroupVersion | undefined => groups.get(p.group)?.find((v) => v.version === p.version);

  // --- resources ---------------------------------------------------------------------------
  const apiHandler = async (req: FastifyRequest, reply: FastifyReply) => {
    const pathname = (req.raw.url ?? '/').split('?')[0];
    const parsed = parseApiPath(pathname);
    if (parsed === undefined) {
      if (req.method !== 'GET')
        throw errors.methodNotAllowed('the server does not allow this method on the requested resource');
      return serveDiscovery(req, reply, pathname.startsWith('/apis') ? 'named' : 'core');
    }
    if ('groupOnly' in parsed) {
      const versions = groups.get(parsed.groupOnly);
      if (!versions || parsed.groupOnly === '') throw notFoundResource();
      if (req.method !== 'GET')
        throw errors.methodNotAllowed('the server does not allow this method on the requested resource');
      return sendJSON(reply, 200, apiGroup(parsed.groupOnly, versions));
    }
    const gv = gvOf(parsed);
    if (!gv) throw notFoundResource();
    if (parsed.resource === undefined) {
      req.fluxLabels = { verb: 'GET', group: gv.group, version: gv.version, resource: '', subresource: '', scope: '' };
      if (req.method !== 'GET')
        throw errors.methodNotAllowed('the server does not allow this method on the requested resource');
      return reply
        .code(200)
        .header('content-type', 'application/json')
        .send(cachedJSON(`legacy/${gv.group}/${gv.version}`, () => apiResourceList(gv, subLookup)).body);
    }
    const kind = gv.kinds.find((k) => k.plural === parsed.resource);
    if (!kind) throw notFoundResource();
    // A namespaced kind is addressed per namespace (or across all for collections); a
    // cluster-scoped kind never has a namespace.
    if (
      kind.namespaced ? parsed.name !== undefined && parsed.namespace === undefined : parsed.namespace !== undefined
    ) {
      throw notFoundResource();
    }
    const virtual = opts.virtual?.[`${gv.group}/${kind.plural}`];
    if (virtual) {
      if (req.method !== 'POST' || parsed.name !== undefined)
        throw errors.methodNotAllowed('the server does not allow this method on the requested resource');
      const body = decodeBody(req.headers['content-type'], req.body as Buffer | undefined) as KubeObject;
      const out = await virtual(body, {
        userAgent: req.headers['user-agent'],
        ...(req.fluxUser ? { user: req.fluxUser } : {}),
      });
      return sendJSON(reply, 201, out);
    }
    const r: Resolved = { path: parsed, kind, gvr: { group: gv.group, version: gv.version, resource: kind.plural } };
    return resources.handle(req, reply, r);
  };
  for (const url of ['/api', '/api/*', '/apis', '/apis/*']) {
    app.route({ method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'], url, handler: apiHandler });
  }

  // --- upgrades (WebSocket subresources): upgrade.ts ---------------------------------------
  const onUpgrade = createUpgradeHandler({ opts, rawRouteOf, gvOf, subs, audit, authorizeAttrs, log, metrics });
  app.server.on('upgrade', onUpgrade);

  let closing: Promise<void> | undefined;
  return {
    app,
    metrics,
    registerSubresource: (plural, name, handler) => subs.register(plural, name, handler),
    registerRawRoute: (prefix, route) => void rawRoutes.set(prefix, route),
    async listen(host, port) {
      await app.listen({ host, port });
      const a = app.server.address() as AddressInfo;
      const h = a.family === 'IPv6' ? `[${a.address}]` : a.address;
      return { host: a.address, port: a.port, url: `${opts.https ? 'https' : 'http'}://${h}:${a.port}` };
    },
    close() {
      if (!closing) {
        resources.closeAllWatches();
        // Streams a subresource handler holds (exec, log -f) would keep close() waiting:
        // after the grace period every remaining connection is destroyed.
        const force = setTimeout(() => app.server.closeAllConnections(), opts.closeGraceMs ?? 5000);
        force.unref();
        closing = app.close().finally(() => clearTimeout(force));
      }
      return closing;
    },
  };
}

function hostOf(req: FastifyRequest): string {
  const a = req.socket.localAddress ?? '127.0.0.1';
  const port = req.socket.localPort ?? 0;
  return a.includes(':') ? `[${a}]:${port}` : `${a}:${port}`;
}

const KNOWN_PATHS = new Set([
  '/',
  '/api',
  '/apis',
  '/openapi',
  '/version',
  '/healthz',
  '/readyz',
  '/livez',
  '/metrics',
]);

/** Labels of a non-resource request; unknown paths collapse to "other" so clients cannot blow up the series count. */
function nonResourceLabels(req: FastifyRequest): RequestLabels {
  const top = '/' + ((req.raw.url ?? '/').split('?')[0].split('/')[1] ?? '');
  return {
    verb: req.method,
    group: '',
    version: '',
    resource: KNOWN_PATHS.has(top) ? top : 'other',
    subresource: '',
    scope: '',
  };
}
