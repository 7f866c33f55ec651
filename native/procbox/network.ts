// Sandbox networking. Every sandbox has its own network namespace (created by the init,
// loopback up). Mode `none` stops there. Mode `open` adds a veth pair: the host end `fvh<hash>`
// gets .1 and the sandbox end (renamed eth0) .2 of a private /30 from 10.213.0.0/16, with a
// default route via the host end, NAT (MASQUERADE) for traffic leaving the host, and
// iptables rules, all tagged with the comment `fluxvm:<id>`:
//   INPUT   -i veth          DROP   (no host address is reachable: not 127.0.0.1, not the
//                                    host's other interfaces, not the veth's own .1)
//   FORWARD -i veth -o fvh+  DROP   (no sandbox-to-sandbox traffic)
//   FORWARD -i veth          ACCEPT (everything else may leave)
//   FORWARD -o veth  new     DROP   (nothing outside may open connections in)
// IPv6 is disabled on the pair. An allow-list or an egress proxy slots in as more rules in
// the FORWARD part (or a redirect in nat PREROUTING) keyed by the same veth name.
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { RuntimeError, type NetworkMode } from '../runtime.js';

export interface NetworkState {
  mode: NetworkMode;
  /** Index of the /30 in 10.213.0.0/16 (open mode). */
  index?: number;
  hostIf?: string;
  address?: string;
}

const BASE = [10, 213];
export const MAX_NETWORKS = 16384;

export function vethName(id: string): string {
  return 'fvh' + createHash('sha256').update(id).digest('hex').slice(0, 10);
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
      `FORWARD -i ${ifn} -o fvh+ ${tag} -j DROP`,
      `FORWARD -o ${ifn} ${tag} -j DROP`,
      `FORWARD -o ${ifn} -m conntrack --ctstate ESTABLISHED,RELATED ${tag} -j ACCEPT`,
    ],
    nat: [`POSTROUTING -s ${sandboxAddr}/32 ! -o ${ifn} ${tag} -j MASQUERADE`],
  };
}

/**
 * Sets up the network of a freshly started init (host pid `pid`). `none`: nothing to do.
 * `open`: veth, addresses, routes, NAT and filter rules (see the header). Throws
 * Unsupported for allowList (it needs the egress proxy, which does not exist yet). Call
 * teardown before repeating.
 */
export async function setupNetwork(id: string, pid: number, net: NetworkState): Promise<NetworkState> {
  if (net.mode === 'none') return { mode: 'none' };
  if (net.mode !== 'open') throw new RuntimeError('Unsupported', `network mode ${net.mode} is not supported by procbox yet`);
  if (net.index === undefined) throw new RuntimeError('Internal', 'open network without a subnet index');
  const ifn = vethName(id);
  const peer = 'fvs' + ifn.slice(3);
  const { host, sandbox } = subnetAddresses(net.index);
  writeFileSync('/proc/sys/net/ipv4/ip_forward', '1');
  await run('ip', ['link', 'add', ifn, 'type', 'veth', 'peer', 'name', peer, 'netns', String(pid)]);
  writeFileSync(`/proc/sys/net/ipv6/conf/${ifn}/disable_ipv6`, '1');
  await run('ip', ['-batch', '-'], `addr add ${host}/30 dev ${ifn}\nlink set ${ifn} up\n`);
  await run('nsenter', [`--net=/proc/${pid}/ns/net`, 'sh', '-c',
    `echo 1 > /proc/sys/net/ipv6/conf/${peer}/disable_ipv6; ip link set ${peer} name eth0 && ip addr add ${sandbox}/30 dev eth0 && ip link set eth0 up && ip route add default via ${host}`]);
  const r = rules(id, ifn, sandbox);
  await run('iptables-restore', ['--noflush', '--wait'],
    `*filter\n${r.filter.map((x) => '-I ' + x).join('\n')}\nCOMMIT\n*nat\n${r.nat.map((x) => '-A ' + x).join('\n')}\nCOMMIT\n`);
  return { mode: 'open', index: net.index, hostIf: ifn, address: sandbox };
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
      .filter((l) => l.startsWith('-A ') && (l.includes(`--comment "${tag}"`) || l.endsWith(`--comment ${tag}`) || l.includes(`--comment ${tag} `)))
      .map((l) => '-D ' + l.slice(3));
    if (dels.length) await run('iptables-restore', ['--noflush', '--wait'], `*${table}\n${dels.join('\n')}\nCOMMIT\n`).catch(() => undefined);
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
