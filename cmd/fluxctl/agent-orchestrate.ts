// `fluxctl agent export|evaluate|rollout` (spec/agent-sessions.md "Evaluating candidates",
// "Trajectory and OpenTelemetry traces", and rollout in "Fork"): client-side orchestration
// over the session subresources (ledger, fork, exec) and delete. Nothing here is a server
// route: these verbs only combine what a token or user may already do, so they follow fork's,
// exec's and the budget's rules and are ledgered by the calls they make.
//
//   export NAME [--out FILE] [--otlp URL [--otlp-header K=V]...]
//        the session as JSON lines (a {type: session} header, then one {type: step} per ledger entry); with
//        --otlp also an OTLP/HTTP JSON trace POSTed to URL/v1/traces
//   evaluate NAME --candidate CMD... [--test CMD] [--keep-all]
//        one fork child per candidate; candidate then test in each, in parallel; scored
//        100 passed / 10 ran cleanly but failed the test / 0 failed; the winner kept
//   rollout NAME --count N [--keep] -- CMD
//        fork N children, run CMD in each in parallel, print the results, delete the children
import http from 'node:http';
import https from 'node:https';
import { randomBytes } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import type { Command } from 'commander';
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import type { GVR } from '../../runtime/meta/types.js';
import type { AgentSession } from '../../apis/zz_generated.types.js';
import { escapeLine } from './escape.js';
import { tabwrite, toJson } from './printers.js';
import { CliError, type Io } from './util.js';

/** A connection to the API in one namespace (agent.ts's Conn). */
export interface SessionConn {
  client: ClientNodeClient;
  ns: string;
}

/** What agent.ts hands over: how to connect and call a session subresource. */
export interface AgentApi {
  sessions: GVR;
  conn(cmd: Command): SessionConn;
  callJson<T>(
    c: SessionConn,
    method: string,
    path: string,
    query?: Record<string, string | undefined>,
    body?: object,
  ): Promise<T>;
  subPath(ns: string, name: string, sub: string): string;
  verb(name: string): Command;
  int(flag: string): (v: string) => number;
  collect(v: string, prev?: string[]): string[];
}

/** The outcome of one command run in a child (exec's JSON answer, trimmed). */
interface RunResult {
  exitCode: number;
  durationMs: number;
  stdout: string;
  stderr: string;
  timedOut?: boolean;
  error?: string;
}

export interface Scored {
  index: number;
  child: string;
  candidate: string;
  candidateResult?: RunResult;
  testResult?: RunResult;
  score: number;
  durationMs: number;
}

/**
 * The document's scoring: 100 when the test exited 0 (or, with no test, the candidate did),
 * 10 when the candidate exited 0 but the test did not, 0 when the candidate failed or never
 * ran. Pure.
 */
export function score(candidate: RunResult | undefined, test: RunResult | undefined, hasTest: boolean): number {
  if (!candidate || candidate.error || candidate.exitCode !== 0) return 0;
  if (!hasTest) return 100;
  return test && !test.error && test.exitCode === 0 ? 100 : 10;
}

/**
 * The winner: the highest score, ties to the shortest total duration, then the lowest index;
 * none unless something passed (score 100), so a failing result is never offered. Pure.
 */
export function pickWinner(results: Scored[]): Scored | undefined {
  const passed = results.filter((r) => r.score === 100);
  passed.sort((a, b) => a.durationMs - b.durationMs || a.index - b.index);
  return passed[0];
}

/** The last `n` lines of an output, escaped for the terminal. Pure. */
export function tail(s: string, n = 5): string[] {
  const lines = s.replace(/\n$/, '').split('\n');
  return (lines.length === 1 && lines[0] === '' ? [] : lines.slice(-n)).map((l) => escapeLine(l));
}

const hex = (bytes: number) => randomBytes(bytes).toString('hex');
const nanos = (ms: number) => String(BigInt(Math.round(ms)) * 1_000_000n);

/** A span attribute value in OTLP JSON. */
function attr(key: string, v: unknown): { key: string; value: Record<string, unknown> } {
  if (typeof v === 'number' && Number.isInteger(v)) return { key, value: { intValue: String(v) } };
  if (typeof v === 'number') return { key, value: { doubleValue: v } };
  if (typeof v === 'boolean') return { key, value: { boolValue: v } };
  return { key, value: { stringValue: typeof v === 'string' ? v : JSON.stringify(v) } };
}

/**
 * The session as an OTLP/HTTP JSON trace (ExportTraceServiceRequest): one root span
 * `agent.session`, one child span per ledger entry; trace id = the session uid; an exec span
 * covers its durationMs (it ends at the entry's time), other steps are instants; status error
 * (code 2) for a non-zero exit, a timeout or a refused command. Pure but for the span ids.
 */
/** A ledger entry as the ledger subresource returns it (controllers/agentsession/ledger.ts, read loosely). */
export interface Step {
  entry: number;
  time: string;
  kind: string;
  [field: string]: unknown;
}

/** The session fields the export and the trace read. */
export interface TracedSession {
  metadata: { name?: string; namespace?: string; uid?: string; creationTimestamp?: string };
  spec?: { agent?: string };
  status?: { phase?: string };
}

export function otlpTrace(session: TracedSession, entries: Step[]): object {
  const traceId = String(session.metadata.uid).replace(/-/g, '').toLowerCase().padEnd(32, '0').slice(0, 32);
  const rootId = hex(8);
  const times = entries.map((e) => Date.parse(e.time));
  const created = Date.parse(session.metadata.creationTimestamp ?? entries[0]?.time ?? new Date().toISOString());
  const start = Math.min(
    created,
    ...times.map((t, i) => t - (entries[i].kind === 'exec' ? Number(entries[i].durationMs ?? 0) : 0)),
  );
  const end = Math.max(start, ...times);
  const failed = (e: Step) =>
    e.kind === 'exec.refused' ||
    e.kind === 'budget.exceeded' ||
    e.kind === 'session.fail' ||
    (e.kind === 'exec' && (e.exitCode !== 0 || e.timedOut));
  const spans = entries.map((e, i) => {
    const { entry, time, kind, ...fields } = e;
    const t = times[i]!;
    const s = kind === 'exec' ? t - Number(e.durationMs ?? 0) : t;
    return {
      traceId,
      spanId: hex(8),
      parentSpanId: rootId,
      name: kind,
      kind: 1,
      startTimeUnixNano: nanos(s),
      endTimeUnixNano: nanos(t),
      attributes: [
        attr('fluxvm.ledger.entry', entry),
        ...Object.entries(fields).map(([k, v]) => attr(`fluxvm.${k}`, v)),
      ],
      status: failed(e)
        ? { code: 2, message: kind === 'exec' ? (e.timedOut ? 'timed out' : `exit code ${e.exitCode}`) : kind }
        : { code: 1 },
    };
  });
  const root = {
    traceId,
    spanId: rootId,
    name: 'agent.session',
    kind: 1,
    startTimeUnixNano: nanos(start),
    endTimeUnixNano: nanos(end),
    attributes: [
      attr('fluxvm.session', session.metadata.name),
      attr('fluxvm.namespace', session.metadata.namespace),
      attr('fluxvm.agent', session.spec?.agent ?? ''),
      attr('fluxvm.phase', session.status?.phase ?? ''),
    ],
    status: { code: session.status?.phase === 'Failed' ? 2 : 1 },
  };
  return {
    resourceSpans: [
      {
        resource: { attributes: [attr('service.name', 'fluxvm'), attr('fluxvm.session', session.metadata.name)] },
        scopeSpans: [{ scope: { name: 'fluxctl', version: '1' }, spans: [root, ...spans] }],
      },
    ],
  };
}

/** POSTs a JSON body; resolves with the status code; rejects with the reason when it is not 2xx. */
async function postJson(url: URL, body: object, headers: Record<string, string>): Promise<number> {
  const payload = Buffer.from(JSON.stringify(body));
  const mod = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.request(
      url,
      {
        method: 'POST',
        headers: { ...headers, 'Content-Type': 'application/json', 'Content-Length': String(payload.length) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (b: Buffer) => chunks.push(b));
        res.on('end', () => {
          const code = res.statusCode ?? 0;
          if (code >= 200 && code < 300) resolve(code);
          else
            reject(
              new CliError(
                `error: the OTLP receiver at ${url.href} answered ${code}: ${escapeLine(Buffer.concat(chunks).toString('utf8').slice(0, 300))}`,
              ),
            );
        });
      },
    );
    req.on('error', (e) => reject(new CliError(`error: cannot send the trace to ${url.href}: ${e.message}`)));
    req.end(payload);
  });
}

/** Every ledger entry of a session, in pages. */
async function allEntries(api: AgentApi, c: SessionConn, name: string): Promise<Step[]> {
  const out: Step[] = [];
  for (let after = 0; ;) {
    const r = await api.callJson<{ entries: Step[]; lastEntry: number }>(c, 'GET', api.subPath(c.ns, name, 'ledger'), {
      afterEntry: String(after),
      limit: '10000',
    });
    out.push(...r.entries);
    if (r.entries.length < 10000) return out;
    after = r.lastEntry;
  }
}

/** Runs one command in a session; an API refusal (policy, budget) becomes an error result. */
async function run(api: AgentApi, c: SessionConn, name: string, command: string, timeout?: number): Promise<RunResult> {
  try {
    type Exec = { exitCode: number; durationMs?: number; stdout?: string; stderr?: string; timedOut?: boolean };
    const r = await api.callJson<Exec>(
      c,
      'POST',
      api.subPath(c.ns, name, 'exec'),
      {},
      { command, ...(timeout ? { timeoutSeconds: timeout } : {}) },
    );
    return {
      exitCode: r.exitCode,
      durationMs: r.durationMs ?? 0,
      stdout: r.stdout ?? '',
      stderr: r.stderr ?? '',
      ...(r.timedOut ? { timedOut: true } : {}),
    };
  } catch (e) {
    return { exitCode: -1, durationMs: 0, stdout: '', stderr: '', error: (e as Error).message };
  }
}

async function fork(api: AgentApi, c: SessionConn, name: string, count: number): Promise<string[]> {
  const r = await api.callJson<{ children: Array<{ name: string }> }>(
    c,
    'POST',
    api.subPath(c.ns, name, 'fork'),
    {},
    { count },
  );
  return r.children.map((x) => x.name);
}

async function deleteAll(c: SessionConn, api: AgentApi, names: string[]): Promise<void> {
  await Promise.all(names.map((n) => c.client.delete(api.sessions, c.ns, n).catch(() => undefined)));
}

function describe(r: RunResult | undefined): string {
  if (!r) return 'not run';
  if (r.error) return `refused: ${escapeLine(r.error)}`;
  return r.timedOut ? `timed out after ${r.durationMs} ms` : `exit ${r.exitCode} in ${r.durationMs} ms`;
}

/** Registers export, evaluate and rollout on `fluxctl agent`. */
export function addOrchestrationVerbs(api: AgentApi, io: Io, setExit: (code: number) => void): void {
  const output = (v: string) => (v.startsWith('=') ? v.slice(1) : v);

  api
    .verb('export')
    .description(
      'the session as JSON lines (a session header, then one step per ledger entry); --otlp also sends an OTLP/HTTP JSON trace',
    )
    .argument('<name>')
    .option('--out <file>', 'write the JSON lines to this file instead of stdout')
    .option('--otlp <url>', 'OTLP/HTTP endpoint (e.g. http://collector:4318): POSTs the trace to URL/v1/traces')
    .option('--otlp-header <key=value>', 'a header for the OTLP request (repeatable), e.g. an API key', api.collect)
    .action(async (name: string, o, cmd: Command) => {
      const c = api.conn(cmd);
      const s = await c.client.get<AgentSession>(api.sessions, c.ns, name);
      const entries = await allEntries(api, c, name);
      const header = {
        type: 'session',
        name: s.metadata.name,
        namespace: s.metadata.namespace,
        uid: s.metadata.uid,
        agent: s.spec?.agent,
        phase: s.status?.phase ?? 'Pending',
        createdAt: s.metadata.creationTimestamp,
        ...(s.spec?.forkOf ? { forkOf: s.spec.forkOf.name } : {}),
        steps: entries.length,
      };
      const lines =
        [JSON.stringify(header), ...entries.map((e) => JSON.stringify({ type: 'step', ...e }))].join('\n') + '\n';
      if (o.out) await writeFile(o.out, lines, { mode: 0o600 });
      else io.out(lines);
      if (o.otlp) {
        const headers: Record<string, string> = {};
        for (const h of o.otlpHeader ?? []) {
          const i = h.indexOf('=');
          if (i <= 0) throw new CliError(`error: --otlp-header must be KEY=VALUE, got ${JSON.stringify(h)}`);
          headers[h.slice(0, i)] = h.slice(i + 1);
        }
        let url: URL;
        try {
          url = new URL(o.otlp.replace(/\/+$/, '') + '/v1/traces');
        } catch {
          throw new CliError(`error: --otlp must be an http(s) URL, got ${JSON.stringify(o.otlp)}`);
        }
        if (url.protocol !== 'http:' && url.protocol !== 'https:')
          throw new CliError(`error: --otlp must be an http(s) URL, got ${JSON.stringify(o.otlp)}`);
        await postJson(url, otlpTrace(s, entries), headers);
        io.err(`fluxctl: sent ${entries.length + 1} spans to ${url.href}\n`);
      }
      setExit(0);
    });

  api
    .verb('evaluate')
    .description(
      'try candidate commands in fork children in parallel, test each, keep the winner (score 100 passed, 10 ran cleanly but failed the test, 0 failed)',
    )
    .argument('<name>')
    .option('--candidate <cmd>', 'a candidate command (repeatable, at least one)', api.collect)
    .option('--test <cmd>', 'the test run after a candidate that exited 0')
    .option('--keep-all', 'keep every child, not only the winner')
    .option('--timeout <seconds>', 'timeout of each command in seconds', api.int('--timeout'))
    .option('-o, --output <format>', 'json', output)
    .addHelpText(
      'after',
      "\nExample:\n  fluxctl agent evaluate s1 --candidate 'patch -p1 < a.diff' --candidate 'patch -p1 < b.diff' --test 'make test'\n  fluxctl agent promote <winner> --dry-run\n",
    )
    .action(async (name: string, o, cmd: Command) => {
      const candidates: string[] = o.candidate ?? [];
      if (!candidates.length) throw new CliError('error: evaluate needs at least one --candidate');
      const c = api.conn(cmd);
      const children = await fork(api, c, name, candidates.length);
      const results: Scored[] = await Promise.all(
        children.map(async (child, index) => {
          const cand = await run(api, c, child, candidates[index]!, o.timeout);
          const test =
            o.test && cand.exitCode === 0 && !cand.error ? await run(api, c, child, o.test, o.timeout) : undefined;
          return {
            index,
            child,
            candidate: candidates[index]!,
            candidateResult: cand,
            testResult: test,
            score: score(cand, test, !!o.test),
            durationMs: cand.durationMs + (test?.durationMs ?? 0),
          };
        }),
      );
      const winner = pickWinner(results);
      if (!o.keepAll)
        await deleteAll(
          c,
          api,
          results.filter((r) => r !== winner).map((r) => r.child),
        );
      if (o.output === 'json') {
        io.out(toJson({ session: name, winner: winner?.child ?? null, results }));
      } else {
        const rows = [['#', 'CHILD', 'SCORE', 'CANDIDATE', 'TEST', 'COMMAND']];
        for (const r of results)
          rows.push([
            String(r.index),
            r.child,
            String(r.score),
            describe(r.candidateResult),
            o.test ? describe(r.testResult) : '-',
            escapeLine(r.candidate),
          ]);
        io.out(tabwrite(rows));
        for (const r of results) {
          const t = [
            ...tail(r.candidateResult?.stdout ?? ''),
            ...tail(r.candidateResult?.stderr ?? ''),
            ...tail(r.testResult?.stdout ?? ''),
            ...tail(r.testResult?.stderr ?? ''),
          ].slice(-5);
          if (t.length) io.out(`--- ${r.child} (last lines)\n${t.map((l) => `  ${l}\n`).join('')}`);
        }
        io.out(
          winner
            ? `winner: ${winner.child}\nnext: fluxctl agent promote ${winner.child} --dry-run\n`
            : `no winner: no candidate passed${o.keepAll ? '' : ' (children deleted)'}\n`,
        );
      }
      setExit(winner ? 0 : 1);
    });

  api
    .verb('rollout')
    .description(
      'fork N children, run the command in each in parallel, print the results, then delete the children (--keep keeps them)',
    )
    .argument('<name>')
    .argument('<command...>', 'one word: a shell line; several: joined with spaces (after --)')
    .option('--count <n>', 'children, 1-32', api.int('--count'), 2)
    .option('--keep', 'keep the children')
    .option('--timeout <seconds>', 'timeout of the command in seconds', api.int('--timeout'))
    .option('-o, --output <format>', 'json', output)
    .action(async (name: string, words: string[], o, cmd: Command) => {
      const c = api.conn(cmd);
      const command = words.join(' ');
      const children = await fork(api, c, name, o.count);
      const results = await Promise.all(
        children.map(async (child) => ({ child, ...(await run(api, c, child, command, o.timeout)) })),
      );
      if (!o.keep) await deleteAll(c, api, children);
      if (o.output === 'json') io.out(toJson({ session: name, command, kept: !!o.keep, results }));
      else {
        const rows = [['CHILD', 'RESULT', 'LAST LINE']];
        for (const r of results) rows.push([r.child, describe(r), tail(r.stdout || r.stderr, 1)[0] ?? '']);
        io.out(tabwrite(rows));
        io.out(o.keep ? `kept ${children.length} children\n` : `deleted ${children.length} children\n`);
      }
      setExit(results.every((r) => !r.error && r.exitCode === 0) ? 0 : 1);
    });
}
