// Shared plumbing of the kubectl-like verbs: kubeconfig resolution, the client, kubectl's
// error output, and small formatting helpers.
import fs from 'node:fs';
import path from 'node:path';
import { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { isStatusError, StatusError } from '../../runtime/meta/errors.js';

export const VERSION = '0.1.0';

/** Thrown by verbs to end with a message and an exit code (no stack trace). */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
    this.name = 'CliError';
  }
}

export interface GlobalOptions {
  kubeconfig?: string;
  namespace?: string;
  context?: string;
}

/** --kubeconfig, else $KUBECONFIG (first existing entry), else ./.fluxvm/kubeconfig. */
export function resolveKubeconfig(flag?: string, env: NodeJS.ProcessEnv = process.env): string {
  if (flag) return flag;
  if (env.KUBECONFIG) {
    const parts = env.KUBECONFIG.split(path.delimiter).filter(Boolean);
    const found = parts.find((p) => fs.existsSync(p));
    if (found) return found;
  }
  return path.join('.fluxvm', 'kubeconfig');
}

export function makeClient(g: GlobalOptions): ClientNodeClient {
  const file = resolveKubeconfig(g.kubeconfig);
  if (!fs.existsSync(file)) {
    throw new CliError(
      `error: no kubeconfig at ${file}: start a server with "fluxctl serve" or pass --kubeconfig / set KUBECONFIG`,
    );
  }
  const c = ClientNodeClient.fromFile(file, { userAgent: `fluxctl/v${VERSION}` });
  if (g.context) c.kc.setCurrentContext(g.context);
  return c;
}

/** The namespace a verb acts in: -n, else the context's namespace, else default. */
export function namespaceOf(g: GlobalOptions, client: ClientNodeClient): string {
  return g.namespace || client.defaultNamespace();
}

/** kubectl's rendering of an API error (cmdutil.StandardErrorMessage). */
export function formatError(e: unknown, server?: string): string {
  if (e instanceof CliError) return e.message;
  if (isStatusError(e)) return formatStatusError(e, server);
  return `error: ${e instanceof Error ? e.message : String(e)}`;
}

export function formatStatusError(e: StatusError, server?: string): string {
  const st = e.status;
  if (st.reason === 'ServiceUnavailable' && /unable to connect/.test(st.message ?? '')) {
    const host = server ? new URL(server).host : 'server';
    return `The connection to the server ${host} was refused - did you specify the right host or port?`;
  }
  const causes = st.details?.causes ?? [];
  if (st.reason === 'Invalid' && st.details?.kind && st.details.name !== undefined) {
    const kind = st.details.kind;
    if (causes.length === 0) return `The ${kind} "${st.details.name}" is invalid`;
    const errs = causes.map((c) => (c.field ? `${c.field}: ${c.message}` : (c.message ?? '')));
    if (errs.length === 1) return `The ${kind} "${st.details.name}" is invalid: ${errs[0]}`;
    return `The ${kind} "${st.details.name}" is invalid: \n${errs.map((x) => `* ${x}`).join('\n')}`;
  }
  const reason = st.reason || 'Unknown';
  return `Error from server (${reason}): ${st.message ?? ''}`;
}

/** Parses kubectl-style durations: 30s, 5m, 1h, 1m30s, 500ms, or a bare number of seconds. */
export function parseDuration(s: string): number {
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
  let total = 0;
  let consumed = 0;
  for (const m of s.matchAll(re)) {
    const n = Number(m[1]);
    total += m[2] === 'ms' ? n : m[2] === 's' ? n * 1000 : m[2] === 'm' ? n * 60_000 : n * 3_600_000;
    consumed += m[0].length;
  }
  if (consumed !== s.length || consumed === 0) throw new CliError(`error: invalid duration "${s}"`);
  return total;
}

/** Output sinks, injectable for tests. */
export interface Io {
  out(s: string): void;
  err(s: string): void;
  stdin(): Promise<string>;
}

export const processIo: Io = {
  out: (s) => process.stdout.write(s),
  err: (s) => process.stderr.write(s),
  stdin: async () => {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString('utf8');
  },
};
