// `fluxctl sandbox ...`: the imperative verbs of sandboxes, over their subresources.
//
//   exec NAME [-i] [-t] [--timeout S] [--raw] -- CMD...   (also `fluxctl exec`)
//                                            streams over the WebSocket exec (v5.channel.k8s.io);
//                                            stdin passed through (with -i, or when stdin is
//                                            not a terminal); exits with the command's code.
//                                            Output going to a terminal is escaped (escape.ts)
//                                            unless --raw; to a pipe or file it is byte-exact.
//                                            -t: an interactive terminal (tty=true, the remote
//                                            pty's bytes go raw to the local terminal, which is
//                                            in raw mode until the end; resizes forwarded).
//   shell NAME [-- CMD...]                   exec -it of /bin/bash if the sandbox has it, else /bin/sh
//   files NAME PATH                          lists a directory (or stats a file)
//   cat NAME PATH [--raw]                    writes a file's bytes to stdout (escaped on a terminal unless --raw)
//   put NAME PATH [FILE|-] [--mode 0644]     writes a file (parents created) from FILE or stdin
//   rm NAME PATH [-r]                        deletes a file (or a directory, recursively)
//   baseline NAME --path P [--path P...]     records a baseline of the files below the paths
//   changes NAME [--path P...]               what changed since the baseline
//   dry-run NAME [--path P...] -- CMD...     runs CMD in a discarded copy, prints its output and changes
//   checkpoint NAME [--name CK] [--memory]   creates a Checkpoint and waits until it is ready
//   fork NAME --count N                      creates N Sandboxes forked from NAME
//   forks NAME                               lists NAME's forks and how their files differ from NAME
//   diff A B [--path P]                      the file differences of two sandboxes (unified diff, escaped)
//   restore NAME CHECKPOINT                  puts NAME back to CHECKPOINT in place (sandboxes/restore)
//   pause|resume NAME                        sets spec.paused
// API errors print as kubectl prints them (util.formatError); the exit code is 1.
import { setTimeout as sleep } from 'node:timers/promises';
import fs from 'node:fs';
import type https from 'node:https';
import type { Command } from 'commander';
import WebSocket from 'ws';
import { statusErrorFrom } from '../../runtime/client/clientnode.js';
import { rfc3339 } from '../../runtime/controller/conditions.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import { isStatusError } from '../../runtime/meta/errors.js';
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import { sideEffectLines } from './changeset.js';
import { escapeLine, escapeTerminal } from './escape.js';
import { withRawTerminal, type TerminalSize } from './terminal.js';
import { printResult, tabwrite } from './printers.js';
import { call, callJson, connect, SANDBOXES, subPath, unreachable, type Conn, type FileStat } from './sandboxapi.js';
import { compareSandboxes, renderDiff } from './sandboxdiff.js';
import { addJobVerbs } from './jobs.js';
import { sandboxOutput } from './output.js';
import { CliError, globalOptions, parseDuration, processIo, type Io } from './util.js';
import { checkpoint } from '../../apis/checkpoint.js';

export { sandboxOutput };

/** A --timeout value: a kubectl duration (30s, 5m; a bare number is seconds) -> ms. */
export const durationFlag =
  (flag: string) =>
  (v: string): number =>
    parseDuration(v.startsWith('=') ? v.slice(1) : v, flag);
const seconds = (ms: number | undefined) => (ms ? Math.max(1, Math.ceil(ms / 1000)) : undefined);

/** The label every fork child carries: the parent's name. */
export const FORK_OF = 'fluxvm.dev/fork-of';
const CHECKPOINTS: GVR = gvrOf(checkpoint);

function collect(v: string, prev: string[] = []): string[] {
  return [...prev, v];
}

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
  return new Promise<number>((resolve, reject) => {
    // The kubeconfig's TLS and auth, as https options (ws takes the same ones).
    const tls = opts as WebSocket.ClientOptions;
    const ws = new WebSocket(url, ['v5.channel.k8s.io', 'v4.channel.k8s.io'], { ...tls, perMessageDeflate: false });
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

/** A CliError when PATH is a directory of the sandbox (a missing path is not: put creates it). */
async function refuseDirectory(c: Conn, name: string, path: string, hint: string): Promise<void> {
  let st: { type?: string } | undefined;
  try {
    st = await callJson<{ type?: string }>(c, 'GET', subPath(c.ns, name, 'files'), { path, stat: 'true' });
  } catch (e) {
    if (isStatusError(e) && e.status.code === 404) return;
    throw e;
  }
  if (st?.type === 'dir') throw new CliError(`error: ${escapeLine(path)} is a directory: ${escapeLine(hint)}`);
}

/** A paused sandbox's processes are frozen: an exec would wait for a thaw, so it is refused with the way out. */
async function notPaused(c: Conn, name: string): Promise<void> {
  const sbx = await c.client.get<Sandbox>(SANDBOXES, c.ns, name);
  if (sbx.spec?.paused || sbx.status?.phase === 'Paused')
    throw new CliError(`error: sandbox ${name} is paused: \`fluxctl sandbox resume ${name}\``);
}

function fmtMode(m: number): string {
  return '0' + (m & 0o7777).toString(8).padStart(3, '0');
}

/** sandboxes/NAME/changes's answer (and the changes part of dryrun's). */
interface Changes {
  added: string[];
  modified: string[];
  deleted: string[];
  unchanged: number;
}

/** sandboxes/NAME/dryrun's answer. */
interface DryRunAnswer {
  exitCode: number;
  timedOut?: boolean;
  stdout?: string;
  stderr?: string;
  changes: Changes & { paths: string[] };
  sideEffects?: Parameters<typeof sideEffectLines>[0];
  discarded: unknown;
  revertedVia: string;
}

function printChanges(io: Io, ch: Changes): void {
  for (const p of ch.added) io.out(`A  ${escapeLine(p)}\n`);
  for (const p of ch.modified) io.out(`M  ${escapeLine(p)}\n`);
  for (const p of ch.deleted) io.out(`D  ${escapeLine(p)}\n`);
  io.out(
    `${ch.added.length} added, ${ch.modified.length} modified, ${ch.deleted.length} deleted, ${ch.unchanged} unchanged\n`,
  );
}

/** Registers `fluxctl sandbox` and its verbs on the program. */
export function addSandboxCommand(program: Command, io: Io, setExit: (code: number) => void): Command {
  const group = program
    .command('sandbox')
    .alias('sbx')
    .description('run commands in sandboxes, read and write their files, fork and checkpoint them');
  const verb = (name: string) =>
    group
      .command(name)
      .option('--kubeconfig <path>', 'path to the kubeconfig file')
      .option('-n, --namespace <ns>', 'namespace of the sandbox')
      .option('--context <name>', 'kubeconfig context to use');
  const g = globalOptions;
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

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

  verb('files')
    .description('list a directory of a sandbox (or show one file)')
    .argument('<name>')
    .argument('[path]', 'absolute path', '/work')
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, path: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const st = await callJson<FileStat>(c, 'GET', subPath(c.ns, name, 'files'), { path, stat: 'true' });
      const items =
        st.type === 'dir'
          ? (await callJson<{ items: FileStat[] }>(c, 'GET', subPath(c.ns, name, 'files'), { path })).items
          : [st];
      printResult(
        (x) => io.out(x),
        o.output,
        items,
        () => {
          const rows = [['MODE', 'SIZE', 'MODIFIED', 'NAME']];
          for (const e of items) {
            const n = escapeLine(e.name); // the sandbox names its files: shown escaped
            rows.push([
              `${e.type === 'dir' ? 'd' : e.type === 'symlink' ? 'l' : '-'}${fmtMode(e.mode)}`,
              String(e.size),
              rfc3339(e.mtime),
              e.type === 'symlink' ? `${n} -> ${escapeLine(String(e.linkTarget))}` : e.type === 'dir' ? `${n}/` : n,
            ]);
          }
          io.out(tabwrite(rows));
        },
      );
      setExit(0);
    });

  verb('cat')
    .description("write a sandbox file's bytes to stdout")
    .argument('<name>')
    .argument('<path>')
    .option(
      '--raw',
      'write the bytes as they are even to a terminal (default: control characters escaped on a terminal)',
    )
    .action(async (name: string, path: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      await refuseDirectory(
        c,
        name,
        path,
        `cat prints one file: list a directory with \`fluxctl sandbox files ${name} ${path}\`, copy it out with \`fluxctl cp ${name}:${path} ./DIR\``,
      );
      const out = sandboxOutput(io, 'out', { raw: o.raw });
      out.write(await call(c, 'GET', subPath(c.ns, name, 'files'), { path }));
      out.end();
      setExit(0);
    });

  verb('put')
    .description('write a file into a sandbox (parent directories created) from FILE or stdin')
    .argument('<name>')
    .argument('<path>')
    .argument('[file]', 'local file, or - for stdin', '-')
    .option('--mode <octal>', 'permission bits, e.g. 0755')
    .option('-o, --output <format>', "json|yaml|jsonpath=...: the written file's path, size and mode", output)
    .action(async (name: string, path: string, file: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      if (file !== '-' && fs.statSync(file, { throwIfNoEntry: false })?.isDirectory())
        throw new CliError(
          `error: ${file} is a directory: put copies one file; copy a tree with \`fluxctl cp ${file} ${name}:${path}\``,
        );
      const hint = `put writes one file: give the file's own path, e.g. ${path.replace(/\/+$/, '')}/${file === '-' ? 'NAME' : (file.split('/').pop() ?? 'NAME')}`;
      if (path.endsWith('/')) throw new CliError(`error: ${escapeLine(path)} is a directory: ${escapeLine(hint)}`);
      await refuseDirectory(c, name, path, hint);
      let data: Buffer;
      if (file === '-') {
        const chunks: Buffer[] = [];
        for await (const b of process.stdin) chunks.push(b as Buffer);
        data = Buffer.concat(chunks);
      } else {
        try {
          data = fs.readFileSync(file);
        } catch (e) {
          throw new CliError(`error: ${(e as Error).message}`);
        }
      }
      const st = await callJson<FileStat>(c, 'PUT', subPath(c.ns, name, 'files'), { path, mode: o.mode }, data);
      printResult(
        (x) => io.out(x),
        o.output,
        st,
        () => io.out(`${escapeLine(st.path)} written (${st.size} bytes, mode ${fmtMode(st.mode)})\n`),
      );
      setExit(0);
    });

  verb('rm')
    .description('delete a file (or, with -r, a directory) in a sandbox')
    .argument('<name>')
    .argument('<path>')
    .option('-r, --recursive', 'delete a directory and everything below it')
    .action(async (name: string, path: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      await call(c, 'DELETE', subPath(c.ns, name, 'files'), { path, recursive: o.recursive ? 'true' : undefined });
      io.out(`${escapeLine(path)} deleted\n`);
      setExit(0);
    });

  verb('baseline')
    .description('record the files below the paths, for a later `changes`')
    .argument('<name>')
    .option('--path <dir>', 'directory to record (repeatable)', collect)
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<{ files: number; paths: string[]; mode: string }>(
        c,
        'POST',
        subPath(c.ns, name, 'baseline'),
        {},
        { paths: o.path ?? ['/work'] },
      );
      printResult(
        (x) => io.out(x),
        o.output,
        r,
        () => io.out(`baseline recorded: ${r.files} files below ${r.paths.join(', ')} (${r.mode})\n`),
      );
      setExit(0);
    });

  verb('changes')
    .description('list the files added, modified and deleted since the baseline')
    .argument('<name>')
    .option('--path <dir>', 'narrow to this directory of the baseline (repeatable)', collect)
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<Changes>(
        c,
        'POST',
        subPath(c.ns, name, 'changes'),
        {},
        o.path ? { paths: o.path } : {},
      ).catch((e) => {
        if (e?.status?.reason === 'NotFound' && /no baseline recorded/.test(e.status.message ?? ''))
          throw new CliError(
            `error: sandbox ${name} has no baseline: take one first: \`fluxctl sandbox baseline ${name} --path /work\``,
          );
        throw e;
      });
      printResult(
        (x) => io.out(x),
        o.output,
        r,
        () => printChanges(io, r),
      );
      setExit(0);
    });

  verb('dry-run')
    .description('run a command in a discarded copy of the sandbox and show what it would change')
    .argument('<name>')
    .argument('<command...>', 'the command and its arguments, after --')
    .option('--path <dir>', 'directory whose changes to report (repeatable; default the workspace)', collect)
    .option(
      '--timeout <duration>',
      'kill the command after this long (30s, 5m; a bare number is seconds)',
      durationFlag('--timeout'),
    )
    .option(
      '--egress <mode>',
      "the copy's network: none, readOnly (only GET/HEAD/OPTIONS go out, the rest is held), sandbox (default: readOnly with an allow-list, none otherwise)",
    )
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .action(async (name: string, argv: string[], o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<DryRunAnswer>(
        c,
        'POST',
        subPath(c.ns, name, 'dryrun'),
        {},
        {
          command: argv,
          ...(o.path ? { paths: o.path } : {}),
          ...(o.timeout ? { timeoutSeconds: seconds(o.timeout) } : {}),
          ...(o.egress ? { egress: o.egress } : {}),
        },
      );
      if (o.output)
        printResult(
          (x) => io.out(x),
          o.output,
          r,
          () => undefined,
        );
      else {
        // A report for a person: the copy's output and paths shown escaped (-o json is raw).
        if (r.stdout) io.out(escapeTerminal(r.stdout));
        if (r.stderr) io.err(escapeTerminal(r.stderr));
        io.out(
          `--- exit code ${r.exitCode}${r.timedOut ? ' (timed out)' : ''}; changes below ${escapeLine(r.changes.paths.join(', '))}:\n`,
        );
        printChanges(io, r.changes);
        if (r.sideEffects) io.out(sideEffectLines(r.sideEffects).join('\n') + '\n');
        io.out(`discarded: ${r.discarded} (via ${r.revertedVia})\n`);
      }
      setExit(r.exitCode === 0 ? 0 : r.exitCode);
    });

  verb('checkpoint')
    .description('checkpoint a sandbox (creates a Checkpoint) and wait until it is ready')
    .argument('<name>')
    .option('--name <ck>', 'name of the Checkpoint (default: <sandbox>-<time>)')
    .option('--memory', 'also save memory (backends that can)')
    .option('--wait [bool]', 'wait until readyToUse', 'true')
    .option(
      '--timeout <duration>',
      'how long to wait (30s, 5m; a bare number is seconds)',
      durationFlag('--timeout'),
      60_000,
    )
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...: the Checkpoint', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const ckName =
        o.name ?? `${name}-${new Date().toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').toLowerCase()}`;
      await c.client.create(CHECKPOINTS, c.ns, {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Checkpoint',
        metadata: { name: ckName },
        spec: { sandboxRef: { name }, memory: !!o.memory },
      });
      if (o.wait !== 'false') {
        const deadline = Date.now() + o.timeout;
        for (;;) {
          const ck = await c.client.get<Checkpoint>(CHECKPOINTS, c.ns, ckName);
          if (ck.status?.readyToUse) break;
          if (ck.status?.phase === 'Failed')
            throw new CliError(`error: checkpoint.fluxvm.dev/${ckName} failed: ${ck.status.message ?? ''}`);
          if (Date.now() > deadline)
            throw new CliError(`error: timed out waiting for checkpoint.fluxvm.dev/${ckName} to be ready`);
          await sleep(100);
        }
      }
      const ck = o.output && o.output !== 'name' ? await c.client.get(CHECKPOINTS, c.ns, ckName) : undefined;
      printResult(
        (x) => io.out(x),
        o.output,
        ck,
        () => io.out(`checkpoint.fluxvm.dev/${ckName} created\n`),
        [`checkpoint.fluxvm.dev/${ckName}`],
      );
      setExit(0);
    });

  verb('restore')
    .description(
      'put a sandbox back to one of its checkpoints in place: same name, uid and address (refused while a command runs)',
    )
    .argument('<name>', 'the sandbox')
    .argument('<checkpoint>', 'a ready Checkpoint of this sandbox (fluxctl sandbox checkpoint NAME --name CK)')
    .option('-o, --output <format>', 'json|yaml|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl sandbox checkpoint dev --name before\n  fluxctl sandbox exec dev -- rm -rf /work/src\n  fluxctl sandbox restore dev before\n',
    )
    .action(async (name: string, ck: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const r = await callJson<{ memory?: boolean }>(c, 'POST', subPath(c.ns, name, 'restore'), {}, { checkpoint: ck });
      printResult(
        (x) => io.out(x),
        o.output,
        r,
        () => io.out(`sandbox.fluxvm.dev/${name} restored to checkpoint ${ck}${r.memory ? ' (memory too)' : ''}\n`),
      );
      setExit(0);
    });

  for (const [v, paused] of [
    ['pause', true],
    ['resume', false],
  ] as const) {
    verb(v)
      .description(
        paused ? 'freeze every process of a sandbox (spec.paused: true)' : 'thaw a paused sandbox (spec.paused: false)',
      )
      .argument('<name>', 'the sandbox')
      .addHelpText('after', `\nExamples:\n  fluxctl sandbox ${v} dev\n`)
      .action(async (name: string, _o, cmd: Command) => {
        const c = connect(g(cmd));
        await c.client.patch(SANDBOXES, c.ns, name, 'merge', { spec: { paused } });
        io.out(`sandbox.fluxvm.dev/${name} ${paused ? 'paused' : 'resumed'}\n`);
        setExit(0);
      });
  }

  verb('diff')
    .description(
      'show the file differences between the workspaces of two sandboxes (A -> B): a unified diff of text files, binary and large files named; exits 1 when they differ, as diff does',
    )
    .argument('<a>', 'the sandbox shown as a/ (the "before")')
    .argument('<b>', 'the sandbox shown as b/ (the "after")')
    .option('--path <dir>', "directory to compare (default A's workspace path)")
    .option('-o, --output <format>', 'json|yaml|jsonpath=...: {added, modified, deleted} (paths)', output)
    .addHelpText(
      'after',
      '\nExamples:\n  fluxctl sandbox diff dev dev-fork-x7k2p\n  fluxctl sandbox diff dev dev-fork-x7k2p --path /work/src\n  fluxctl sandbox diff dev dev-fork-x7k2p -o json\n',
    )
    .action(async (a: string, b: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const sa = await c.client.get<Sandbox>(SANDBOXES, c.ns, a);
      const path = o.path ?? sa.spec?.workspace?.path ?? '/work';
      const d = await compareSandboxes(c, a, b, path);
      const differ = d.added.length + d.modified.length + d.deleted.length > 0;
      if (o.output)
        printResult(
          (x) => io.out(x),
          o.output,
          { added: d.added, modified: d.modified, deleted: d.deleted },
          () => undefined,
        );
      else io.out(escapeTerminal(await renderDiff(c, a, b, d)));
      setExit(differ ? 1 : 0);
    });

  verb('forks')
    .description(
      'list the sandboxes forked from NAME (label fluxvm.dev/fork-of=NAME), with their changes since the fork',
    )
    .argument('<name>', 'the parent sandbox')
    .option('-o, --output <format>', 'json|yaml|name|wide|jsonpath=...', output)
    .addHelpText(
      'after',
      '\nCHANGES: files the child added/modified/deleted since it was forked (its layered history, by content: a mode-only change is not counted); where the backend keeps none (vm), how the child differs from the parent now, marked "(vs parent now)"; - when not running. See the files with `fluxctl sandbox diff NAME CHILD`.\n\nExamples:\n  fluxctl sandbox forks dev\n  fluxctl sandbox forks dev -o name\n',
    )
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      const list = await c.client.list<Sandbox>(SANDBOXES, c.ns, { labelSelector: `${FORK_OF}=${name}` });
      const items = list.items ?? [];
      if (!o.output || o.output === 'wide') {
        if (!items.length) {
          io.err(`No forks of sandbox ${name} in ${c.ns} namespace.\n`);
          return setExit(0);
        }
        const parent = await c.client.get<Sandbox>(SANDBOXES, c.ns, name);
        const usable = (s: Sandbox) =>
          !s.metadata.deletionTimestamp && (s.status?.phase === 'Running' || s.status?.phase === 'Paused');
        // Since the fork (the child's layered history), else how the child differs from the parent now.
        const changes = async (s: Sandbox): Promise<string> => {
          if (!usable(s)) return '-';
          type Changed = Record<'added' | 'modified' | 'deleted', unknown[]>;
          const since = await callJson<Changed>(
            c,
            'POST',
            subPath(c.ns, s.metadata.name!, 'changes'),
            {},
            { since: 'fork' },
          ).catch(() => undefined);
          if (since) return `+${since.added.length} ~${since.modified.length} -${since.deleted.length}`;
          if (!usable(parent)) return '-';
          const d = await compareSandboxes(c, name, s.metadata.name!, parent.spec?.workspace?.path ?? '/work').catch(
            () => undefined,
          );
          return d ? `+${d.added.length} ~${d.modified.length} -${d.deleted.length} (vs parent now)` : '-';
        };
        const rows = [['NAME', 'PHASE', 'OWNED', 'CHANGES', 'AGE', ...(o.output === 'wide' ? ['UID'] : [])]];
        for (const s of items) {
          const owned = (s.metadata.ownerReferences ?? []).some((r) => r.kind === 'Sandbox' && r.name === name);
          const secs = Math.max(0, Math.floor((Date.now() - Date.parse(s.metadata.creationTimestamp ?? '')) / 1000));
          rows.push([
            s.metadata.name ?? '',
            s.status?.phase ?? '',
            owned ? 'yes' : 'no (--keep)',
            await changes(s),
            secs < 120 ? `${secs}s` : secs < 7200 ? `${Math.floor(secs / 60)}m` : `${Math.floor(secs / 3600)}h`,
            ...(o.output === 'wide' ? [s.metadata.uid ?? ''] : []),
          ]);
        }
        io.out(tabwrite(rows));
      } else
        printResult(
          (x) => io.out(x),
          o.output,
          { apiVersion: 'v1', kind: 'List', items },
          () => undefined,
          items.map((s) => `sandbox.fluxvm.dev/${s.metadata.name}`),
        );
      setExit(0);
    });

  verb('fork')
    .description('create N sandboxes that start from the current state of NAME')
    .argument('<name>')
    .option('--count <n>', 'how many (1..1000)', (v) => Number(v), 1)
    .option('--keep', 'children outlive the parent (no ownerReference; the fork-of label stays so `forks` finds them)')
    .option('--wait [bool]', 'wait until every child is Ready', 'true')
    .option(
      '--timeout <duration>',
      'how long to wait (30s, 5m; a bare number is seconds)',
      durationFlag('--timeout'),
      120_000,
    )
    .option('-o, --output <format>', 'json|yaml|name|jsonpath=...: the child names ({"parent", "children"})', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = connect(g(cmd));
      if (!Number.isInteger(o.count) || o.count < 1 || o.count > 1000)
        throw new CliError('error: --count must be an integer between 1 and 1000');
      const parent = await c.client.get<Sandbox>(SANDBOXES, c.ns, name);
      const names = await Promise.all(
        Array.from({ length: o.count }, async () => {
          const child = await c.client.create<Sandbox>(SANDBOXES, c.ns, {
            apiVersion: 'fluxvm.dev/v1alpha1',
            kind: 'Sandbox',
            // Findable (label) and, unless --keep, owned: deleting the parent deletes them (GC).
            metadata: {
              generateName: `${name}-fork-`,
              labels: { [FORK_OF]: name },
              ...(o.keep
                ? {}
                : {
                    ownerReferences: [
                      {
                        apiVersion: 'fluxvm.dev/v1alpha1',
                        kind: 'Sandbox',
                        name,
                        uid: parent.metadata.uid!,
                        blockOwnerDeletion: true,
                      },
                    ],
                  }),
            },
            spec: {
              runtime: parent.spec?.runtime,
              ...(parent.spec?.resources ? { resources: parent.spec.resources } : {}),
              ...(parent.spec?.network ? { network: parent.spec.network } : {}),
              ...(parent.spec?.env ? { env: parent.spec.env } : {}),
              workspace: { path: parent.spec?.workspace?.path ?? '/work', source: { sandboxRef: { name } } },
            },
          });
          return child.metadata.name as string;
        }),
      );
      if (o.wait !== 'false') {
        const deadline = Date.now() + o.timeout;
        const pending = new Set(names);
        while (pending.size) {
          for (const n of [...pending]) {
            const s = await c.client.get<Sandbox>(SANDBOXES, c.ns, n);
            const ready = s.status?.conditions?.find((x) => x.type === 'Ready');
            if (ready?.status === 'True') pending.delete(n);
            else if (s.status?.phase === 'Failed')
              throw new CliError(`error: sandbox.fluxvm.dev/${n} failed: ${s.status.message ?? ''}`);
          }
          if (!pending.size) break;
          if (Date.now() > deadline)
            throw new CliError(`error: timed out waiting for ${[...pending].join(', ')} to be Ready`);
          await sleep(50);
        }
      }
      printResult(
        (x) => io.out(x),
        o.output,
        { parent: name, children: names },
        () => {
          for (const n of names) io.out(`sandbox.fluxvm.dev/${n} created\n`);
        },
        names.map((n) => `sandbox.fluxvm.dev/${n}`),
      );
      setExit(0);
    });

  addJobVerbs(
    { verb, conn: (cmd) => connect(g(cmd)), jobsPath: (c, n) => subPath(c.ns, n, 'jobs'), session: false },
    io,
    setExit,
  );
  return group;
}
