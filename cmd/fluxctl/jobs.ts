// Background-job verbs, for `fluxctl agent` (agentsessions/NAME/jobs) and `fluxctl sandbox`
// (sandboxes/NAME/jobs); spec/agent-sessions.md "Background jobs":
//
//   bg NAME [--stdin] [--max-output-bytes N] [--timeout S] -- CMD...   starts one, prints its JSON ({job, ...})
//   jobs NAME [-o json]                                               the list: JOB STATE EXIT STARTED COMMAND
//   logs NAME JOB [-f] [--raw]                                        stdout to stdout, stderr to stderr; -f follows
//        the Server-Sent Events stream to the end (reconnecting with Last-Event-ID: no byte twice or lost)
//        and exits with the job's exit code (128+N for a signal)
//   stdin NAME JOB [TEXT] [--close]                                   writes TEXT (or this process's stdin, in
//        48 KiB writes) to the job's stdin; --close sends end-of-file
//   kill NAME JOB [--signal S]                                        signals the job's process tree (TERM)
//
// The output is the sandbox's: on a terminal it is escaped (escape.ts), piped it is byte-exact.
import { constants } from 'node:os';
import type http from 'node:http';
import type { Command } from 'commander';
import { escapeLine } from './escape.js';
import { tabwrite, toJson } from './printers.js';
import { sandboxOutput } from './output.js';
import { call, prepare, statusOf, unreachable, type Conn } from './sandboxapi.js';
import { CliError, parseDuration, type Io } from './util.js';
import { sseEvents } from './sse.js';
import { int } from './flags.js';

/** What the kind's verb file hands over. */
export interface JobVerbApi {
  /** A verb of the group with the connection flags. */
  verb(name: string): Command;
  conn(cmd: Command): Conn;
  /** The path of `<plural>/<name>/jobs` in the connection's namespace. */
  jobsPath(c: Conn, name: string): string;
  /** `agent` adds the session's flags (approval, idempotency key). */
  session: boolean;
}

const STDIN_CHUNK = 48 * 1024;

/** The fields of the server's job answers the verbs read (a record, a list, a read). */
interface JobJson {
  job?: string;
  state?: string;
  exitCode?: number;
  signal?: string;
  startedAt?: string;
  command?: unknown;
  items?: JobJson[];
  outputBase64?: string;
  stderrBase64?: string;
  nextOffset?: number;
  stderrNextOffset?: number;
  more?: boolean;
}

/** The exit code a job's end maps to: its exit code, else 128 + the signal's number (1 when unknown). Pure. */
export function jobExitCode(e: { exitCode?: number; signal?: string; state?: string }): number {
  if (typeof e.exitCode === 'number') return e.exitCode;
  const n = e.signal ? (constants.signals as Record<string, number>)[e.signal] : undefined;
  return n ? 128 + n : 1;
}

async function json<T = JobJson>(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined> = {},
  body?: object,
  headers: Record<string, string> = {},
): Promise<T> {
  if (!Object.keys(headers).length) return JSON.parse((await call(c, method, path, query, body)).toString('utf8')) as T;
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  const r = await prepare(c, method, path, query, {
    Accept: 'application/json',
    ...headers,
    ...(payload ? { 'Content-Type': 'application/json', 'Content-Length': String(payload.length) } : {}),
  });
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    r.on('response', resolve);
    r.on('error', (e) => reject(unreachable(e)));
    r.end(payload);
  });
  if ((res.statusCode ?? 0) < 200 || (res.statusCode ?? 0) >= 300) throw await statusOf(res);
  const chunks: Buffer[] = [];
  for await (const b of res) chunks.push(b as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8')) as T;
}

/**
 * Follows `<jobs>/JOB/stream` to the job's end, reconnecting after a dropped connection (or
 * the stream's one-hour lifetime) with Last-Event-ID; returns the exit event's data.
 */
export async function followJob(
  c: Conn,
  jobsPath: string,
  job: string,
  onStdout: (b: Buffer) => void,
  onStderr: (b: Buffer) => void,
  from?: string,
): Promise<{ exitCode?: number; signal?: string; state: string }> {
  let cursor = from;
  let fails = 0;
  for (;;) {
    let res: http.IncomingMessage;
    try {
      const r = await prepare(
        c,
        'GET',
        `${jobsPath}/${encodeURIComponent(job)}/stream`,
        {},
        { Accept: 'text/event-stream', ...(cursor ? { 'Last-Event-ID': cursor } : {}) },
      );
      res = await new Promise<http.IncomingMessage>((resolve, reject) => {
        r.on('response', resolve);
        r.on('error', (e) => reject(unreachable(e)));
        r.end();
      });
    } catch (e) {
      if (++fails > 5) throw e;
      await new Promise((r) => setTimeout(r, 200 * fails));
      continue;
    }
    if (res.statusCode === 429 && fails < 5) {
      res.resume();
      fails++;
      await new Promise((r) => setTimeout(r, 1000 * fails));
      continue;
    }
    if ((res.statusCode ?? 0) < 200 || (res.statusCode ?? 0) >= 300) throw await statusOf(res);
    try {
      for await (const ev of sseEvents(res)) {
        const d = JSON.parse(ev.data) as Record<string, unknown>;
        if (ev.event === 'output') onStdout(Buffer.from(String(d.outputBase64 ?? ''), 'base64'));
        else if (ev.event === 'stderr') onStderr(Buffer.from(String(d.stderrBase64 ?? ''), 'base64'));
        else if (ev.event === 'exit') return d as { exitCode?: number; signal?: string; state: string };
        else if (ev.event === 'error')
          throw new CliError(`error: the job stream ended: ${escapeLine(String(d.message ?? ''))}`);
        if (ev.id) {
          cursor = ev.id;
          fails = 0;
        }
      }
    } catch (e) {
      if (e instanceof CliError) throw e;
      // A dropped connection: resume after the last event seen.
    }
    if (++fails > 5) throw new CliError(`error: the stream of job ${job} kept ending without its exit event`);
  }
}

/** Registers bg, jobs, logs, stdin and kill on a group. */
export function addJobVerbs(a: JobVerbApi, io: Io, setExit: (code: number) => void): void {
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);
  const grp = a.session ? 'agent' : 'sandbox';
  const ex = (...lines: string[]) => `\nExamples:\n${lines.map((l) => `  fluxctl ${grp} ${l}\n`).join('')}`;
  const bg = a
    .verb('bg')
    .description(
      'start a background job; prints its JSON ({"job": ID, ...}): read it with logs, feed it with stdin, stop it with kill',
    )
    .argument('<name>', a.session ? 'the AgentSession' : 'the Sandbox')
    .argument('<command...>', 'one word: a shell line; several: an argv (after --)')
    .addHelpText('after', ex('bg dev --timeout 10m -- npm run dev', 'bg dev --stdin -- python3 -i'))
    .option('--stdin', 'give the job a stdin pipe (write it with `stdin`, end it with `stdin --close`)')
    .option(
      '--max-output-bytes <n>',
      'output kept per stream (default 16 MiB, at most 256 MiB); the rest is drained and counted',
      int('--max-output-bytes'),
    )
    .option('--timeout <duration>', 'kill the job (its whole process tree) after this long (30s, 5m, 2h)');
  if (a.session) {
    bg.option('--idempotency-key <key>', 'a retry with this key returns the first answer and starts nothing')
      .option('--approval <name>', 'start a command held by policy.process.ask with this Approved Approval')
      .option('--approval-wait <duration>', 'hold a held command open until an operator decides (at most 120s)');
  }
  bg.action(async (name: string, words: string[], o, cmd: Command) => {
    const timeoutSeconds =
      o.timeout !== undefined ? Math.ceil(parseDuration(o.timeout, '--timeout') / 1000) : undefined;
    const approvalWaitSeconds =
      o.approvalWait !== undefined ? Math.ceil(parseDuration(o.approvalWait, '--approval-wait') / 1000) : undefined;
    const c = a.conn(cmd);
    const body = {
      command: words.length === 1 ? words[0] : words,
      ...(o.stdin ? { stdin: true } : {}),
      ...(o.maxOutputBytes !== undefined ? { maxOutputBytes: o.maxOutputBytes } : {}),
      ...(timeoutSeconds !== undefined ? { timeoutSeconds } : {}),
      ...(o.approval ? { approvalName: o.approval } : {}),
      ...(approvalWaitSeconds !== undefined ? { approvalWaitSeconds } : {}),
    };
    const r = await json(
      c,
      'POST',
      a.jobsPath(c, name),
      {},
      body,
      o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {},
    );
    io.out(toJson(r));
    setExit(0);
  });

  a.verb('jobs')
    .description('list the background jobs')
    .argument('<name>', a.session ? 'the AgentSession' : 'the Sandbox')
    .addHelpText('after', ex('jobs dev', 'jobs dev -o json'))
    .option('-o, --output <format>', 'json', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await json(c, 'GET', a.jobsPath(c, name));
      if (o.output === 'json') return (io.out(toJson(r)), setExit(0));
      if (o.output) throw new CliError(`error: unknown output format ${JSON.stringify(o.output)} (json)`);
      const cmdLine = (v: unknown) =>
        escapeLine(
          Array.isArray(v)
            ? v[0] === 'sh' && v[1] === '-c' && v.length === 3
              ? String(v[2])
              : v.join(' ')
            : String(v),
        );
      const items = r.items ?? [];
      if (!items.length) io.out(`No jobs for ${name} in ${c.ns} namespace.\n`);
      else
        io.out(
          tabwrite([
            ['JOB', 'STATE', 'EXIT', 'STARTED', 'COMMAND'],
            ...items.map((j) => [
              String(j.job),
              escapeLine(String(j.state)),
              String(j.exitCode ?? (j.signal || '')),
              String(j.startedAt),
              cmdLine(j.command),
            ]),
          ]),
        );
      setExit(0);
    });

  a.verb('logs')
    .description("a job's output (stderr to stderr); -f follows it to the end and exits with the job's exit code")
    .argument('<name>', a.session ? 'the AgentSession' : 'the Sandbox')
    .argument('<job>', 'the job id (from bg or jobs)')
    .addHelpText('after', ex('logs dev JOB', 'logs dev JOB -f'))
    .option('-f, --follow', 'follow until the job ends (Server-Sent Events, resumed after a dropped connection)')
    .option('--raw', 'write output byte for byte even to a terminal')
    .action(async (name: string, job: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const out = sandboxOutput(io, 'out', { raw: o.raw });
      const err = sandboxOutput(io, 'err', { raw: o.raw });
      const base = a.jobsPath(c, name);
      if (o.follow) {
        const end = await followJob(
          c,
          base,
          job,
          (b) => out.write(b),
          (b) => err.write(b),
        );
        out.end();
        err.end();
        return setExit(jobExitCode(end));
      }
      let offset = 0;
      let stderrOffset = 0;
      for (;;) {
        const r = await json(c, 'GET', `${base}/${encodeURIComponent(job)}`, {
          offset: String(offset),
          stderrOffset: String(stderrOffset),
        });
        out.write(Buffer.from(r.outputBase64 ?? '', 'base64'));
        err.write(Buffer.from(r.stderrBase64 ?? '', 'base64'));
        if (!r.more || (r.nextOffset === offset && r.stderrNextOffset === stderrOffset)) break;
        offset = r.nextOffset ?? offset;
        stderrOffset = r.stderrNextOffset ?? stderrOffset;
      }
      out.end();
      err.end();
      setExit(0);
    });

  a.verb('stdin')
    .description("write to a job's stdin (TEXT, or this process's stdin); --close sends end-of-file")
    .argument('<name>', a.session ? 'the AgentSession' : 'the Sandbox')
    .argument('<job>', 'the job id (from bg or jobs)')
    .argument('[text]', "the bytes to write (absent: this process's stdin)")
    .addHelpText('after', ex("stdin dev JOB 'print(1)'", 'stdin dev JOB --close'))
    .option('--close', 'end-of-file after the write')
    .action(async (name: string, job: string, text: string | undefined, o, cmd: Command) => {
      const c = a.conn(cmd);
      const path = `${a.jobsPath(c, name)}/${encodeURIComponent(job)}/stdin`;
      if (text !== undefined) {
        const b = Buffer.from(text, 'utf8');
        for (let i = 0; i < b.length || i === 0; i += STDIN_CHUNK) {
          const last = i + STDIN_CHUNK >= b.length;
          await json(
            c,
            'POST',
            path,
            {},
            {
              dataBase64: b.subarray(i, i + STDIN_CHUNK).toString('base64'),
              ...(last && o.close ? { close: true } : {}),
            },
          );
        }
      } else if (o.close && process.stdin.isTTY) {
        await json(c, 'POST', path, {}, { close: true });
      } else {
        let pending = Buffer.alloc(0);
        for await (const chunk of process.stdin) {
          pending = Buffer.concat([pending, chunk as Buffer]);
          while (pending.length >= STDIN_CHUNK) {
            await json(c, 'POST', path, {}, { dataBase64: pending.subarray(0, STDIN_CHUNK).toString('base64') });
            pending = pending.subarray(STDIN_CHUNK);
          }
        }
        if (pending.length || o.close)
          await json(
            c,
            'POST',
            path,
            {},
            {
              ...(pending.length ? { dataBase64: pending.toString('base64') } : {}),
              ...(o.close ? { close: true } : {}),
            },
          );
      }
      setExit(0);
    });

  a.verb('kill')
    .description("signal a job's whole process tree (TERM by default)")
    .argument('<name>', a.session ? 'the AgentSession' : 'the Sandbox')
    .argument('<job>', 'the job id (from bg or jobs)')
    .addHelpText('after', ex('kill dev JOB', 'kill dev JOB --signal KILL'))
    .option('--signal <signal>', 'TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT', 'TERM')
    .action(async (name: string, job: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const r = await json(c, 'DELETE', `${a.jobsPath(c, name)}/${encodeURIComponent(job)}`, { signal: o.signal });
      io.out(`job ${job} ${escapeLine(String(r.state))}${r.signal ? ` (${r.signal})` : ''}\n`);
      setExit(0);
    });
}
