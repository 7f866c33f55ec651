// `fluxctl agent token|tokens|untoken` (spec/agent-sessions.md "Session tokens") over the
// agentsessions/<name>/token subresource (controllers/agentsession/tokens.ts):
//
//   token NAME --ops exec,files.read [--ttl 30m] [--label L] [--kubeconfig-out FILE] [-o json]
//        mints a token and prints it once (or writes a 0600 kubeconfig: this server, its CA,
//        the token, the session's namespace), so fluxctl and kubectl work for that one session
//   tokens NAME [-o json|yaml]     the live tokens: id, label, ops, expiry (never a secret)
//   untoken NAME ID                revokes one
import fs from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { escapeLine } from './escape.js';
import { kubeconfigFor, writeKubeconfig } from './kubeconfig.js';
import { tabwrite, toJson, toYaml } from './printers.js';
import { CliError, parseDuration, type Io } from './util.js';

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

/** What agent.ts hands over: how to connect and call a session subresource. */
/** A session token as agentsessions/NAME/token lists it (never the secret). */
interface TokenView {
  id: string;
  label?: string;
  ops: string[];
  expirationTimestamp: string;
}

export interface TokenVerbApi {
  conn(cmd: Command): Conn;
  callJson<T>(
    c: Conn,
    method: string,
    path: string,
    query?: Record<string, string | undefined>,
    body?: object,
  ): Promise<T>;
  subPath(ns: string, name: string, sub: string): string;
  verb(name: string): Command;
}

/** The cluster CA of the connection as PEM (undefined when the kubeconfig has none). */
function caPemOf(client: ClientNodeClient): string | undefined {
  const cl = client.kc.getCurrentCluster();
  if (cl?.caData) return Buffer.from(cl.caData, 'base64').toString('utf8');
  if (cl?.caFile) return fs.readFileSync(cl.caFile, 'utf8');
  return undefined;
}

/** Registers token, tokens and untoken on `fluxctl agent`. */
export function addTokenVerbs(a: TokenVerbApi, io: Io, setExit: (code: number) => void): void {
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

  a.verb('token')
    .description('mint a session token for the given ops and print it once (or write a kubeconfig with it)')
    .argument('<name>', 'the session')
    .requiredOption(
      '--ops <ops>',
      'comma-separated: read, exec, terminal (with exec: exec -it), jobs, files.read, files.write, git, checkpoint, preview, screen',
    )
    .option(
      '--ttl <duration>',
      'lifetime (30s, 30m, 2h; a bare number is seconds; 1m to 24h, capped at the session expiry; default 1h)',
    )
    .option('--label <label>', 'a name for the token in the list and the ledger')
    .option(
      '--kubeconfig-out <file>',
      'write a kubeconfig (0600) with the server, its CA and the token instead of printing it',
    )
    .option('-o, --output <format>', 'json: the whole answer, token included', output)
    .action(async (name: string, o, cmd: Command) => {
      // Flags first: a bad one is refused before anything is sent.
      const ops = String(o.ops)
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean);
      const ttlSeconds = o.ttl !== undefined ? Math.ceil(parseDuration(o.ttl, '--ttl') / 1000) : undefined;
      if (o.output && o.output !== 'json')
        throw new CliError(`error: unknown output format ${JSON.stringify(o.output)} (json)`);
      const c = a.conn(cmd);
      const r = await a.callJson<{ status: TokenView & { token: string } }>(
        c,
        'POST',
        a.subPath(c.ns, name, 'token'),
        {},
        {
          ops,
          ...(ttlSeconds !== undefined ? { ttlSeconds } : {}),
          ...(o.label !== undefined ? { label: o.label } : {}),
        },
      );
      if (o.kubeconfigOut) {
        const file = path.resolve(o.kubeconfigOut);
        const user = `agentsession-${c.ns}-${name}`;
        writeKubeconfig(
          file,
          kubeconfigFor(
            c.client.server(),
            { caPem: caPemOf(c.client), token: r.status.token },
            { name: `fluxvm-${name}`, user, namespace: c.ns },
          ),
        );
        io.out(
          `token ${r.status.id} (${r.status.ops.join(',')}, expires ${r.status.expirationTimestamp}) written to ${file}\n`,
        );
      } else if (o.output === 'json') io.out(toJson(r));
      else io.out(`${r.status.token}\n`);
      setExit(0);
    });

  a.verb('tokens')
    .description('the live tokens of a session: id, label, ops, expiry (never the secret)')
    .argument('<name>', 'the session')
    .option('-o, --output <format>', 'json or yaml', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await a.callJson<{ items: TokenView[] }>(c, 'GET', a.subPath(c.ns, name, 'token'));
      if (o.output === 'json') return (io.out(toJson(r)), setExit(0));
      if (o.output === 'yaml') return (io.out(toYaml(r)), setExit(0));
      if (o.output) throw new CliError(`error: unknown output format ${JSON.stringify(o.output)} (json, yaml)`);
      if (!r.items.length) io.out(`No tokens for agentsession ${name} in ${c.ns} namespace.\n`);
      else
        io.out(
          tabwrite([
            ['ID', 'LABEL', 'OPS', 'EXPIRES'],
            ...r.items.map((t) => [t.id, escapeLine(t.label || '<none>'), t.ops.join(','), t.expirationTimestamp]),
          ]),
        );
      setExit(0);
    });

  a.verb('untoken')
    .description('revoke a session token (its holder gets 401 from now on)')
    .argument('<name>', 'the session')
    .argument('<id>', 'the token id (fluxctl agent tokens)')
    .action(async (name: string, id: string, _o, cmd: Command) => {
      const c = a.conn(cmd);
      await a.callJson<unknown>(c, 'DELETE', a.subPath(c.ns, name, 'token'), { id });
      io.out(`token "${id}" of agentsession ${name} revoked\n`);
      setExit(0);
    });
}
