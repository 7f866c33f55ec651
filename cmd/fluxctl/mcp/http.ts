// The MCP endpoint on `serve`: POST /mcp (streamable HTTP, stateless: no Mcp-Session-Id, a
// Server per request, JSON answers) and GET /llms.txt. Mounted with ApiServer.registerRawRoute
// from cmd/fluxctl/serve.ts. Authentication is the API server's own authenticator (admin token,
// user token, AgentSession token); the tools then call the API in process with the same
// Authorization header (api.ts injectCaller), so the API's authorization decides every call.
// The body is bounded before it is parsed: a Content-Length past the limit is refused unread, and
// a body that grows past it is cut.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ApiServer } from '../../../runtime/apiserver/http/server.js';
import type { Authenticator } from '../../../runtime/apiserver/http/auth.js';
import { injectCaller } from './api.js';
import type { SpanLog } from './telemetry.js';
import type { TaskStore } from './tasks.js';

export const MCP_PATH = '/mcp';
export const LLMS_PATH = '/llms.txt';
/** The largest JSON-RPC request /mcp reads: a file argument of 1.5 MB as base64 with room for the envelope. */
export const MAX_MCP_BODY_BYTES = 2_200_000;

function jsonRpcError(
  res: ServerResponse,
  http: number,
  code: number,
  message: string,
  extra: Record<string, string> = {},
) {
  const body = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code, message } });
  res.writeHead(http, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...extra });
  res.end(body);
}

/** The request body, or undefined after answering 413 (too large, not read whole). */
function readBounded(req: IncomingMessage, res: ServerResponse, limit: number): Promise<Buffer | undefined> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) {
    jsonRpcError(res, 413, -32600, `the request body is ${declared} bytes, the limit of /mcp is ${limit}`, {
      connection: 'close',
    });
    req.destroy();
    return Promise.resolve(undefined);
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let n = 0;
    req.on('data', (b: Buffer) => {
      n += b.length;
      if (n > limit) {
        jsonRpcError(res, 413, -32600, `the request body is larger than the limit of /mcp, ${limit} bytes`, {
          connection: 'close',
        });
        req.destroy();
        resolve(undefined);
        return;
      }
      chunks.push(b);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** llms.txt of this installation (the generated file at the repository root, beside package.json). */
function llmsText(): string | undefined {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    const f = path.join(dir, 'llms.txt');
    if (fs.existsSync(f) && fs.existsSync(path.join(dir, 'package.json'))) return fs.readFileSync(f, 'utf8');
    dir = path.dirname(dir);
  }
  return undefined;
}

export interface McpRouteOptions {
  authenticate?: Authenticator;
  log?: SpanLog & { error(msg: string, fields?: Record<string, unknown>): void };
  tasks?: TaskStore;
}

/**
 * The MCP server module and the SDK's transport, imported at the first /mcp request: with the SDK,
 * zod and the tools' compiled schemas they cost `serve` about 0.4 s of CPU at start-up, which every
 * server that is never asked for MCP would pay.
 */
async function loadMcp() {
  const [srv, transport] = await Promise.all([
    import('./server.js'),
    import('@modelcontextprotocol/sdk/server/streamableHttp.js'),
  ]);
  return {
    mcpServer: srv.mcpServer,
    newTaskStore: srv.newTaskStore,
    Transport: transport.StreamableHTTPServerTransport,
  };
}

export function registerMcpRoutes(server: ApiServer, o: McpRouteOptions): void {
  let mcpModules: ReturnType<typeof loadMcp> | undefined;
  let tasks: TaskStore | undefined = o.tasks;
  let llms: string | undefined;
  server.registerRawRoute(LLMS_PATH, {
    request(req, res) {
      llms ??= llmsText();
      if ((req.url ?? '').split('?')[0] !== LLMS_PATH || !llms) return jsonRpcError(res, 404, -32601, 'not found');
      res.writeHead(200, { 'content-type': 'text/markdown; charset=utf-8', 'cache-control': 'no-cache' });
      res.end(llms);
    },
  });
  server.registerRawRoute(MCP_PATH, {
    request(req, res) {
      void handle(req, res).catch((e: unknown) => {
        o.log?.error('mcp request failed', { err: String(e) });
        if (!res.headersSent) jsonRpcError(res, 500, -32603, 'internal error');
        else res.end();
      });
    },
  });

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const p = (req.url ?? '').split('?')[0];
    if (p !== MCP_PATH && p !== `${MCP_PATH}/`) return jsonRpcError(res, 404, -32601, 'not found');
    if (req.method !== 'POST')
      // Stateless (MCP 2026-07-28): no standalone GET stream, no session to DELETE.
      return jsonRpcError(res, 405, -32600, 'only POST: this server is stateless', { allow: 'POST' });
    let principal = 'system:anonymous';
    if (o.authenticate) {
      let user;
      try {
        user = await o.authenticate(req);
      } catch {
        user = undefined;
      }
      if (!user || user.name === 'system:anonymous')
        return jsonRpcError(res, 401, -32001, 'Unauthorized: a bearer token is required', {
          'www-authenticate': 'Bearer realm="fluxvm"',
        });
      principal = user.name;
    }
    const body = await readBounded(req, res, MAX_MCP_BODY_BYTES);
    if (!body) return;
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch {
      return jsonRpcError(res, 400, -32700, 'Parse error: the body is not JSON');
    }
    // A 2026-07-28 client sends its version in the header; the SDK's transport knows up to
    // 2025-11-25, whose wire shape for these methods is the same: let it through.
    if (req.headers['mcp-protocol-version'] === '2026-07-28') {
      req.headers['mcp-protocol-version'] = '2025-11-25';
      for (let i = 0; i + 1 < req.rawHeaders.length; i += 2)
        if (req.rawHeaders[i]!.toLowerCase() === 'mcp-protocol-version') req.rawHeaders[i + 1] = '2025-11-25';
    }
    const authorization = typeof req.headers.authorization === 'string' ? req.headers.authorization : undefined;
    mcpModules ??= loadMcp();
    const { mcpServer, newTaskStore, Transport } = await mcpModules;
    tasks ??= newTaskStore();
    const mcp = mcpServer({ api: injectCaller(server.app, authorization), principal, tasks, log: o.log });
    const transport = new Transport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => {
      void transport.close();
      void mcp.close();
    });
    await mcp.connect(transport);
    await transport.handleRequest(req, res, parsed);
  }
}
