// The imperative subresources of agentsessions (spec/agent-sessions.md "API"), served on the
// API server through its subresource hook; each is authorized separately as
// agentsessions/<name> (create for POST, get for GET):
//   exec        POST {command | argv, stdin?, env?, cwd?, timeoutSeconds?, approvalName?,
//               approvalWaitSeconds?}: policy-, gate- and budget-checked, ledgered; the timeout
//               is at most the exec seconds left; a policy.process.ask match is held for an
//               Approval (428 ApprovalRequired, approvals.ts)
//   ledger      GET [?afterEntry=N] [&watch=true] [&limit=N]: the append-only record
//   artifacts   GET: workspace changes since the baseline, checkpoints, children, usage
//   checkpoint  POST {tag?, memory?}        restore POST {tag}
//   fork        POST {count, identity?}     promote POST {dryRun?, planId?, skipConflicts?, paths?}
//   token       POST {ops, ttlSeconds?, label?} mints, GET lists, DELETE ?id= revokes (tokens.ts)
// A session is resolved by name in the request's namespace only (another namespace's is a
// 404 like a missing one). Errors are metav1.Status; field names are camelCase (the
// document's snake_case maps one to one: timeout_seconds -> timeoutSeconds).
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import { getIfExists, type Client } from '../../runtime/client/client.js';
import type { Logger } from '../../runtime/controller/index.js';
import type { IncomingMessage } from 'node:http';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import type {
  SubresourceHandler,
  SubresourceRequest,
  SubresourceTarget,
  SubresourceUpgradeRequest,
} from '../../runtime/apiserver/http/subresources.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { toStatusError } from '../common/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { agentSessionsGVR } from './gvr.js';
import { argvOf, boolParam, jsonBody, noSpaceError, queryParam, timeoutOf } from '../sandbox/subresources.js';
import { EXEC_PROTOCOLS, exitStatus, initialTtySize, resizeOf } from '../sandbox/exec.js';
import type { LedgerEntry } from './ledger.js';
import {
  budgetError,
  GROUP,
  idempotencyKey,
  mirrorUsage,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
export {
  budgetError,
  GROUP,
  idempotencyKey,
  mirrorUsage,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
import { checkCommand, terminalRefusal } from './policy.js';
import { sessionFilesHandler } from './files.js';
import { sessionLargeFileSubresources } from './uploads.js';
import { approvalNameOf, approvalWaitMs, type HeldRequest } from './approval-rules.js';
import { approvalDecisionHandler, approvalGate, consumeApproval } from './approvals.js';
import type { SessionState, Usage } from './state.js';
import { lifecycleHandlers } from './lifecycle.js';
import { eventsHandlers } from './events.js';
import { fileWatchHandler } from './watch.js';
import { FileWatches } from '../common/filewatch.js';
import { SessionTokens, sessionTokenLacks, tokenHandler } from './tokens.js';
import { sessionJobHandlers } from './jobs.js';
import { gitHandler } from './git.js';
import { replayHandler } from './replay.js';
import { sessionProvenanceHandler } from './promote-provenance.js';
import { rewindHandler } from './rewind.js';
import {
  beginExec,
  cutOutput,
  execBudgetRefusal,
  execTimeoutMs,
  runTicketed,
  type ExecTicket,
  type Hold,
} from './execgate.js';
export { beginExec, cutOutput, execBudgetRefusal, execTimeoutMs, type ExecTicket, type Hold } from './execgate.js';
import { PreviewStore, previewsHandler } from './previews.js';
import type { UserInfo } from '../../runtime/apiserver/registry-types.js';

const DEFAULT_TIMEOUT_S = 300;

/** What a streamed exec asked for: the channels it wants and whether it runs on a terminal. */
interface Want {
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

function wrap(h: SubresourceHandler): SubresourceHandler {
  return {
    ...h,
    handle: async (r: SubresourceRequest) => {
      try {
        return await h.handle!(r);
      } catch (e) {
        if (!(e instanceof StatusError))
          throw noSpaceError(e) ?? toStatusError(e, { resource: 'agentsessions', group: GROUP, name: r.name });
        throw e;
      }
    },
  };
}

function execHandler(
  d: AgentSessionSubresourceDeps,
  execStream?: (r: SubresourceRequest) => Promise<unknown>,
): SubresourceHandler {
  const wss = new WebSocketServer({
    noServer: true,
    perMessageDeflate: false,
    handleProtocols: (offered) => EXEC_PROTOCOLS.find((p) => offered.has(p)) ?? false,
  });
  return {
    verbs: ['create', 'get'],
    async handle(r) {
      if (r.method !== 'POST')
        throw errors.methodNotAllowed(`exec takes POST (JSON) or a WebSocket upgrade (GET), not ${r.method}`);
      if (execStream && boolParam(r, 'stream', false)) return execStream(r); // exec?stream=true: jobs.ts
      const body = jsonBody(r);
      const argv = argvOf(body.command ?? body.argv, body.command !== undefined ? 'command' : 'argv');
      if (body.stdin !== undefined && typeof body.stdin !== 'string') throw errors.badRequest('stdin must be a string');
      if (body.cwd !== undefined && typeof body.cwd !== 'string')
        throw errors.badRequest('cwd must be an absolute path');
      const askedMs = timeoutOf(body.timeoutSeconds, DEFAULT_TIMEOUT_S);
      const hold = {
        name: approvalNameOf(body.approvalName),
        waitMs: approvalWaitMs(body.approvalWaitSeconds, r.name),
        signal: clientGone(r),
      };
      const t = await resolveSession(d, r);
      return d.state.idempotent(t.uid, r.name, idempotencyKey(r), 'exec', body, () =>
        runExec(d, t, argv, body, askedMs, hold),
      );
    },
    // The Kubernetes channel protocol as sandboxes/exec speaks it (controllers/sandbox/exec.ts),
    // with the session's gate, policy, budget (per-stream output cap) and ledger around it.
    // &tty=true: the command runs on a pseudo-terminal (backends with capabilities.pty; others
    // 400 naming tty) after exactly the same checks, so a denied program is refused before
    // anything runs; channel 4 resizes it, stderr is merged into stdout (one capped stream).
    upgrade(r: SubresourceUpgradeRequest) {
      void (async () => {
        let t: SessionTarget;
        let argv: string[];
        let tk: ExecTicket;
        let want: Want;
        try {
          const q = r.query.command;
          argv = argvOf(q === undefined ? [] : Array.isArray(q) ? q : [q], 'command');
          const askedMs = timeoutOf(queryParam(r, 'timeoutSeconds'), 3600);
          const tty = boolParam(r, 'tty', false);
          want = {
            stdin: boolParam(r, 'stdin', false),
            stdout: boolParam(r, 'stdout', true),
            stderr: boolParam(r, 'stderr', true) && !tty,
            tty,
          };
          const hold = {
            name: approvalNameOf(queryParam(r, 'approvalName')),
            waitMs: approvalWaitMs(queryParam(r, 'approvalWaitSeconds'), r.name),
            transport: 'stream' as const,
          };
          t = await resolveSession(d, r);
          if (tty) await refuseTerminal(d, t, argv, r.ctx?.user);
          const backend = t.s.spec.runtime?.backend ?? 'procbox';
          if (tty && !d.runtime.capabilities(backend).pty) {
            throw errors.badRequest(
              `tty: the ${backend} backend of session ${r.name} has no interactive terminal (status.capabilities.pty is false); run the command without a tty (fluxctl agent exec without -t)`,
              [{ reason: 'FieldValueNotSupported', field: 'tty', message: 'not supported by this backend' }],
            );
          }
          tk = await beginExec(d, t, argv, askedMs, hold);
        } catch (e) {
          const err = toStatusError(e, { resource: 'agentsessions', group: GROUP, name: r.name });
          const body = JSON.stringify(err.status);
          r.socket.end(
            `HTTP/1.1 ${err.code} ${err.reason}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
          );
          return;
        }
        wss.handleUpgrade(r.req as IncomingMessage, r.socket, r.head, (ws) => {
          void streamExec(d, ws, t, argv, tk, want).catch((e) =>
            d.log?.error('agentsession exec stream failed', { session: `${r.namespace}/${r.name}`, error: String(e) }),
          );
        });
      })();
    },
  };
}

/**
 * A terminal (tty=true) passes the exec checks and these, before anything runs: 403 when the
 * session has process rules or a filesystem policy (policy.ts terminalRefusal; ledgered as
 * exec.refused with tty), and 403 for a session token without the terminal op.
 */
async function refuseTerminal(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  argv: string[],
  user: UserInfo | undefined,
): Promise<void> {
  const name = t.s.metadata.name!;
  const why = terminalRefusal(t.s.spec);
  if (why) {
    const command = argv[0] === 'sh' && argv[1] === '-c' && argv.length === 3 ? argv[2]! : argv;
    await d.ledger.append(t.uid, 'exec.refused', { command, tty: true, reason: why.message });
    const e = errors.forbidden(`exec.refused: ${why.message}`);
    e.status.details = {
      name,
      group: GROUP,
      kind: 'agentsessions',
      causes: [{ reason: 'exec.refused', message: why.message, field: why.field }],
    };
    throw e;
  }
  const lacks = sessionTokenLacks(user, 'terminal');
  if (lacks) {
    const e = errors.forbidden(`a terminal (tty=true) needs the terminal op: ${lacks}`);
    e.status.details = {
      name,
      group: GROUP,
      kind: 'agentsessions',
      causes: [{ reason: 'FieldValueForbidden', message: lacks, field: 'tty' }],
    };
    throw e;
  }
}

async function streamExec(
  d: AgentSessionSubresourceDeps,
  ws: WebSocket,
  t: SessionTarget,
  argv: string[],
  tk: ExecTicket,
  want: Want,
) {
  const send = (ch: number, b: Buffer) => {
    if (b.length && ws.readyState === ws.OPEN) ws.send(Buffer.concat([Buffer.from([ch]), b]));
  };
  const queued: Buffer[] = [];
  let deliver = (b: Buffer) => void queued.push(b);
  ws.on('message', (data: RawData) =>
    deliver(Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data)),
  );
  ws.on('error', () => undefined);
  const started = performance.now();
  let proc;
  try {
    proc = await d.runtime.execStream(t.sandboxId, {
      argv,
      timeoutMs: tk.timeoutMs,
      // The client's first resize frame, or 80x24 (as sandboxes/exec).
      ...(want.tty ? { tty: await initialTtySize(ws, queued) } : {}),
    });
  } catch (e) {
    await tk.abort();
    const st = toStatusError(e, { resource: 'agentsessions', group: GROUP, name: t.s.metadata.name! }).status;
    send(
      3,
      Buffer.from(
        JSON.stringify({ metadata: {}, status: 'Failure', message: st.message, reason: st.reason, code: st.code }),
      ),
    );
    ws.close(1000);
    return;
  }
  const p = proc;
  let finished = false;
  p.stdin.on('error', () => undefined);
  if (!want.stdin) p.stdin.end();
  deliver = (b: Buffer) => {
    if (b[0] === 0 && want.stdin && !p.stdin.writableEnded) p.stdin.write(b.subarray(1));
    else if (b[0] === 255 && b[1] === 0 && !p.stdin.writableEnded) p.stdin.end();
    else if (b[0] === 4 && want.tty) {
      const size = resizeOf(b.subarray(1));
      if (size) p.resize?.(size);
    }
  };
  for (const b of queued.splice(0)) deliver(b);
  ws.on('close', () => {
    if (!finished) p.kill();
  });
  if (ws.readyState !== ws.OPEN) p.kill();
  const caps = { out: new StreamCap(tk.cap), err: new StreamCap(tk.cap) };
  p.stdout.on('data', (b: Buffer) => {
    const x = caps.out.push(b);
    if (want.stdout) send(1, x);
  });
  p.stderr.on('data', (b: Buffer) => {
    const x = caps.err.push(b);
    if (want.stderr) send(2, x);
  });
  const ex = await p.exit;
  finished = true;
  caps.out.end();
  caps.err.end();
  await tk.finish({
    exitCode: ex.exitCode,
    durationMs: performance.now() - started,
    timedOut: ex.timedOut,
    signal: ex.signal,
    stdoutDropped: caps.out.dropped,
    stderrDropped: caps.err.dropped,
    tty: want.tty,
  });
  send(3, Buffer.from(JSON.stringify(exitStatus(argv, ex.exitCode, ex.timedOut))));
  ws.close(1000);
}

/** Aborts when the client of a plain request goes away before its answer (a held request then never runs). */
function clientGone(r: SubresourceRequest): AbortSignal | undefined {
  const res = r.reply?.raw;
  if (!res) return undefined;
  const ac = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) ac.abort();
  });
  return ac.signal;
}

async function runExec(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  argv: string[],
  body: Record<string, unknown>,
  askedMs: number,
  hold: Hold,
) {
  const tk = await beginExec(d, t, argv, askedMs, {
    ...hold,
    stdin: body.stdin as string | undefined,
    env: body.env as Record<string, string> | undefined,
    cwd: body.cwd as string | undefined,
  });
  const { res, out, err, entry } = await runTicketed(d, t, tk, {
    argv,
    stdin: body.stdin as string | undefined,
    env: body.env as Record<string, string> | undefined,
    cwd: body.cwd as string | undefined,
  });
  return {
    exitCode: res.exitCode,
    stdout: out.text,
    stderr: err.text,
    durationMs: Math.round(res.durationMs),
    timeoutSeconds: tk.timeoutMs / 1000,
    timedOut: res.timedOut,
    outputTruncated: out.dropped > 0 || err.dropped > 0,
    stdoutDroppedBytes: out.dropped,
    stderrDroppedBytes: err.dropped,
    ...(res.signal ? { signal: res.signal } : {}),
    ...(res.oomKilled ? { oomKilled: true } : {}),
    ledgerEntry: entry,
  };
}

/**
 * Per-stream output budget for a streamed exec: passes at most `cap` bytes, cut on a UTF-8
 * character boundary (a character split across chunks is held until it is complete), and
 * counts what it drops. Pure state machine.
 */
export class StreamCap {
  private sent = 0;
  private held = Buffer.alloc(0);
  dropped = 0;
  constructor(private readonly cap: number) {}
  /** The bytes of `chunk` to forward now. */
  push(chunk: Buffer): Buffer {
    if (this.sent >= this.cap && this.held.length === 0) {
      this.dropped += chunk.length;
      return Buffer.alloc(0);
    }
    const b = this.held.length ? Buffer.concat([this.held, chunk]) : chunk;
    this.held = Buffer.alloc(0);
    const room = this.cap - this.sent;
    // Keep back an incomplete last character (it may complete in the next chunk).
    let end = b.length;
    let i = end;
    while (i > 0 && i > end - 4 && (b[i - 1]! & 0xc0) === 0x80) i--;
    if (i > 0) {
      const lead = b[i - 1]!;
      const len = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      if (i - 1 + len > end) end = i - 1;
    }
    const complete = b.subarray(0, end);
    const tail = b.subarray(end);
    if (complete.length <= room) {
      this.sent += complete.length;
      this.held = Buffer.from(tail);
      return complete;
    }
    const cut = cutOutput(complete, room);
    const out = Buffer.from(cut.text, 'utf8');
    this.sent = this.cap;
    this.dropped += b.length - out.length;
    return out;
  }
  /** At the end: a held partial character is dropped. */
  end(): void {
    this.dropped += this.held.length;
    this.held = Buffer.alloc(0);
  }
}

function intParam(r: SubresourceTarget, name: string, def: number, min: number, max: number): number {
  const v = queryParam(r, name);
  if (v === undefined || v === '') return def;
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n) || n < min || n > max)
    throw errors.badRequest(`${name} must be an integer between ${min} and ${max}, got ${JSON.stringify(v)}`);
  return n;
}

/**
 * ledger: GET -> {kind: AgentSessionLedger, entries, lastEntry}; with watch=true a stream of
 * JSON lines, one entry each, first every entry after afterEntry, then new ones as they are
 * appended; the `entry` number is the cursor to resume from (afterEntry=<last seen>), so a
 * reconnect repeats and misses nothing. The stream ends after timeoutSeconds (default 1800,
 * at most 3600), when the client goes, or when the session ends: deleted (after its
 * session.delete entry, or when the object goes without one) or expired (after session.expire;
 * at once for a session that is Expired already). A session's end is the stream's last line,
 * a metav1.Status (kind Status, code 410, reason Gone or Expired, details.name the session)
 * that tells a client not to resume.
 */
function ledgerHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`ledger is read-only: GET, not ${r.method}`);
      const after = intParam(r, 'afterEntry', 0, 0, Number.MAX_SAFE_INTEGER);
      const limit = intParam(r, 'limit', 10_000, 1, 10_000);
      const w = queryParam(r, 'watch');
      if (w !== undefined && !['true', '1', 'false', '0', ''].includes(w))
        throw errors.badRequest(`invalid boolean value for watch: ${JSON.stringify(w)}`);
      const watch = w === 'true' || w === '1' || w === '';
      const timeoutS = intParam(r, 'timeoutSeconds', 1800, 1, 3600);
      const { uid, s } = await resolveSession(d, r, { running: false });
      if (!watch) {
        const entries = await d.ledger.read(uid, after, limit);
        return {
          kind: 'AgentSessionLedger',
          apiVersion: 'fluxvm.dev/v1alpha1',
          session: r.name,
          entries,
          lastEntry: entries.length ? entries[entries.length - 1]!.entry : after,
        };
      }
      r.reply.hijack();
      const res = r.reply.raw;
      res.writeHead(200, {
        'Content-Type': 'application/json',
        'Cache-Control': 'no-store',
        'Transfer-Encoding': 'chunked',
      });
      let last = after;
      const pending: LedgerEntry[] = [];
      let live = false;
      let ended = false;
      // The session's end, as the stream's last line (see above); the entries before it were sent.
      const sessionEnded = (how: 'deleted' | 'expired') => {
        if (ended) return;
        const st = {
          kind: 'Status',
          apiVersion: 'v1',
          metadata: {},
          status: 'Failure',
          code: 410,
          reason: how === 'deleted' ? 'Gone' : 'Expired',
          message: `the session ${r.name} ${how === 'deleted' ? 'was deleted' : 'expired'}: its ledger ends at entry ${last}`,
          details: { name: r.name, group: GROUP, kind: 'agentsessions', uid },
        };
        if (!res.writableEnded) res.write(JSON.stringify(st) + '\n');
        end();
      };
      const send = (e: LedgerEntry) => {
        if (ended || e.entry <= last) return;
        last = e.entry;
        res.write(JSON.stringify(e) + '\n');
        if (e.kind === 'session.delete') sessionEnded('deleted');
        else if (e.kind === 'session.expire') sessionEnded('expired');
      };
      const unsubscribe = d.ledger.subscribe(uid, (e) => (live ? send(e) : pending.push(e)));
      // The session object too: deleted without a session.delete entry (no finalizer pass), or
      // replaced by another of the same name; Expired after its session.expire entry.
      const sessionWatch = d.client.watch<AgentSession>(
        agentSessionsGVR,
        r.namespace,
        { fieldSelector: `metadata.name=${r.name}`, resourceVersion: s.metadata.resourceVersion },
        (ev) => {
          if (!live) return;
          if (ev.type === 'DELETED' || (ev.object?.metadata?.uid && ev.object.metadata.uid !== uid))
            sessionEnded('deleted');
          else if (ev.type !== 'ERROR' && ev.object?.status?.phase === 'Expired') sessionEnded('expired');
        },
      );
      const end = () => {
        ended = true;
        unsubscribe();
        sessionWatch.stop();
        clearTimeout(timer);
        if (!res.writableEnded) res.end();
      };
      const timer = setTimeout(end, timeoutS * 1000);
      r.req.on('close', end);
      res.on('close', end);
      try {
        for (const e of await d.ledger.read(uid, after)) send(e);
      } catch (e) {
        d.log?.error('ledger read failed', { session: r.name, error: String(e) });
        return end();
      }
      for (const e of pending.splice(0)) send(e);
      live = true;
      if (s.status?.phase === 'Expired') sessionEnded('expired');
      else
        void getIfExists<AgentSession>(d.client, agentSessionsGVR, r.namespace, r.name).then(
          (cur) => {
            // Gone (or Expired) between the first read and the watch's start.
            if (!cur || cur.metadata.uid !== uid) sessionEnded('deleted');
            else if (cur.status?.phase === 'Expired') sessionEnded('expired');
          },
          () => undefined,
        );
      return undefined;
    },
  };
}

/** Every agentsessions subresource handler, ready to register on the API server. */
export function agentSessionSubresources(
  d: AgentSessionSubresourceDeps,
  tokens = new SessionTokens(d.state.dir),
  previews = new PreviewStore(d.state.dir),
  watches = new FileWatches(d.runtime),
): Array<{ plural: string; name: string; handler: SubresourceHandler }> {
  const l = {
    ...lifecycleHandlers(d),
    rewind: rewindHandler(d), // rewind.ts: list, undo, pin, unpin, config, branch, bisect
    token: tokenHandler(d, tokens),
    ...eventsHandlers(d),
    'files/watch': fileWatchHandler(d, watches),
    previews: previewsHandler(d, previews),
  };
  const jobs = sessionJobHandlers(d);
  return [
    { plural: 'agentsessions', name: 'exec', handler: wrap(execHandler(d, jobs.execStream)) },
    { plural: 'agentsessions', name: 'exec/stream', handler: wrap(jobs.execStreamHandler) },
    { plural: 'agentsessions', name: 'jobs', handler: wrap(jobs.jobs) },
    { plural: 'agentsessions', name: 'ledger', handler: wrap(ledgerHandler(d)) },
    { plural: 'agentsessions', name: 'replay', handler: wrap(replayHandler(d)) },
    { plural: 'agentsessions', name: 'provenance', handler: wrap(sessionProvenanceHandler(d)) },
    { plural: 'agentsessions', name: 'files', handler: wrap(sessionFilesHandler(d)) },
    { plural: 'agentsessions', name: 'git', handler: wrap(gitHandler(d)) },
    ...sessionLargeFileSubresources(d).map((s) => ({ ...s, handler: wrap(s.handler) })),
    { plural: 'approvals', name: 'approval', handler: wrap(approvalDecisionHandler(d)) },
    ...Object.entries(l).map(([name, handler]) => ({ plural: 'agentsessions', name, handler: wrap(handler) })),
  ];
}
