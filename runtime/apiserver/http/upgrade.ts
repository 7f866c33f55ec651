// WebSocket upgrades of the API server (exec-like subresources, raw routes that upgrade): the path
// resolved as the resource routes resolve it, authenticated and authorized as `create` (as kube
// authorizes pods/exec), audited when the socket closes, then handed to the subresource's handler.
// A path that does not upgrade answers a 400 Status, one that does not exist a 404.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { errors, isStatusError } from '../../meta/errors.js';
import type { Metrics } from '../../metrics/metrics.js';
import type { AuditRecord } from '../auth/audit.js';
import type { RequestContext } from '../registry-types.js';
import { ANONYMOUS, type Attributes, type Authenticator, type Authorizer, type ResourceAttributes } from './auth.js';
import type { GroupVersion } from './discovery.js';
import { endSocketWithStatus } from './hardening.js';
import type { Query } from './options.js';
import { notFoundResource, parseApiPath, type ApiPath } from './paths.js';
import type { RawRoute } from './rawroutes.js';
import { toStatusError, type Logger } from './status.js';
import type { SubresourceRegistry } from './subresources.js';

export interface UpgradeDeps {
  opts: { authenticate?: Authenticator; authorize?: Authorizer };
  rawRouteOf: (url: string | undefined) => { prefix: string; route: RawRoute } | undefined;
  gvOf: (p: ApiPath) => GroupVersion | undefined;
  subs: SubresourceRegistry;
  audit: ((rec: AuditRecord) => void) | undefined;
  authorizeAttrs: (attrs: Attributes) => Promise<void>;
  log: Logger;
  metrics: Metrics;
}

/** The server's 'upgrade' listener. */
export function createUpgradeHandler({
  opts,
  rawRouteOf,
  gvOf,
  subs,
  audit,
  authorizeAttrs,
  log,
  metrics,
}: UpgradeDeps): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    // Any path that does not upgrade (an unknown one, discovery, a plain resource) answers a
    // 400 Status: the request was a valid HTTP request with an Upgrade it cannot have.
    const noUpgrade = () =>
      endSocketWithStatus(
        socket,
        errors.badRequest(
          `the requested path does not support upgrading the connection to ${JSON.stringify(String(req.headers.upgrade ?? ''))}`,
        ),
      );
    try {
      const raw = rawRouteOf(req.url);
      if (raw?.route.upgrade) return raw.route.upgrade(req, socket, head);
      const [pathname, qs] = (req.url ?? '/').split('?');
      if (!/^\/apis?(\/|$)/.test(pathname)) return noUpgrade();
      const parsed = parseApiPath(pathname);
      if (!parsed || 'groupOnly' in parsed || !parsed.resource || !parsed.name || !parsed.subresource)
        return noUpgrade();
      const gv = gvOf(parsed);
      const kind = gv?.kinds.find((k) => k.plural === parsed.resource);
      const h = kind && subs.resolve(kind.plural, parsed.subresource, parsed.subpath);
      // What does not exist is a 404 Status, as without the Upgrade; what exists but does not upgrade, 400.
      const notFound = () => endSocketWithStatus(socket, notFoundResource());
      if (!gv || !kind || kind.namespaced !== (parsed.namespace !== undefined)) return notFound();
      const unknownSub = !h && !(parsed.subresource === 'status' && kind.statusSubresource);
      // With authentication on, who asks is checked before what exists (kube: 401/403 before 404).
      if (!h?.upgrade && !(opts.authenticate || opts.authorize)) return unknownSub ? notFound() : noUpgrade();
      const query = Object.fromEntries(
        [...new URLSearchParams(qs ?? '').keys()].map((k) => {
          const all = new URLSearchParams(qs ?? '').getAll(k);
          return [k, all.length === 1 ? all[0] : all];
        }),
      ) as Query;
      const ctx: RequestContext = { userAgent: req.headers['user-agent'] };
      const target = {
        gvr: { group: gv.group, version: gv.version, resource: kind.plural },
        kind,
        namespace: parsed.namespace,
        name: parsed.name,
        subresource: parsed.subresource,
        ...(parsed.subpath !== undefined ? { subpath: parsed.subpath } : {}),
      };
      // Connecting to exec-like subresources is `create`, as kube authorizes pods/exec.
      const resource: ResourceAttributes = {
        verb: 'create',
        namespace: parsed.namespace,
        group: gv.group,
        version: gv.version,
        resource: kind.plural,
        subresource: parsed.subresource,
        name: parsed.name,
      };
      const received = Date.now();
      const auditUpgrade = (code: number) =>
        audit?.({
          user: ctx.user ?? ANONYMOUS,
          verb: 'create',
          requestURI: req.url ?? '/',
          sourceIPs: [req.socket.remoteAddress ?? ''],
          userAgent: req.headers['user-agent'],
          resource,
          code,
          received,
          completed: Date.now(),
          ...(parsed.subresource === 'exec' ? { requestObject: { command: query.command } } : {}),
        });
      let refused = 0;
      if (audit) socket.once('close', () => auditUpgrade(ctx.user && !refused ? 101 : refused || 500));
      if (opts.authenticate || opts.authorize) {
        void (async () => {
          try {
            const user = (opts.authenticate && (await opts.authenticate(req))) || ANONYMOUS;
            ctx.user = user;
            await authorizeAttrs({ user, resource });
          } catch (e) {
            const err = toStatusError(e, undefined, log);
            refused = err.code;
            const body = JSON.stringify(err.status);
            socket.end(
              `HTTP/1.1 ${err.code} ${err.reason}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
            );
            return;
          }
          if (!h?.upgrade) {
            refused = unknownSub ? 404 : 400;
            return unknownSub ? notFound() : noUpgrade();
          }
          h.upgrade({ ...target, query, headers: req.headers, ctx, req, socket, head });
        })();
        return;
      }
      h!.upgrade!({
        gvr: { group: gv.group, version: gv.version, resource: kind.plural },
        kind,
        namespace: parsed.namespace,
        name: parsed.name,
        subresource: parsed.subresource,
        ...(parsed.subpath !== undefined ? { subpath: parsed.subpath } : {}),
        query,
        headers: req.headers,
        ctx,
        req,
        socket,
        head,
      });
    } catch (e) {
      if (!isStatusError(e)) metrics.unexpectedError();
      endSocketWithStatus(socket, toStatusError(e, undefined, log));
    }
  };
}
