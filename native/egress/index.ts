// The host egress proxy (see README.md). procboxHook adapts a started proxy to what the
// procbox runtime needs for allowList sandboxes (native/procbox/network.ts EgressHook).
import { linkHostOf, type EgressHook } from '../procbox/network.js';
import { parseAllowList, withHttpRules } from './policy.js';
import type { EgressProxy } from './proxy.js';

export { AuditFile, Aggregator, type AuditRecord, type Aggregate } from './audit.js';
export { CaStore, type CaOptions } from './ca.js';
export { AddressGuard } from './guard.js';
export { parseAllowEntry, parseAllowList, type AllowRule, type AllowList } from './policy.js';
export {
  EgressProxy,
  type EgressProxyOptions,
  type GrantBinding,
  type InterceptOptions,
  type SandboxLink,
} from './proxy.js';

/**
 * The hook procbox calls when an allowList link comes up, changes or goes. Keeps grants
 * already set for the address when only the allow-list changes. Throws on a bad entry.
 * Unless the proxy listens on a wildcard address, it listens on each link's host end while
 * the link exists (`ready` resolves once it does; procbox awaits it before a command runs).
 */
export function procboxHook(proxy: EgressProxy, ports: { port: number; dnsPort: number }): EgressHook {
  return {
    port: ports.port,
    dnsPort: ports.dnsPort,
    attach(address, id, allow, watch, http) {
      const prev = proxy.link(address);
      proxy.setLink(address, {
        id,
        allow: withHttpRules(parseAllowList(allow), http),
        grants: prev?.id === id ? prev.grants : undefined,
        ...(watch ? { watch } : {}),
      });
      // the error is ready()'s
      if (!proxy.listensEverywhere) proxy.listenOn(linkHostOf(address)).catch(() => undefined);
    },
    detach(address) {
      proxy.removeLink(address);
      proxy.unlisten(linkHostOf(address));
    },
    async ready(address) {
      if (!proxy.listensEverywhere) await proxy.listenOn(linkHostOf(address));
    },
    ...(proxy.intercepting ? { trust: async (id: string) => (await proxy.trustPem(id)) ?? '' } : {}),
    takeTraffic(address) {
      return proxy.takeTraffic(address);
    },
  };
}
