// How the MCP tools reach the API: the same REST routes and subresources fluxctl calls, with the
// caller's own credential, so the API server's authentication and authorization (admin token,
// user token and RBAC, AgentSession token scope) decide every tool call; the MCP layer has no
// rules of its own. Two callers: `injectCaller` (the /mcp route on serve: fastify's inject, in
// process, the request's Authorization header passed on) and `kubeconfigCaller` (`fluxctl mcp`
// over stdio: HTTPS with the kubeconfig's credentials, as every verb).
import type { FastifyInstance } from 'fastify';
import http from 'node:http';
import https from 'node:https';
import { makeClient, namespaceOf, type GlobalOptions } from '../util.js';

export interface ApiAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

export interface ApiCall {
  query?: Record<string, string | undefined>;
  /** An object is sent as JSON, a Buffer as application/octet-stream. */
  body?: object | Buffer;
  contentType?: string;
  headers?: Record<string, string>;
}

export interface ApiCaller {
  /** The namespace a tool works in when its arguments name none. */
  namespace: string;
  call(method: string, path: string, c?: ApiCall): Promise<ApiAnswer>;
}

/** At most this much of an answer is read; more is a 502 naming the limit (a tool never holds an unbounded body). */
export const MAX_ANSWER_BYTES = 8 * 1024 * 1024;

function encode(c: ApiCall): { payload?: Buffer; type?: string } {
  if (c.body === undefined) return {};
  if (Buffer.isBuffer(c.body)) return { payload: c.body, type: c.contentType ?? 'application/octet-stream' };
  return { payload: Buffer.from(JSON.stringify(c.body)), type: c.contentType ?? 'application/json' };
}

function url(path: string, query: ApiCall['query']): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) q.append(k, v);
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** In process: the request goes through fastify's hooks (authenticate, authorize, audit) like one from the network. */
export function injectCaller(
  app: FastifyInstance,
  authorization: string | undefined,
  namespace = 'default',
): ApiCaller {
  return {
    namespace,
    async call(method, path, c = {}) {
      const { payload, type } = encode(c);
      const r = await app.inject({
        method: method as 'GET',
        url: url(path, c.query),
        headers: {
          accept: 'application/json, */*',
          'user-agent': 'fluxvm-mcp',
          ...(authorization ? { authorization } : {}),
          ...(type ? { 'content-type': type } : {}),
          ...c.headers,
        },
        ...(payload ? { payload } : {}),
      });
      const body = r.rawPayload;
      if (body.length > MAX_ANSWER_BYTES) return tooLarge();
      return { status: r.statusCode, headers: r.headers as ApiAnswer['headers'], body };
    },
  };
}

function tooLarge(): ApiAnswer {
  const status = {
    kind: 'Status',
    apiVersion: 'v1',
    status: 'Failure',
    code: 502,
    reason: 'BadGateway',
    message: `the answer is larger than the MCP tools read (${MAX_ANSWER_BYTES} bytes)`,
  };
  return { status: 502, headers: {}, body: Buffer.from(JSON.stringify(status)) };
}

/** Over the network with the kubeconfig's server and credentials (fluxctl mcp). */
export function kubeconfigCaller(g: GlobalOptions): ApiCaller {
  const client = makeClient(g);
  return {
    namespace: namespaceOf(g, client),
    async call(method, path, c = {}) {
      const { payload, type } = encode(c);
      const u = new URL(client.server() + url(path, c.query));
      const opts: https.RequestOptions = { method, headers: {} };
      await client.kc.applyToHTTPSOptions(opts);
      opts.headers = {
        ...(opts.headers as Record<string, string>),
        'User-Agent': 'fluxctl-mcp',
        Accept: 'application/json, */*',
        ...(type ? { 'Content-Type': type, 'Content-Length': String(payload!.length) } : {}),
        ...c.headers,
      };
      return new Promise<ApiAnswer>((resolve, reject) => {
        const req = (u.protocol === 'https:' ? https : http).request(u, opts, (res) => {
          const chunks: Buffer[] = [];
          let n = 0;
          res.on('data', (b: Buffer) => {
            n += b.length;
            if (n > MAX_ANSWER_BYTES) {
              res.destroy();
              resolve(tooLarge());
              return;
            }
            chunks.push(b);
          });
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
          );
          res.on('error', reject);
        });
        req.on('error', (e) => reject(new Error(`unable to connect to the server: ${e.message}`)));
        req.end(payload);
      });
    },
  };
}

/** The JSON of an answer (a Status for errors), or undefined when the body is not JSON. */
export function jsonOf(a: ApiAnswer): Record<string, unknown> | undefined {
  try {
    const v: unknown = JSON.parse(a.body.toString('utf8'));
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}
