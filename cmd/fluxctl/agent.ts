// `fluxctl agent ...`: AgentSessions (spec/agent-sessions.md "Clients") over the kind and its
// subresources (controllers/agentsession/README.md maps every route).
//
//   run AGENT [--name N] [--preset P] [--backend B] [--ttl-seconds S] [--max-execs N] ...
//                                  creates a session, waits until it is Running, prints its name
//   ls                             the sessions of the namespace
//   get NAME [-o json]             phase, sandbox, capabilities, compiled policy, usage
//   exec NAME [--timeout D] [--stream] [-i] [-t] -- CMD   one word = a shell line; several words
//                                  = an argv; exits with its code; --stream: output as produced
//                                  (WebSocket); -i: stdin passed (streamed); -t: an interactive
//                                  terminal (tty=true, sandbox.ts ttyExec: raw mode, resizes)
//   checkpoint NAME [--tag T] [--memory]     restore NAME TAG
//   fork NAME [--count N] [--identity I]     promote CHILD [--dry-run | --plan-id ID] [--skip-conflicts] [--path P...]
//   artifacts NAME                 workspace changes since the baseline, checkpoints, children, usage
//   timeline NAME [--after N] [--watch]      the ledger, one line an entry (--watch follows, resuming after a drop,
// until the session is deleted or expires)
//   rm NAME                        deletes the session (its sandbox goes with it)
//   export, evaluate, rollout      client-side orchestration: agent-orchestrate.ts
//   token, tokens, untoken         session tokens: agent-token.ts
//   git NAME status|diff|log|commit|branch|push|pull|fetch   agent-git.ts
//   expose, previews, unexpose     preview URLs: agent-preview.ts
//   approvals, approve, deny       held commands (policy.process.ask): agent-approval.ts;
//                                  exec --approval NAME / --approval-wait D for the held command
// Text the sandbox or the agent controls (output, commands, paths) is escaped on a terminal
// (escape.ts); API errors print as kubectl prints them.
import { setTimeout as sleep } from 'node:timers/promises';
import http from 'node:http';
import https from 'node:https';
import { randomBytes } from 'node:crypto';
import type { Command } from 'commander';
import { statusErrorFrom, type ClientNodeClient } from '../../runtime/client/clientnode.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import { agentSession } from '../../apis/agentsession.js';
import type { AgentSession } from '../../apis/zz_generated.types.js';
import { escapeLine } from './escape.js';
import { tabwrite, toJson } from './printers.js';
import { addOrchestrationVerbs } from './agent-orchestrate.js';
import { watchObject } from './wait.js';
import { addTokenVerbs } from './agent-token.js';
import { addApprovalVerbs, heldHint } from './agent-approval.js';
import { addGitVerbs } from './agent-git.js';
import { addLifecycleVerbs } from './agent-lifecycle.js';
import { addPreviewVerbs } from './agent-preview.js';
import { addFileTransferVerbs } from './agent-files.js';
import { addEventVerbs } from './agent-events.js';
import { isStatusError } from '../../runtime/meta/errors.js';
import { sandboxOutput, streamExec, ttyExec } from './sandbox.js';
import { addJobVerbs } from './jobs.js';
import { CliError, globalOptions, makeClient, namespaceOf, type Io } from './util.js';
import { collect, idem, int, output, seconds } from './flags.js';

const SESSIONS: GVR = gvrOf(agentSession);

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

const subPath = (ns: string, name: string, sub: string) =>
  `/apis/${SESSIONS.group}/${SESSIONS.version}/namespaces/${encodeURIComponent(ns)}/agentsessions/${encodeURIComponent(name)}/${sub}`;

async function request(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined>,
  body?: object,
  headers: Record<string, string> = {},
): Promise<http.IncomingMessage> {
  const url = new URL(c.client.server() + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, v);
  const opts: https.RequestOptions = { method, headers: {} };
  await c.client.kc.applyToHTTPSOptions(opts);
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  opts.headers = {
    ...(opts.headers as Record<string, string>),
    'User-Agent': 'fluxctl',
    Accept: 'application/json',
    ...headers,
    ...(payload ? { 'Content-Type': 'application/json', 'Content-Length': String(payload.length) } : {}),
  };
  const mod = url.protocol === 'https:' ? https : http;
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    const r = mod.request(url, opts, resolve);
    r.on('error', (e) =>
      reject(
        statusErrorFrom(
          503,
          JSON.stringify({
            kind: 'Status',
            code: 503,
            reason: 'ServiceUnavailable',
            message: `unable to connect to the server: ${e.message}`,
          }),
        ),
      ),
    );
    r.end(payload);
  });
  if ((res.statusCode ?? 0) < 200 || (res.statusCode ?? 0) >= 300) {
    const chunks: Buffer[] = [];
    for await (const b of res) chunks.push(b as Buffer);
    throw statusErrorFrom(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'));
  }
  return res;
}

/** agentsessions/NAME/exec's JSON answer. */
interface ExecAnswer {
  exitCode: number;
  stdout?: string;
  stderr?: string;
  outputTruncated?: boolean;
  stdoutDroppedBytes?: number;
  stderrDroppedBytes?: number;
  timedOut?: boolean;
  timeoutSeconds?: number;
}

async function callJson<T>(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined> = {},
  body?: object,
  headers?: Record<string, string>,
): Promise<T> {
  const res = await request(c, method, path, query, body, headers);
  const chunks: Buffer[] = [];
  for await (const b of res) chunks.push(b as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8')) as T;
}

function age(ts: string | undefined): string {
  if (!ts) return '<unknown>';
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(ts)) / 1000));
  return s < 120
    ? `${s}s`
    : s < 7200
      ? `${Math.floor(s / 60)}m`
      : s < 172800
        ? `${Math.floor(s / 3600)}h`
        : `${Math.floor(s / 86400)}d`;
}

/** One ledger entry as a line: entry number, time, kind, then its fields (agent-controlled text escaped). Pure. */
export function ledgerLine(e: Record<string, unknown>): string {
  const { entry, time, kind, ...rest } = e;
  const fields = Object.entries(rest)
    .map(([k, v]) => `${k}=${typeof v === 'string' ? JSON.stringify(v) : JSON.stringify(v)}`)
    .join(' ');
  return escapeLine(`${String(entry).padStart(4)} ${time} ${kind}${fields ? ' ' + fields : ''}`) + '\n';
}

/** Registers `fluxctl agent` and its verbs on the program. */
export function addAgentCommands(program: Command, io: Io, setExit: (code: number) => void): Command {
  const group = program
    .command('agent')
    .alias('ags')
    .description(
      'AgentSessions: one handle for an AI agent (sandbox, policy, budget, ledger, checkpoints, fork, promote)',
    );
  const verb = (name: string) =>
    group
      .command(name)
      .option('--kubeconfig <path>', 'path to the kubeconfig file')
      .option('-n, --namespace <ns>', 'namespace of the session')
      .option('--context <name>', 'kubeconfig context to use');
  const conn = (cmd: Command): Conn => {
    const g = globalOptions(cmd);
    const client = makeClient(g);
    return { client, ns: namespaceOf(g, client) };
  };

  verb('run')
    .description('create a session and wait until it is Running; prints its name')
    .argument('<agent>', 'the agent using the session, e.g. claude-code')
    .option('--name <name>', 'session name (default: the agent name and a random suffix)')
    .option('--preset <preset>', 'policy preset: offline, developerSafe or open')
    .option('--backend <backend>', 'procbox or vm')
    .option('--image <image>', 'sandbox image')
    .option('--workspace <path>', 'workspace path in the sandbox (default /work)')
    .option('--allow-host <host>', 'allowed network destination (repeatable)', collect)
    .option('--best-effort', 'create even when a network or filesystem rule cannot be enforced')
    .option('--cmd-allow <glob>', 'process.allow pattern (repeatable)', collect)
    .option('--cmd-deny <glob>', 'process.deny pattern (repeatable)', collect)
    .option(
      '--cmd-enforce',
      'process.enforce exec: the programs the --cmd-allow patterns name are the only ones the kernel lets start',
    )
    .option(
      '--readonly',
      "workspace.mode readonly: the agent's commands cannot write the workspace (Landlock); /tmp stays writable",
    )
    .option('--ttl-seconds <s>', 'lifetime', int('--ttl-seconds'))
    .option('--max-execs <n>', 'budget.maxExecs', int('--max-execs'))
    .option('--max-exec-seconds <n>', 'budget.maxExecSeconds', int('--max-exec-seconds'))
    .option('--max-output-bytes <n>', 'budget.maxOutputBytes', int('--max-output-bytes'))
    .option('--max-children <n>', 'budget.maxChildren', int('--max-children'))
    .option(
      '--timeout <duration>',
      'how long to wait for Running (30s, 5m; a bare number is seconds)',
      seconds('--timeout'),
      120,
    )
    .action(async (agent: string, o, cmd: Command) => {
      const c = conn(cmd);
      const name =
        o.name ??
        `${
          agent
            .toLowerCase()
            .replace(/[^a-z0-9-]/g, '-')
            .replace(/^-+|-+$/g, '')
            .slice(0, 40) || 'session'
        }-${randomBytes(3).toString('hex')}`;
      const budget: Record<string, number> = {};
      if (o.maxExecs !== undefined) budget.maxExecs = o.maxExecs;
      if (o.maxExecSeconds !== undefined) budget.maxExecSeconds = o.maxExecSeconds;
      if (o.maxOutputBytes !== undefined) budget.maxOutputBytes = o.maxOutputBytes;
      if (o.maxChildren !== undefined) budget.maxChildren = o.maxChildren;
      const policy: Record<string, unknown> = {};
      if (o.preset) policy.preset = o.preset;
      if (o.allowHost?.length || o.bestEffort)
        policy.network = {
          ...(o.allowHost?.length ? { default: 'deny', allow: o.allowHost.map((host: string) => ({ host })) } : {}),
          ...(o.bestEffort ? { enforcement: 'bestEffort' } : {}),
        };
      if (o.bestEffort) policy.filesystem = { enforcement: 'bestEffort' };
      if (o.cmdAllow?.length || o.cmdDeny?.length || o.cmdEnforce) {
        policy.process = {
          ...(o.cmdAllow?.length ? { allow: o.cmdAllow } : {}),
          ...(o.cmdDeny?.length ? { deny: o.cmdDeny } : {}),
          ...(o.cmdEnforce ? { enforce: 'exec' } : {}),
        };
      }
      const spec: Record<string, unknown> = {
        agent,
        ...(Object.keys(policy).length ? { policy } : {}),
        ...(Object.keys(budget).length ? { budget } : {}),
        ...(o.ttlSeconds !== undefined ? { ttlSeconds: o.ttlSeconds } : {}),
        ...(o.backend || o.image
          ? { runtime: { ...(o.backend ? { backend: o.backend } : {}), ...(o.image ? { image: o.image } : {}) } }
          : {}),
        ...(o.workspace || o.readonly
          ? {
              workspace: { ...(o.workspace ? { path: o.workspace } : {}), ...(o.readonly ? { mode: 'readonly' } : {}) },
            }
          : {}),
      };
      await c.client.create(SESSIONS, c.ns, {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name, namespace: c.ns },
        spec,
      });
      // A watch of the session (no polling): its status writes wake the wait.
      let seen: { phase?: string; message?: string } | undefined;
      let gone = false;
      const ran = await watchObject(c.client, SESSIONS, c.ns, name, o.timeout * 1000, (s) => {
        if (!s) return (gone = true);
        seen = (s as { status?: { phase?: string; message?: string } }).status ?? {};
        return ['Running', 'Failed', 'Expired'].includes(seen.phase ?? '');
      });
      if (gone) throw new CliError(`error: session ${name} was deleted while waiting for it to run`);
      const ph = seen?.phase;
      if (ph === 'Failed' || ph === 'Expired')
        throw new CliError(`error: session ${name} is ${ph}: ${seen?.message ?? ''}`);
      if (!ran)
        throw new CliError(`error: timed out waiting for session ${name} to be Running (phase ${ph ?? 'Pending'})`);
      io.out(`${name}\n`);
      setExit(0);
    });

  verb('ls')
    .description('list the sessions of the namespace')
    .action(async (_o, cmd: Command) => {
      const c = conn(cmd);
      const l = await c.client.list<AgentSession>(SESSIONS, c.ns);
      const rows = [['NAME', 'AGENT', 'PHASE', 'SANDBOX', 'PARENT', 'EXECS', 'AGE']];
      for (const s of l.items)
        rows.push([
          s.metadata.name ?? '',
          escapeLine(s.spec.agent),
          s.status?.phase ?? 'Pending',
          s.status?.sandbox?.name ?? '',
          s.spec.forkOf?.name ?? '',
          String(s.status?.usage?.execs ?? 0),
          age(s.metadata.creationTimestamp),
        ]);
      io.out(l.items.length ? tabwrite(rows) : `No agent sessions found in ${c.ns} namespace.\n`);
      setExit(0);
    });

  verb('get')
    .description('one session: phase, sandbox, capabilities, compiled policy, usage, checkpoints, children')
    .argument('<name>')
    .option('-o, --output <format>', 'json', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = conn(cmd);
      const s = await c.client.get<AgentSession>(SESSIONS, c.ns, name);
      if (o.output === 'json') return (io.out(toJson(s)), setExit(0));
      const st: NonNullable<AgentSession['status']> = s.status ?? {};
      const lines = [
        `Name:         ${s.metadata.name}`,
        `Agent:        ${escapeLine(s.spec.agent)}`,
        `Phase:        ${st.phase ?? 'Pending'}`,
        `Sandbox:      ${st.sandbox?.name ?? ''}`,
        ...(s.spec.forkOf ? [`Fork of:      ${s.spec.forkOf.name}`] : []),
        `Expires:      ${st.expiresAt ?? ''}`,
        `Message:      ${escapeLine(st.message ?? '')}`,
        `Capabilities: ${Object.entries(st.capabilities ?? {})
          .map(([k, v]) => `${k}=${v}`)
          .join(' ')}`,
        `Network:      ${st.compiledPolicy?.networkMode ?? ''}${st.compiledPolicy?.allowHosts?.length ? ' ' + st.compiledPolicy.allowHosts.join(',') : ''}`,
        `Usage:        ${Object.entries(st.usage ?? {})
          .map(([k, v]) => `${k}=${v}`)
          .join(' ')}`,
        `Checkpoints:  ${(st.checkpoints ?? []).map((x) => x.name).join(', ')}`,
        `Children:     ${(st.children ?? []).map((x) => x.name).join(', ')}`,
        ...(st.interruptedOp ? [`Interrupted:  ${st.interruptedOp.op} started ${st.interruptedOp.startedAt}`] : []),
      ];
      io.out(lines.join('\n') + '\n');
      setExit(0);
    });

  verb('exec')
    .description('run a command in the session (policy- and budget-checked, ledgered); exits with its exit code')
    .argument('<name>')
    .argument('<command...>', 'one word: a shell line; several: an argv (after --)')
    .option(
      '--timeout <duration>',
      'timeout (30s, 5m; a bare number is seconds; at most what the budget leaves)',
      seconds('--timeout'),
    )
    .option('--idempotency-key <key>', 'replay the first answer for a retry with this key')
    .option('--raw', 'write output byte for byte even to a terminal')
    .option('--stream', 'stream the output as it is produced (WebSocket)')
    .option('-i, --stdin', 'pass stdin to the command (streamed)')
    .option(
      '-t, --tty',
      'an interactive terminal: the local terminal in raw mode, window size followed (with -i: -it); the same policy, budget and ledger',
    )
    .option(
      '--approval <name>',
      'run a command held by policy.process.ask with this Approved Approval (fluxctl agent approvals NAME)',
    )
    .option(
      '--approval-wait <duration>',
      'hold a held command open until an operator decides (at most 120s), then run it',
      seconds('--approval-wait'),
    )
    .action(async (name: string, words: string[], o, cmd: Command) => {
      const c = conn(cmd);
      const approval: Record<string, string> = {
        ...(o.approval ? { approvalName: o.approval } : {}),
        ...(o.approvalWait !== undefined ? { approvalWaitSeconds: String(o.approvalWait) } : {}),
      };
      const held = (e: unknown) => {
        if (!isStatusError(e) || e.code !== 428) throw e;
        io.err(heldHint(e, name, c.ns, words));
        setExit(1);
      };
      const argv = words.length === 1 ? ['sh', '-c', words[0]!] : words;
      const at = { path: subPath(c.ns, name, 'exec'), query: approval };
      if (o.tty) {
        let code: number | undefined;
        try {
          code = await ttyExec(c, name, argv, io, o.timeout, at);
        } catch (e) {
          return held(e);
        }
        if (code !== undefined) return setExit(code);
        // No terminal here (ttyExec said so): the command runs streamed with stdin, as exec -t does.
      }
      if (o.stream || o.stdin || o.tty) {
        const out = sandboxOutput(io, 'out', { raw: o.raw });
        const err = sandboxOutput(io, 'err', { raw: o.raw });
        const stdin = o.stdin || (o.tty && !process.stdin.isTTY) ? process.stdin : undefined;
        let code: number;
        try {
          code = await streamExec(c, name, argv, {
            at,
            stdin,
            timeoutSeconds: o.timeout,
            onStdout: (b) => out.write(b),
            onStderr: (b) => err.write(b),
          });
        } catch (e) {
          return held(e);
        }
        out.end();
        err.end();
        return setExit(code);
      }
      const body = {
        command: words.length === 1 ? words[0] : words,
        ...(o.timeout ? { timeoutSeconds: o.timeout } : {}),
        ...(o.approval ? { approvalName: o.approval } : {}),
        ...(o.approvalWait !== undefined ? { approvalWaitSeconds: o.approvalWait } : {}),
      };
      let r: ExecAnswer;
      try {
        r = await callJson<ExecAnswer>(c, 'POST', subPath(c.ns, name, 'exec'), {}, body, idem(o));
      } catch (e) {
        return held(e);
      }
      const out = sandboxOutput(io, 'out', { raw: o.raw });
      const err = sandboxOutput(io, 'err', { raw: o.raw });
      out.write(Buffer.from(r.stdout ?? ''));
      err.write(Buffer.from(r.stderr ?? ''));
      out.end();
      err.end();
      if (r.outputTruncated)
        io.err(
          `fluxctl: output truncated by budget.maxOutputBytes (stdout ${r.stdoutDroppedBytes} and stderr ${r.stderrDroppedBytes} bytes dropped)\n`,
        );
      if (r.timedOut) io.err(`fluxctl: the command timed out after ${r.timeoutSeconds} s\n`);
      setExit(r.exitCode);
    });

  addLifecycleVerbs({ conn, callJson, subPath, verb }, io, setExit);

  verb('timeline')
    .description(
      'the session ledger, one line an entry; --watch follows new entries (resuming after a dropped connection)',
    )
    .argument('<name>')
    .option('--after <n>', 'only entries after this one', int('--after'), 0)
    .option('--watch', 'follow new entries')
    .option('-o, --output <format>', 'json (JSON lines)', output)
    .action(async (name: string, o, cmd: Command) => {
      const c = conn(cmd);
      const print = (e: Record<string, unknown>) =>
        io.out(o.output === 'json' ? JSON.stringify(e) + '\n' : ledgerLine(e));
      if (!o.watch) {
        const r = await callJson<{ entries: Array<Record<string, unknown>> }>(c, 'GET', subPath(c.ns, name, 'ledger'), {
          afterEntry: String(o.after),
        });
        for (const e of r.entries) print(e);
        return setExit(0);
      }
      let cursor = o.after as number;
      for (;;) {
        try {
          const res = await request(c, 'GET', subPath(c.ns, name, 'ledger'), {
            afterEntry: String(cursor),
            watch: 'true',
          });
          let buf = '';
          for await (const chunk of res) {
            buf += (chunk as Buffer).toString('utf8');
            let i: number;
            while ((i = buf.indexOf('\n')) >= 0) {
              const line = buf.slice(0, i);
              buf = buf.slice(i + 1);
              if (!line) continue;
              const e = JSON.parse(line) as Record<string, unknown>;
              if (e.kind === 'Status' && e.apiVersion === 'v1') {
                // The session was deleted or expired: its ledger is complete, nothing to resume.
                io.err(`${e.message}\n`);
                return setExit(0);
              }
              cursor = Number(e.entry);
              print(e);
            }
          }
        } catch (e) {
          if ((e as { code?: unknown } | undefined)?.code === 404) throw e;
        }
        await sleep(500); // the stream ended (timeout, dropped connection): resume after the cursor
      }
    });

  verb('rm')
    .description('delete the session (its sandbox is deleted with it)')
    .argument('<name...>')
    .action(async (names: string[], _o, cmd: Command) => {
      const c = conn(cmd);
      for (const n of names) {
        await c.client.delete(SESSIONS, c.ns, n);
        io.out(`agentsession.fluxvm.dev "${n}" deleted\n`);
      }
      setExit(0);
    });
  addOrchestrationVerbs({ sessions: SESSIONS, conn, callJson, subPath, verb, int, collect }, io, setExit);
  addTokenVerbs({ conn, callJson, subPath, verb }, io, setExit);
  addApprovalVerbs({ conn, verb }, io, setExit);
  addJobVerbs({ verb, conn, jobsPath: (c, n) => subPath(c.ns, n, 'jobs'), session: true }, io, setExit);
  addGitVerbs({ conn, callJson, subPath, verb }, io, setExit);
  addPreviewVerbs({ conn, callJson, subPath, verb }, io, setExit);
  addFileTransferVerbs({ conn, subPath, verb }, io, setExit);
  addEventVerbs({ conn, subPath, verb, callJson, ledgerLine }, io, setExit);
  return group;
}
