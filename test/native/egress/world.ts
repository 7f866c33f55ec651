// The egress tests' world, built once per test file: the fake internet (a network namespace
// with HTTP and HTTPS upstreams for api.test, a test CA), a DNS server for the given names, the
// egress proxy as serve runs it (loopback listener, the test network allowed by its guard, TLS
// interception verifying upstreams against the test CA) and a host service listening on every
// address that no sandbox may reach. Used by the procbox allowList tests and the VM network
// tests, which must meet the same world.
import { createServer, type Server } from 'node:net';
import type { AuditRecord } from '../../../native/egress/audit.js';
import { CaStore } from '../../../native/egress/ca.js';
import { AddressGuard } from '../../../native/egress/guard.js';
import { parseAllowList } from '../../../native/egress/policy.js';
import { EgressProxy } from '../../../native/egress/proxy.js';
import { netnsInternet, testCA, testDns, type NetnsInternet, type TestCA, type TestDns } from './fakenet.js';

export interface EgressWorld {
  ca: TestCA;
  inet: NetnsInternet;
  dns: TestDns;
  proxy: EgressProxy;
  ports: { port: number; dnsPort: number };
  /** Every audit record of the proxy (emptied by reset). */
  audit: AuditRecord[];
  /** The interception CAs (one per sandbox). */
  cas: CaStore;
  /** The port of the host service on 0.0.0.0. */
  hostSvcPort: number;
  /** Forgets the audit records and what the upstreams saw (before each test). */
  reset(): void;
  close(): Promise<void>;
}

/**
 * Builds the world: `tag` names the namespace, `names` are the DNS server's extra answers
 * (api.test and other.test resolve to the upstream). Returns why when this host cannot build
 * the test network (for skipWith).
 */
export async function egressWorld(tag: string, names: Record<string, string[]> = {}): Promise<EgressWorld | string> {
  const ca = testCA();
  let inet: NetnsInternet;
  try {
    inet = await netnsInternet(tag, ca.leaf('api.test'));
  } catch (err) {
    ca.cleanup();
    return `cannot build the test network: ${(err as Error).message}`;
  }
  const dns = await testDns('127.0.0.1', { 'api.test': [inet.ip], 'other.test': [inet.ip], ...names });
  const audit: AuditRecord[] = [];
  const cas = new CaStore();
  const proxy = new EgressProxy({
    ceiling: parseAllowList(['*.test']),
    guard: new AddressGuard({ allowCidrs: [`${inet.ip}/32`] }),
    resolvers: [dns.server],
    // As serve does: the main listener on loopback, each link's host end added by the hook.
    host: '127.0.0.1',
    dnsPort: 0,
    onAudit: (r) => audit.push(r),
    // TLS interception for hosts with rules or grants; upstreams verified against the test CA, as
    // `--egress-upstream-ca` does.
    intercept: { cas, upstreamCa: [ca.ca] },
  });
  const ports = (await proxy.start()) as { port: number; dnsPort: number };
  const hostSvc: Server = createServer((s) => s.end('host-service\n'));
  await new Promise<void>((r) => hostSvc.listen(0, '0.0.0.0', () => r()));
  return {
    ca,
    inet,
    dns,
    proxy,
    ports,
    audit,
    cas,
    hostSvcPort: (hostSvc.address() as { port: number }).port,
    reset() {
      audit.length = 0;
      inet.seen.length = 0;
    },
    async close() {
      await proxy.stop();
      await dns.close();
      hostSvc.close();
      inet.close();
      ca.cleanup();
    },
  };
}
