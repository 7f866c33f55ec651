// The egress proxy's DNS responder and name cache (proxy.ts uses both). The responder answers A
// queries for names the sandbox's allow-list names, with addresses the proxy resolved itself and
// the SSRF guard passes; the sandbox is told apart by its link's source address, never by
// anything it sends. Everything else is REFUSED (no link), NXDOMAIN (not allowed), an empty
// answer (not an A query) or SERVFAIL (cannot resolve). See README.md (threat model).
import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import dnsPacket from 'dns-packet';
import type { AuditRecord } from './audit.js';
import { matchHost, normalizeHost, type AllowList } from './policy.js';

/** What the responder needs of the proxy. */
export interface DnsContext {
  /** The sandbox link behind a source address. */
  link(address: string): { id: string; allow: AllowList } | undefined;
  /** The operator's ceiling (read at each query: it can change). */
  ceiling(): AllowList;
  resolve4(host: string): Promise<string[]>;
  /** Why the SSRF guard refuses an address (undefined: allowed). */
  refuses(address: string): string | undefined;
  audit(rec: Omit<AuditRecord, 'time'>): void;
}

/**
 * A records of a name, cached for their TTL (at most 30 s, bounded to 4096 names): a request
 * needs no DNS round trip of its own. Safe against rebinding because every address is still
 * checked by the SSRF guard at each connect, cached or not.
 */
export class NameCache {
  private readonly resolver = new Resolver({ timeout: 2000, tries: 2 });
  private readonly cache = new Map<string, { addrs: string[]; until: number }>();

  /** `resolvers`: servers to ask (`ip` or `ip:port`; default the host's). */
  constructor(
    resolvers: string[] | undefined,
    private readonly now: () => number,
  ) {
    if (resolvers?.length) this.resolver.setServers(resolvers);
  }

  async resolve4(host: string): Promise<string[]> {
    const now = this.now();
    const hit = this.cache.get(host);
    if (hit && hit.until > now) return hit.addrs;
    const recs = await this.resolver.resolve4(host, { ttl: true });
    const ttl = Math.min(30, ...recs.map((r) => r.ttl));
    const addrs = recs.map((r) => r.address);
    this.cache.delete(host);
    if (ttl > 0) this.cache.set(host, { addrs, until: now + ttl * 1000 });
    if (this.cache.size > 4096) this.cache.delete(this.cache.keys().next().value as string);
    return addrs;
  }
}

/**
 * A UDP socket answering DNS on `port` of `address`; resolves once bound (rejects when it cannot
 * bind). `created` sees the socket before the bind, so a caller can close it on failure.
 */
export async function bindDns(
  port: number | undefined,
  address: string,
  ctx: DnsContext,
  created?: (udp: dgram.Socket) => void,
): Promise<dgram.Socket> {
  const udp = dgram.createSocket('udp4');
  created?.(udp);
  udp.on('message', (msg, rinfo) => void answerDns(msg, rinfo, udp, ctx));
  udp.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    udp.once('error', reject);
    udp.bind(port, address, () => resolve());
  });
  return udp;
}

export async function answerDns(
  msg: Buffer,
  rinfo: dgram.RemoteInfo,
  sock: dgram.Socket,
  ctx: DnsContext,
): Promise<void> {
  let q: dnsPacket.Packet;
  try {
    q = dnsPacket.decode(msg);
  } catch {
    return; // not DNS: no answer, as a resolver does
  }
  if (q.type !== 'query' || !q.questions?.length || q.questions.length > 1) return;
  const question = q.questions[0];
  const link = ctx.link(rinfo.address);
  const rd = (q.flags ?? 0) & dnsPacket.RECURSION_DESIRED;
  const reply = (rcode: number, answers: dnsPacket.Answer[]): void => {
    const out = dnsPacket.encode({
      type: 'response',
      id: q.id,
      flags: rd | dnsPacket.RECURSION_AVAILABLE | rcode,
      questions: [question],
      answers,
    });
    sock.send(out, rinfo.port, rinfo.address);
  };
  const rec = {
    sandbox: link?.id ?? null,
    client: rinfo.address,
    kind: 'dns' as const,
    host: question.name.slice(0, 253),
    method: question.type,
    bytesOut: 0,
    bytesIn: 0,
  };
  if (!link) {
    ctx.audit({ ...rec, decision: 'deny', reason: 'the source address is no sandbox link' });
    return reply(5, []); // REFUSED
  }
  const host = normalizeHost(question.name);
  const match = host ? matchHost(ctx.ceiling(), link.allow, host) : undefined;
  if (!host || !match) {
    ctx.audit({ ...rec, decision: 'deny', reason: 'name not in the allow-list' });
    return reply(3, []); // NXDOMAIN
  }
  if (question.type !== 'A') {
    ctx.audit({ ...rec, host, decision: 'allow', rule: match.rule.host, reason: 'only A records are answered' });
    return reply(0, []);
  }
  let addrs: string[] = [];
  try {
    addrs = (await ctx.resolve4(host)).filter((a) => !ctx.refuses(a));
  } catch (e) {
    ctx.audit({
      ...rec,
      host,
      decision: 'deny',
      rule: match.rule.host,
      reason: `cannot resolve: ${(e as NodeJS.ErrnoException).code ?? e}`,
    });
    return reply(2, []); // SERVFAIL
  }
  ctx.audit({ ...rec, host, address: addrs.join(','), decision: 'allow', rule: match.rule.host });
  reply(
    0,
    addrs.map((a) => ({ type: 'A', name: question.name, ttl: 5, class: 'IN', data: a })),
  );
}
