// OpenTelemetry GenAI `execute_tool` spans for tool calls. No OpenTelemetry API is a dependency of
// this project, so the span is recorded as one log line carrying the semantic-convention
// attributes (gen_ai.operation.name, gen_ai.tool.name, gen_ai.tool.call.id, error.type) and the
// W3C trace context read from params._meta.traceparent (a new span id under the caller's trace; a
// new trace when none or a malformed one is given). A collector-side exporter can turn the line
// into a span; nothing is sent anywhere from here.
import { randomBytes } from 'node:crypto';

export interface SpanLog {
  info?(msg: string, fields?: Record<string, unknown>): void;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The trace id and parent span id of a W3C traceparent, or undefined (all-zero ids are invalid). Pure. */
export function parseTraceparent(v: unknown): { traceId: string; parentSpanId: string; flags: string } | undefined {
  if (typeof v !== 'string') return undefined;
  const m = TRACEPARENT.exec(v.trim());
  if (!m || /^0+$/.test(m[1]!) || /^0+$/.test(m[2]!)) return undefined;
  return { traceId: m[1]!, parentSpanId: m[2]!, flags: m[3]! };
}

export interface ToolSpan {
  traceId: string;
  spanId: string;
  end(errorType?: string, status?: string): void;
}

export function executeToolSpan(
  log: SpanLog | undefined,
  tool: string,
  callId: string,
  meta: Record<string, unknown> | undefined,
  principal: string,
): ToolSpan {
  const parent = parseTraceparent(meta?.traceparent);
  const traceId = parent?.traceId ?? randomBytes(16).toString('hex');
  const spanId = randomBytes(8).toString('hex');
  const start = Date.now();
  let ended = false;
  return {
    traceId,
    spanId,
    end(errorType, status) {
      if (ended) return;
      ended = true;
      log?.info?.('span execute_tool', {
        name: `execute_tool ${tool}`,
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': tool,
        'gen_ai.tool.call.id': callId,
        'gen_ai.tool.type': 'function',
        traceId,
        spanId,
        ...(parent ? { parentSpanId: parent.parentSpanId } : {}),
        startTime: new Date(start).toISOString(),
        durationMs: Date.now() - start,
        'enduser.id': principal,
        ...(errorType ? { 'error.type': errorType } : {}),
        ...(status ? { 'fluxvm.task.status': status } : {}),
      });
    },
  };
}
