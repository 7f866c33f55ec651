// The host egress proxy: one per serve / node agent. It is the only way out for a sandbox
// with an allow-list (the host rules in native/procbox/network.ts drop everything else on
// its link). One TCP port serves, told apart by the first bytes of a connection:
//   - an HTTP forward proxy (absolute-form requests) and CONNECT tunnels (clients that
//     honour HTTP_PROXY / HTTPS_PROXY);
//   - transparent interception of redirected port 80 (the Host header) and 443 (the TLS
//     SNI, peeked without terminating TLS) for clients that ignore proxy settings.
// Hosts that carry L7 rules or grants (and every host of a readOnly link) are intercepted
// when the proxy has a CaStore: it terminates the sandbox's TLS with a leaf its per-sandbox
// CA minted for the name, checks every HTTP/1.1 request inside, and talks TLS to the upstream
// itself, verifying its certificate (ca.ts, README.md "Interception").
// A UDP port answers DNS for allowed names only (dns.ts). The sandbox is identified by the source
// address of its link (anti-spoofing on the link makes it trustworthy), never by anything
// it sends. The proxy resolves names itself with the resolver the operator configures and
// connects to an address it resolved and the SSRF guard passed, so spoofed Host/SNI names
// or DNS rebinding only ever reach what the policy names. See README.md (threat model).
import type dgram from 'node:dgram';
import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import type { EgressTraffic, EgressWatch } from '../runtime.js';
import type { AuditRecord, Decision } from './audit.js';
import type { CaStore } from './ca.js';
import type { DnsContext } from './dns.js';
import { NameCache, bindDns } from './dns.js';
import type { AddressGuard } from './guard.js';
import { hostMatches, l7Allows, matchHost, normalizeHost, type AllowList, type Match } from './policy.js';
import { RELAY_HELPER, RelayHelper, type Relay, type RelayOptions } from './relay.js';
import { MAX_HELLO, parseSni } from './sni.js';

/** A credential the proxy injects (see controllers/grant). `value` is the whole header value. */
export interface GrantBinding {
  name: string;
  hosts: string[];
  methods?: string[];
  paths?: string[];
  header: string;
  value: string;
}

/** What the proxy knows about the sandbox behind one link address. */
export interface SandboxLink {
  id: string;
  allow: AllowList;
  /** Credentials for this link only (also settable alone with setGrants). */
  grants?: GrantBinding[];
  /** A speculation copy's link: readOnly holds unsafe requests; both record (takeTraffic). */
  watch?: EgressWatch;
}

/** Methods a readOnly link may send (RFC 9110 safe methods, TRACE aside). */
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
/** Entries kept per list of a watched link (the rest is counted). */
export const WATCH_CAP = 100;
/** Body bytes of a held request counted before the proxy answers 403 and closes. */
export const HELD_BODY_CAP = 64 * 1024 * 1024;

/** TLS interception (README.md "Interception"). */
export interface InterceptOptions {
  /** The per-sandbox CAs that mint the leaves the sandbox sees. */
  cas: CaStore;
  /** Extra CAs (PEM) the upstream certificate may chain to, besides the host trust store (an operator's, a test's). */
  upstreamCa?: string[];
  /**
   * The host trust store the upstream is verified against. Default /etc/ssl/certs/ca-certificates.crt, else Node's
   * bundled roots.
   */
  hostBundle?: string;
}

/** One intercepted TLS connection: what was decided for it when it came in. */
interface Conn {
  client: string;
  id: string;
  host: string;
  port: number;
  address: string;
}

export interface EgressProxyOptions {
  /** The operator's ceiling; undefined denies everything (the intersection rule). */
  ceiling: AllowList;
  guard: AddressGuard;
  /** DNS servers the proxy resolves with (`ip` or `ip:port`); default: the host's. */
  resolvers?: string[];
  /** Address and port of the proxy's TCP listener (port 0: any). */
  host?: string;
  port?: number;
  /** UDP port of the DNS responder on the same address; undefined: no DNS responder. */
  dnsPort?: number;
  /** The port a transparently intercepted TLS connection is for (the one the host rules redirect). Default 443. */
  transparentTlsPort?: number;
  /** Called with every decision (an audit file, an Event aggregator). Must not throw. */
  onAudit?: (rec: AuditRecord) => void;
  /** Upstream connect timeout. Default 10 s. */
  connectTimeoutMs?: number;
  /** Idle timeout of client and upstream sockets. Default 120 s. */
  idleTimeoutMs?: number;
  /** Simultaneous client connections. Default 4096. */
  maxConnections?: number;
  /**
   * TLS interception for hosts with method/path rules or grants, and every host of a
   * readOnly link; absent: TLS to such a host is refused (fail closed).
   */
  intercept?: InterceptOptions;
  /**
   * Plain tunnels that prove to be bulk transfers are handed to the splice helper
   * (relay.ts; README.md "Performance"). Default: on when the helper is built; false: never.
   */
  relay?: RelayOptions | false;
  now?: () => Date;
}

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

class Refused extends Error {
  constructor(
    readonly status: number,
    reason: string,
    readonly host?: string,
    readonly rule?: string,
  ) {
    super(reason);
  }
}

function plainAddress(a: string | undefined): string {
  if (!a) return '';
  return a.startsWith('::ffff:') && net.isIPv4(a.slice(7)) ? a.slice(7) : a;
}

/** `host[:port]` of a Host header or CONNECT target; undefined when malformed (IPv6 literals included). */
function splitAuthority(a: string, defPort: number): { host: string; port: number } | undefined {
  const m = /^([^:@/\s[\]]+)(?::([0-9]{1,5}))?$/.exec(a);
  if (!m) return undefined;
  const port = m[2] === undefined ? defPort : Number(m[2]);
  if (port < 1 || port > 65535) return undefined;
  return { host: m[1], port };
}

export class EgressProxy {
  private readonly links = new Map<string, SandboxLink>();
  /** What each watched link did, by address; sealed once taken (everything refused since). */
  private readonly traffic = new Map<string, EgressTraffic & { id: string; sealed: boolean }>();
  private readonly names: NameCache;
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 256, maxFreeSockets: 64 });
  private tcp?: net.Server;
  private udp?: dgram.Socket;
  private readonly http: http.Server;
  /** Serves the HTTP/1.1 inside intercepted TLS connections. */
  private readonly ihttp: http.Server;
  private readonly conns = new WeakMap<net.Socket, Conn>();
  private readonly httpsAgent?: https.Agent;
  private readonly sockets = new Set<net.Socket>();
  /** Tunnels the splice helper carries now. */
  private readonly relays = new Set<Relay>();
  /** Hand-overs under way (counted against relay.max with the running ones). */
  private handing = 0;
  private readonly relay?: { helper: RelayHelper; afterBytes: number; max: number };
  private listenPort = 0;
  private dnsPort?: number;
  /** Link host addresses listened on (listenOn), with their TCP and DNS sockets. */
  private readonly extra = new Map<string, { tcp: net.Server; udp?: dgram.Socket; ready: Promise<void> }>();
  ceiling: AllowList;

  constructor(private readonly opts: EgressProxyOptions) {
    this.ceiling = opts.ceiling;
    const r = opts.relay === false ? undefined : { helper: RELAY_HELPER, afterBytes: 1 << 20, max: 64, ...opts.relay };
    if (r && existsSync(r.helper))
      this.relay = {
        helper: new RelayHelper({
          helper: r.helper,
          idleMs: opts.idleTimeoutMs ?? 120_000,
          now: opts.now && (() => opts.now!().getTime()),
        }),
        afterBytes: r.afterBytes,
        max: r.max,
      };
    this.names = new NameCache(opts.resolvers, () => opts.now?.().getTime() ?? Date.now());
    this.http = http.createServer({ requireHostHeader: false });
    this.http.on('request', (req, res) => void this.onRequest(req, res));
    this.http.on('connect', (req, sock: net.Socket, head: Buffer) => void this.onConnect(req, sock, head));
    this.http.on('clientError', (_err, sock: net.Socket) => {
      if (sock.writable) sock.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
      else sock.destroy();
    });
    this.http.keepAliveTimeout = 5000;
    this.ihttp = http.createServer({ requireHostHeader: false });
    this.ihttp.on('request', (req, res) => void this.onIntercepted(req, res));
    this.ihttp.on('connect', (_req, sock: net.Socket) =>
      sock.end('HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\nContent-Length: 0\r\n\r\n'),
    );
    this.ihttp.on('clientError', (_err, sock: net.Socket) => {
      if (sock.writable) sock.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
      else sock.destroy();
    });
    this.ihttp.keepAliveTimeout = 5000;
    if (opts.intercept) {
      let roots: string[] = [...tls.rootCertificates];
      try {
        roots = [readFileSync(opts.intercept.hostBundle ?? '/etc/ssl/certs/ca-certificates.crt', 'utf8')];
      } catch {
        // no host bundle: Node's bundled roots
      }
      // One secure context, parsed once: an `ca` option would re-parse the whole bundle at every new upstream
      // connection.
      const secureContext = tls.createSecureContext({
        ca: [...roots, ...(opts.intercept.upstreamCa ?? [])],
        minVersion: 'TLSv1.2',
      });
      this.httpsAgent = new https.Agent({
        keepAlive: true,
        maxSockets: 256,
        maxFreeSockets: 64,
        secureContext,
        rejectUnauthorized: true,
      });
    }
  }

  /** True when the proxy intercepts TLS (has a CaStore). */
  get intercepting(): boolean {
    return !!this.opts.intercept;
  }

  /** PEM of the sandbox's egress CA(s) for its trust store; undefined without interception. */
  async trustPem(id: string): Promise<string | undefined> {
    return this.opts.intercept?.cas.trustPem(id);
  }

  /**
   * Installs or replaces what the proxy enforces for the link with source address `address`. Takes effect for the next
   * connection or request.
   */
  setLink(address: string, link: SandboxLink): void {
    this.links.set(address, link);
    const t = this.traffic.get(address);
    if (link.watch && t?.id !== link.id)
      this.traffic.set(address, {
        id: link.id,
        sealed: false,
        contacted: [],
        held: [],
        contactedDropped: 0,
        heldDropped: 0,
      });
    else if (!link.watch && t) this.traffic.delete(address);
  }

  /**
   * What the watched link at `address` did since setLink, and seals it: from now on every
   * connection and request from it is refused (audited, not recorded), so the report is all
   * that went out. Open connections are closed. Undefined for an address that is not a watched
   * link. Calling it again returns the same report.
   */
  takeTraffic(address: string): EgressTraffic | undefined {
    const t = this.traffic.get(address);
    if (!t) return undefined;
    if (!t.sealed) {
      t.sealed = true;
      this.cut(address);
    }
    return {
      contacted: [...t.contacted],
      held: [...t.held],
      contactedDropped: t.contactedDropped,
      heldDropped: t.heldDropped,
    };
  }

  /**
   * Replaces the credentials injected for requests from `address` (the Grant controller's
   * bound address). No effect until that address is a link; removed with the link.
   */
  setGrants(address: string, grants: GrantBinding[]): void {
    const l = this.links.get(address);
    if (l) this.links.set(address, { ...l, grants });
  }

  /** Forgets a link (and its grants); its open connections are closed. Idempotent. */
  removeLink(address: string): void {
    const l = this.links.get(address);
    if (l) this.opts.intercept?.cas.drop(l.id);
    this.links.delete(address);
    this.traffic.delete(address);
    this.cut(address);
  }

  /** Closes every connection from `address`, the ones the splice helper carries included. */
  private cut(address: string): void {
    for (const s of this.sockets) if (plainAddress(s.remoteAddress) === address) s.destroy();
    for (const r of this.relays) if (r.client === address) r.kill();
  }

  /** Tunnels carried by the splice helper now (tests, metrics). */
  get relayed(): number {
    return this.relays.size;
  }

  link(address: string): SandboxLink | undefined {
    return this.links.get(address);
  }

  /** Starts the listeners; resolves to their ports. Call once. */
  async start(): Promise<{ port: number; dnsPort?: number }> {
    const host = this.opts.host ?? '127.0.0.1';
    const tcp = net.createServer((s) => this.onSocket(s));
    tcp.maxConnections = this.opts.maxConnections ?? 4096;
    await new Promise<void>((resolve, reject) => {
      tcp.once('error', reject);
      tcp.listen(this.opts.port ?? 0, host, () => resolve());
    });
    this.tcp = tcp;
    this.listenPort = (tcp.address() as net.AddressInfo).port;
    let dnsPort: number | undefined;
    if (this.opts.dnsPort !== undefined) {
      const udp = await bindDns(this.opts.dnsPort, host, this.dnsContext());
      this.udp = udp;
      dnsPort = udp.address().port;
    }
    this.dnsPort = dnsPort;
    return { port: this.listenPort, dnsPort };
  }

  /**
   * Listens also on `address` (a link's host end), on the same TCP and DNS ports: the proxy
   * then needs no wildcard listener (serve's main one is on 127.0.0.1), and a sandbox reaches
   * it only on its own link's address, which the host rules accept for these two ports
   * alone. Idempotent; call after start(), once the address is configured.
   */
  listenOn(address: string): Promise<void> {
    const have = this.extra.get(address);
    if (have) return have.ready;
    const tcp = net.createServer((s) => this.onSocket(s));
    tcp.maxConnections = this.opts.maxConnections ?? 4096;
    const entry: { tcp: net.Server; udp?: dgram.Socket; ready: Promise<void> } = { tcp, ready: Promise.resolve() };
    entry.ready = (async () => {
      await new Promise<void>((resolve, reject) => {
        tcp.once('error', reject);
        tcp.listen(this.listenPort, address, () => resolve());
      });
      if (this.dnsPort !== undefined) {
        entry.udp = await bindDns(this.dnsPort, address, this.dnsContext(), (udp) => (entry.udp = udp));
      }
    })();
    entry.ready.catch(() => {
      if (this.extra.get(address) === entry) this.extra.delete(address);
      tcp.close();
      entry.udp?.close();
    });
    this.extra.set(address, entry);
    return entry.ready;
  }

  /** What the DNS responder (dns.ts) needs of the proxy. */
  private dnsContext(): DnsContext {
    return {
      link: (address) => this.links.get(address),
      ceiling: () => this.ceiling,
      resolve4: (host) => this.resolve4(host),
      refuses: (address) => this.opts.guard.refuses(address),
      audit: (rec) => this.audit(rec),
    };
  }

  /** Stops listening on `address` (its link went). Idempotent. */
  unlisten(address: string): void {
    const e = this.extra.get(address);
    if (!e) return;
    this.extra.delete(address);
    e.ready.then(
      () => {
        e.tcp.close();
        e.udp?.close();
      },
      () => undefined,
    );
  }

  /** True when the main listener is a wildcard address (then listenOn is not needed and would collide). */
  get listensEverywhere(): boolean {
    return this.opts.host === '0.0.0.0' || this.opts.host === '::';
  }

  /** Addresses listened on besides the main one (listenOn). */
  listening(): string[] {
    return [...this.extra.keys()];
  }

  /** Closes listeners and every connection. Idempotent. */
  async stop(): Promise<void> {
    for (const a of [...this.extra.keys()]) this.unlisten(a);
    for (const s of this.sockets) s.destroy();
    for (const r of this.relays) r.kill();
    await Promise.all([...this.relays].map((r) => r.done));
    await this.relay?.helper.stop();
    this.agent.destroy();
    this.httpsAgent?.destroy();
    if (this.udp) await new Promise<void>((r) => this.udp!.close(() => r()));
    this.udp = undefined;
    if (this.tcp) await new Promise<void>((r) => this.tcp!.close(() => r()));
    this.tcp = undefined;
  }

  private audit(rec: Omit<AuditRecord, 'time'>): void {
    this.opts.onAudit?.({ time: (this.opts.now?.() ?? new Date()).toISOString(), ...rec });
    const t = this.traffic.get(rec.client);
    if (!t || t.sealed || t.id !== rec.sandbox || rec.kind === 'dns') return;
    const held = rec.decision === 'hold';
    const list = held ? t.held : t.contacted;
    if (list.length >= WATCH_CAP) {
      if (held) t.heldDropped++;
      else t.contactedDropped++;
      return;
    }
    const { kind, host, port, address, method, path, status, bytesOut, bytesIn, decision, reason } = rec;
    list.push({
      kind,
      host,
      port,
      address,
      method,
      path,
      status,
      bytesOut,
      bytesIn,
      decision,
      ...(reason ? { reason } : {}),
    });
  }

  /** A sealed watched link (its speculation finished) reaches nothing any more. */
  private sealed(client: string): boolean {
    return this.traffic.get(client)?.sealed === true;
  }

  private track(s: net.Socket): void {
    this.sockets.add(s);
    s.on('close', () => this.sockets.delete(s));
    s.setTimeout(this.opts.idleTimeoutMs ?? 120_000, () => s.destroy());
    s.on('error', () => undefined);
  }

  private onSocket(s: net.Socket): void {
    this.track(s);
    let buf: Buffer = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      if (buf[0] !== 0x16) {
        s.off('data', onData);
        s.pause();
        s.unshift(buf);
        this.http.emit('connection', s);
        s.resume();
        return;
      }
      const r = parseSni(buf);
      if (r.need && buf.length < MAX_HELLO) return;
      s.off('data', onData);
      s.pause();
      void this.onTls(s, buf, r.need ? 'ClientHello too long' : r.error, r.need ? undefined : r.name);
    };
    s.on('data', onData);
  }

  /** Policy + resolution for one destination; throws Refused. */
  private async decide(
    client: string,
    rawHost: string,
    port: number,
  ): Promise<{ link: SandboxLink; host: string; match: Match; address: string }> {
    const link = this.links.get(client);
    if (!link) throw new Refused(403, 'the source address is no sandbox link', rawHost);
    if (this.sealed(client)) throw new Refused(403, 'the speculation finished: its link is sealed', rawHost);
    const host = normalizeHost(rawHost);
    if (!host)
      throw new Refused(
        403,
        net.isIP(rawHost.replace(/^\[|\]$/g, '')) ? 'an IP literal: allow rules name hosts' : 'not a valid host name',
        rawHost,
      );
    const match = matchHost(this.ceiling, link.allow, host, port);
    if (!match)
      throw new Refused(
        403,
        !this.ceiling
          ? 'no operator egress policy'
          : !link.allow
            ? 'no sandbox egress policy'
            : 'host or port not in the allow-list',
        host,
      );
    let addrs: string[];
    try {
      addrs = await this.resolve4(host);
    } catch (e) {
      throw new Refused(
        502,
        `cannot resolve: ${(e as NodeJS.ErrnoException).code ?? String(e)}`,
        host,
        match.rule.host,
      );
    }
    let why = 'no address';
    for (const a of addrs) {
      const r = this.guard(a, port);
      if (!r) return { link, host, match, address: a };
      why = r;
    }
    throw new Refused(403, `resolved to ${addrs.join(',') || 'nothing'}: ${why}`, host, match.rule.host);
  }

  /** A records of `host`, cached (dns.ts NameCache). */
  private resolve4(host: string): Promise<string[]> {
    return this.names.resolve4(host);
  }

  private guard(address: string, port: number): string | undefined {
    // Never a connection back into the proxy itself, whatever CIDRs the operator allows.
    if (
      port === this.listenPort &&
      (address.startsWith('127.') ||
        address === this.opts.host ||
        this.extra.has(address) ||
        this.opts.guard.isHostAddress(address))
    )
      return "the proxy's own address";
    return this.opts.guard.refuses(address);
  }

  private grantFor(link: SandboxLink, host: string, method: string, path: string): GrantBinding | undefined {
    return link.grants?.find(
      (g) => g.hosts.some((h) => hostMatches(h.toLowerCase(), host)) && l7Allows(g, method, path),
    );
  }

  private async onRequest(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const client = plainAddress(req.socket.remoteAddress);
    const link = this.links.get(client);
    const base = { sandbox: link?.id ?? null, client, kind: 'http' as const, method: req.method ?? '' };
    let authority: string;
    let path: string;
    const hosts = req.rawHeaders.filter((_, i) => i % 2 === 0 && req.rawHeaders[i].toLowerCase() === 'host').length;
    const abs = /^([a-z][a-z0-9+.-]*):\/\/([^/?#]*)(.*)$/i.exec(req.url ?? '');
    if (abs) {
      if (abs[1].toLowerCase() !== 'http')
        return this.refuse(res, base, new Refused(400, `a forward request for ${abs[1]}: use CONNECT`));
      authority = abs[2];
      path = abs[3] || '/';
    } else {
      if (hosts !== 1) return this.refuse(res, base, new Refused(400, hosts ? 'two Host headers' : 'no Host header'));
      authority = req.headers.host ?? '';
      path = req.url ?? '/';
    }
    if (hosts > 1) return this.refuse(res, base, new Refused(400, 'two Host headers'));
    const at = splitAuthority(authority, 80);
    if (!at)
      return this.refuse(res, base, new Refused(403, `bad authority ${JSON.stringify(authority).slice(0, 300)}`));
    const rec = { ...base, host: at.host, port: at.port, path: path.slice(0, 2048) };
    let d: Awaited<ReturnType<EgressProxy['decide']>>;
    try {
      d = await this.decide(client, at.host, at.port);
    } catch (e) {
      return this.refuse(res, rec, e);
    }
    this.forward(req, res, d, at.port, path, rec, false);
  }

  /**
   * A request inside an intercepted TLS connection (HTTP/1.1, every request of a keep-alive
   * connection): exactly one Host, naming the host the connection was decided for (its SNI
   * or CONNECT target); the policy is looked up again (a changed allow-list applies to the
   * next request), then the same checks and forwarding as plain HTTP, over TLS upstream.
   */
  private async onIntercepted(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const c = this.conns.get(req.socket);
    if (!c) return void res.destroy();
    const path = req.url ?? '/';
    const rec = {
      sandbox: c.id,
      client: c.client,
      kind: 'https' as const,
      method: req.method ?? '',
      host: c.host,
      port: c.port,
      address: c.address,
      path: path.slice(0, 2048),
    };
    const hosts = req.rawHeaders.filter((_, i) => i % 2 === 0 && req.rawHeaders[i].toLowerCase() === 'host').length;
    if (hosts !== 1) return this.refuse(res, rec, new Refused(400, hosts ? 'two Host headers' : 'no Host header'));
    if (!path.startsWith('/'))
      return this.refuse(res, rec, new Refused(400, 'inside TLS only origin-form request targets are accepted'));
    const at = splitAuthority(req.headers.host ?? '', c.port);
    if (!at || normalizeHost(at.host) !== c.host || at.port !== c.port) {
      return this.refuse(
        res,
        rec,
        new Refused(
          421,
          `the Host header ${JSON.stringify(req.headers.host ?? '').slice(0, 300)} does not match the TLS server name ${c.host}:${c.port}`,
        ),
      );
    }
    const link = this.links.get(c.client);
    const match =
      link?.id === c.id && !this.sealed(c.client) ? matchHost(this.ceiling, link.allow, c.host, c.port) : undefined;
    if (!link || !match)
      return this.refuse(
        res,
        rec,
        new Refused(403, link?.id === c.id ? 'host or port no longer in the allow-list' : 'the link changed', c.host),
      );
    this.forward(req, res, { link, host: c.host, match, address: c.address }, c.port, path, rec, true);
  }

  /**
   * The per-request part of plain and intercepted HTTP: L7 rules of both layers, readOnly
   * holds, the grant, then the request to the decided address (TLS verified against the host
   * trust store and the operator's CAs when `tls`), audited once.
   */
  private forward(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    d: { link: SandboxLink; host: string; match: Match; address: string },
    port: number,
    path: string,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
    overTls: boolean,
  ): void {
    if (!l7Allows(d.match.rule, req.method ?? '', path) || !l7Allows(d.match.ceiling, req.method ?? '', path)) {
      return this.refuse(
        res,
        { ...rec, host: d.host, address: d.address },
        new Refused(403, 'method or path not allowed by the rule', d.host, d.match.rule.host),
      );
    }
    if (d.link.watch === 'readOnly' && !SAFE_METHODS.has(req.method ?? ''))
      return this.hold(req, res, { ...rec, host: d.host, address: d.address, rule: d.match.rule.host });
    const headers: Record<string, string | string[]> = {};
    const connList = new Set(
      String(req.headers.connection ?? '')
        .toLowerCase()
        .split(',')
        .map((x) => x.trim()),
    );
    const grant = this.grantFor(d.link, d.host, req.method ?? '', path);
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
      this.audit({
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
      timeout: this.opts.connectTimeoutMs ?? 10_000,
    };
    // Upstream TLS: the name checked is the host the policy allowed, never the address.
    const up = overTls
      ? https.request({ ...common, agent: this.httpsAgent, servername: d.host })
      : http.request({ ...common, agent: this.agent });
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

  private refuse(
    res: http.ServerResponse,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
    e: unknown,
  ): void {
    const r = e instanceof Refused ? e : new Refused(500, String(e));
    this.audit({
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
  private hold(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
  ): void {
    let bytesOut = 0;
    let done = false;
    const answer = (reason: string): void => {
      if (done) return;
      done = true;
      this.audit({ ...rec, status: 403, bytesOut, bytesIn: 0, decision: 'hold', reason });
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

  private async onConnect(req: http.IncomingMessage, sock: net.Socket, head: Buffer): Promise<void> {
    const client = plainAddress(sock.remoteAddress);
    const link = this.links.get(client);
    const rec = { sandbox: link?.id ?? null, client, kind: 'connect' as const, method: 'CONNECT' };
    const deny = (r: Refused): void => {
      this.audit({
        ...rec,
        host: r.host,
        status: r.status,
        bytesOut: 0,
        bytesIn: 0,
        decision: 'deny',
        rule: r.rule,
        reason: r.message,
      });
      sock.end(
        `HTTP/1.1 ${r.status} ${http.STATUS_CODES[r.status] ?? 'Refused'}\r\nConnection: close\r\nX-Egress-Decision: deny\r\nContent-Length: 0\r\n\r\n`,
      );
    };
    const at = splitAuthority(req.url ?? '', 443);
    if (!at || !/^[^:]+:[0-9]+$/.test(req.url ?? ''))
      return deny(new Refused(400, `bad CONNECT target ${JSON.stringify(req.url ?? '').slice(0, 300)}`, req.url));
    let d;
    try {
      d = await this.decide(client, at.host, at.port);
    } catch (e) {
      return deny(e instanceof Refused ? e : new Refused(500, String(e)));
    }
    if (this.intercepts(d.link, d.host, d.match))
      return this.intercept(
        sock,
        head,
        { client, id: d.link.id, host: d.host, port: at.port, address: d.address },
        'connect',
      );
    if (d.link.watch === 'readOnly')
      return this.holdTls(sock, { ...rec, host: d.host, port: at.port, rule: d.match.rule.host });
    if (d.match.limited)
      return deny(
        new Refused(403, 'the host has method/path rules, which need TLS interception', d.host, d.match.rule.host),
      );
    this.tunnel(sock, head, { ...rec, host: d.host, port: at.port, address: d.address, rule: d.match.rule.host }, true);
  }

  private async onTls(s: net.Socket, hello: Buffer, error: string | undefined, sni: string | undefined): Promise<void> {
    const client = plainAddress(s.remoteAddress);
    const link = this.links.get(client);
    const port = this.opts.transparentTlsPort ?? 443;
    const rec = { sandbox: link?.id ?? null, client, kind: 'tls' as const, port };
    const deny = (r: Refused): void => {
      this.audit({ ...rec, host: r.host, bytesOut: 0, bytesIn: 0, decision: 'deny', rule: r.rule, reason: r.message });
      s.destroy();
    };
    if (error || !sni) return deny(new Refused(403, error ?? 'a TLS ClientHello without a server name'));
    let d;
    try {
      d = await this.decide(client, sni, port);
    } catch (e) {
      return deny(e instanceof Refused ? e : new Refused(500, String(e)));
    }
    if (this.intercepts(d.link, d.host, d.match))
      return this.intercept(s, hello, { client, id: d.link.id, host: d.host, port, address: d.address }, 'tls');
    if (d.link.watch === 'readOnly') return this.holdTls(s, { ...rec, host: d.host, rule: d.match.rule.host });
    if (d.match.limited)
      return deny(
        new Refused(403, 'the host has method/path rules, which need TLS interception', d.host, d.match.rule.host),
      );
    this.tunnel(s, hello, { ...rec, host: d.host, address: d.address, rule: d.match.rule.host }, false);
  }

  /**
   * Whether TLS to `host` is intercepted: the proxy can, and the host has L7 rules or a grant, or the link is readOnly.
   */
  private intercepts(link: SandboxLink, host: string, match: Match): boolean {
    if (!this.opts.intercept) return false;
    return (
      match.limited ||
      link.watch === 'readOnly' ||
      !!link.grants?.some((g) => g.hosts.some((h) => hostMatches(h.toLowerCase(), host)))
    );
  }

  /**
   * Terminates the sandbox's TLS with a leaf for `c.host` from the sandbox's CA (offering
   * only http/1.1 by ALPN: no HTTP/2) and hands the clear connection to the inner HTTP
   * server (onIntercepted). A ClientHello naming another server than the decided host is
   * refused. `head`: bytes already read (the peeked ClientHello, or what followed CONNECT).
   */
  private async intercept(s: net.Socket, head: Buffer, c: Conn, kind: 'connect' | 'tls'): Promise<void> {
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
      ctx = await this.opts.intercept!.cas.contextFor(c.id, c.host);
    } catch (e) {
      this.audit({ ...rec, decision: 'deny', reason: `cannot mint a certificate: ${(e as Error).message}` });
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
      if (!this.conns.has(t))
        this.audit({ ...rec, decision: 'deny', reason: `TLS with the sandbox failed: ${e.message}` });
      t.destroy();
    });
    t.once('secure', () => {
      const sni = (t as tls.TLSSocket & { servername?: string | false }).servername;
      if (sni && normalizeHost(sni) !== c.host) {
        this.audit({
          ...rec,
          decision: 'deny',
          reason: `the TLS server name ${JSON.stringify(sni).slice(0, 260)} is not the CONNECT host`,
        });
        return void t.destroy();
      }
      this.conns.set(t, c);
      this.ihttp.emit('connection', t);
    });
    // No s.resume(): the TLS socket reads the raw one from here (a resume would hand the
    // unshifted ClientHello to nobody).
  }

  /**
   * readOnly over TLS: without interception the proxy cannot see the method, so the
   * connection is refused (fail closed) and held with its host; nothing reaches the upstream.
   */
  private holdTls(s: net.Socket, rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>): void {
    const reason = 'readOnly: HTTPS held (the method is not visible without TLS interception; fails closed)';
    this.audit({ ...rec, status: 403, bytesOut: 0, bytesIn: 0, decision: 'hold', reason });
    if (rec.kind === 'connect' && s.writable)
      s.end('HTTP/1.1 403 Forbidden\r\nConnection: close\r\nX-Egress-Decision: hold\r\nContent-Length: 0\r\n\r\n');
    else s.destroy();
  }

  /**
   * Connects to the decided address and relays both ways; audits once when both ends are
   * gone. Half-close passes through: an end read on one side ends the other side's writing,
   * the other direction keeps flowing. A tunnel that carries `relay.afterBytes` is handed to
   * the splice helper (relay.ts), which keeps these semantics and the idle timeout.
   */
  private tunnel(
    s: net.Socket,
    head: Buffer,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
    answer: boolean,
  ): void {
    const up = net.connect({ host: rec.address!, port: rec.port!, allowHalfOpen: true });
    this.track(up);
    const timer = setTimeout(() => up.destroy(new Error('connect timeout')), this.opts.connectTimeoutMs ?? 10_000);
    let connected = false;
    let handed = false;
    let reason: string | undefined;
    const ended = (): void => {
      // Both directions over (each side read its end and wrote its own): the tunnel is done.
      if (s.readableEnded && up.readableEnded && s.writableFinished && up.writableFinished) s.destroy();
    };
    up.once('connect', () => {
      connected = true;
      clearTimeout(timer);
      // No Nagle on either leg: a small write (a TLS record, a request) leaves at once, as it would direct.
      up.setNoDelay(true);
      s.setNoDelay(true);
      s.allowHalfOpen = true;
      if (answer) s.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) up.write(head);
      s.pipe(up);
      up.pipe(s);
      for (const x of [s, up]) {
        x.on('end', ended);
        x.on('finish', ended);
      }
      s.resume();
      const r = this.relay;
      if (!r) return;
      // Counted from the sockets' own totals, checked once per chunk until the threshold only.
      const bulk = (): void => {
        if (s.bytesRead + up.bytesRead < r.afterBytes) return;
        s.off('data', bulk);
        up.off('data', bulk);
        if (this.relays.size + this.handing >= r.max) return;
        this.handing++;
        void this.toRelay(s, up, rec, r.helper, () => (handed = true))
          .catch(() => s.destroy()) // a hand-over gone wrong half-way: the tunnel is cut, never left half-relayed
          .finally(() => this.handing--);
      };
      s.on('data', bulk);
      up.on('data', bulk);
    });
    up.on('error', (e) => {
      reason = `upstream: ${e.message}`;
      if (!connected && answer && s.writable)
        s.end('HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
      else s.destroy();
    });
    s.on('close', () => {
      if (!handed) up.destroy();
    });
    up.on('close', () => {
      clearTimeout(timer);
      if (handed) return;
      s.destroy();
      // bytesOut counts what the sandbox sent upstream, past the hello the proxy peeked.
      this.audit({
        ...rec,
        status: connected ? 200 : 502,
        bytesOut: up.bytesWritten,
        bytesIn: up.bytesRead,
        decision: 'allow',
        reason,
      });
    });
  }

  /** Hands a tunnel to the splice helper; audits when it ends. False when the tunnel stayed in JS. */
  private async toRelay(
    s: net.Socket,
    up: net.Socket,
    rec: Omit<AuditRecord, 'time' | 'decision' | 'bytesIn' | 'bytesOut'>,
    helper: RelayHelper,
    onHanded: () => void,
  ): Promise<boolean> {
    const client = rec.client;
    const relay = await helper.handOver(s, up, client, onHanded);
    if (!relay) return false;
    // What the JS relay moved (the prefixes the helper got included in bytesRead, not in bytesWritten; the helper
    // counts those it writes).
    const before = { out: up.bytesWritten, in: up.bytesRead };
    this.relays.add(relay);
    // The link may have gone while the hand-over waited for the JS writes to flush.
    if (this.links.get(client)?.id !== rec.sandbox || this.sealed(client)) relay.kill();
    void relay.done.then((r) => {
      this.relays.delete(relay);
      this.audit({
        ...rec,
        status: 200,
        bytesOut: before.out + r.out,
        bytesIn: before.in + r.in,
        decision: 'allow',
        reason: r.reason === 'eof' ? undefined : `relay: ${r.reason}`,
        relayed: true,
      });
    });
    return true;
  }
}
