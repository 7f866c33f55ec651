// `fluxctl agent expose|previews|unexpose` (spec/agent-sessions.md "Preview URLs") over the
// agentsessions/<name>/previews subresource (controllers/agentsession/previews.ts):
//
//   expose NAME PORT [--ttl 10m]   mints a preview URL for PORT inside the session's sandbox
//                                  and prints the answer as JSON ({id, port, url, expiresAt});
//                                  the URL is the credential (no bearer token)
//   previews NAME [-o json|yaml]   the live previews: id, port, expiry; the table never prints a URL,
//                                  -o json|yaml carries each one's url only for a caller allowed
//                                  to create previews of the session (the API decides)
//   unexpose NAME ID               revokes one (its URL answers 404 from then on)
import type { Command } from 'commander';
import type { TokenVerbApi } from './agent-token.js';
import { tabwrite, toJson, toYaml } from './printers.js';
import { CliError, parseDuration, type Io } from './util.js';

/** Registers expose, previews and unexpose on `fluxctl agent`. */
export function addPreviewVerbs(a: TokenVerbApi, io: Io, setExit: (code: number) => void): void {
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

  a.verb('expose')
    .description('a preview URL for a TCP port inside the session (HTTP and WebSocket; the URL is the credential)')
    .argument('<name>', 'the session')
    .argument('<port>', 'the port inside the sandbox (1-65535)')
    .option(
      '--ttl <duration>',
      'lifetime (30s, 10m, 2h; a bare number is seconds; 1s to 24h, capped at the session expiry; default 1h)',
    )
    .action(async (name: string, portArg: string, o, cmd: Command) => {
      if (!/^\d+$/.test(portArg))
        throw new CliError(`error: invalid port ${JSON.stringify(portArg)}: a number from 1 to 65535`);
      const port = Number(portArg);
      const ttlSeconds = o.ttl !== undefined ? Math.ceil(parseDuration(o.ttl, '--ttl') / 1000) : undefined;
      const c = a.conn(cmd);
      type Minted = { id: string; port: number; url: string; expiresAt: string };
      const r = await a.callJson<Minted>(
        c,
        'POST',
        a.subPath(c.ns, name, 'previews'),
        {},
        { port, ...(ttlSeconds !== undefined ? { ttlSeconds } : {}) },
      );
      io.out(toJson({ id: r.id, port: r.port, url: r.url, expiresAt: r.expiresAt }));
      setExit(0);
    });

  a.verb('previews')
    .description('the live preview URLs of a session: id, port, expiry (never the URL)')
    .argument('<name>', 'the session')
    .option('-o, --output <format>', 'json or yaml', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      type Listed = { id: string; port: number; expirationTimestamp: string };
      const r = await a.callJson<{ items: Listed[] }>(c, 'GET', a.subPath(c.ns, name, 'previews'));
      if (o.output === 'json') return (io.out(toJson(r)), setExit(0));
      if (o.output === 'yaml') return (io.out(toYaml(r)), setExit(0));
      if (o.output) throw new CliError(`error: unknown output format ${JSON.stringify(o.output)} (json, yaml)`);
      if (!r.items.length) io.out(`No previews for agentsession ${name} in ${c.ns} namespace.\n`);
      else
        io.out(
          tabwrite([['ID', 'PORT', 'EXPIRES'], ...r.items.map((p) => [p.id, String(p.port), p.expirationTimestamp])]),
        );
      setExit(0);
    });

  a.verb('unexpose')
    .description('revoke a preview URL (it answers 404 from then on; open WebSockets are cut)')
    .argument('<name>', 'the session')
    .argument('<id>', 'the preview id (fluxctl agent previews NAME)')
    .action(async (name: string, id: string, _o, cmd: Command) => {
      const c = a.conn(cmd);
      await a.callJson<unknown>(c, 'DELETE', `${a.subPath(c.ns, name, 'previews')}/${encodeURIComponent(id)}`);
      io.out(`preview ${id} of agentsession ${name} revoked\n`);
      setExit(0);
    });
}
