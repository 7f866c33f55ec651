// The SSRF guard: addresses the proxy never connects to on a sandbox's behalf, unless the
// operator allows a CIDR by flag (tests allow their own test network this way).
import { BlockList, isIP } from 'node:net';
import { networkInterfaces } from 'node:os';

/** Ranges refused by default: unspecified, loopback, private, CGNAT, link-local (metadata), multicast, reserved. */
export const DENIED_V4 = [
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.2.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  '224.0.0.0/4',
  '240.0.0.0/4',
];
export const DENIED_V6 = [
  '::/128',
  '::1/128',
  '64:ff9b::/96',
  '100::/64',
  '2001:db8::/32',
  'fc00::/7',
  'fe80::/10',
  'ff00::/8',
];

function addCidr(list: BlockList, cidr: string): void {
  const [addr, bits] = cidr.split('/');
  const fam = isIP(addr);
  if (!fam || bits === undefined || !/^[0-9]{1,3}$/.test(bits) || Number(bits) > (fam === 4 ? 32 : 128))
    throw new Error(`bad CIDR ${JSON.stringify(cidr)}`);
  list.addSubnet(addr, Number(bits), fam === 4 ? 'ipv4' : 'ipv6');
}

/** The IPv4 address inside an IPv4-mapped IPv6 address (::ffff:a.b.c.d or ::ffff:7f00:1). */
function mappedV4(ip: string): string | undefined {
  const m = /^(?:0{0,4}:){0,5}:?ffff:(.+)$/i.exec(ip);
  if (!m || isIP(ip) !== 6) return undefined;
  if (isIP(m[1]) === 4) return m[1];
  const h = /^([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(m[1]);
  if (!h) return undefined;
  const a = parseInt(h[1], 16);
  const b = parseInt(h[2], 16);
  return `${a >> 8}.${a & 255}.${b >> 8}.${b & 255}`;
}

export interface GuardOptions {
  /** CIDRs the operator allows although they are in a denied range (e.g. a test network). */
  allowCidrs?: string[];
  /** The host's own addresses; default: every address of every local interface. */
  hostAddresses?: string[];
}

export class AddressGuard {
  private readonly denied = new BlockList();
  private readonly allowed = new BlockList();
  private readonly own: Set<string>;

  /** Throws on a malformed CIDR in allowCidrs. */
  constructor(opts: GuardOptions = {}) {
    for (const c of DENIED_V4) addCidr(this.denied, c);
    for (const c of DENIED_V6) addCidr(this.denied, c);
    for (const c of opts.allowCidrs ?? []) addCidr(this.allowed, c);
    this.own = new Set(
      opts.hostAddresses ?? Object.values(networkInterfaces()).flatMap((l) => (l ?? []).map((i) => i.address)),
    );
  }

  isHostAddress(ip: string): boolean {
    return this.own.has(ip);
  }

  /** Undefined when the proxy may connect to `ip`, else why not. */
  refuses(ip: string): string | undefined {
    const v4 = mappedV4(ip);
    if (v4) return this.refuses(v4);
    const fam = isIP(ip);
    if (!fam) return 'not an IP address';
    const type = fam === 4 ? 'ipv4' : 'ipv6';
    if (this.allowed.check(ip, type)) return undefined;
    if (this.own.has(ip)) return 'a host address';
    if (this.denied.check(ip, type)) return 'a loopback, private, link-local, metadata or reserved address';
    return undefined;
  }
}
