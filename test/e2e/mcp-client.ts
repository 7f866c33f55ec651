// The official MCP SDK client against a real serve, over streamable HTTP (/mcp, trusting the
// state CA through a fetch that uses node's https) or over stdio (`fluxctl mcp` with a kubeconfig).
import https from 'node:https';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  GetTaskResultSchema,
  type CallToolResult,
} from '@modelcontextprotocol/sdk/types.js';

/** fetch over node's https with a CA (undici's fetch takes no CA without a dispatcher package). */
export function fetchWithCa(ca: string | undefined): (url: string | URL, init?: RequestInit) => Promise<Response> {
  return (url, init = {}) =>
    new Promise<Response>((resolve, reject) => {
      const headers: Record<string, string> = {};
      new Headers(init.headers).forEach((v, k) => (headers[k] = v));
      const req = https.request(String(url), { method: init.method ?? 'GET', headers, ca }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (b: Buffer) => chunks.push(b));
        res.on('end', () => {
          const h = new Headers();
          for (const [k, v] of Object.entries(res.headers)) if (typeof v === 'string') h.set(k, v);
          const status = res.statusCode ?? 500;
          const body = status === 204 || status === 202 || status === 304 ? null : Buffer.concat(chunks);
          resolve(new Response(body, { status, headers: h }));
        });
        res.on('error', reject);
      });
      req.on('error', reject);
      const abort = () => req.destroy(new Error('aborted'));
      init.signal?.addEventListener('abort', abort, { once: true });
      req.on('close', () => init.signal?.removeEventListener('abort', abort));
      req.end(typeof init.body === 'string' ? init.body : undefined);
    });
}

export async function httpClient(url: string, token: string, ca?: string): Promise<Client> {
  const c = new Client({ name: 'fluxvm-e2e', version: '1.0.0' });
  await c.connect(
    new StreamableHTTPClientTransport(new URL('/mcp', url), {
      fetch: fetchWithCa(ca),
      requestInit: { headers: { authorization: `Bearer ${token}` } },
    }),
  );
  return c;
}

export async function stdioClient(command: string[], kubeconfig: string, cwd: string): Promise<Client> {
  const c = new Client({ name: 'fluxvm-e2e', version: '1.0.0' });
  const t = new StdioClientTransport({
    command: command[0]!,
    args: [...command.slice(1), '--kubeconfig', kubeconfig, 'mcp'],
    cwd,
    stderr: 'pipe',
    env: { ...(process.env as Record<string, string>) },
  });
  let stderr = '';
  t.stderr?.on('data', (b: Buffer) => void (stderr = (stderr + b.toString()).slice(-4000)));
  try {
    await c.connect(t);
  } catch (e) {
    throw new Error(`fluxctl mcp did not start: ${(e as Error).message}; its stderr: ${stderr}`);
  }
  return c;
}

/** tasks/get's answer with the fields of FluxVM's Tasks extension kept (inputRequest). */
export const TaskSchema = GetTaskResultSchema.passthrough();
export type TaskAnswer = ReturnType<typeof TaskSchema.parse> & { inputRequest?: Record<string, unknown> };

/** tools/call as a Task (params.task): the created task. */
export async function callAsTask(c: Client, name: string, args: Record<string, unknown>) {
  return (
    await c.request(
      { method: 'tools/call', params: { name, arguments: args, task: { ttl: 600_000 } } },
      CreateTaskResultSchema,
    )
  ).task;
}

export async function getTask(c: Client, taskId: string): Promise<TaskAnswer> {
  return (await c.request({ method: 'tasks/get', params: { taskId } }, TaskSchema)) as TaskAnswer;
}

export async function taskResult(c: Client, taskId: string): Promise<CallToolResult> {
  return c.request({ method: 'tasks/result', params: { taskId } }, CallToolResultSchema);
}

/** Polls tasks/get (bounded) until the task reaches one of `states`. */
export async function waitTask(c: Client, taskId: string, states: string[], timeoutMs = 120_000) {
  const end = Date.now() + timeoutMs;
  let last: TaskAnswer | undefined;
  while (Date.now() < end) {
    last = await getTask(c, taskId);
    if (states.includes(last.status)) return last;
    // A fixed pause on purpose: the pace the server asks for (pollInterval), at most 500 ms.
    await new Promise((r) => setTimeout(r, Math.min(last!.pollInterval ?? 500, 500)));
  }
  throw new Error(
    `task ${taskId} did not reach ${states.join('|')} in ${timeoutMs} ms (last: ${JSON.stringify(last)})`,
  );
}

export const textOf = (r: CallToolResult) => r.content.map((x) => (x.type === 'text' ? x.text : '')).join('');
