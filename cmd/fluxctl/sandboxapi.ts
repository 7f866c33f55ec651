// The HTTP plumbing of the sandbox verbs (sandbox.ts, cp.ts, sandboxdiff.ts): the connection
// from the kubeconfig, the subresource paths, one buffered request with the kubeconfig's
// credentials. Errors are StatusErrors (util.formatError prints them as kubectl does).
import http from 'node:http';
import https from 'node:https';
import { statusErrorFrom, type ClientNodeClient } from '../../runtime/client/clientnode.js';
import type { GVR } from '../../runtime/meta/types.js';
import { makeClient, namespaceOf, type GlobalOptions } from './util.js';

export const SANDBOXES: GVR = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' };

export function subPath(ns: string, name: string, sub: string): string {
  return `/apis/${SANDBOXES.group}/${SANDBOXES.version}/namespaces/${encodeURIComponent(ns)}/sandboxes/${encodeURIComponent(name)}/${sub}`;
}

export interface Conn {
  client: ClientNodeClient;
  ns: string;
}

export function connect(g: GlobalOptions): Conn {
  const client = makeClient(g);
  return { client, ns: namespaceOf(g, client) };
}

/** One request with the kubeconfig's credentials; raw bytes back; throws a StatusError on non-2xx. */
export async function call(c: Conn, method: string, path: string, query: Record<string, string | undefined>, body?: Buffer | object): Promise<Buffer> {
  const url = new URL(c.client.server() + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, v);
  const opts: https.RequestOptions = { method, headers: {} };
  await c.client.kc.applyToHTTPSOptions(opts);
  const payload = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
  opts.headers = {
    ...(opts.headers as Record<string, string>),
    'User-Agent': 'fluxctl',
    Accept: 'application/json, */*',
    ...(payload ? { 'Content-Type': Buffer.isBuffer(body) ? 'application/octet-stream' : 'application/json', 'Content-Length': String(payload.length) } : {}),
  };
  const mod = url.protocol === 'https:' ? https : http;
  const { status, data } = await new Promise<{ status: number; data: Buffer }>((resolve, reject) => {
    const r = mod.request(url, opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (b: Buffer) => chunks.push(b));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, data: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    r.on('error', (e) => reject(statusErrorFrom(503, JSON.stringify({ kind: 'Status', code: 503, reason: 'ServiceUnavailable', message: `unable to connect to the server: ${e.message}` }))));
    r.end(payload);
  });
  if (status < 200 || status >= 300) throw statusErrorFrom(status, data.toString('utf8'));
  return data;
}

export async function callJson<T = any>(c: Conn, method: string, path: string, query: Record<string, string | undefined>, body?: object): Promise<T> {
  return JSON.parse((await call(c, method, path, query, body)).toString('utf8')) as T;
}
