// An MCP client session with the official SDK client (@modelcontextprotocol/sdk) against a
// `fluxctl serve`'s /mcp: speculate a change as a Task, show its diff, wait for an approver's
// decision, apply it as a Task; then run a command the session's policy holds for approval
// (process.ask) as a Task that goes input_required and completes once an approver answers it
// through tasks/update. The agent and the approver are two principals with their own tokens.
//
//   FLUXVM_URL=https://127.0.0.1:7788 FLUXVM_TOKEN=<agent token> FLUXVM_APPROVER_TOKEN=<approver token> \
//   NODE_EXTRA_CA_CERTS=<state dir>/pki/ca.crt npx tsx examples/mcp-approval.ts SESSION
//
// SESSION is an AgentSession whose policy has `process: {ask: ["deploy *"]}`. Without
// FLUXVM_APPROVER_TOKEN the example prints what to approve and waits (an approver runs
// `fluxctl agent approve SESSION APPROVAL` or `fluxctl changeset approve NAME`).
// test/e2e/examples-mcp.test.ts runs it in CI against a real serve.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  GetTaskResultSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';

const url = process.env.FLUXVM_URL ?? 'https://127.0.0.1:7788';
const session = process.argv[2] ?? 'mcp-example';
const out = (s: string) => process.stdout.write(`${s}\n`);

async function connect(token: string, name: string): Promise<Client> {
  const c = new Client({ name, version: '1.0.0' });
  await c.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      requestInit: { headers: { authorization: `Bearer ${token}` } },
    }),
  );
  return c;
}

const text = (r: CallToolResult) => r.content.map((x) => (x.type === 'text' ? x.text : '')).join('');

async function tool(c: Client, name: string, args: Record<string, unknown>): Promise<string> {
  const r = (await c.callTool({ name, arguments: args }, CallToolResultSchema)) as CallToolResult;
  if (r.isError) throw new Error(`${name}: ${text(r)}`);
  return text(r);
}

/** tools/call as a Task, then tasks/get until it leaves `working`. */
async function startTask(c: Client, name: string, args: Record<string, unknown>): Promise<string> {
  const { task } = await c.request(
    { method: 'tools/call', params: { name, arguments: args, task: { ttl: 600_000 } } },
    CreateTaskResultSchema,
  );
  return task.taskId;
}

const TaskView = GetTaskResultSchema.passthrough();
async function settle(c: Client, taskId: string, timeoutMs = 300_000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const t = (await c.request({ method: 'tasks/get', params: { taskId } }, TaskView)) as {
      status: string;
      statusMessage?: string;
      pollInterval?: number;
      inputRequest?: { approval?: string; commandLine?: string };
    };
    if (t.status !== 'working') return t;
    if (Date.now() > end) throw new Error(`task ${taskId} still working after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, t.pollInterval ?? 500));
  }
}

async function result(c: Client, taskId: string): Promise<Record<string, unknown>> {
  const r = (await c.request({ method: 'tasks/result', params: { taskId } }, CallToolResultSchema)) as CallToolResult;
  if (r.isError) throw new Error(text(r));
  return JSON.parse(text(r)) as Record<string, unknown>;
}

const agent = await connect(process.env.FLUXVM_TOKEN ?? '', 'example-agent');
const approverToken = process.env.FLUXVM_APPROVER_TOKEN;
const approver = approverToken ? await connect(approverToken, 'example-approver') : undefined;
try {
  // 1. Speculate: the change runs in an isolated copy; the session's files do not change yet.
  await tool(agent, 'session_file_write', { session, path: '/work/config.ini', content: 'workers = 2\n' });
  const spec = await startTask(agent, 'sandbox_speculate', {
    sandbox: session,
    command: ['sh', '-c', "sed -i 's/workers = 2/workers = 8/' /work/config.ini"],
  });
  const s = await settle(agent, spec);
  if (s.status !== 'completed') throw new Error(`speculation ${s.status}: ${s.statusMessage ?? ''}`);
  const cs = String((await result(agent, spec)).name);
  out(`changeset ${cs} would change:\n${await tool(agent, 'changeset_diff', { changeset: cs })}`);

  // 2. A person decides (here the approver's own client), then the agent applies as a Task.
  if (approver) await tool(approver, 'changeset_decide', { changeset: cs, decision: 'Approve' });
  else out(`waiting for approval: fluxctl changeset approve ${cs}`);
  let applied: Record<string, unknown> | undefined;
  for (let i = 0; i < 600 && !applied; i++) {
    const cur = JSON.parse(await tool(agent, 'changeset_get', { changeset: cs })) as { decision?: string };
    if (cur.decision === 'Reject') throw new Error(`changeset ${cs} was rejected`);
    if (cur.decision === 'Approve') {
      const ap = await startTask(agent, 'changeset_apply', { changeset: cs });
      const t = await settle(agent, ap);
      if (t.status !== 'completed') throw new Error(`apply ${t.status}: ${t.statusMessage ?? ''}`);
      applied = await result(agent, ap);
    } else await new Promise((r) => setTimeout(r, 1000));
  }
  out(`changeset ${cs}: ${String(applied?.phase)}`);

  // 3. A command the policy holds: the Task waits in input_required with the Approval.
  const held = await startTask(agent, 'session_exec', {
    session,
    command: 'deploy() { echo "deployed $1"; }; deploy prod',
  });
  const h = await settle(agent, held);
  if (h.status !== 'input_required') throw new Error(`expected input_required, got ${h.status}`);
  out(`task ${held}: input_required: ${h.statusMessage ?? ''}`);
  if (approver)
    await approver.request(
      { method: 'tasks/update', params: { taskId: held, input: { decision: 'approve', note: 'example' } } },
      TaskView,
    );
  else out(`approve it: fluxctl agent approve ${session} ${h.inputRequest?.approval ?? ''}`);
  const done = await settle(agent, held, 900_000);
  if (done.status !== 'completed') throw new Error(`held command ${done.status}: ${done.statusMessage ?? ''}`);
  const r = await result(agent, held);
  out(`held command ran once after approval: exit ${String(r.exitCode)}, stdout ${JSON.stringify(r.stdout)}`);
} finally {
  await agent.close();
  await approver?.close();
}
