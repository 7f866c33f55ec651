// `fluxctl agent events|watch` over agentsessions/NAME/events,
// events/stream and files/watch (controllers/agentsession/events.ts, watch.ts):
//
//   events NAME [-f] [--since CURSOR|RFC3339] [--timeout D] [-o json]
//        the ledger (and the core Events of the session and its Sandbox, without -f), one line an
//        entry; -f follows events/stream, reconnecting with Last-Event-ID after a drop (no entry
//        twice or lost) until the session ends (exit 0) or --timeout passes
//   watch NAME PATH [-r] [--timeout D] [-o json]
//        created/modified/deleted/renamed below PATH as they happen; reconnects with
//        Last-Event-ID; a `resync` (the window moved past the cursor) is said on stderr
//
// Names, messages and fields are the sandbox's: on a terminal (and in any text line) they are
// escaped (escape.ts), so a file name cannot move the cursor or fake a line; -o json prints the
// events as JSON lines (JSON escapes control characters, and pathBase64 carries invalid UTF-8).
import type http from 'node:http';
import type { Command } from 'commander';
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import { escapeLine } from './escape.js';
import { prepare, statusOf, unreachable } from './sandboxapi.js';
import { CliError, parseDuration, type Io } from './util.js';
import { sseEvents, type SseEv } from './sse.js';

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

/** What agent.ts hands over. */
export interface EventVerbApi {
  conn(cmd: Command): Conn;
  subPath(ns: string, name: string, sub: string): string;
  verb(name: string): Command;
  callJson<T>(c: Conn, method: string, path: string, query?: Record<string, string | undefined>): Promise<T>;
  ledgerLine(e: Record<string, unknown>): string;
}

/**
 * Follows an SSE path until `onEvent` returns true (done), `stopAt` passes or the stream fails
 * five times in a row; reconnects after a drop with the last id as Last-Event-ID.
 */
async function follow(
  c: Conn,
  path: string,
  query: Record<string, string | undefined>,
  onEvent: (ev: SseEv, d: Record<string, unknown>) => boolean,
  stopAt: number,
  from?: string,
): Promise<void> {
  let cursor = from;
  let fails = 0;
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  while (Date.now() < stopAt) {
    let res: http.IncomingMessage;
    let req: http.ClientRequest;
    try {
      req = await prepare(c, 'GET', path, query, {
        Accept: 'text/event-stream',
        ...(cursor ? { 'Last-Event-ID': cursor } : {}),
      });
      res = await new Promise<http.IncomingMessage>((resolve, reject) => {
        req.on('response', resolve);
        req.on('error', (e) => reject(unreachable(e)));
        req.end();
      });
    } catch (e) {
      if (++fails > 5) throw e;
      await sleep(200 * fails);
      continue;
    }
    if (res.statusCode === 429 && fails < 5) {
      res.resume();
      await sleep(1000 * ++fails);
      continue;
    }
    if ((res.statusCode ?? 0) < 200 || (res.statusCode ?? 0) >= 300) throw await statusOf(res);
    const timer = setTimeout(() => req.destroy(), Math.max(0, stopAt - Date.now()));
    try {
      for await (const ev of sseEvents(res)) {
        let d: Record<string, unknown>;
        try {
          d = JSON.parse(ev.data) as Record<string, unknown>;
        } catch {
          continue;
        }
        if (ev.id) {
          cursor = ev.id;
          fails = 0;
        }
        if (ev.event === 'error') throw new CliError(`error: the stream ended: ${escapeLine(String(d.message ?? ''))}`);
        if (onEvent(ev, d)) return;
      }
    } catch (e) {
      if (e instanceof CliError) throw e;
      // a dropped connection: resume after the cursor
    } finally {
      clearTimeout(timer);
    }
    if (Date.now() >= stopAt) return;
    if (++fails > 5) throw new CliError(`error: the stream of ${escapeLine(path)} kept ending`);
    await sleep(200 * fails);
  }
}

/** One watch event as a line (names escaped). Pure. */
export function watchLine(event: string, d: Record<string, unknown>): string {
  const p = (v: unknown, b64: unknown) => escapeLine(String(v ?? '')) + (b64 ? ' (bytes not UTF-8)' : '');
  if (event === 'renamed') return `renamed  ${p(d.oldPath, d.oldPathBase64)} -> ${p(d.path, d.pathBase64)}\n`;
  const count = typeof d.count === 'number' && d.count > 1 ? ` (x${d.count})` : '';
  return `${event.padEnd(8)} ${p(d.path, d.pathBase64)}${d.isDir ? '/' : ''}${count}\n`;
}

export function addEventVerbs(a: EventVerbApi, io: Io, setExit: (code: number) => void): void {
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);
  const until = (o: { timeout?: string }) =>
    o.timeout ? Date.now() + parseDuration(o.timeout, '--timeout') : Number.POSITIVE_INFINITY;

  a.verb('events')
    .description('the session ledger and its events; -f follows events/stream (resuming after a drop)')
    .argument('<name>')
    .option('-f, --follow', 'follow new entries until the session ends')
    .option('--since <cursor>', 'after this ledger entry number (or RFC 3339 time)')
    .option('--timeout <duration>', 'stop following after this long (exit 0)')
    .option('-o, --output <format>', 'json (JSON lines)', output)
    .action(
      async (
        name: string,
        o: { follow?: boolean; since?: string; timeout?: string; output?: string },
        cmd: Command,
      ) => {
        const c = a.conn(cmd);
        const json = o.output === 'json';
        if (o.output !== undefined && !json)
          throw new CliError(`error: --output must be json, got ${JSON.stringify(o.output)}`);
        const print = (e: Record<string, unknown>) => io.out(json ? JSON.stringify(e) + '\n' : a.ledgerLine(e));
        if (!o.follow) {
          let since = o.since;
          for (;;) {
            const r = await a.callJson<{
              ledger: Array<Record<string, unknown>>;
              events: Array<Record<string, unknown>>;
              cursor: string;
              more: boolean;
            }>(c, 'GET', a.subPath(c.ns, name, 'events'), { since, limit: '10000' });
            for (const e of r.ledger) print(e);
            if (!r.more) {
              for (const e of r.events)
                io.out(
                  json
                    ? JSON.stringify({ event: e }) + '\n'
                    : escapeLine(`     ${e.time} ${e.kind} ${e.type} ${e.reason}: ${e.message}`) + '\n',
                );
              break;
            }
            since = r.cursor;
          }
          return setExit(0);
        }
        await follow(
          c,
          a.subPath(c.ns, name, 'events/stream'),
          {},
          (ev, d) => {
            if (ev.event === 'ledger') print(d);
            else if (ev.event === 'event')
              io.out(
                json
                  ? JSON.stringify({ event: d }) + '\n'
                  : escapeLine(`     ${d.time} ${d.kind} ${d.type} ${d.reason}: ${d.message}`) + '\n',
              );
            else if (ev.event === 'resync') io.err(`fluxctl: ${escapeLine(String(d.message ?? 'resync'))}\n`);
            else if (ev.event === 'end') {
              io.err(`${escapeLine(String(d.message ?? 'the session ended'))}\n`);
              return true;
            }
            return false;
          },
          until(o),
          o.since,
        );
        setExit(0);
      },
    );

  a.verb('watch')
    .description('file changes below PATH in the session (created, modified, deleted, renamed) as they happen')
    .argument('<name>')
    .argument('<path>', 'an absolute directory in the sandbox')
    .option('-r, --recursive', 'also below its subdirectories (new ones included)')
    .option('--timeout <duration>', 'stop after this long (exit 0)')
    .option('-o, --output <format>', 'json (JSON lines)', output)
    .action(
      async (
        name: string,
        path: string,
        o: { recursive?: boolean; timeout?: string; output?: string },
        cmd: Command,
      ) => {
        const c = a.conn(cmd);
        const json = o.output === 'json';
        if (o.output !== undefined && !json)
          throw new CliError(`error: --output must be json, got ${JSON.stringify(o.output)}`);
        await follow(
          c,
          a.subPath(c.ns, name, 'files/watch'),
          { path, recursive: o.recursive ? 'true' : 'false' },
          (ev, d) => {
            if (json && ev.event !== 'ready') io.out(JSON.stringify({ event: ev.event, ...d }) + '\n');
            else if (['created', 'modified', 'deleted', 'renamed'].includes(ev.event)) io.out(watchLine(ev.event, d));
            else if (ev.event === 'resync' || ev.event === 'limit')
              io.err(`fluxctl: ${escapeLine(String(d.message ?? ev.event))}\n`);
            if (ev.event === 'end') {
              if (!json) io.err(`${escapeLine(String(d.message ?? 'the watch ended'))}\n`);
              return true;
            }
            return false;
          },
          until(o),
        );
        setExit(0);
      },
    );
}
