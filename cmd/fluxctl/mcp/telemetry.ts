// OpenTelemetry GenAI `execute_tool` spans for MCP tool calls, through the OpenTelemetry API's global
// tracer (`@opentelemetry/api`): one INTERNAL span `execute_tool <tool>` per tools/call carrying the
// semantic-convention attributes (gen_ai.operation.name, gen_ai.tool.name, gen_ai.tool.call.id,
// mcp.method.name, jsonrpc.request.id; error.type and status ERROR when the tool fails), its parent
// the W3C trace context in params._meta (traceparent, tracestate). Without a registered
// TracerProvider the API is a no-op: nothing is recorded or sent; an operator registers one (the
// OTel SDK, e.g. through NODE_OPTIONS) to export the spans. The same span is also written as one
// log line (`span execute_tool`) for serve's logger and `fluxctl mcp -v`.
import { randomBytes } from 'node:crypto';
import {
  context,
  createTraceState,
  isSpanContextValid,
  SpanKind,
  SpanStatusCode,
  trace,
  type Context,
} from '@opentelemetry/api';
import { VERSION } from '../util.js';

export interface SpanLog {
  info?(msg: string, fields?: Record<string, unknown>): void;
}

/** The instrumentation scope of the spans (the tracer's name). */
export const TRACER_NAME = 'fluxvm-mcp';

// W3C Trace Context: version-traceid-parentid-flags; a version after 00 may carry more fields.
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The trace id and parent span id of a W3C traceparent, or undefined (all-zero ids, version ff, invalid). Pure. */
export function parseTraceparent(v: unknown): { traceId: string; parentSpanId: string; flags: string } | undefined {
  if (typeof v !== 'string' || v.length > 512) return undefined;
  const m = TRACEPARENT.exec(v.trim());
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[5] !== undefined)) return undefined;
  if (/^0+$/.test(m[2]!) || /^0+$/.test(m[3]!)) return undefined;
  return { traceId: m[2]!, parentSpanId: m[3]!, flags: m[4]! };
}

/** The context a tool call's span starts in: the caller's remote span from _meta, else the active context. */
export function parentContext(meta: Record<string, unknown> | undefined): Context {
  const p = parseTraceparent(meta?.traceparent);
  if (!p) return context.active();
  const ts = typeof meta?.tracestate === 'string' && meta.tracestate.length <= 512 ? meta.tracestate : undefined;
  return trace.setSpanContext(context.active(), {
    traceId: p.traceId,
    spanId: p.parentSpanId,
    traceFlags: parseInt(p.flags, 16) & 1,
    isRemote: true,
    ...(ts ? { traceState: createTraceState(ts) } : {}),
  });
}

export interface ToolSpan {
  traceId: string;
  spanId: string;
  /** The context with this span active: the tool runs in it, so spans it starts are children. */
  context: Context;
  /** Ends the span once: errorType set means the tool failed (error.type, status ERROR with message). */
  end(errorType?: string, o?: { message?: string; taskStatus?: string }): void;
}

export function executeToolSpan(
  log: SpanLog | undefined,
  tool: string,
  callId: string,
  meta: Record<string, unknown> | undefined,
  principal: string,
): ToolSpan {
  const parent = parseTraceparent(meta?.traceparent);
  const parentCtx = parentContext(meta);
  const attributes = {
    'gen_ai.operation.name': 'execute_tool',
    'gen_ai.tool.name': tool,
    'gen_ai.tool.type': 'function',
    'gen_ai.tool.call.id': callId,
    'mcp.method.name': 'tools/call',
    'jsonrpc.request.id': callId,
  };
  const span = trace
    .getTracer(TRACER_NAME, VERSION)
    .startSpan(`execute_tool ${tool}`, { kind: SpanKind.INTERNAL, attributes }, parentCtx);
  // With no provider the API answers a non-recording span holding the parent's ids: the log line
  // then gets ids of its own, as before there was a tracer.
  const sc = span.spanContext();
  const own = isSpanContextValid(sc) && sc.spanId !== parent?.parentSpanId;
  const traceId = own ? sc.traceId : (parent?.traceId ?? randomBytes(16).toString('hex'));
  const spanId = own ? sc.spanId : randomBytes(8).toString('hex');
  const start = Date.now();
  let ended = false;
  return {
    traceId,
    spanId,
    context: trace.setSpan(parentCtx, span),
    end(errorType, o = {}) {
      if (ended) return;
      ended = true;
      if (o.taskStatus) span.setAttribute('fluxvm.task.status', o.taskStatus);
      if (errorType) {
        span.setAttribute('error.type', errorType);
        span.setStatus({ code: SpanStatusCode.ERROR, ...(o.message ? { message: o.message.slice(0, 1024) } : {}) });
      }
      span.end();
      log?.info?.('span execute_tool', {
        name: `execute_tool ${tool}`,
        ...attributes,
        traceId,
        spanId,
        ...(parent ? { parentSpanId: parent.parentSpanId } : {}),
        startTime: new Date(start).toISOString(),
        durationMs: Date.now() - start,
        'enduser.id': principal,
        ...(errorType ? { 'error.type': errorType } : {}),
        ...(o.taskStatus ? { 'fluxvm.task.status': o.taskStatus } : {}),
      });
    },
  };
}
