// The MCP server's OpenTelemetry GenAI `execute_tool` spans: the MCP server module runs in this
// process (the official SDK client over an in-memory transport, the tools calling a real API server:
// registry over SQLite, fastify inject) with the OTel SDK's in-memory exporter registered as the
// global TracerProvider, so the spans the server starts through the API's global tracer are read
// back: name, kind INTERNAL, the GenAI attributes, the caller's trace id and parent span id from
// params._meta.traceparent, error.type and status ERROR on a tool error (inline and as a Task).
import { expect } from 'chai';
import { SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-base';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { CallToolResultSchema, CreateTaskResultSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { injectCaller } from '../../../cmd/fluxctl/mcp/api.js';
import { mcpServer, newTaskStore } from '../../../cmd/fluxctl/mcp/server.js';
import { parseTraceparent, TRACER_NAME } from '../../../cmd/fluxctl/mcp/telemetry.js';
import { startFixture, type Fixture } from '../../runtime/apiserver/http/fixture.js';
import { eventually } from '../../support/wait.js';

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT_ID = '00f067aa0ba902b7';
const TRACEPARENT = `00-${TRACE_ID}-${PARENT_ID}-01`;

describe('fluxctl mcp: OTel GenAI execute_tool spans (in process, in-memory exporter)', () => {
  let fx: Fixture;
  let client: Client;
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });

  before(async () => {
    expect(trace.setGlobalTracerProvider(provider), 'no other global TracerProvider').to.equal(true);
    fx = startFixture();
    const server = mcpServer({
      api: injectCaller(fx.server.app, undefined),
      principal: 'tester',
      tasks: newTaskStore(),
    });
    const [a, b] = InMemoryTransport.createLinkedPair();
    await server.connect(b);
    client = new Client({ name: 'otel-test', version: '1.0.0' });
    await client.connect(a);
  });
  after(async () => {
    await client?.close();
    await provider.shutdown();
    trace.disable();
    await fx?.close();
  });
  beforeEach(() => exporter.reset());

  const call = async (name: string, args: Record<string, unknown>, meta?: Record<string, unknown>) =>
    (await client.callTool(
      { name, arguments: args, ...(meta ? { _meta: meta } : {}) },
      CallToolResultSchema,
    )) as CallToolResult;
  const spans = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.name === name);
  const only = (name: string): ReadableSpan => {
    const s = spans(name);
    expect(s, `one span ${name} (exported: ${exporter.getFinishedSpans().map((x) => x.name)})`).to.have.length(1);
    return s[0]!;
  };

  it('a successful call: one INTERNAL span under the traceparent of params._meta, GenAI attributes, status unset', async () => {
    const r = await call('session_approvals', { session: 's1' }, { traceparent: TRACEPARENT, tracestate: 'vendor=x' });
    expect(r.isError, JSON.stringify(r)).to.not.equal(true);
    const s = only('execute_tool session_approvals');
    expect(s.kind).to.equal(SpanKind.INTERNAL);
    expect(s.instrumentationScope.name).to.equal(TRACER_NAME);
    expect(s.spanContext().traceId).to.equal(TRACE_ID);
    expect(s.spanContext().spanId).to.not.equal(PARENT_ID);
    expect(s.parentSpanContext?.spanId).to.equal(PARENT_ID);
    expect(s.parentSpanContext?.isRemote).to.equal(true);
    expect(s.spanContext().traceState?.get('vendor')).to.equal('x');
    expect(s.attributes).to.include({
      'gen_ai.operation.name': 'execute_tool',
      'gen_ai.tool.name': 'session_approvals',
      'mcp.method.name': 'tools/call',
    });
    expect(s.attributes['gen_ai.tool.call.id']).to.be.a('string').and.not.equal('');
    expect(s.attributes).to.not.have.property('error.type');
    expect(s.status.code).to.equal(SpanStatusCode.UNSET);
  });

  it('a failing tool: error.type is the API Status reason, status ERROR, same parent', async () => {
    const r = await call('session_get', { session: 'nope' }, { traceparent: TRACEPARENT });
    expect(r.isError).to.equal(true);
    const s = only('execute_tool session_get');
    expect(s.spanContext().traceId).to.equal(TRACE_ID);
    expect(s.parentSpanContext?.spanId).to.equal(PARENT_ID);
    expect(s.attributes['error.type']).to.equal('NotFound');
    expect(s.status.code).to.equal(SpanStatusCode.ERROR);
    expect(s.status.message).to.match(/^404 NotFound/);
  });

  it('a bad argument: error.type invalid_argument, status ERROR', async () => {
    const r = await call('session_get', {}, { traceparent: TRACEPARENT });
    expect(r.isError).to.equal(true);
    const s = only('execute_tool session_get');
    expect(s.attributes['error.type']).to.equal('invalid_argument');
    expect(s.status).to.deep.include({ code: SpanStatusCode.ERROR });
    expect(s.status.message).to.match(/invalid argument session/);
  });

  it('a Task: the span ends when the task does (ERROR when it fails), under the traceparent', async () => {
    const { task } = await client.request(
      {
        method: 'tools/call',
        params: {
          name: 'session_checkpoint',
          arguments: { session: 'nope' },
          task: { ttl: 60_000 },
          _meta: { traceparent: TRACEPARENT },
        },
      },
      CreateTaskResultSchema,
    );
    expect(task.taskId).to.be.a('string');
    const s = await eventually(() => spans('execute_tool session_checkpoint')[0], 10_000, 'the task span to end');
    expect(s.spanContext().traceId).to.equal(TRACE_ID);
    expect(s.parentSpanContext?.spanId).to.equal(PARENT_ID);
    expect(s.status.code).to.equal(SpanStatusCode.ERROR);
    expect(s.attributes['fluxvm.task.status']).to.equal('failed');
    expect(s.attributes['error.type']).to.be.a('string');
  });

  it('no or a malformed traceparent: a root span of a new trace', async () => {
    await call('session_approvals', { session: 's1' });
    await call('session_approvals', { session: 's1' }, { traceparent: `00-${'0'.repeat(32)}-${PARENT_ID}-01` });
    const s = spans('execute_tool session_approvals');
    expect(s).to.have.length(2);
    for (const x of s) {
      expect(x.parentSpanContext).to.equal(undefined);
      expect(x.spanContext().traceId).to.not.equal(TRACE_ID);
    }
  });

  it('parses W3C traceparent (version 00 exact, later versions extendable, ff and zero ids refused)', () => {
    expect(parseTraceparent(TRACEPARENT)).to.deep.equal({ traceId: TRACE_ID, parentSpanId: PARENT_ID, flags: '01' });
    expect(parseTraceparent(`01-${TRACE_ID}-${PARENT_ID}-01-extra`)?.traceId).to.equal(TRACE_ID);
    expect(parseTraceparent(`00-${TRACE_ID}-${PARENT_ID}-01-extra`)).to.equal(undefined);
    expect(parseTraceparent(`ff-${TRACE_ID}-${PARENT_ID}-01`)).to.equal(undefined);
    expect(parseTraceparent(`00-${TRACE_ID}-${'0'.repeat(16)}-01`)).to.equal(undefined);
    expect(parseTraceparent(`00-${TRACE_ID.toUpperCase()}-${PARENT_ID}-01`)).to.equal(undefined);
    expect(parseTraceparent(42)).to.equal(undefined);
  });
});
