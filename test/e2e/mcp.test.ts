// End to end against a real `fluxctl serve` (procbox, HTTPS, bearer tokens) with the official MCP
// SDK client, over streamable HTTP (/mcp) and over stdio (`fluxctl mcp` with a kubeconfig):
// FluxVM's MCP server. The same cases run on both transports: discover and initialize, the
// tool list with annotations, exec, a speculation Task to completion, a held `ask` command as a
// Task that goes input_required, is refused when a session token answers and completes when an
// approver answers (the command runs once: counted in the sandbox), a bad argument as a tool error
// naming the field, and an oversized file argument refused (before the body is read whole, over
// HTTP). Over HTTP also: a session token on another session's tool refused, unauthenticated 401,
// an exec past the session's budget (maxExecs) a tool error carrying the API's budget Status.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import https from 'node:https';
import type { IncomingHttpHeaders } from 'node:http';
import yaml from 'js-yaml';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { callAsTask, httpClient, stdioClient, taskResult, textOf, waitTask } from './mcp-client.js';
import { MAX_FILE_WRITE_BYTES } from '../../cmd/fluxctl/mcp/tools-session.js';
import { MAX_MCP_BODY_BYTES } from '../../cmd/fluxctl/mcp/http.js';

const agsPath = (name: string, sub: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}/${sub}`;
const session = (name: string, spec: Record<string, unknown> = {}) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline', process: { ask: ['deploy *'] } }, ...spec },
  });
const deploy = (what: string) => `deploy() { echo "$1" >> /work/runs; }; deploy ${what}`;

async function call(c: Client, name: string, args: Record<string, unknown>): Promise<CallToolResult> {
  return c.callTool({ name, arguments: args }, CallToolResultSchema) as Promise<CallToolResult>;
}

describe('e2e: MCP server (official SDK client, stdio and streamable HTTP)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let tmp: string;
  let sessionToken = '';
  const clients: Client[] = [];
  const runs = async (name: string) => {
    const r = await fx.request('POST', agsPath(name, 'exec'), {
      body: { command: ['sh', '-c', 'cat /work/runs 2>/dev/null || true'] },
    });
    return String(r.json.stdout);
  };

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-mcp-e2e-'));
    const sessions = [...['mh', 'ms', 'mo'].map((n) => session(n)), session('mb', { budget: { maxExecs: 1 } })];
    await kubectlOk(fx, ['apply', '-f', '-'], sessions.join('\n'));
    for (const n of ['mh', 'ms', 'mo', 'mb'])
      await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=90s']);
    const t = await fx.request('POST', agsPath('mh', 'token'), { body: { ops: ['exec', 'read', 'files.read'] } });
    expect(t.status, JSON.stringify(t.json)).to.equal(201);
    sessionToken = t.json.status.token;
  });
  after(async () => {
    for (const c of clients) await c.close().catch(() => undefined);
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  const open = async (kind: 'http' | 'stdio', token?: string) => {
    let c: Client;
    if (kind === 'http') c = await httpClient(fx.url, token ?? fx.token!, fx.ca);
    else {
      let kc = fx.kubeconfig;
      if (token) {
        const doc = yaml.load(fs.readFileSync(fx.kubeconfig, 'utf8')) as { users: Array<{ user: { token?: string } }> };
        doc.users[0]!.user = { token };
        kc = path.join(tmp, `kc-${clients.length}`);
        fs.writeFileSync(kc, yaml.dump(doc), { mode: 0o600 });
      }
      c = await stdioClient(fluxctlCommand(), kc, REPO);
    }
    clients.push(c);
    return c;
  };

  for (const kind of ['http', 'stdio'] as const) {
    describe(`over ${kind}`, () => {
      let c: Client;
      let agent: Client;
      before(async () => {
        c = await open(kind);
        agent = await open(kind, sessionToken);
      });

      it('answers initialize and server/discover (stateless: 2026-07-28 listed, capabilities with tasks)', async () => {
        expect(c.getServerVersion()?.name).to.equal('fluxvm');
        expect(c.getServerCapabilities()?.tasks?.requests?.tools?.call).to.deep.equal({});
        const d = (await c.request(
          { method: 'server/discover', params: {} },
          CallToolResultSchema.passthrough().partial(),
        )) as Record<string, unknown>;
        expect(d.supportedVersions).to.include('2026-07-28');
        expect((d.capabilities as { tools?: unknown }).tools).to.be.an('object');
      });

      it('lists the tools in snake_case with annotations (destructive apply/delete/kill, read-only reads)', async () => {
        const { tools } = await c.listTools();
        const by = Object.fromEntries(tools.map((t) => [t.name, t]));
        for (const t of tools) expect(t.name).to.match(/^[a-z]+(_[a-z]+)*$/);
        for (const n of ['changeset_apply', 'session_delete', 'session_job_kill'])
          expect(by[n]?.annotations?.destructiveHint, n).to.equal(true);
        for (const n of ['session_get', 'changeset_diff', 'session_events', 'session_file_read'])
          expect(by[n]?.annotations, n).to.include({ readOnlyHint: true, idempotentHint: true });
        expect(by.session_exec?.annotations?.readOnlyHint).to.equal(false);
        expect(by.sandbox_speculate?.execution?.taskSupport).to.equal('optional');
      });

      it('runs exec and escapes its output for a terminal', async () => {
        const r = await call(agent, 'session_exec', { session: 'mh', command: "printf 'ok\\033[2K\\n'" });
        expect(r.isError, textOf(r)).to.not.equal(true);
        const v = JSON.parse(textOf(r));
        expect(v.exitCode).to.equal(0);
        expect(v.stdout).to.equal('ok^[[2K\n');
      });

      it('a bad argument is a tool error naming the field (not a transport error), and nothing runs', async () => {
        const r = await call(c, 'session_exec', { session: 'mh', command: 'true', timeout_seconds: 0 });
        expect(r.isError).to.equal(true);
        expect(textOf(r)).to.match(/invalid argument timeout_seconds/);
        const m = await call(c, 'session_exec', { session: 'mh' });
        expect(textOf(m)).to.match(/invalid argument command/);
      });

      it('an oversized file argument is refused (one byte past the limit), the limit itself is written', async () => {
        const over = await call(c, 'session_file_write', {
          session: 'mh',
          path: '/work/big.txt',
          content: 'x'.repeat(MAX_FILE_WRITE_BYTES + 1),
        });
        expect(over.isError).to.equal(true);
        expect(textOf(over)).to.match(/invalid argument content/);
        const at = await call(c, 'session_file_write', {
          session: 'mh',
          path: '/work/big.txt',
          content: 'y'.repeat(MAX_FILE_WRITE_BYTES),
        });
        expect(at.isError, textOf(at)).to.not.equal(true);
        const st = await fx.request('GET', `${agsPath('mh', 'files')}?path=/work/big.txt&stat=true`);
        expect(st.json.size).to.equal(MAX_FILE_WRITE_BYTES);
      });

      it('speculates as a Task to completion, then diff', async () => {
        const task = await callAsTask(c, 'sandbox_speculate', {
          sandbox: 'mh',
          command: ['sh', '-c', `echo ${kind} > /work/spec-${kind}.txt`],
        });
        expect(task.status).to.equal('working');
        const done = await waitTask(c, task.taskId, ['completed', 'failed']);
        expect(done.status, JSON.stringify(done)).to.equal('completed');
        const v = JSON.parse(textOf(await taskResult(c, task.taskId)));
        expect(v.phase).to.equal('Pending');
        expect(JSON.stringify(v.changes)).to.contain(`spec-${kind}.txt`);
        const d = await call(c, 'changeset_diff', { changeset: v.name });
        expect(textOf(d)).to.contain(`+${kind}`);
        // the real sandbox is unchanged
        const st = await fx.request('GET', `${agsPath('mh', 'files')}?path=/work/spec-${kind}.txt&stat=true`);
        expect(st.status).to.equal(404);
      });

      it('a held ask command is a Task in input_required; a session token cannot answer; an approver can, and it runs once', async () => {
        const before = (await runs('mh')).split('\n').filter((l) => l === kind).length;
        const task = await callAsTask(agent, 'session_exec', { session: 'mh', command: deploy(kind) });
        const held = await waitTask(agent, task.taskId, ['input_required', 'completed', 'failed']);
        expect(held.status, JSON.stringify(held)).to.equal('input_required');
        expect(held.statusMessage).to.match(/held for approval: Approval mh-/);
        expect(held.inputRequest?.kind).to.equal('approval');
        const approval = String(held.inputRequest?.approval);

        // The session token (the agent) answers its own task: refused by the API, nothing runs.
        let refused: Error | undefined;
        try {
          await agent.request(
            { method: 'tasks/update', params: { taskId: task.taskId, input: { decision: 'approve' } } },
            CallToolResultSchema.passthrough().partial(),
          );
        } catch (e) {
          refused = e as Error;
        }
        expect(refused?.message).to.match(/not decided: 403/);
        expect((await waitTask(agent, task.taskId, ['input_required'])).status).to.equal('input_required');
        const apr = await fx.request('GET', `/apis/fluxvm.dev/v1alpha1/namespaces/default/approvals/${approval}`);
        expect(apr.json.status?.decision).to.equal(undefined);

        if (kind === 'http') {
          // The approver (admin) answers through tasks/update on the same endpoint (stateless: any
          // request finds the task by id): the task completes, the command ran once.
          const upd = await c.request(
            { method: 'tasks/update', params: { taskId: task.taskId, input: { decision: 'approve', note: 'ok' } } },
            CallToolResultSchema.passthrough().partial(),
          );
          expect((upd as { status?: string }).status).to.equal('working');
        } else {
          // Over stdio the task lives in the agent's own process (its session token): the approver
          // answers from theirs (session_approve), and the agent's waiting task sees the decision.
          const r = await call(c, 'session_approve', { session: 'mh', approval, note: 'ok' });
          expect(r.isError, textOf(r)).to.not.equal(true);
        }
        const done = await waitTask(agent, task.taskId, ['completed', 'failed']);
        expect(done.status, JSON.stringify(done)).to.equal('completed');
        expect(JSON.parse(textOf(await taskResult(agent, task.taskId))).exitCode).to.equal(0);
        const after = (await runs('mh')).split('\n').filter((l) => l === kind).length;
        expect(after).to.equal(before + 1);
      });

      it("a session token on another session's tool is refused (and another principal's task is not found)", async () => {
        const r = await call(agent, 'session_exec', { session: 'mo', command: 'touch /work/pwned' });
        expect(r.isError).to.equal(true);
        expect(textOf(r)).to.match(/^"?403 Forbidden/);
        const f = await fx.request('GET', `${agsPath('mo', 'files')}?path=/work/pwned&stat=true`);
        expect(f.status).to.equal(404);
        const t = await callAsTask(c, 'sandbox_speculate', { sandbox: 'mo', command: ['true'] });
        let err: Error | undefined;
        try {
          await agent.request(
            { method: 'tasks/get', params: { taskId: t.taskId } },
            CallToolResultSchema.passthrough().partial(),
          );
        } catch (e) {
          err = e as Error;
        }
        expect(err?.message).to.match(/not found/);
        await waitTask(c, t.taskId, ['completed', 'failed']);
      });
    });
  }

  describe('over HTTP only', () => {
    const post = (body: Buffer | string, headers: Record<string, string>) =>
      new Promise<{ status: number; body: string; headers: IncomingHttpHeaders }>((resolve, reject) => {
        const u = new URL('/mcp', fx.url);
        const req = https.request(u, { method: 'POST', ca: fx.ca, headers }, (res) => {
          let s = '';
          res.on('data', (b) => (s += b));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: s, headers: res.headers }));
        });
        req.on('error', reject);
        req.end(body);
      });

    it('refuses a request without a valid token (401) and a body past the limit before reading it (413)', async () => {
      const rpc = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} });
      const h = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
      expect((await post(rpc, h)).status).to.equal(401);
      expect((await post(rpc, { ...h, authorization: 'Bearer fxst_nope' })).status).to.equal(401);
      // The stateless shape: no initialize, no session header, the 2026-07-28 version header.
      const ok = await post(rpc, { ...h, authorization: `Bearer ${fx.token}`, 'mcp-protocol-version': '2026-07-28' });
      expect(ok.headers['mcp-session-id']).to.equal(undefined);
      expect(ok.status, ok.body).to.equal(200);
      expect(JSON.parse(ok.body).result.tools.length).to.be.greaterThan(20);
      // Declared larger than the limit: answered 413 at once, the body never sent.
      const big = await new Promise<number>((resolve, reject) => {
        const req = https.request(new URL('/mcp', fx.url), {
          method: 'POST',
          ca: fx.ca,
          headers: { ...h, authorization: `Bearer ${fx.token}`, 'content-length': String(MAX_MCP_BODY_BYTES + 1) },
        });
        req.on('response', (res) => resolve(res.statusCode ?? 0));
        req.on('error', reject);
        req.write('{');
      });
      expect(big).to.equal(413);
    });

    it('rewind points, replay (dry run) and a rewind with both steps and to (a tool error naming steps)', async () => {
      const c = await open('http');
      const pts = await call(c, 'session_rewind_points', { session: 'mh' });
      expect(pts.isError, textOf(pts)).to.not.equal(true);
      expect(JSON.parse(textOf(pts))).to.have.property('points');
      const rp = await call(c, 'session_replay', { session: 'mh', dry_run: true });
      expect(rp.isError, textOf(rp)).to.not.equal(true);
      expect(textOf(rp)).to.contain('printf');
      const bad = await call(c, 'session_rewind', { session: 'mh', steps: 1, to: 'x' });
      expect(bad.isError).to.equal(true);
      expect(textOf(bad)).to.match(/invalid argument steps/);
    });

    it('an exec past the budget is a tool error carrying the API budget Status (inline and as a Task), nothing runs', async () => {
      const c = await open('http');
      const stat = async (f: string) =>
        (await fx.request('GET', `${agsPath('mb', 'files')}?path=/work/${f}&stat=true`)).status;
      // budget.maxExecs 1: the first exec is at the limit and runs.
      const first = await call(c, 'session_exec', { session: 'mb', command: 'touch /work/b1' });
      expect(first.isError, textOf(first)).to.not.equal(true);
      expect(await stat('b1')).to.equal(200);
      // One past: the API's 403 budget Status as a tool result (callTool resolved: no transport error).
      const over = await call(c, 'session_exec', { session: 'mb', command: 'touch /work/b2' });
      expect(over.isError).to.equal(true);
      expect(textOf(over)).to.match(/^"?403 Forbidden: budget exceeded: budget\.maxExecs is 1, the session used 1/);
      const status = (over.structuredContent as { status?: Record<string, unknown> } | undefined)?.status;
      expect(status).to.deep.include({ kind: 'Status', code: 403, reason: 'Forbidden' });
      expect(String(status?.message)).to.match(/budget exceeded: budget\.maxExecs is 1, the session used 1/);
      // As a Task: the task fails and its result is the same tool error.
      const task = await callAsTask(c, 'session_exec', { session: 'mb', command: 'touch /work/b3' });
      const done = await waitTask(c, task.taskId, ['completed', 'failed']);
      expect(done.status, JSON.stringify(done)).to.equal('failed');
      expect(done.statusMessage).to.match(/budget exceeded: budget\.maxExecs is 1/);
      const r = await taskResult(c, task.taskId);
      expect(r.isError).to.equal(true);
      expect((r.structuredContent as { status?: Record<string, unknown> }).status).to.deep.include({
        code: 403,
        reason: 'Forbidden',
      });
      expect(await stat('b2')).to.equal(404);
      expect(await stat('b3')).to.equal(404);
    });

    it('serves llms.txt', async () => {
      const r = await fx.request('GET', '/llms.txt', { token: null });
      expect(r.status).to.equal(200);
      expect(r.body.toString()).to.contain('session_exec');
    });
  });
});
