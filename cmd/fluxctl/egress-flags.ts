// The --egress-* flags of the commands that run a node's runtime (`fluxctl serve` and
// `fluxctl node-agent`): the host egress proxy of allowList sandboxes (cmd/fluxctl/egress.ts).
import type { Command } from 'commander';
import type { EgressOptions } from './egress.js';
import { CliError } from './util.js';

const csv = (v: string): string[] =>
  v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);

const port = (v: string): number => {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n <= 0) throw new CliError(`error: expected a positive integer, got "${v}"`);
  return n;
};

/** Adds the --egress-* flags and --no-egress to `cmd`. */
export function egressFlags(cmd: Command): Command {
  return cmd
    .option(
      '--egress-allow <hosts>',
      'operator egress ceiling for allowList sandboxes: hosts, *.example.com or host:port (comma-separated, repeatable); a sandbox only narrows it; absent: allowList sandboxes reach nothing',
      (v: string, prev: string[] | undefined) => [...(prev ?? []), ...csv(v)],
    )
    .option(
      '--egress-allow-cidr <cidrs>',
      'CIDRs the egress SSRF guard lets through although private/loopback/link-local (comma-separated)',
      csv,
    )
    .option(
      '--egress-resolver <servers>',
      'DNS servers the egress proxy resolves with, ip or ip:port (comma-separated; default: the host resolvers)',
      csv,
    )
    .option(
      '--egress-port <n>',
      'TCP port of the egress proxy (default: picked once, kept in <state-dir>/egress.json)',
      port,
    )
    .option('--egress-dns-port <n>', 'UDP port of the egress proxy DNS responder (default: picked once)', port)
    .option(
      '--egress-upstream-ca <files>',
      'PEM files of CAs the egress proxy trusts for upstream certificates when it intercepts TLS, besides the host trust store (comma-separated)',
      csv,
    )
    .option('--no-egress', 'no egress proxy: network mode allowList is Unsupported');
}

/** The parsed --egress-* flags: false with --no-egress. */
export function egressOptionsOf(o: {
  egress?: boolean;
  egressAllow?: string[];
  egressAllowCidr?: string[];
  egressResolver?: string[];
  egressPort?: number;
  egressDnsPort?: number;
  egressUpstreamCa?: string[];
}): EgressOptions | false {
  if (o.egress === false) return false;
  return {
    allow: o.egressAllow,
    allowCidrs: o.egressAllowCidr,
    resolvers: o.egressResolver,
    port: o.egressPort,
    dnsPort: o.egressDnsPort,
    upstreamCaFiles: o.egressUpstreamCa,
  };
}
