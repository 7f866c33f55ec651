// --listen and --health-listen values: host:port parsing and the loopback test that
// --insecure-http depends on. Shared by serve, controller and node-agent.
import { CliError } from './util.js';

/** Parses host:port ([v6]:port too; an empty host is 127.0.0.1). Throws CliError naming the value. */
export function parseListen(s: string): { host: string; port: number } {
  const i = s.lastIndexOf(':');
  if (i < 0) throw new CliError(`error: --listen must be host:port, got "${s}"`);
  const host = s.slice(0, i).replace(/^\[|\]$/g, '') || '127.0.0.1';
  const port = Number(s.slice(i + 1));
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new CliError(`error: invalid port in --listen "${s}"`);
  return { host, port };
}

/** True for 127.0.0.0/8, ::1 and localhost. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host) || host === '::ffff:127.0.0.1';
}
