// HTTP through the egress proxy, plain and inside intercepted TLS: the per-request L7 checks, readOnly holds, the
// grant's header, the request to the decided address and its audit record; and the refusals (Refused) every layer of
// the proxy answers with. The connection-level decisions are proxy.ts's.
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { AuditRecord, Decision } from './audit.js';
import { hostMatches, l7Allows, type Match } from './policy.js';
import { HELD_BODY_CAP, type GrantBinding, type SandboxLink } from './options.js';

/** What forwarding needs of the proxy. */
export interface HttpContext {
  audit(rec: Omit<AuditRecord, 'time'>): void;
  agent: http.Agent;
  httpsAgent?: https.Agent;
  connectTimeoutMs?: number;
}

/** Methods a readOnly link may send (RFC 9110 safe methods, TRACE aside). */
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

const HOP = new Set([
  'connection',
  'proxy-connection',
  'keep-alive',
  'proxy-authorization',
  'proxy-authenticate',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/** A refusal: the status answered, the reason audited, the host and rule when known. */
export class Refused extends Error {
  constructor(
    readonly status: number,
    reason: string,
    readonly host?: string,
    readonly rule?: string,
  ) {
    super(reason);
  }
}

/** The client address without an IPv4-mapped IPv6 prefix. */
export function plainAddress(a: string | undefined): string {
  if (!a) return '';
  return a.startsWith('::ffff:') && net.isIPv4(a.slice(7)) ? a.slice(7) : a;
}

/** `host[:port]` of a Host header or CONNECT target; undefined when malformed (IPv6 literals included). */
export function splitAuthority(a: string, defPort: number): { host: string; port: number } | undefined {
  const m = /^([^:@/\s[\]]+)(?::([0-9]{1,5}))?$/.exec(a);
  if (!m) return undefined;
  const port = m[2] === undefined ? defPort : Number(m[2]);
  if (port < 1 || port > 65535) return undefined;
  return { host: m[1], port };
}

function grantFor(link: SandboxLink, host: string, method: string, path: string): GrantBinding | undefined {
  return link.grants?.find((g) => g.hosts.some((h) => hostMatches(h.toLowerCase(), host)) && l7Allows(g, method, path));
}

/**
 * The per-request part of plain and intercepted HTTP: L7 rules of both layers, readOnly
 * holds, the grant, then the request to the decided address (TLS verified against the host
 * trust store and the operator's CAs when `tls`), audited once.
 */
export function forward(
  ctx: HttpContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  d: { link: SandboxLink; host: string; match: Match; address: string },
  port: number,
  path: string,
  rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
  overTls: boolean,
): void {
  if (!l7Allows(d.match.rule, req.method ?? '', path) || !l7Allows(d.match.ceiling, req.method ?? '', path)) {
    return refuse(
      ctx,
      res,
      { ...rec, host: d.host, address: d.address },
      new Refused(403, 'method or path not allowed by the rule', d.host, d.match.rule.host),
    );
  }
  if (d.link.watch === 'readOnly' && !SAFE_METHODS.has(req.method ?? ''))
    return hold(ctx, req, res, { ...rec, host: d.host, address: d.address, rule: d.match.rule.host });
  const headers: Record<string, string | string[]> = {};
  const connList = new Set(
    String(req.headers.connection ?? '')
      .toLowerCase()
      .split(',')
      .map((x) => x.trim()),
  );
  const grant = grantFor(d.link, d.host, req.method ?? '', path);
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const k = req.rawHeaders[i];
    const lk = k.toLowerCase();
    if (HOP.has(lk) || connList.has(lk) || lk === 'host' || (grant && lk === grant.header.toLowerCase())) continue;
    const prev = headers[k];
    headers[k] = prev === undefined ? req.rawHeaders[i + 1] : ([] as string[]).concat(prev, req.rawHeaders[i + 1]);
  }
  headers.Host = port === (overTls ? 443 : 80) ? d.host : `${d.host}:${port}`;
  if (grant) headers[grant.header] = grant.value;
  let bytesOut = 0;
  let bytesIn = 0;
  let done = false;
  const finish = (status: number | undefined, decision: Decision, reason?: string): void => {
    if (done) return;
    done = true;
    ctx.audit({
      ...rec,
      host: d.host,
      address: d.address,
      status,
      bytesOut,
      bytesIn,
      decision,
      rule: d.match.rule.host,
      reason,
      grant: grant?.name,
    });
  };
  const common = {
    host: d.address,
    port,
    method: req.method,
    path,
    headers,
    setHost: false,
    timeout: ctx.connectTimeoutMs ?? 10_000,
  };
  // Upstream TLS: the name checked is the host the policy allowed, never the address.
  const up = overTls
    ? https.request({ ...common, agent: ctx.httpsAgent, servername: d.host })
    : http.request({ ...common, agent: ctx.agent });
  up.on('timeout', () => up.destroy(new Error('upstream timeout')));
  up.on('error', (e) => {
    const code = (e as NodeJS.ErrnoException).code;
    const why =
      overTls && code && /CERT|SIGNATURE|ISSUER|SELF_SIGNED|HOSTNAME|ALTNAME|ERR_TLS|EPROTO/.test(code)
        ? `upstream TLS: ${code}: ${e.message}`
        : `upstream: ${e.message}`;
    finish(502, 'allow', why);
    if (!res.headersSent)
      res
        .writeHead(502, { 'Content-Type': 'text/plain', Connection: 'close' })
        .end(`egress: upstream failed: ${why}\n`);
    else res.destroy();
  });
  up.on('response', (ur) => {
    const out: Record<string, string | string[]> = {};
    const uconn = new Set(
      String(ur.headers.connection ?? '')
        .toLowerCase()
        .split(',')
        .map((x) => x.trim()),
    );
    for (let i = 0; i < ur.rawHeaders.length; i += 2) {
      const lk = ur.rawHeaders[i].toLowerCase();
      if (HOP.has(lk) || uconn.has(lk)) continue;
      const prev = out[ur.rawHeaders[i]];
      out[ur.rawHeaders[i]] =
        prev === undefined ? ur.rawHeaders[i + 1] : ([] as string[]).concat(prev, ur.rawHeaders[i + 1]);
    }
    res.writeHead(ur.statusCode ?? 502, out);
    ur.on('data', (c: Buffer) => {
      bytesIn += c.length;
    });
    ur.pipe(res);
    ur.on('end', () => finish(ur.statusCode, 'allow'));
    ur.on('error', () => finish(ur.statusCode, 'allow', 'upstream response cut'));
  });
  req.on('data', (c: Buffer) => {
    bytesOut += c.length;
  });
  req.pipe(up);
  res.on('close', () => {
    if (!done) {
      up.destroy();
      finish(undefined, 'allow', 'client went away');
    }
  });
}

export function refuse(
  ctx: HttpContext,
  res: http.ServerResponse,
  rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
  e: unknown,
): void {
  const r = e instanceof Refused ? e : new Refused(500, String(e));
  ctx.audit({
    ...rec,
    host: r.host ?? rec.host,
    status: r.status,
    bytesOut: 0,
    bytesIn: 0,
    decision: 'deny',
    rule: r.rule,
    reason: r.message,
  });
  res
    .writeHead(r.status, { 'Content-Type': 'text/plain', Connection: 'close', 'X-Egress-Decision': 'deny' })
    .end(`egress: ${r.message}\n`);
  res.req.resume();
}

/**
 * readOnly: the request never goes upstream. Its body is read (counted, up to
 * HELD_BODY_CAP) so the record says how much it tried to send, then it is answered 403.
 */
function hold(
  ctx: HttpContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
): void {
  let bytesOut = 0;
  let done = false;
  const answer = (reason: string): void => {
    if (done) return;
    done = true;
    ctx.audit({ ...rec, status: 403, bytesOut, bytesIn: 0, decision: 'hold', reason });
    if (!res.headersSent)
      res
        .writeHead(403, { 'Content-Type': 'text/plain', Connection: 'close', 'X-Egress-Decision': 'hold' })
        .end(
          `egress: held: a read-only speculation sends only GET, HEAD and OPTIONS (${rec.method} ${rec.host} recorded for the reviewer)\n`,
        );
  };
  const count = (c: Buffer): void => {
    bytesOut += c.length;
    if (bytesOut <= HELD_BODY_CAP) return;
    // Past the cap the size is recorded as the cap ("more than"); the rest is drained uncounted
    // until the 403 (Connection: close) ends the connection.
    bytesOut = HELD_BODY_CAP;
    req.off('data', count);
    req.resume();
    answer(`readOnly: ${rec.method} held; body larger than ${HELD_BODY_CAP} bytes (counted up to there)`);
  };
  req.on('data', count);
  req.on('end', () => answer(`readOnly: ${rec.method} held`));
  req.on('error', () => answer(`readOnly: ${rec.method} held; the client went away`));
  res.on('close', () => answer(`readOnly: ${rec.method} held; the client went away`));
}
