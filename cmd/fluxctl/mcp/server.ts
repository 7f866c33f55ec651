// The MCP server of FluxVM on the official SDK's low-level Server: tools/list and
// tools/call (arguments checked against each tool's JSON schema: a bad one is a tool error naming
// the field), tasks/get|result|list|cancel, resources (sessions, changesets, a session's ledger),
// and the two methods of MCP 2026-07-28 the SDK (1.32.2, protocol 2025-11-25) does not have:
// `server/discover` (the stateless shape: no initialize needed) and `tasks/update` (the answer to
// an input_required task), served through the SDK's fallback request handler.
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { context } from '@opentelemetry/api';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema,
  CancelTaskRequestSchema,
  ErrorCode,
  GetTaskPayloadRequestSchema,
  GetTaskRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListResourcesRequestSchema,
  ListTasksRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  type CallToolResult,
  type JSONRPCRequest,
} from '@modelcontextprotocol/sdk/types.js';
import { VERSION } from '../util.js';
import type { ApiCaller } from './api.js';
import { readResource, RESOURCES, RESOURCE_TEMPLATES } from './resources.js';
import { TaskError, TaskStore } from './tasks.js';
import { executeToolSpan, type SpanLog, type ToolSpan } from './telemetry.js';
import { resultText, type Outcome, type ToolDef } from './tool.js';
import { changesetTools } from './tools-changeset.js';
import { sessionTools } from './tools-session.js';
import { rewindTools } from './tools-rewind.js';

/** Every tool, in the order tools/list answers (llms.txt lists the same). */
export const TOOLS: ToolDef[] = [...sessionTools, ...rewindTools, ...changesetTools];

export const PROTOCOL_VERSIONS = ['2026-07-28', '2025-11-25'];

export const CAPABILITIES = {
  tools: { listChanged: false },
  resources: {},
  tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } },
};

const INSTRUCTIONS =
  'FluxVM sandboxes for agents. Speculate before a risky change (sandbox_speculate, then changeset_diff), ' +
  'ask for approval rather than working around a held command, never print secrets. Long work runs as a Task ' +
  '(pass params.task on tools/call); a held command is input_required until an approver answers with tasks/update.';

const ajv = new Ajv({ allErrors: false, strict: false });
const validators = new Map<string, ValidateFunction>(TOOLS.map((t) => [t.name, ajv.compile(t.input)]));

/** The field an ajv error is about, as a dotted path (`command`, `env.HOME`, `paths[2]`). */
export function fieldOf(e: ErrorObject): string {
  const base = e.instancePath
    .split('/')
    .slice(1)
    .map((p) => (/^\d+$/.test(p) ? `[${p}]` : `.${p}`))
    .join('')
    .replace(/^\./, '');
  const extra =
    e.keyword === 'required'
      ? (e.params as { missingProperty: string }).missingProperty
      : e.keyword === 'additionalProperties'
        ? (e.params as { additionalProperty: string }).additionalProperty
        : '';
  return [base, extra].filter(Boolean).join('.') || '(arguments)';
}

export function toolResult(o: Outcome): CallToolResult {
  if (o.kind === 'ok') return { content: [{ type: 'text', text: resultText(o.value) }] };
  if (o.kind === 'error')
    return {
      isError: true,
      content: [{ type: 'text', text: resultText(o.message) }],
      ...(o.status ? { structuredContent: { status: o.status } } : {}),
    };
  return {
    isError: true,
    content: [
      {
        type: 'text',
        text: resultText(
          `held for approval: Approval ${o.held.approval} (${o.held.commandLine}). An approver decides it (session_approve); then call again with a task to wait, or retry after the decision.`,
        ),
      },
    ],
    structuredContent: { approval: o.held.approval, session: o.held.session, namespace: o.held.namespace },
  };
}

/**
 * Ends a tool call's span from its outcome: a tool error is error.type = the API Status's reason
 * (`NotFound`, `Forbidden`, ...; `tool_error` without one) with status ERROR; a held command is
 * not an error (the task waits for an approval).
 */
function endSpan(span: ToolSpan, o: Outcome, taskStatus?: string): void {
  if (o.kind !== 'error') return span.end(undefined, { taskStatus });
  const reason = o.status?.reason;
  span.end(typeof reason === 'string' && /^[A-Za-z][A-Za-z0-9_.]{0,63}$/.test(reason) ? reason : 'tool_error', {
    message: o.message,
    taskStatus: taskStatus === 'completed' ? 'failed' : taskStatus,
  });
}

export interface McpContext {
  /** The API with this request's (or this process's) credential. */
  api: ApiCaller;
  /** Who is asking: the owner of the tasks it starts. */
  principal: string;
  tasks: TaskStore;
  log?: SpanLog;
}

/** The process-wide task store (one per serve or per fluxctl mcp). */
export function newTaskStore(): TaskStore {
  return new TaskStore(toolResult);
}

function taskErr(e: unknown): never {
  if (e instanceof TaskError) throw new McpError(ErrorCode.InvalidParams, e.message, e.data);
  throw e;
}

/** One Server for a context: per request over HTTP (stateless), one for the process over stdio. */
export function mcpServer(c: McpContext): Server {
  const server = new Server(
    { name: 'fluxvm', version: VERSION, title: 'FluxVM' },
    { capabilities: CAPABILITIES, instructions: INSTRUCTIONS },
  );
  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: TOOLS.map((t) => ({
      name: t.name,
      title: t.title,
      description: t.description,
      inputSchema: t.input as { type: 'object' },
      annotations: { title: t.title, ...t.annotations },
      execution: { taskSupport: t.task },
    })),
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
    const tool = TOOLS.find((t) => t.name === req.params.name);
    if (!tool) throw new McpError(ErrorCode.InvalidParams, `unknown tool ${JSON.stringify(req.params.name)}`);
    const args = (req.params.arguments ?? {}) as Record<string, unknown>;
    const span = executeToolSpan(c.log, tool.name, String(extra.requestId), req.params._meta, c.principal);
    const validate = validators.get(tool.name)!;
    if (!validate(args)) {
      const e = validate.errors![0]!;
      const message = `invalid argument ${fieldOf(e)}: ${e.message ?? 'invalid'}`;
      span.end('invalid_argument', { message });
      return toolResult({ kind: 'error', message });
    }
    const taskParams = (req.params as { task?: { ttl?: number } }).task;
    if (taskParams && tool.task !== 'forbidden') {
      try {
        const task = c.tasks.start(c.principal, taskParams.ttl, async (signal, progress) => {
          try {
            const o = await context.with(span.context, () => tool.run({ api: c.api, signal, progress }, args));
            endSpan(span, o, o.kind === 'held' ? 'input_required' : 'completed');
            return o;
          } catch (e) {
            span.end('internal_error', { message: String((e as Error)?.message ?? e), taskStatus: 'failed' });
            throw e;
          }
        });
        return { task };
      } catch (e) {
        span.end('tool_error', { message: String((e as Error)?.message ?? e) });
        if (e instanceof TaskError) return toolResult({ kind: 'error', message: e.message });
        throw e;
      }
    }
    try {
      const o = await context.with(span.context, () =>
        tool.run({ api: c.api, signal: extra.signal, progress: () => {} }, args),
      );
      endSpan(span, o);
      return toolResult(o);
    } catch (e) {
      span.end('internal_error', { message: String((e as Error)?.message ?? e) });
      return toolResult({ kind: 'error', message: `the tool failed: ${String((e as Error)?.message ?? e)}` });
    }
  });
  server.setRequestHandler(GetTaskRequestSchema, (req) => {
    try {
      return c.tasks.get(c.principal, req.params.taskId);
    } catch (e) {
      return taskErr(e);
    }
  });
  server.setRequestHandler(GetTaskPayloadRequestSchema, (req) =>
    c.tasks.result(c.principal, req.params.taskId).catch(taskErr),
  );
  server.setRequestHandler(ListTasksRequestSchema, () => ({ tasks: c.tasks.list(c.principal) }));
  server.setRequestHandler(CancelTaskRequestSchema, (req) => {
    try {
      return c.tasks.cancel(c.principal, req.params.taskId);
    } catch (e) {
      return taskErr(e);
    }
  });
  server.setRequestHandler(ListResourcesRequestSchema, () => ({ resources: RESOURCES }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, () => ({ resourceTemplates: RESOURCE_TEMPLATES }));
  server.setRequestHandler(ReadResourceRequestSchema, (req) => readResource(c.api, req.params.uri));
  server.fallbackRequestHandler = async (req: JSONRPCRequest) => {
    if (req.method === 'server/discover')
      return {
        supportedVersions: PROTOCOL_VERSIONS,
        capabilities: CAPABILITIES,
        serverInfo: { name: 'fluxvm', version: VERSION, title: 'FluxVM' },
        instructions: INSTRUCTIONS,
      };
    if (req.method === 'tasks/update') {
      const p = (req.params ?? {}) as { taskId?: unknown; input?: { decision?: unknown; note?: unknown } };
      if (typeof p.taskId !== 'string')
        throw new McpError(ErrorCode.InvalidParams, 'invalid argument taskId: a string');
      if (!p.input || typeof p.input !== 'object')
        throw new McpError(ErrorCode.InvalidParams, 'invalid argument input: {decision: "approve"|"deny", note?}');
      return c.tasks.update(p.taskId, p.input, { api: c.api }).catch(taskErr);
    }
    throw new McpError(ErrorCode.MethodNotFound, `Method not found: ${req.method}`);
  };
  return server;
}
