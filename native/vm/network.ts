// VM networking (network.mode allowList and open). A networked VM gets its own link: a host tap
// device named like a procbox veth (`fvh<hash>` of its link key), the .1 of a private /30 from
// the same 10.213.0.0/16 range as procbox sandboxes, and exactly the host rules a procbox link
// of that mode gets (native/procbox/network.ts configureHostLink): in allowList nothing is
// forwarded or NATed, only the egress proxy's TCP and DNS ports on the link's .1 are accepted,
// 80/443 and udp 53 are redirected to the proxy, a source other than the VM's .2 is dropped on
// the tap (anti-spoofing: the guest kernel may set any address, only its own passes). The
// proxy identifies the VM by that source address, exactly as it does a procbox sandbox.
//
// QEMU never opens /dev/net/tun: the runtime starts it through the tap helper
// (tapfd/tapfd.c), which opens the VM's tap as root and hands it over as fd 3 before setpriv
// drops to the QEMU user. The NIC (virtio-net) is in every VM's device set, with a hub port of
// its own as the backend when the VM has no network, so any saved machine loads anywhere.
// The guest's side is configured by the agent after every boot (create, restore, fork,
// revive): its address, the default route via .1, /etc/resolv.conf, the egress CA.
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseAllowList, withHttpRules } from '../egress/policy.js';
import {
  allocateIndex,
  configureHostLink,
  egressEnv,
  linkHostOf,
  teardownNetwork,
  vethName,
  type EgressHook,
  type NetworkState,
} from '../procbox/network.js';
import { RuntimeError, type HttpRule, type NetworkConfig, type NetworkMode } from '../runtime.js';
import type { AgentClient } from './agent-client.js';
import { execFileP } from './qemu.js';
import { REPO_ROOT } from './state.js';

/** The host's CA bundle, and where the guest gets it (plus the VM's egress CA). */
export const CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

/** The tap helper (built by `make -C native/vm`). */
export const TAP_HELPER = join(REPO_ROOT, 'native', 'vm', 'build', 'fluxvm-tapfd');

/**
 * Network modes a VM can have on this host: links need root (taps, iptables) and
 * /dev/net/tun; allowList needs the egress proxy as well.
 */
export function vmNetworkModes(egress: EgressHook | undefined): NetworkMode[] {
  if (process.getuid?.() !== 0 || !existsSync('/dev/net/tun')) return ['none'];
  return egress ? ['none', 'allowList', 'open'] : ['none', 'open'];
}

/** Throws (before anything is made) Unsupported for a mode `modes` lacks, InvalidArgument for a bad allow-list. */
export function checkVmNetwork(net: NetworkConfig | undefined, modes: NetworkMode[]): void {
  const mode = net?.mode ?? 'none';
  if (!modes.includes(mode)) {
    const why =
      mode === 'allowList' && modes.includes('open')
        ? 'it needs the host egress proxy, which this runtime was not given'
        : 'VM links need root and /dev/net/tun';
    throw new RuntimeError(
      'Unsupported',
      `network mode ${mode} is not available for vm sandboxes on this node: ${why}`,
    );
  }
  if (mode === 'allowList') checkAllow(net?.allow ?? [], net?.http);
}

/** InvalidArgument naming the entry when the egress proxy would refuse the list. */
export function checkAllow(allow: string[], http?: HttpRule[]): void {
  try {
    withHttpRules(parseAllowList(allow), http);
  } catch (e) {
    throw new RuntimeError('InvalidArgument', `network.allow: ${(e as Error).message}`);
  }
}

/** The name of a VM's link on the host (tap and rule tag): unique per runtime state directory and id. */
export function linkKey(stateDir: string, id: string): string {
  return `vm${createHash('sha256').update(stateDir).digest('hex').slice(0, 8)}-${id}`;
}

/**
 * Makes the VM's link: a tap (root's: only the helper opens it), its host side and rules,
 * and tells the egress proxy (allowList). `used`: subnet indexes this runtime holds. Undone
 * (teardownVmLink) on failure. A link of an earlier crashed run under the same key goes first.
 */
export async function setupVmLink(
  key: string,
  id: string,
  net: NetworkConfig,
  used: Set<number>,
  egress: EgressHook | undefined,
): Promise<NetworkState> {
  // Reserved at once (no await before): concurrent creates and fork children never share one.
  const index = allocateIndex(used);
  used.add(index);
  const ifn = vethName(key);
  const want: NetworkState = {
    mode: net.mode,
    index,
    ...(net.allow ? { allow: [...net.allow] } : {}),
    ...(net.http?.length ? { http: net.http.map((r) => ({ ...r })) } : {}),
    ...(net.watch ? { watch: net.watch } : {}),
  };
  try {
    if (!existsSync(TAP_HELPER))
      await execFileP('make', ['-s', '-C', join(REPO_ROOT, 'native', 'vm'), 'build/fluxvm-tapfd']);
    await teardownNetwork(key);
    await execFileP('ip', ['tuntap', 'add', 'dev', ifn, 'mode', 'tap']);
    const state = await configureHostLink(key, ifn, want, egress, 'vm');
    attachLink(id, state, egress);
    return state;
  } catch (e) {
    await teardownNetwork(key);
    used.delete(index);
    throw e instanceof RuntimeError ? e : new RuntimeError('Internal', `vm link: ${(e as Error).message}`);
  }
}

/** Tells the egress proxy what to enforce for an allowList link (again after a restart or an allow-list change). */
export function attachLink(id: string, state: NetworkState | undefined, egress: EgressHook | undefined): void {
  if (state?.mode === 'allowList' && state.address)
    egress?.attach(state.address, id, state.allow ?? [], state.watch, state.http);
}

/** Removes the link (tap, rules), the proxy's record of it and its index from `used`. Idempotent. */
export async function teardownVmLink(
  key: string,
  state: NetworkState | undefined,
  egress: EgressHook | undefined,
  used?: Set<number>,
): Promise<void> {
  if (state?.mode === 'allowList' && state.address) egress?.detach(state.address);
  await teardownNetwork(key);
  if (state?.index !== undefined) used?.delete(state.index);
}

/**
 * The guest's side, after each boot: its address and default route on the link, DNS via the
 * link's .1 (allowList: redirected to the proxy's responder) or the host's resolvers (open);
 * without a link the NIC is down and has no address (a fork or restore may carry its source's).
 */
export async function configureGuest(agent: AgentClient, state: NetworkState | undefined): Promise<void> {
  if (!state?.address) {
    await agent.net({});
    return;
  }
  const gateway = linkHostOf(state.address);
  await agent.net({ address: state.address, prefix: 30, gateway });
  const resolv = state.mode === 'allowList' ? `nameserver ${gateway}\n` : hostResolvers();
  await agent.writeFile('/etc/resolv.conf', Buffer.from(resolv), { mode: 0o644 });
}

function hostResolvers(): string {
  try {
    return readFileSync('/etc/resolv.conf', 'utf8');
  } catch {
    return '';
  }
}

/**
 * allowList with TLS interception: makes the guest's CA bundle the host bundle plus the VM's
 * egress CA(s) when they differ from `written` (what was last written into this guest), and
 * returns what it holds now. Waits for the proxy to listen on the link first.
 */
export async function syncGuestTrust(
  agent: AgentClient,
  id: string,
  state: NetworkState | undefined,
  egress: EgressHook | undefined,
  written: string | undefined,
): Promise<string | undefined> {
  if (state?.mode !== 'allowList' || !state.address || !egress) return written;
  if (egress.ready) {
    await egress.ready(state.address).catch((e: Error) => {
      throw new RuntimeError(
        'Internal',
        `the egress proxy cannot listen on ${linkHostOf(state.address!)}: ${e.message}`,
      );
    });
  }
  if (!egress.trust) return written;
  const pem = await egress.trust(id);
  if (pem === written) return written;
  const base = existsSync(CA_BUNDLE) ? readFileSync(CA_BUNDLE, 'utf8') : '';
  await agent.writeFile(CA_BUNDLE, Buffer.from((base && !base.endsWith('\n') ? base + '\n' : base) + pem), {
    mode: 0o644,
    mkdirs: true,
  });
  return pem;
}

/** allowList: the proxy settings every command gets (clients ignoring them are redirected transparently). */
export function proxyEnv(state: NetworkState | undefined, egress: EgressHook | undefined): Record<string, string> {
  if (state?.mode !== 'allowList' || !state.address || !egress) return {};
  return egressEnv(linkHostOf(state.address), egress.port, egress.trust ? CA_BUNDLE : undefined);
}
