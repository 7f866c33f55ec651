// The shape of an MCP tool of FluxVM and what the tools share: the API paths, the outcome of a
// REST answer (a metav1.Status becomes a tool error carrying it), bounded and escaped output.
// A tool is a thin client of the API (api.ts): it never holds a rule the API server does not.
import { escapeTerminal } from '../escape.js';
import { jsonOf, type ApiAnswer, type ApiCaller } from './api.js';

export type JsonSchema = Record<string, unknown>;

/** A command held by policy.process.ask: the Approval the 428 named and how to run it once approved. */
export interface Held {
  approval: string;
  namespace: string;
  session: string;
  commandLine: string;
  rule?: string;
  expiresAt?: string;
  message: string;
  /**
   * Runs the held request again with the Approval (approvalName), as fluxctl agent exec --approval
   * does, holding it open up to waitSeconds for the decision (approvalWaitSeconds: the API watches
   * the Approval; no polling). Still undecided: a `held` outcome again.
   */
  retry(approvalName: string, waitSeconds: number): Promise<Outcome>;
}

export type Outcome =
  | { kind: 'ok'; value: unknown }
  | { kind: 'error'; message: string; status?: Record<string, unknown> }
  | { kind: 'held'; held: Held };

export interface ToolContext {
  api: ApiCaller;
  /** Aborted when the caller goes away (inline calls) or the task is cancelled. */
  signal: AbortSignal;
  /** Long work reports progress here when it runs as a Task. */
  progress(message: string): void;
}

export interface ToolDef {
  name: string;
  title: string;
  description: string;
  input: JsonSchema;
  annotations: { readOnlyHint: boolean; destructiveHint: boolean; idempotentHint: boolean; openWorldHint: boolean };
  /** optional: a Task when the client asks for one (params.task); forbidden: always inline. */
  task: 'optional' | 'forbidden';
  /** What a person reads in llms.txt: the REST route(s) the tool calls. */
  route: string;
  run(ctx: ToolContext, args: Record<string, unknown>): Promise<Outcome>;
}

export const GROUP_PATH = '/apis/fluxvm.dev/v1alpha1';

export const nsOf = (ctx: ToolContext, args: Record<string, unknown>) =>
  typeof args.namespace === 'string' ? args.namespace : ctx.api.namespace;

export function resourcePath(ns: string, plural: string, name?: string, sub?: string): string {
  const base = `${GROUP_PATH}/namespaces/${encodeURIComponent(ns)}/${plural}`;
  if (name === undefined) return base;
  return `${base}/${encodeURIComponent(name)}${sub ? `/${sub}` : ''}`;
}

/** A 2xx answer's JSON as the tool's value; anything else a tool error carrying the Status. */
export function outcomeOf(a: ApiAnswer, shape: (v: Record<string, unknown>) => unknown = (v) => v): Outcome {
  const j = jsonOf(a);
  if (a.status >= 200 && a.status < 300) return { kind: 'ok', value: j ? shape(j) : a.body.toString('utf8') };
  return statusError(a.status, j);
}

export function statusError(code: number, j: Record<string, unknown> | undefined): Outcome {
  const message = typeof j?.message === 'string' ? j.message : `the API answered ${code}`;
  return { kind: 'error', message: `${code} ${typeof j?.reason === 'string' ? j.reason : ''}: ${message}`, status: j };
}

export const OUTPUT_CAP = 64 * 1024;
export const RESULT_CAP = 256 * 1024;

/** Sandbox output for a reader: cut at `cap` characters with a marker, control characters made visible (escape.ts). */
export function terminalText(s: string, cap = OUTPUT_CAP): string {
  if (s.length <= cap) return escapeTerminal(s);
  return `${escapeTerminal(s.slice(0, cap))}\n[... ${s.length - cap} more characters cut by the MCP server]`;
}

// C1 controls, DEL and the bidi/separator characters JSON.stringify leaves raw: written as \u escapes.
const JSON_UNSAFE = /[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** A value as the tool's text: JSON with every invisible or reordering character escaped, bounded. */
export function resultText(v: unknown): string {
  const s = (typeof v === 'string' ? escapeTerminal(v) : JSON.stringify(v, null, 1)).replace(
    JSON_UNSAFE,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
  if (s.length <= RESULT_CAP) return s;
  return `${s.slice(0, RESULT_CAP)}\n[... ${s.length - RESULT_CAP} more characters cut by the MCP server; narrow the request]`;
}

/** Common argument schemas. */
export const S = {
  namespace: { type: 'string', minLength: 1, maxLength: 63, description: 'namespace (default: the caller’s)' },
  session: { type: 'string', minLength: 1, maxLength: 253, description: 'the AgentSession name' },
  path: {
    type: 'string',
    minLength: 1,
    maxLength: 4096,
    pattern: '^/',
    description: 'an absolute path in the sandbox',
  },
  command: {
    description: 'a shell line (run with sh -c) or an argv list',
    oneOf: [
      { type: 'string', minLength: 1, maxLength: 65536 },
      { type: 'array', minItems: 1, maxItems: 4096, items: { type: 'string', maxLength: 65536 } },
    ],
  },
  timeoutSeconds: { type: 'integer', minimum: 1, maximum: 3600, description: 'timeout in seconds' },
} as const;

export function obj(properties: Record<string, unknown>, required: string[] = []): JsonSchema {
  return { type: 'object', properties, required, additionalProperties: false };
}

export const READ = { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false };
export const WRITE = { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false };
export const IDEMPOTENT_WRITE = { ...WRITE, idempotentHint: true };
export const DESTRUCTIVE = { readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false };

/** A bounded poll for long work (speculation, apply): at most `timeoutMs`, stopping when the signal aborts. */
export async function pollUntil<T>(
  signal: AbortSignal,
  timeoutMs: number,
  step: () => Promise<T | undefined>,
): Promise<T | undefined> {
  const end = Date.now() + timeoutMs;
  let wait = 100;
  while (!signal.aborted && Date.now() < end) {
    const v = await step();
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, 1000);
  }
  return undefined;
}
