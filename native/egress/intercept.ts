// TLS interception (README.md "Interception"): the proxy terminates the sandbox's TLS with a leaf its per-sandbox CA
// minted for the decided host and hands the clear connection to its inner HTTP server; upstream it talks TLS itself,
// verified against the host trust store and the operator's CAs. readOnly HTTPS without interception is held here.
import { readFileSync } from 'node:fs';
import type http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import tls from 'node:tls';
import type { AuditRecord } from './audit.js';
import type { Conn, InterceptOptions } from './options.js';
import { normalizeHost } from './policy.js';

/** What interception needs of the proxy. */
export interface InterceptContext {
  intercept?: InterceptOptions;
  audit(rec: Omit<AuditRecord, 'time'>): void;
  /** The intercepted connections, for the inner server's requests. */
  conns: WeakMap<net.Socket, Conn>;
  /** The inner HTTP server (proxy.ts onIntercepted). */
  ihttp: http.Server;
}

/** The agent upstream TLS goes through: verified against the host bundle (or Node's roots) and `upstreamCa`. */
export function upstreamAgent(intercept: InterceptOptions): https.Agent {
  let roots: string[] = [...tls.rootCertificates];
  try {
    roots = [readFileSync(intercept.hostBundle ?? '/etc/ssl/certs/ca-certificates.crt', 'utf8')];
  } catch {
    // no host bundle: Node's bundled roots
  }
  // One secure context, parsed once: an `ca` option would re-parse the whole bundle at every new upstream
  // connection.
  const secureContext = tls.createSecureContext({
    ca: [...roots, ...(intercept.upstreamCa ?? [])],
    minVersion: 'TLSv1.2',
  });
  return new https.Agent({
    keepAlive: true,
    maxSockets: 256,
    maxFreeSockets: 64,
    secureContext,
    rejectUnauthorized: true,
  });
}

/**
 * Terminates the sandbox's TLS with a leaf for `c.host` from the sandbox's CA (offering
 * only http/1.1 by ALPN: no HTTP/2) and hands the clear connection to the inner HTTP
 * server (onIntercepted). A ClientHello naming another server than the decided host is
 * refused. `head`: bytes already read (the peeked ClientHello, or what followed CONNECT).
 */
export async function terminateTls(
  proxy: InterceptContext,
  s: net.Socket,
  head: Buffer,
  c: Conn,
  kind: 'connect' | 'tls',
): Promise<void> {
  const rec = {
    sandbox: c.id,
    client: c.client,
    kind,
    host: c.host,
    port: c.port,
    address: c.address,
    bytesOut: 0,
    bytesIn: 0,
  };
  let ctx: tls.SecureContext;
  try {
    ctx = await proxy.intercept!.cas.contextFor(c.id, c.host);
  } catch (e) {
    proxy.audit({ ...rec, decision: 'deny', reason: `cannot mint a certificate: ${(e as Error).message}` });
    if (kind === 'connect' && s.writable)
      s.end('HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    else s.destroy();
    return;
  }
  if (s.destroyed) return;
  if (kind === 'connect') s.write('HTTP/1.1 200 Connection Established\r\n\r\n');
  if (head.length) s.unshift(head);
  const t = new tls.TLSSocket(s, { isServer: true, secureContext: ctx, ALPNProtocols: ['http/1.1'] });
  // (The raw socket keeps its idle timer: the TLS socket's traffic refreshes its parent's.)
  t.on('error', (e) => {
    if (!proxy.conns.has(t))
      proxy.audit({ ...rec, decision: 'deny', reason: `TLS with the sandbox failed: ${e.message}` });
    t.destroy();
  });
  t.once('secure', () => {
    const sni = (t as tls.TLSSocket & { servername?: string | false }).servername;
    if (sni && normalizeHost(sni) !== c.host) {
      proxy.audit({
        ...rec,
        decision: 'deny',
        reason: `the TLS server name ${JSON.stringify(sni).slice(0, 260)} is not the CONNECT host`,
      });
      return void t.destroy();
    }
    proxy.conns.set(t, c);
    proxy.ihttp.emit('connection', t);
  });
  // No s.resume(): the TLS socket reads the raw one from here (a resume would hand the
  // unshifted ClientHello to nobody).
}

/**
 * readOnly over TLS: without interception the proxy cannot see the method, so the
 * connection is refused (fail closed) and held with its host; nothing reaches the upstream.
 */
export function holdTls(
  proxy: Pick<InterceptContext, 'audit'>,
  s: net.Socket,
  rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
): void {
  const reason = 'readOnly: HTTPS held (the method is not visible without TLS interception; fails closed)';
  proxy.audit({ ...rec, status: 403, bytesOut: 0, bytesIn: 0, decision: 'hold', reason });
  if (rec.kind === 'connect' && s.writable)
    s.end('HTTP/1.1 403 Forbidden\r\nConnection: close\r\nX-Egress-Decision: hold\r\nContent-Length: 0\r\n\r\n');
  else s.destroy();
}
