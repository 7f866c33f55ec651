// Shared plumbing of the kubectl-like verbs: kubeconfig resolution, the client, kubectl's
// error output, and small formatting helpers.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { isStatusError, type StatusError } from '../../runtime/meta/errors.js';

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
  /** -o/--output given anywhere on the line. */
  output?: string;
  /** --request-timeout in ms (0 or undefined: none). */
  requestTimeoutMs?: number;
}

/** The global flags of a parsed command (commander's optsWithGlobals: the verb's and the program's). */
/** The global flags as commander parses them (main.ts declares them). */
type GlobalFlags = {
  kubeconfig?: string;
  namespace?: string;
  context?: string;
  output?: string;
  requestTimeout?: number;
};

export function globalOptions(cmd: { optsWithGlobals(): GlobalFlags }): GlobalOptions {
  const o = cmd.optsWithGlobals();
  return {
    kubeconfig: o.kubeconfig,
    namespace: o.namespace,
    context: o.context,
    output: o.output,
    requestTimeoutMs: o.requestTimeout,
  };
}

/**
 * The kubeconfig files in the order kubectl reads them: --kubeconfig alone; else every
 * entry of $KUBECONFIG (`:`-separated, missing ones skipped, as kubectl does); else
 * ~/.kube/config; else (fluxctl's own fallback, when ~/.kube/config does not exist)
 * ./.fluxvm/kubeconfig, the file a `fluxctl serve` in this directory writes.
 */
export function kubeconfigFiles(
  flag?: string,
  env: NodeJS.ProcessEnv = process.env,
): { files: string[]; from: string } {
  if (flag) return { files: [flag], from: '--kubeconfig' };
  if (env.KUBECONFIG) {
    const parts = [...new Set(env.KUBECONFIG.split(path.delimiter).filter(Boolean))];
    const found = parts.filter((p) => fs.existsSync(p));
    if (found.length) return { files: found, from: 'KUBECONFIG' };
    return { files: parts, from: 'KUBECONFIG' };
  }
  const home = path.join(env.HOME || os.homedir(), '.kube', 'config');
  if (fs.existsSync(home)) return { files: [home], from: '~/.kube/config' };
  const local = path.join('.fluxvm', 'kubeconfig');
  if (fs.existsSync(local)) return { files: [local], from: './.fluxvm/kubeconfig' };
  return { files: [home], from: '~/.kube/config' };
}

/** The first file of kubeconfigFiles (kept for callers that want one path). */
export function resolveKubeconfig(flag?: string, env: NodeJS.ProcessEnv = process.env): string {
  return kubeconfigFiles(flag, env).files[0];
}

/** kubeconfig files merged: lists of named entries (each checked to have its inner mapping). */
export interface MergedKubeconfig {
  apiVersion: string;
  kind: string;
  clusters: Array<{ name: string; cluster: Record<string, unknown> }>;
  users: Array<{ name: string; user: Record<string, unknown> }>;
  contexts: Array<{ name: string; context: Record<string, unknown> }>;
  preferences: object;
  'current-context'?: string;
}

const PATH_FIELDS: Record<string, string[]> = {
  clusters: ['certificate-authority'],
  users: ['client-certificate', 'client-key', 'tokenFile'],
};

/**
 * Reads and merges kubeconfig files with kubectl's rules: the first file that sets
 * current-context (or a map entry: a cluster, user or context of a name) wins; later files
 * only add names not seen yet. Relative file paths in a file are resolved against its
 * directory. A missing, unreadable or malformed file is a CliError naming the file and why.
 */
export function mergeKubeconfigs(files: string[], from = 'kubeconfig'): MergedKubeconfig {
  const out: MergedKubeconfig = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [],
    users: [],
    contexts: [],
    preferences: {},
  };
  for (const file of files) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      const why =
        code === 'ENOENT'
          ? 'no such file'
          : code === 'EACCES'
            ? 'permission denied'
            : code === 'EISDIR'
              ? 'it is a directory'
              : (e as Error).message;
      const hint =
        code === 'ENOENT'
          ? ': start a server with "fluxctl serve --write-kubeconfig" or pass --kubeconfig / set KUBECONFIG'
          : '';
      throw new CliError(`error: cannot read the kubeconfig ${file} (from ${from}): ${why}${hint}`);
    }
    let doc: unknown;
    try {
      doc = yaml.load(text);
    } catch (e) {
      const m = (e as Error).message.split('\n')[0];
      throw new CliError(`error: the kubeconfig ${file} is not valid YAML: ${m}`);
    }
    if (doc === undefined || doc === null) continue; // an empty file adds nothing (kubectl too)
    if (typeof doc !== 'object' || Array.isArray(doc))
      throw new CliError(
        `error: the kubeconfig ${file} is not a kubeconfig: expected a mapping with clusters, users and contexts`,
      );
    const d = doc as Record<string, unknown>;
    for (const key of ['clusters', 'users', 'contexts'] as const) {
      const list = d[key];
      if (list === undefined || list === null) continue;
      if (!Array.isArray(list))
        throw new CliError(`error: the kubeconfig ${file} is not a kubeconfig: ${key} must be a list`);
      const inner = key.slice(0, -1);
      for (const [i, entry] of list.entries()) {
        if (
          !entry ||
          typeof entry !== 'object' ||
          typeof entry.name !== 'string' ||
          !entry[inner] ||
          typeof entry[inner] !== 'object'
        )
          throw new CliError(
            `error: the kubeconfig ${file} is not a kubeconfig: ${key}[${i}] needs a name and a ${inner} mapping`,
          );
        if (out[key].some((x) => x.name === entry.name)) continue; // first wins
        const body = { ...entry[inner] };
        for (const f of PATH_FIELDS[key] ?? [])
          if (typeof body[f] === 'string' && body[f] && !path.isAbsolute(body[f]))
            body[f] = path.resolve(path.dirname(file), body[f]);
        out[key].push({ ...entry, [inner]: body });
      }
    }
    const current = d['current-context'];
    if (out['current-context'] === undefined && typeof current === 'string' && current)
      out['current-context'] = current;
  }
  return out;
}

/** The server URL of the last client made (for "server down" messages). */
let lastServer: string | undefined;

export function makeClient(g: GlobalOptions): ClientNodeClient {
  const { files, from } = kubeconfigFiles(g.kubeconfig);
  const merged = mergeKubeconfigs(files, from);
  const shown = files.join(path.delimiter);
  const ctxName = g.context ?? merged['current-context'];
  if (!ctxName)
    throw new CliError(
      `error: the kubeconfig ${shown} has no current-context: pass --context NAME or run "kubectl config use-context NAME"`,
    );
  const ctx = merged.contexts.find((c) => c.name === ctxName) as
    { name: string; context: { cluster?: string; user?: string } } | undefined;
  if (!ctx) throw new CliError(`error: context "${ctxName}" does not exist in the kubeconfig ${shown}`);
  const cluster = merged.clusters.find((c) => c.name === ctx.context.cluster) as
    { name: string; cluster: { server?: unknown } } | undefined;
  if (!cluster)
    throw new CliError(
      `error: cluster "${ctx.context.cluster}" of context "${ctxName}" does not exist in the kubeconfig ${shown}`,
    );
  if (typeof cluster.cluster.server !== 'string' || !/^https?:\/\/./.test(cluster.cluster.server))
    throw new CliError(
      `error: cluster "${cluster.name}" in the kubeconfig ${shown} has no server URL (https://host:port)`,
    );
  if (
    ctx.context.user !== undefined &&
    ctx.context.user !== '' &&
    !merged.users.some((u) => u.name === ctx.context.user)
  )
    throw new CliError(
      `error: user "${ctx.context.user}" of context "${ctxName}" does not exist in the kubeconfig ${shown}`,
    );
  merged['current-context'] = ctxName;
  let c: ClientNodeClient;
  try {
    c = ClientNodeClient.fromConfig(merged, { userAgent: `fluxctl/v${VERSION}`, requestTimeoutMs: g.requestTimeoutMs });
  } catch (e) {
    throw new CliError(`error: the kubeconfig ${shown} cannot be used: ${(e as Error).message}`);
  }
  lastServer = c.server();
  return c;
}

/** The server the last client talks to, if any. */
export function currentServer(): string | undefined {
  return lastServer;
}

/** The namespace a verb acts in: -n, else the context's namespace, else default. */
export function namespaceOf(g: GlobalOptions, client: ClientNodeClient): string {
  return g.namespace || client.defaultNamespace();
}

/** kubectl's rendering of an API error (cmdutil.StandardErrorMessage). */
export function formatError(e: unknown, server: string | undefined = lastServer): string {
  if (e instanceof CliError) return e.message;
  if (isStatusError(e)) return formatStatusError(e, server);
  return `error: ${e instanceof Error ? e.message : String(e)}`;
}

export function formatStatusError(e: StatusError, server?: string): string {
  const st = e.status;
  if (st.reason === 'ServiceUnavailable' && /unable to connect/.test(st.message ?? '')) {
    // kubectl names host:port; the whole URL says which scheme was tried as well. Only a refused
    // connection is "refused" (as kubectl); a reset, a cut or a TLS failure says what it was.
    if (/ECONNREFUSED/.test(st.message ?? ''))
      return `The connection to the server ${server ?? 'server'} was refused - did you specify the right host or port? (is \`fluxctl serve\` running?)`;
    return `Unable to connect to the server ${server ?? 'server'}: ${(st.message ?? '').replace(/^unable to connect to the server: /, '')}`;
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
export function parseDuration(s: string, flag?: string): number {
  s = s.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
  let total = 0;
  let consumed = 0;
  for (const m of s.matchAll(re)) {
    const n = Number(m[1]);
    total += m[2] === 'ms' ? n : m[2] === 's' ? n * 1000 : m[2] === 'm' ? n * 60_000 : n * 3_600_000;
    consumed += m[0].length;
  }
  if (consumed !== s.length || consumed === 0)
    throw new CliError(
      `error: invalid duration${flag ? ` for ${flag}` : ''} "${s}": use a number of seconds or units like 30s, 5m, 1h30m, 500ms`,
    );
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
