// Sandbox networking. Every sandbox has its own network namespace (created by the init,
// loopback up). Mode `none` stops there. Mode `open` adds a veth pair: the host end `fvh<hash>`
// gets .1 and the sandbox end (renamed eth0) .2 of a private /30 from 10.213.0.0/16, with a
// default route via the host end, NAT (MASQUERADE) for traffic leaving the host, and
// iptables rules, all tagged with the comment `fluxvm:<id>`:
//   INPUT   -i veth          DROP   (no host address is reachable: not 127.0.0.1, not the
//                                    host's other interfaces, not the veth's own .1)
//   FORWARD -i veth -o fvh+  DROP   (no sandbox-to-sandbox traffic)
//   FORWARD -i veth -d 169.254.0.0/16 DROP (SSRF guard: link-local, the cloud metadata address)
//   FORWARD -i veth          ACCEPT (everything else may leave)
//   FORWARD -o veth  new     DROP   (nothing outside may open connections in)
// IPv6 is disabled on the pair.
// Mode `allowList` gets the same veth and /30, but its only way out is the host egress proxy
// (native/egress): nothing is forwarded or NATed, and
//   INPUT   -i veth ! -s <sandbox .2>             DROP   (anti-spoofing; rp_filter too)
//   INPUT   -i veth -d <.1> tcp <proxy port>      ACCEPT (HTTP_PROXY / HTTPS_PROXY)
//   INPUT   -i veth -d <.1> udp <dns port>        ACCEPT (the proxy's DNS)
//   INPUT   -i veth                               DROP   (no other host port or address)
//   FORWARD -i veth / -o veth                     DROP   (no route anywhere, either way)
//   nat PREROUTING -i veth tcp 80,443 REDIRECT <proxy port> (clients ignoring proxy settings:
//                                    the proxy reads the Host header or the TLS SNI)
//   nat PREROUTING -i veth udp 53 REDIRECT <dns port>  (any resolver address the sandbox tries)
// The proxy identifies the sandbox by the source address, which the anti-spoofing rule pins
// to the link. TCP 53, UDP other than 53, other ports and IPv6: dropped.
// A VM sandbox (native/vm/network.ts) gets the same host side, rules included, on a tap
// device named like the veth (configureHostLink); its guest sets the .2 itself.
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { RuntimeError, type EgressTraffic, type EgressWatch, type HttpRule, type NetworkMode } from '../runtime.js';

export interface NetworkState {
  mode: NetworkMode;
  /** allowList: the sandbox's allow entries (what the egress proxy enforces for its link). */
  allow?: string[];
  /** allowList: method/path limits on allowed hosts (NetworkConfig.http). */
  http?: HttpRule[];
  /** allowList: a speculation copy's link, watched by the egress proxy (kept so an adopted copy stays watched). */
  watch?: EgressWatch;
  /** Index of the /30 in 10.213.0.0/16 (open mode). */
  index?: number;
  hostIf?: string;
  address?: string;
}

/** Where the sandbox's link leads in allowList mode: the ports of the host egress proxy. */
export interface EgressPorts {
  /** TCP port of the proxy (explicit proxy and transparent 80/443), on each link's host end. */
  port: number;
  /** UDP port of the proxy's DNS responder, on each link's host end. */
  dnsPort: number;
}

/** The host egress proxy as procbox uses it (cmd/fluxctl/serve.ts adapts native/egress to it). */
export interface EgressHook extends EgressPorts {
  /**
   * Installs or replaces the allow-list enforced for the link with source address `address` (watch: a speculation
   * copy's).
   */
  attach(address: string, id: string, allow: string[], watch?: EgressWatch, http?: HttpRule[]): void;
  /** Forgets the link. Idempotent. */
  detach(address: string): void;
  /** Resolves once the proxy answers on the link of `address` (its host end); rejects when it cannot. */
  ready?(address: string): Promise<void>;
  /**
   * With TLS interception: the PEM of the sandbox's egress CA(s), which procbox appends to the
   * generated /etc's CA bundle (the sandbox trusts what the proxy mints for it). Absent: no
   * interception, the bundle is the host's.
   */
  trust?(id: string): Promise<string>;
  /** A watched link's traffic so far; seals the link (everything refused from then on). */
  takeTraffic?(address: string): EgressTraffic | undefined;
}

/** The variables that name a CA bundle for the usual clients (OpenSSL, Node, Python requests, curl, git). */
export const CA_BUNDLE_ENV = [
  'SSL_CERT_FILE',
  'NODE_EXTRA_CA_CERTS',
  'REQUESTS_CA_BUNDLE',
  'CURL_CA_BUNDLE',
  'GIT_SSL_CAINFO',
];

/**
 * The environment of a command in an allowList sandbox: the proxy settings (both cases; the
 * proxy on the link's host end) and, with interception, `caBundle` (the sandbox's trust store,
 * which holds its egress CA) named by every CA_BUNDLE_ENV variable. Pure.
 */
export function egressEnv(linkHost: string, port: number, caBundle?: string): Record<string, string> {
  const url = `http://${linkHost}:${port}`;
  const ca = caBundle ? Object.fromEntries(CA_BUNDLE_ENV.map((k) => [k, caBundle])) : {};
  return {
    HTTP_PROXY: url,
    HTTPS_PROXY: url,
    http_proxy: url,
    https_proxy: url,
    NO_PROXY: 'localhost,127.0.0.1',
    no_proxy: 'localhost,127.0.0.1',
    ...ca,
  };
}

const BASE = [10, 213];
export const MAX_NETWORKS = 16384;

export function vethName(id: string): string {
  return 'fvh' + createHash('sha256').update(id).digest('hex').slice(0, 10);
}

/** The host end (.1) of the /30 whose sandbox end (.2) is `sandboxAddress`. Pure. */
export function linkHostOf(sandboxAddress: string): string {
  const p = sandboxAddress.split('.');
  return `${p[0]}.${p[1]}.${p[2]}.${Number(p[3]) - 1}`;
}

/** Host and sandbox addresses of the /30 with this index. Pure. */
export function subnetAddresses(index: number): { host: string; sandbox: string } {
  const off = index * 4;
  const a = `${BASE[0]}.${BASE[1]}.${(off >> 8) & 255}`;
  return { host: `${a}.${(off & 255) + 1}`, sandbox: `${a}.${(off & 255) + 2}` };
}

function run(cmd: string, args: string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, { timeout: 10_000 }, (err, stdout, stderr) => {
      if (err) reject(new RuntimeError('Internal', `${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`));
      else resolve(stdout);
    });
    if (input !== undefined) child.stdin!.end(input);
  });
}

function rules(id: string, ifn: string, sandboxAddr: string): { filter: string[]; nat: string[] } {
  const tag = `-m comment --comment fluxvm:${id}`;
  return {
    // Inserted at the top in this order, so the last one listed ends up first.
    filter: [
      `INPUT -i ${ifn} ${tag} -j DROP`,
      `FORWARD -i ${ifn} ${tag} -j ACCEPT`,
      // The SSRF guard of open mode: link-local (cloud metadata at 169.254.169.254) never.
      `FORWARD -i ${ifn} -d 169.254.0.0/16 ${tag} -j DROP`,
      `FORWARD -i ${ifn} -o fvh+ ${tag} -j DROP`,
      `FORWARD -o ${ifn} ${tag} -j DROP`,
      `FORWARD -o ${ifn} -m conntrack --ctstate ESTABLISHED,RELATED ${tag} -j ACCEPT`,
    ],
    nat: [`POSTROUTING -s ${sandboxAddr}/32 ! -o ${ifn} ${tag} -j MASQUERADE`],
  };
}

function allowListRules(
  id: string,
  ifn: string,
  host: string,
  sandboxAddr: string,
  egress: EgressPorts,
): { filter: string[]; nat: string[] } {
  const tag = `-m comment --comment fluxvm:${id}`;
  return {
    // Inserted at the top in this order, so the last one listed ends up first.
    filter: [
      `INPUT -i ${ifn} ${tag} -j DROP`,
      `INPUT -i ${ifn} -d ${host}/32 -p udp --dport ${egress.dnsPort} ${tag} -j ACCEPT`,
      `INPUT -i ${ifn} -d ${host}/32 -p tcp --dport ${egress.port} ${tag} -j ACCEPT`,
      `INPUT -i ${ifn} ! -s ${sandboxAddr}/32 ${tag} -j DROP`,
      `FORWARD -i ${ifn} ${tag} -j DROP`,
      `FORWARD -o ${ifn} ${tag} -j DROP`,
    ],
    nat: [
      `PREROUTING -i ${ifn} -p tcp --dport 80 ${tag} -j REDIRECT --to-ports ${egress.port}`,
      `PREROUTING -i ${ifn} -p tcp --dport 443 ${tag} -j REDIRECT --to-ports ${egress.port}`,
      `PREROUTING -i ${ifn} -p udp --dport 53 ${tag} -j REDIRECT --to-ports ${egress.dnsPort}`,
    ],
  };
}

/**
 * Sets up the network of a freshly started init (host pid `pid`). `none`: nothing to do.
 * `open`: veth, addresses, routes, NAT and filter rules (see the header). `allowList`: the
 * same link with the proxy-only rules; throws Unsupported without `egress`. Call teardown
 * before repeating.
 */
export async function setupNetwork(
  id: string,
  pid: number,
  net: NetworkState,
  egress?: EgressPorts,
): Promise<NetworkState> {
  if (net.mode === 'none') return { mode: 'none' };
  checkLinkMode(net, egress, 'procbox');
  const ifn = vethName(id);
  const peer = 'fvs' + ifn.slice(3);
  const { host, sandbox } = subnetAddresses(net.index!);
  await run('ip', ['link', 'add', ifn, 'type', 'veth', 'peer', 'name', peer, 'netns', String(pid)]);
  // The host end and its rules first: the sandbox end has no address or route until they are in place.
  const state = await configureHostLink(id, ifn, net, egress);
  await run('nsenter', [
    `--net=/proc/${pid}/ns/net`,
    'sh',
    '-c',
    `echo 1 > /proc/sys/net/ipv6/conf/${peer}/disable_ipv6; ip link set ${peer} name eth0 && ip addr add ${sandbox}/30 dev eth0 && ip link set eth0 up && ip route add default via ${host}`,
  ]);
  return state;
}

function checkLinkMode(net: NetworkState, egress: EgressPorts | undefined, backend: string): void {
  if (net.mode === 'allowList' && !egress)
    throw new RuntimeError(
      'Unsupported',
      'network mode allowList needs the host egress proxy, which this runtime was not given',
    );
  if (net.mode !== 'open' && net.mode !== 'allowList')
    throw new RuntimeError('Unsupported', `network mode ${net.mode} is not supported by ${backend}`);
  if (net.index === undefined) throw new RuntimeError('Internal', `${net.mode} network without a subnet index`);
}

/**
 * The host side of a sandbox link whose host interface `ifn` exists (procbox: the veth's host
 * end; a VM: its tap, whose guest takes the .2 itself): IPv6 off and rp_filter on it, the .1
 * of the /30 of `net.index`, up, and the mode's filter and NAT rules tagged `fluxvm:<id>` (see
 * the header). Returns the state to record. Throws Unsupported for a mode other than open or
 * allowList (allowList without `egress`); teardownNetwork(id) undoes it (also after a throw).
 */
export async function configureHostLink(
  id: string,
  ifn: string,
  net: NetworkState,
  egress?: EgressPorts,
  backend = 'procbox',
): Promise<NetworkState> {
  checkLinkMode(net, egress, backend);
  const { host, sandbox } = subnetAddresses(net.index!);
  if (net.mode === 'open') writeFileSync('/proc/sys/net/ipv4/ip_forward', '1');
  writeFileSync(`/proc/sys/net/ipv6/conf/${ifn}/disable_ipv6`, '1');
  writeFileSync(`/proc/sys/net/ipv4/conf/${ifn}/rp_filter`, '1');
  await run('ip', ['-batch', '-'], `addr add ${host}/30 dev ${ifn}\nlink set ${ifn} up\n`);
  const r = net.mode === 'open' ? rules(id, ifn, sandbox) : allowListRules(id, ifn, host, sandbox, egress!);
  await run(
    'iptables-restore',
    ['--noflush', '--wait'],
    `*filter\n${r.filter.map((x) => '-I ' + x).join('\n')}\nCOMMIT\n*nat\n${r.nat.map((x) => '-A ' + x).join('\n')}\nCOMMIT\n`,
  );
  return {
    mode: net.mode,
    index: net.index,
    hostIf: ifn,
    address: sandbox,
    ...(net.allow ? { allow: net.allow } : {}),
    ...(net.http?.length && net.mode === 'allowList' ? { http: net.http } : {}),
    ...(net.watch && net.mode === 'allowList' ? { watch: net.watch } : {}),
  };
}

/**
 * Removes everything setupNetwork made for `id`: the veth (its peer goes with it) and every
 * iptables rule carrying the `fluxvm:<id>` comment (found by listing, so rules of a crashed
 * earlier run go too). Idempotent.
 */
export async function teardownNetwork(id: string): Promise<void> {
  const ifn = vethName(id);
  await run('ip', ['link', 'del', ifn]).catch(() => undefined);
  const tag = `fluxvm:${id}`;
  for (const table of ['filter', 'nat']) {
    let listing = '';
    try {
      listing = await run('iptables', ['--wait', '-t', table, '-S']);
    } catch {
      continue; // no iptables: nothing of ours can be there
    }
    const dels = listing
      .split('\n')
      // iptables -S prints the comment quoted: --comment "fluxvm:<id>"
      .filter(
        (l) =>
          l.startsWith('-A ') &&
          (l.includes(`--comment "${tag}"`) || l.endsWith(`--comment ${tag}`) || l.includes(`--comment ${tag} `)),
      )
      .map((l) => '-D ' + l.slice(3));
    if (dels.length)
      await run('iptables-restore', ['--noflush', '--wait'], `*${table}\n${dels.join('\n')}\nCOMMIT\n`).catch(
        () => undefined,
      );
  }
}

/**
 * A subnet index not in `used` and not configured on any host interface (other runtimes on
 * the same host, e.g. test runs, allocate from the same range). Starts at a random index so
 * two runtimes allocating at the same moment rarely pick the same one.
 */
export function allocateIndex(used: Set<number>): number {
  const taken = new Set(used);
  try {
    const out = execFileSync('ip', ['-4', '-o', 'addr', 'show'], { encoding: 'utf8' });
    for (const m of out.matchAll(/inet 10\.213\.(\d+)\.(\d+)\//g)) taken.add((Number(m[1]) * 256 + Number(m[2])) >> 2);
  } catch {
    // no iproute2: rely on `used`
  }
  const start = Math.floor(Math.random() * MAX_NETWORKS);
  for (let k = 0; k < MAX_NETWORKS; k++) {
    const i = (start + k) % MAX_NETWORKS;
    if (!taken.has(i)) return i;
  }
  throw new RuntimeError('LimitExceeded', 'no free sandbox subnet');
}
