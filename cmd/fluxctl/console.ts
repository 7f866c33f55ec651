// `fluxctl console`: opens the review console (console-serve.ts) in a browser, signed in as the
// kubeconfig's user. It asks the server for a single-use sign-in code valid 30 s
// (POST /console/auth/links with the kubeconfig's bearer token) and opens
// <server>/console/#signin=<code>; the page redeems the code for its session cookie. The code
// is in the URL's fragment, which a browser never sends to a server, a proxy or a Referer.
// --print-url prints the URL instead (a browser on another machine, a script).
import { spawn } from 'node:child_process';
import https from 'node:https';
import http from 'node:http';
import type { Command } from 'commander';
import { CliError, globalOptions, makeClient, type Io } from './util.js';

/** The browser command: $BROWSER, else xdg-open (Linux) or open (macOS). */
function browserCommand(): string[] {
  if (process.env.BROWSER) return [process.env.BROWSER];
  return process.platform === 'darwin' ? ['open'] : ['xdg-open'];
}

export function addConsoleCommand(program: Command, io: Io, setExit: (code: number) => void): void {
  program
    .command('console')
    .description('open the review console in a browser, signed in as the kubeconfig user (a single-use 30 s link)')
    .option('--print-url', 'print the sign-in URL instead of opening a browser')
    .option('--kubeconfig <path>', 'path to the kubeconfig file')
    .option('--context <name>', 'kubeconfig context to use')
    .addHelpText('after', '\nExamples:\n  fluxctl console\n  fluxctl console --print-url\n')
    .action(async (o: { printUrl?: boolean }, cmd: Command) => {
      const client = makeClient(globalOptions(cmd));
      const server = client.server();
      const opts: https.RequestOptions = { headers: {} };
      await client.kc.applyToHTTPSOptions(opts);
      const auth = String((opts.headers as Record<string, unknown>).Authorization ?? '');
      if (!/^Bearer \S+$/.test(auth))
        throw new CliError(
          'error: the console signs in with a bearer token, and this kubeconfig user has none (a client certificate cannot be handed to a browser): use a token user, or paste a token on the sign-in page',
        );
      const u = new URL('/console/auth/links', server);
      const body = await new Promise<{ status: number; text: string }>((resolve, reject) => {
        const mod = u.protocol === 'https:' ? https : http;
        const r = mod.request(
          u,
          { ...opts, method: 'POST', headers: { ...opts.headers, 'content-length': 0 } },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (c: Buffer) => chunks.push(c));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
          },
        );
        r.on('error', (e) => reject(new CliError(`error: cannot reach ${server}: ${e.message}`)));
        r.end();
      });
      if (body.status !== 201) {
        let msg = body.text;
        try {
          msg = (JSON.parse(body.text) as { message?: string }).message ?? msg;
        } catch {
          // not JSON
        }
        throw new CliError(
          body.status === 404
            ? `error: ${server} serves no console (an older server, or not fluxctl serve)`
            : `error: the server refused a sign-in link (${body.status}): ${msg}`,
        );
      }
      const { path: p } = JSON.parse(body.text) as { path: string };
      const url = new URL(p, server).toString();
      if (o.printUrl) {
        io.out(`${url}\n`);
        return setExit(0);
      }
      const [bin, ...args] = browserCommand();
      io.err(`Opening ${new URL('/console/', server).toString()} (the sign-in link works once, within 30 s)\n`);
      const child = spawn(bin!, [...args, url], { stdio: 'ignore', detached: true });
      child.on('error', () => io.err(`could not start ${bin}; open this URL within 30 s:\n${url}\n`));
      child.unref();
      setExit(0);
    });
}
