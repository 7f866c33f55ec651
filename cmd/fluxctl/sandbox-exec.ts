// `fluxctl sandbox exec` (and `fluxctl exec`), `fluxctl sandbox shell`: streamed and terminal execs over the
// WebSocket exec subresource (v5.channel.k8s.io). See sandbox.ts for the verbs' summary.
import type https from 'node:https';
import type { Command } from 'commander';
import type WebSocket from 'ws';
import { statusErrorFrom } from '../../runtime/client/clientnode.js';
import { escapeLine } from './escape.js';
import { withRawTerminal, type TerminalSize } from './terminal.js';
import { printResult } from './printers.js';
import { connect, subPath, unreachable, type Conn } from './sandboxapi.js';
import { sandboxOutput } from './output.js';
import { CliError, processIo, type Io, globalOptions } from './util.js';
import { durationFlag, notPaused, seconds, optionValue, type SandboxVerbs } from './sandbox-common.js';

/** The metav1.Status an exec stream ends with (channel 3). */
export interface ExecStatus {
  status?: string;
  reason?: string;
  code?: number;
  message?: string;
  details?: { causes?: Array<{ reason?: string; message?: string }> };
}

/**
 * The one-line reason for a non-zero exit of a command that printed nothing, or undefined:
 * 127 / 126 is what the runtime answers for a command it could not start (no such program /
 * not executable; its stderr then holds only the runtime's line, see onlyStartFailure), a
 * Status saying "timed out" is the deadline's SIGKILL (137), other signals by their exit code
 * 128+N. `timeoutSeconds`: the deadline asked for (the server's WebSocket default is 3600 s).
 */

export function exitReason(
  argv: string[],
  code: number,
  status: ExecStatus | undefined,
  timeoutSeconds = 3600,
): string | undefined {
  if (code === 0) return undefined;
  if (/timed out/.test(String(status?.message ?? ''))) return `killed after the ${timeoutSeconds} s timeout`;
  if (code === 127) return `command not found: ${escapeLine(argv[0] ?? '')}`;
  if (code === 126) return `command not executable: ${escapeLine(argv[0] ?? '')}`;
  if (code === 137) return 'killed (SIGKILL: out of memory, or killed from outside)';
  if (code > 128 && code < 160) return `killed by signal ${code - 128}`;
  return undefined;
}

/**
 * Whether the stderr bytes of an exec are only the runtime's line saying why the command could
 * not start (procbox: `procbox: exec ARGV0: REASON`; the vm guest agent: `fluxvm-agent:
 * ARGV0: REASON`): the command itself printed nothing, so exitReason's line still follows. Pure.
 */
export function onlyStartFailure(stderr: Buffer): boolean {
  return stderr.length <= 1024 && /^(procbox: exec |fluxvm-agent: )[^\n]*\r?\n$/.test(stderr.toString('utf8'));
}

/** Where an exec WebSocket goes when it is not sandboxes/NAME/exec: the path and extra query parameters. */
export interface ExecAt {
  path: string;
  query?: Record<string, string>;
}

/** Exec over the WebSocket channel protocol; resolves with the command's exit code. */
export async function streamExec(
  c: Conn,
  name: string,
  argv: string[],
  o: {
    stdin?: NodeJS.ReadableStream;
    timeoutSeconds?: number;
    onStdout: (b: Buffer) => void;
    onStderr: (b: Buffer) => void;
    onStatus?: (status: ExecStatus) => void;
    /** A terminal of this size (tty=true, its first resize frame); its output comes as stdout. */
    tty?: TerminalSize;
    /** Once connected: resize the remote terminal, or close the stream (the command is killed). */
    onOpen?: (ctl: { resize(s: TerminalSize): void; close(): void }) => void;
    /** Another exec subresource speaking the same protocol (agentsessions/NAME/exec) and its extra query parameters. */
    at?: ExecAt;
  },
): Promise<number> {
  const url = new URL(c.client.server() + (o.at?.path ?? subPath(c.ns, name, 'exec')));
  for (const a of argv) url.searchParams.append('command', a);
  for (const [k, v] of Object.entries(o.at?.query ?? {})) url.searchParams.set(k, v);
  url.searchParams.set('stdin', o.stdin ? 'true' : 'false');
  url.searchParams.set('stdout', 'true');
  url.searchParams.set('stderr', o.tty ? 'false' : 'true');
  if (o.tty) url.searchParams.set('tty', 'true');
  if (o.timeoutSeconds) url.searchParams.set('timeoutSeconds', String(o.timeoutSeconds));
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  const opts: https.RequestOptions = { headers: {} };
  await c.client.kc.applyToHTTPSOptions(opts);
  // ws is imported here, not at start-up: it costs every fluxctl command ~0.1 s of CPU to load.
  const { default: WebSocketClass } = await import('ws');
  return new Promise<number>((resolve, reject) => {
    // The kubeconfig's TLS and auth, as https options (ws takes the same ones).
    const tls = opts as WebSocket.ClientOptions;
    const ws = new WebSocketClass(url, ['v5.channel.k8s.io', 'v4.channel.k8s.io'], {
      ...tls,
      perMessageDeflate: false,
    });
    let status: ExecStatus | undefined;
    ws.on('unexpected-response', (_req, res) => {
      const chunks: Buffer[] = [];
      res.on('data', (b: Buffer) => chunks.push(b));
      res.on('end', () => reject(statusErrorFrom(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
    });
    ws.on('error', (e) => reject(unreachable(e)));
    const onData = (b: Buffer) => ws.send(Buffer.concat([Buffer.from([0]), Buffer.from(b)]));
    const onEnd = () => {
      if (ws.protocol === 'v5.channel.k8s.io') ws.send(Buffer.from([255, 0]));
    };
    ws.on('open', () => {
      const resize = (s: TerminalSize) => {
        if (ws.readyState === ws.OPEN)
          ws.send(Buffer.concat([Buffer.from([4]), Buffer.from(JSON.stringify({ Width: s.cols, Height: s.rows }))]));
      };
      if (o.tty) resize(o.tty);
      o.onOpen?.({ resize, close: () => ws.close() });
      if (!o.stdin) return;
      o.stdin.on('data', onData);
      o.stdin.on('end', onEnd);
    });
    ws.on('message', (data: WebSocket.RawData) => {
      const b = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
      if (b.length === 0) return;
      const body = b.subarray(1);
      if (b[0] === 1) o.onStdout(body);
      else if (b[0] === 2) o.onStderr(body);
      else if (b[0] === 3) {
        try {
          status = JSON.parse(body.toString('utf8')) as ExecStatus;
        } catch {
          status = { status: 'Failure', message: body.toString('utf8') };
        }
      }
    });
    ws.on('close', () => {
      // Listeners off: main() may run many execs in one process (tests) on the same stdin.
      o.stdin?.off('data', onData);
      o.stdin?.off('end', onEnd);
      o.stdin?.pause?.();
      if (!status) return reject(new CliError('error: the exec stream ended without an exit status'));
      o.onStatus?.(status);
      if (status.status === 'Success') return resolve(0);
      const cause = status.details?.causes?.find((x) => x.reason === 'ExitCode');
      if (status.reason === 'NonZeroExitCode' && cause) return resolve(Number(cause.message));
      reject(statusErrorFrom(status.code ?? 500, JSON.stringify({ kind: 'Status', ...status })));
    });
  });
}

/** `fluxctl sandbox shell`'s program: bash where the sandbox has it, else sh. */
export const SHELL = ['/bin/sh', '-c', 'if [ -x /bin/bash ]; then exec /bin/bash; fi; exec /bin/sh'];

/**
 * `exec -t`: the command on a remote terminal with the local one in raw mode (terminal.ts),
 * the remote bytes written to it as they are (what a terminal is for: no escaping), window
 * sizes forwarded; resolves with the remote exit code (128+N when signal N ended fluxctl; the
 * stream is closed, which kills the command). Undefined, after kubectl's warning, when
 * stdin or stdout is not a terminal: the caller runs the command without one.
 */
export async function ttyExec(
  c: Conn,
  name: string,
  argv: string[],
  io: Io,
  timeoutSeconds?: number,
  at?: ExecAt,
): Promise<number | undefined> {
  const stdin = process.stdin;
  const stdout = process.stdout;
  if (io !== processIo || !stdin.isTTY || !stdout.isTTY) {
    io.err('Unable to use a TTY - input is not a terminal or the right kind of file\n');
    return undefined;
  }
  return withRawTerminal(stdin, stdout, (t) => {
    let ctl: { resize(s: TerminalSize): void; close(): void } | undefined;
    t.onResize((s) => ctl?.resize(s));
    t.onSignal(() => ctl?.close());
    return streamExec(c, name, argv, {
      stdin,
      tty: t.size(),
      timeoutSeconds,
      at,
      onOpen: (x) => (ctl = x),
      onStdout: (b) => stdout.write(b),
      onStderr: (b) => stdout.write(b),
    });
  });
}

export function addExecVerbs({ verb, io, setExit, program }: SandboxVerbs): void {
  const g = globalOptions;
  const output = optionValue;
  // `fluxctl sandbox exec` and its kubectl-shaped alias `fluxctl exec`.
  const defineExec = (cmd: Command, verbPath: string) =>
    cmd
      .description('run a command in a sandbox, streaming its output; exits with its exit code')
      .argument('<name>')
      .argument('<command...>', 'the command and its arguments, after --')
      .option('-i, --stdin', 'pass stdin to the command (default when stdin is not a terminal)')
      .option(
        '-t, --tty',
        'an interactive terminal: the local terminal in raw mode, window size followed (with -i: -it)',
      )
      .option(
        '--timeout <duration>',
        'kill the command after this long (30s, 5m; a bare number is seconds)',
        durationFlag('--timeout'),
      )
      .option(
        '--raw',
        'write output byte for byte even to a terminal (default: control characters escaped on a terminal)',
      )
      .option(
        '-o, --output <format>',
        'json|yaml|jsonpath=...: print {exitCode, stdout, stderr, durationMs} when the command ends',
        output,
      )
      .addHelpText(
        'after',
        `\nExamples:\n  ${verbPath} dev -- ls -la /work\n  ${verbPath} -it dev -- bash\n  ${verbPath} dev --timeout 30s -- make test\n  ${verbPath} dev -o json -- cat /etc/os-release\n`,
      )
      .action(async (name: string, argv: string[], o, cmd: Command) => {
        if (o.tty && o.output)
          throw new CliError('error: -o cannot be used with -t (a terminal session has no structured result)');
        const c = connect(g(cmd));
        await notPaused(c, name);
        if (o.tty) {
          const code = await ttyExec(c, name, argv, io, seconds(o.timeout));
          if (code !== undefined) return setExit(code);
        }
        const stdin = o.stdin || !process.stdin.isTTY ? process.stdin : undefined;
        const started = Date.now();
        if (o.output) {
          // A structured result: the bytes are collected (as text) and printed once, raw (a format, not a terminal
          // view).
          const outs: Buffer[] = [];
          const errs: Buffer[] = [];
          const exitCode = await streamExec(c, name, argv, {
            stdin,
            timeoutSeconds: seconds(o.timeout),
            onStdout: (b) => outs.push(b),
            onStderr: (b) => errs.push(b),
          });
          const value = {
            exitCode,
            stdout: Buffer.concat(outs).toString('utf8'),
            stderr: Buffer.concat(errs).toString('utf8'),
            durationMs: Date.now() - started,
          };
          printResult(
            (x) => io.out(x),
            o.output,
            value,
            () => undefined,
          );
          setExit(exitCode);
          return;
        }
        const out = sandboxOutput(io, 'out', { raw: o.raw });
        const err = sandboxOutput(io, 'err', { raw: o.raw });
        let printed = 0;
        const errHead: Buffer[] = []; // the first KiB of stderr: is it only the runtime's start failure?
        let errBytes = 0;
        let status: ExecStatus | undefined;
        const code = await streamExec(c, name, argv, {
          stdin,
          timeoutSeconds: seconds(o.timeout),
          onStdout: (b) => ((printed += b.length), out.write(b)),
          onStderr: (b) => {
            printed += b.length;
            if (errBytes <= 1024) errHead.push(b);
            errBytes += b.length;
            err.write(b);
          },
          onStatus: (st) => (status = st),
        });
        out.end();
        err.end();
        // The code is kept; a command that printed nothing gets a line saying why it ended.
        const quiet = printed === 0 || (printed === errBytes && onlyStartFailure(Buffer.concat(errHead)));
        const why = quiet ? exitReason(argv, code, status, seconds(o.timeout)) : undefined;
        if (why) io.err(`error: ${why}\n`);
        setExit(code);
      });
  defineExec(verb('exec'), 'fluxctl sandbox exec');
  defineExec(
    program
      .command('exec')
      .option('--kubeconfig <path>', 'path to the kubeconfig file')
      .option('-n, --namespace <ns>', 'namespace of the sandbox')
      .option('--context <name>', 'kubeconfig context to use'),
    'fluxctl exec',
  );

  verb('shell')
    .description(
      'an interactive shell in a sandbox: /bin/bash if it has one, else /bin/sh (or CMD); exits with its exit code',
    )
    .argument('<name>')
    .argument('[command...]', 'another program to run on the terminal, after --')
    .option(
      '--timeout <duration>',
      'end the session after this long (30s, 5m; a bare number is seconds; default 1h)',
      durationFlag('--timeout'),
    )
    .addHelpText('after', '\nExamples:\n  fluxctl sandbox shell dev\n  fluxctl sandbox shell dev -- python3\n')
    .action(async (name: string, argv: string[], o, cmd: Command) => {
      const c = connect(g(cmd));
      await notPaused(c, name);
      const command = argv.length ? argv : SHELL;
      const code = await ttyExec(c, name, command, io, seconds(o.timeout));
      if (code !== undefined) return setExit(code);
      // No terminal here: the shell reads the commands from stdin, its output as exec prints it.
      const out = sandboxOutput(io, 'out');
      const err = sandboxOutput(io, 'err');
      setExit(
        await streamExec(c, name, command, {
          stdin: process.stdin,
          timeoutSeconds: seconds(o.timeout),
          onStdout: (b) => out.write(b),
          onStderr: (b) => err.write(b),
        }),
      );
      out.end();
      err.end();
    });
}
