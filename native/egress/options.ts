// What the egress proxy is configured with (EgressProxyOptions) and told about each sandbox link (SandboxLink, its
// grants), and the limits of a watched link. proxy.ts re-exports these.
import type { EgressWatch } from '../runtime.js';
import type { AuditRecord } from './audit.js';
import type { CaStore } from './ca.js';
import type { AddressGuard } from './guard.js';
import type { AllowList } from './policy.js';
import type { RelayOptions } from './relay.js';

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
export interface Conn {
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
