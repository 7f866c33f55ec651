// Network namespaces for the multi-node e2e tests: one per simulated node, each joined to the
// host by a veth pair with its own /30 (host side .1, node side .2) and a default route through
// the host side, so a process in one node's namespace reaches the host's addresses (the API
// server) and the other node's address only across real links. Made with `ip` (iproute2);
// processes are started in a namespace with `nsenter --net=` (the network namespace only: the
// mount namespace stays the host's, so procbox's mounts and state are where they are in a real
// node agent). Everything made is removed by remove(), which the test calls in its after hook.
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';

export interface NodeNet {
  /** The namespace's name (`ip netns`), bind-mounted under /run/netns. */
  ns: string;
  /** The host side's address (the node's gateway). */
  hostIp: string;
  /** The node side's address (the node agent listens here). */
  nodeIp: string;
  /** The host side's interface. */
  hostIf: string;
  /** argv prefix that runs a command in this namespace. */
  prefix: string[];
}

function ip(args: string[]): void {
  execFileSync('ip', args, { stdio: 'pipe' });
}

/** Why network namespaces cannot be made here, or undefined (tries one and removes it). */
export function netnsSkipReason(): string | undefined {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'creating network namespaces and veth pairs needs root';
  for (const bin of ['ip', 'nsenter']) {
    if (spawnSync(bin, ['-V'], { stdio: 'pipe' }).error) return `no ${bin} binary (iproute2 / util-linux)`;
  }
  const probe = `fxprobe${process.pid % 100000}`;
  try {
    ip(['netns', 'add', probe]);
    ip(['link', 'add', `${probe}h`, 'type', 'veth', 'peer', 'name', `${probe}n`]);
    ip(['link', 'del', `${probe}h`]);
  } catch (e) {
    return `this host cannot make a network namespace with a veth pair: ${(e as { stderr?: Buffer }).stderr?.toString().trim() || String(e)}`;
  } finally {
    spawnSync('ip', ['netns', 'del', probe], { stdio: 'pipe' });
  }
  return undefined;
}

/** A /24 in 10.231.0.0/16 no interface of the host uses (the third octet from the pid, then the next free). */
function freeSubnet(): number {
  const used = fs.existsSync('/proc/net/fib_trie') ? fs.readFileSync('/proc/net/fib_trie', 'utf8') : '';
  for (let i = 0; i < 200; i++) {
    const k = 20 + ((process.pid + i) % 230);
    if (!used.includes(`10.231.${k}.`)) return k;
  }
  throw new Error('no free 10.231.x.0/24 subnet for the test namespaces');
}

/** Makes `names.length` namespaces joined to the host. On a failure, removes what it made and throws. */
export function makeNodeNets(names: string[]): { nets: NodeNet[]; remove(): void } {
  const k = freeSubnet();
  const tag = `fx${process.pid % 100000}`;
  const nets: NodeNet[] = [];
  const remove = () => {
    for (const n of nets) {
      spawnSync('ip', ['link', 'del', n.hostIf], { stdio: 'pipe' });
      spawnSync('ip', ['netns', 'del', n.ns], { stdio: 'pipe' });
    }
  };
  try {
    names.forEach((name, i) => {
      const ns = `${tag}-${name}`;
      const hostIf = `${tag}h${i}`;
      const nodeIf = `${tag}n${i}`;
      const hostIp = `10.231.${k}.${i * 4 + 1}`;
      const nodeIp = `10.231.${k}.${i * 4 + 2}`;
      ip(['netns', 'add', ns]);
      nets.push({ ns, hostIp, nodeIp, hostIf, prefix: ['nsenter', `--net=/run/netns/${ns}`, '--'] });
      ip(['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nodeIf]);
      ip(['link', 'set', nodeIf, 'netns', ns]);
      ip(['addr', 'add', `${hostIp}/30`, 'dev', hostIf]);
      ip(['link', 'set', hostIf, 'up']);
      ip(['-n', ns, 'addr', 'add', `${nodeIp}/30`, 'dev', nodeIf]);
      ip(['-n', ns, 'link', 'set', nodeIf, 'up']);
      ip(['-n', ns, 'link', 'set', 'lo', 'up']);
      ip(['-n', ns, 'route', 'add', 'default', 'via', hostIp]);
    });
  } catch (e) {
    remove();
    throw e;
  }
  return { nets, remove };
}

/** The network namespace (its inode, as /proc/PID/ns/net reads) of a process, and of a named namespace. */
export function netnsOf(pid: number): string {
  return fs.readlinkSync(`/proc/${pid}/ns/net`);
}

export function namedNetns(ns: string): string {
  return `net:[${fs.statSync(`/run/netns/${ns}`).ino}]`;
}

/** Bytes received and sent by an interface of the host (its counters in /sys). */
export function linkBytes(ifName: string): { rx: number; tx: number } {
  const read = (f: string) => Number(fs.readFileSync(`/sys/class/net/${ifName}/statistics/${f}`, 'utf8'));
  return { rx: read('rx_bytes'), tx: read('tx_bytes') };
}
