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
import http from 'node:http';
import type https from 'node:https';
import net from 'node:net';
import type { EgressTraffic } from '../runtime.js';
import type { AuditRecord } from './audit.js';
import type { DnsContext } from './dns.js';
import { NameCache, bindDns } from './dns.js';
import { hostMatches, matchHost, normalizeHost, type AllowList, type Match } from './policy.js';
import { MAX_HELLO, parseSni } from './sni.js';
import { Refused, forward, plainAddress, refuse, splitAuthority, type HttpContext } from './forward.js';
import { holdTls, terminateTls, upstreamAgent, type InterceptContext } from './intercept.js';
import { WATCH_CAP, type Conn, type EgressProxyOptions, type GrantBinding, type SandboxLink } from './options.js';
import { Tunnels } from './tunnel.js';

export { HELD_BODY_CAP, WATCH_CAP } from './options.js';
export type { EgressProxyOptions, GrantBinding, InterceptOptions, SandboxLink } from './options.js';

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
  /** What forward.ts and intercept.ts need of the proxy. */
  private readonly fwd: HttpContext;
  private readonly icpt: InterceptContext;
  /** The upstream agent of intercepted HTTPS, made at its first use (parsing the host's CA bundle is ~0.2 s of CPU). */
  private httpsAgent?: https.Agent;
  private readonly sockets = new Set<net.Socket>();
  /** Tunnels, in JS or handed to the splice helper (tunnel.ts). */
  private readonly tunnels: Tunnels;
  private listenPort = 0;
  private dnsPort?: number;
  /** Link host addresses listened on (listenOn), with their TCP and DNS sockets. */
  private readonly extra = new Map<string, { tcp: net.Server; udp?: dgram.Socket; ready: Promise<void> }>();
  ceiling: AllowList;

  constructor(private readonly opts: EgressProxyOptions) {
    this.ceiling = opts.ceiling;
    this.tunnels = new Tunnels(opts, {
      track: (s) => this.track(s),
      audit: (rec) => this.audit(rec),
      linked: (client, sandbox) => this.links.get(client)?.id === sandbox && !this.sealed(client),
    });
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
    const audit = (rec: Omit<AuditRecord, 'time'>): void => this.audit(rec);
    const intercept = opts.intercept;
    const upstream = (): https.Agent | undefined =>
      intercept ? (this.httpsAgent ??= upstreamAgent(intercept)) : undefined;
    this.fwd = {
      audit,
      agent: this.agent,
      get httpsAgent() {
        return upstream();
      },
      connectTimeoutMs: opts.connectTimeoutMs,
    };
    this.icpt = { intercept: opts.intercept, audit, conns: this.conns, ihttp: this.ihttp };
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
    this.tunnels.cut(address);
  }

  /** Tunnels carried by the splice helper now (tests, metrics). */
  get relayed(): number {
    return this.tunnels.relays.size;
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
    await this.tunnels.stop();
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
    // Never a connection back into the proxy itself, whatever CIDRs the operator allows: its
    // address and the links' gateway addresses; listening on a wildcard, every loopback and host
    // address too. Only those: with the proxy on 127.0.0.1, 127.0.0.2 at the same port is another
    // server (an allowed upstream was refused when its port happened to equal the proxy's).
    const host = this.opts.host ?? '127.0.0.1';
    const wildcard = host === '0.0.0.0' || host === '::';
    if (
      port === this.listenPort &&
      (address === host ||
        this.extra.has(address) ||
        (wildcard && (address.startsWith('127.') || this.opts.guard.isHostAddress(address))))
    )
      return "the proxy's own address";
    return this.opts.guard.refuses(address);
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
        return refuse(this.fwd, res, base, new Refused(400, `a forward request for ${abs[1]}: use CONNECT`));
      authority = abs[2];
      path = abs[3] || '/';
    } else {
      if (hosts !== 1)
        return refuse(this.fwd, res, base, new Refused(400, hosts ? 'two Host headers' : 'no Host header'));
      authority = req.headers.host ?? '';
      path = req.url ?? '/';
    }
    if (hosts > 1) return refuse(this.fwd, res, base, new Refused(400, 'two Host headers'));
    const at = splitAuthority(authority, 80);
    if (!at)
      return refuse(this.fwd, res, base, new Refused(403, `bad authority ${JSON.stringify(authority).slice(0, 300)}`));
    const rec = { ...base, host: at.host, port: at.port, path: path.slice(0, 2048) };
    let d: Awaited<ReturnType<EgressProxy['decide']>>;
    try {
      d = await this.decide(client, at.host, at.port);
    } catch (e) {
      return refuse(this.fwd, res, rec, e);
    }
    forward(this.fwd, req, res, d, at.port, path, rec, false);
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
    if (hosts !== 1) return refuse(this.fwd, res, rec, new Refused(400, hosts ? 'two Host headers' : 'no Host header'));
    if (!path.startsWith('/'))
      return refuse(this.fwd, res, rec, new Refused(400, 'inside TLS only origin-form request targets are accepted'));
    const at = splitAuthority(req.headers.host ?? '', c.port);
    if (!at || normalizeHost(at.host) !== c.host || at.port !== c.port) {
      return refuse(
        this.fwd,
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
      return refuse(
        this.fwd,
        res,
        rec,
        new Refused(403, link?.id === c.id ? 'host or port no longer in the allow-list' : 'the link changed', c.host),
      );
    forward(this.fwd, req, res, { link, host: c.host, match, address: c.address }, c.port, path, rec, true);
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
      return terminateTls(
        this.icpt,
        sock,
        head,
        { client, id: d.link.id, host: d.host, port: at.port, address: d.address },
        'connect',
      );
    if (d.link.watch === 'readOnly')
      return holdTls(this.icpt, sock, { ...rec, host: d.host, port: at.port, rule: d.match.rule.host });
    if (d.match.limited)
      return deny(
        new Refused(403, 'the host has method/path rules, which need TLS interception', d.host, d.match.rule.host),
      );
    this.tunnels.tunnel(
      sock,
      head,
      { ...rec, host: d.host, port: at.port, address: d.address, rule: d.match.rule.host },
      true,
    );
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
      return terminateTls(
        this.icpt,
        s,
        hello,
        { client, id: d.link.id, host: d.host, port, address: d.address },
        'tls',
      );
    if (d.link.watch === 'readOnly') return holdTls(this.icpt, s, { ...rec, host: d.host, rule: d.match.rule.host });
    if (d.match.limited)
      return deny(
        new Refused(403, 'the host has method/path rules, which need TLS interception', d.host, d.match.rule.host),
      );
    this.tunnels.tunnel(s, hello, { ...rec, host: d.host, address: d.address, rule: d.match.rule.host }, false);
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
}
