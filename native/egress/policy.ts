// Egress policy: allow-list entries, host matching, the intersection of the operator's
// ceiling with a sandbox's list, L7 (method, path) checks and path canonicalization. Pure:
// no I/O, table-tested in test/native/egress/policy.test.ts.
import { isIP } from 'node:net';

/** One allow entry: a host (exact or `*.example.com`), its ports, optional L7 limits. */
export interface AllowRule {
  /** Lower-case host name or `*.suffix`. */
  host: string;
  ports: number[];
  /** Upper-case HTTP methods; absent: every method. */
  methods?: string[];
  /** Path patterns (`*` matches any run of characters); absent: every path. */
  paths?: string[];
}

/** The policy of one layer. `undefined` (no policy at all) denies everything. */
export type AllowList = AllowRule[] | undefined;

export const DEFAULT_PORTS = [80, 443];
export const MAX_ALLOW_ENTRIES = 128;

const LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** Lower-cases and drops one trailing dot; undefined when `h` is not a valid DNS name. */
export function normalizeHost(h: string): string | undefined {
  let s = h.toLowerCase();
  if (s.endsWith('.')) s = s.slice(0, -1);
  if (s.length === 0 || s.length > 253 || isIP(s)) return undefined;
  const labels = s.split('.');
  if (labels.length < 1 || !labels.every((l) => LABEL.test(l))) return undefined;
  // An all-numeric last label is what inet_aton would read as an address (1.2.3, 0x7f.1).
  if (/^[0-9]+$/.test(labels[labels.length - 1]) || /^0x/.test(labels[labels.length - 1])) return undefined;
  return s;
}

/**
 * Parses `host`, `*.suffix`, `host:port` or `*.suffix:port`. Throws an Error with a reason
 * for IP literals, CIDRs, wildcards anywhere but the whole first label, and bad ports.
 */
export function parseAllowEntry(entry: string): AllowRule {
  let host = entry;
  let ports = DEFAULT_PORTS;
  const colon = entry.lastIndexOf(':');
  if (colon >= 0) {
    const p = entry.slice(colon + 1);
    host = entry.slice(0, colon);
    if (!/^[0-9]{1,5}$/.test(p) || Number(p) < 1 || Number(p) > 65535)
      throw new Error(`bad port in ${JSON.stringify(entry)}`);
    ports = [Number(p)];
  }
  if (isIP(host) || isIP(entry) || host.includes('/'))
    throw new Error(`${JSON.stringify(entry)} is an IP address or CIDR; allow entries name hosts`);
  const wild = host.startsWith('*.');
  const rest = wild ? host.slice(2) : host;
  if (rest.includes('*'))
    throw new Error(`${JSON.stringify(entry)}: a wildcard is only allowed as the whole first label (*.example.com)`);
  const name = normalizeHost(rest);
  if (!name) throw new Error(`${JSON.stringify(entry)} is not a valid host name`);
  return { host: wild ? '*.' + name : name, ports };
}

/** Parses a list of entries (see parseAllowEntry); throws on the first bad one or past the cap. */
export function parseAllowList(entries: string[]): AllowRule[] {
  if (entries.length > MAX_ALLOW_ENTRIES) throw new Error(`at most ${MAX_ALLOW_ENTRIES} allow entries`);
  return entries.map(parseAllowEntry);
}

/** NetworkConfig.http, structurally (native/egress does not import the runtime's types). */
export interface HttpLimit {
  host: string;
  methods?: string[];
  paths?: string[];
}

/**
 * The allow rules with the method/path limits of `http` put on the entries of the same host
 * (compared as written, after normalizing: `*.example.com` limits the `*.example.com` entry,
 * every port of it). Throws for a limit whose host is not in the allow-list or is limited
 * twice (a host has one methods x paths set), a path that does not start with '/', or an
 * empty methods/paths list (an empty list would allow nothing: say so instead). Pure.
 */
export function withHttpRules(rules: AllowRule[], http: HttpLimit[] | undefined): AllowRule[] {
  if (!http?.length) return rules;
  const out = rules.map((r) => ({ ...r }));
  for (const [i, h] of http.entries()) {
    const wild = h.host.startsWith('*.');
    const name = normalizeHost(wild ? h.host.slice(2) : h.host);
    if (!name) throw new Error(`http[${i}].host ${JSON.stringify(h.host)} is not a valid host name`);
    const host = wild ? '*.' + name : name;
    if (http.slice(0, i).some((o) => o.host.toLowerCase().replace(/\.$/, '') === host)) {
      throw new Error(`http[${i}].host ${host} is limited twice: put every method and path for a host in one entry`);
    }
    const targets = out.filter((r) => r.host === host);
    if (!targets.length) throw new Error(`http[${i}].host ${host} is not in the allow-list`);
    if (h.methods && !h.methods.length) throw new Error(`http[${i}].methods is empty (omit it for every method)`);
    if (h.paths && !h.paths.length) throw new Error(`http[${i}].paths is empty (omit it for every path)`);
    for (const p of h.paths ?? [])
      if (!p.startsWith('/')) throw new Error(`http[${i}].paths: ${JSON.stringify(p)} must start with /`);
    for (const r of targets) {
      if (h.methods) r.methods = [...new Set(h.methods.map((m) => m.toUpperCase()))];
      if (h.paths) r.paths = [...new Set(h.paths)];
    }
  }
  return out;
}

/** `*.example.com` matches any name below example.com (not example.com itself); else exact. */
export function hostMatches(pattern: string, host: string): boolean {
  if (pattern.startsWith('*.')) return host.endsWith(pattern.slice(1)) && host.length > pattern.length - 1;
  return pattern === host;
}

function ruleFor(list: AllowRule[], host: string, port: number | undefined): AllowRule | undefined {
  return list.find((r) => hostMatches(r.host, host) && (port === undefined || r.ports.includes(port)));
}

export interface Match {
  /** The sandbox's rule that matched (its host pattern names the rule in audits). */
  rule: AllowRule;
  ceiling: AllowRule;
  /** True when either layer limits methods or paths: HTTPS then needs interception. */
  limited: boolean;
}

/**
 * The intersection rule: a destination is allowed only when both the operator's ceiling and
 * the sandbox's list allow it; a missing policy at either layer denies (never inherits).
 * `port` undefined asks whether the host is allowed at any port (DNS). `host` must already
 * be normalized (normalizeHost).
 */
export function matchHost(ceiling: AllowList, sandbox: AllowList, host: string, port?: number): Match | undefined {
  if (!ceiling || !sandbox) return undefined;
  const rule = ruleFor(sandbox, host, port);
  if (!rule) return undefined;
  // For DNS, the same port must be allowed on both sides for at least one rule pair.
  const ceil =
    port === undefined
      ? ceiling.find(
          (c) =>
            hostMatches(c.host, host) &&
            c.ports.some((p) => sandbox.some((s) => hostMatches(s.host, host) && s.ports.includes(p))),
        )
      : ruleFor(ceiling, host, port);
  if (!ceil) return undefined;
  const limited = !!(rule.methods || rule.paths || ceil.methods || ceil.paths);
  return { rule, ceiling: ceil, limited };
}

/**
 * The path of a request target without its query, or undefined when it is not canonical:
 * `..` or `.` segments, `//`, percent-encoded dots, slashes or backslashes (`%2e`, `%2f`,
 * `%5c`), a raw backslash, or anything not starting with `/`. A non-canonical path never
 * matches a limited rule or grant.
 */
export function canonicalPath(target: string): string | undefined {
  const q = target.search(/[?#]/);
  const path = q >= 0 ? target.slice(0, q) : target;
  if (!path.startsWith('/')) return undefined;
  if (path.includes('\\') || path.includes('//')) return undefined;
  if (/%(2e|2f|5c|00)/i.test(path)) return undefined;
  if (/%(?![0-9a-f]{2})/i.test(path)) return undefined;
  for (const seg of path.split('/')) if (seg === '.' || seg === '..') return undefined;
  return path;
}

/** `*` matches any run of characters (including `/`); everything else is literal. */
export function pathMatches(pattern: string, path: string): boolean {
  const parts = pattern.split('*');
  if (parts.length === 1) return pattern === path;
  if (!path.startsWith(parts[0])) return false;
  let at = parts[0].length;
  for (let i = 1; i < parts.length - 1; i++) {
    const j = path.indexOf(parts[i], at);
    if (j < 0) return false;
    at = j + parts[i].length;
  }
  const last = parts[parts.length - 1];
  return path.length - at >= last.length && path.endsWith(last);
}

/** True when `method` and `target` pass a rule's limits (a rule without limits passes all). */
export function l7Allows(rule: { methods?: string[]; paths?: string[] }, method: string, target: string): boolean {
  if (rule.methods && !rule.methods.includes(method.toUpperCase())) return false;
  if (rule.paths) {
    const p = canonicalPath(target);
    if (p === undefined || !rule.paths.some((pat) => pathMatches(pat, p))) return false;
  }
  return true;
}
