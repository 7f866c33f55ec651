// The host egress proxy of `fluxctl serve` (native/egress): built from the --egress-* flags,
// its ports kept in <state-dir>/egress.json so the host rules of sandboxes adopted after a
// restart still lead to it, its audit in <state-dir>/egress-audit.log (JSON lines, 0600).
//
// The operator ceiling is --egress-allow (hosts, *.example.com, host:port; repeatable or
// comma-separated). Without it no allowList sandbox reaches anything: a missing policy at
// either layer denies (spec/sandboxd-pools-pr.md).
import fs from 'node:fs';
import path from 'node:path';
import {
  Aggregator,
  AddressGuard,
  AuditFile,
  CaStore,
  EgressProxy,
  parseAllowList,
  procboxHook,
  type AuditRecord,
} from '../../native/egress/index.js';
import type { EgressHook } from '../../native/procbox/network.js';
import type { Logger } from '../../runtime/controller/index.js';
import { CliError } from './util.js';

export interface EgressOptions {
  /** The operator ceiling; undefined: deny everything. */
  allow?: string[];
  /** CIDRs the SSRF guard lets through (a lab network). */
  allowCidrs?: string[];
  /** DNS servers the proxy resolves with (ip or ip:port); default: the host's. */
  resolvers?: string[];
  /** Fixed ports; default: picked once and kept in <state-dir>/egress.json. */
  port?: number;
  dnsPort?: number;
  /** PEM files of CAs trusted for upstream certificates (besides the host store) when TLS is intercepted. */
  upstreamCaFiles?: string[];
}

export interface StartedEgress {
  proxy: EgressProxy;
  hook: EgressHook;
  aggregator: Aggregator;
  auditPath: string;
  stop(): Promise<void>;
}

/**
 * Starts the proxy on 127.0.0.1 and, through the procbox hook, on each allowList link's host
 * end while the link exists (never a wildcard address); throws CliError on a bad flag.
 */
export async function startEgress(stateDir: string, o: EgressOptions, log: Logger): Promise<StartedEgress> {
  let ceiling;
  let guard;
  try {
    ceiling = o.allow ? parseAllowList(o.allow) : undefined;
    guard = new AddressGuard({ allowCidrs: o.allowCidrs });
  } catch (e) {
    throw new CliError(`error: --egress-allow / --egress-allow-cidr: ${(e as Error).message}`);
  }
  const upstreamCa: string[] = [];
  for (const f of o.upstreamCaFiles ?? []) {
    try {
      upstreamCa.push(fs.readFileSync(f, 'utf8'));
    } catch (e) {
      throw new CliError(`error: --egress-upstream-ca: ${(e as Error).message}`);
    }
  }
  // TLS interception: one CA per sandbox, minted in memory (native/egress/ca.ts); a restart
  // mints new ones and procbox rewrites each sandbox's bundle before its next command.
  const intercept = { cas: new CaStore(), upstreamCa };
  const portsFile = path.join(stateDir, 'egress.json');
  let saved: { port?: number; dnsPort?: number } = {};
  try {
    saved = JSON.parse(fs.readFileSync(portsFile, 'utf8')) as typeof saved;
  } catch {
    // first start
  }
  const auditPath = path.join(stateDir, 'egress-audit.log');
  // A full disk must not keep serve from starting (it starts read-and-delete-only then): the
  // audit file and the saved ports are best effort, logged when they fail.
  let audit: AuditFile | undefined;
  try {
    audit = new AuditFile(auditPath);
  } catch (e) {
    log.error('egress audit file cannot be opened; decisions are not audited to disk', { error: String(e) });
  }
  const aggregator = new Aggregator();
  const onAudit = (r: AuditRecord): void => {
    try {
      audit?.write(r);
    } catch (e) {
      log.error('egress audit write failed', { error: String(e) });
    }
    aggregator.add(r);
  };
  const make = (port: number, dnsPort: number) =>
    new EgressProxy({ ceiling, guard, resolvers: o.resolvers, host: '127.0.0.1', port, dnsPort, onAudit, intercept });
  let proxy = make(o.port ?? saved.port ?? 0, o.dnsPort ?? saved.dnsPort ?? 0);
  let ports;
  try {
    ports = await proxy.start();
  } catch (e) {
    if (o.port !== undefined || o.dnsPort !== undefined)
      throw new CliError(`error: cannot start the egress proxy: ${(e as Error).message}`);
    // The saved ports are taken: new ones (sandboxes adopted with the old ones lose their way out until restarted).
    log.error('egress proxy: saved ports taken, picking new ones', { error: String(e) });
    await proxy.stop();
    proxy = make(0, 0);
    ports = await proxy.start();
  }
  const tmp = `${portsFile}.tmp`;
  try {
    fs.writeFileSync(tmp, JSON.stringify({ port: ports.port, dnsPort: ports.dnsPort }), { mode: 0o600 });
    fs.renameSync(tmp, portsFile);
  } catch (e) {
    log.error('egress ports cannot be saved; a restart may pick others', { error: String(e) });
  }
  return {
    proxy,
    hook: procboxHook(proxy, { port: ports.port, dnsPort: ports.dnsPort! }),
    aggregator,
    auditPath,
    async stop() {
      await proxy.stop();
      audit?.close();
    },
  };
}
