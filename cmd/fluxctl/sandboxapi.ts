// The HTTP plumbing of the sandbox verbs (sandbox.ts, cp.ts, sandboxdiff.ts): the connection
// from the kubeconfig, the subresource paths, one buffered request with the kubeconfig's
// credentials. Errors are StatusErrors (util.formatError prints them as kubectl does).
import http from 'node:http';
import https from 'node:https';
import { statusErrorFrom, type ClientNodeClient } from '../../runtime/client/clientnode.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import { makeClient, namespaceOf, type GlobalOptions } from './util.js';
import { sandbox } from '../../apis/sandbox.js';

export const SANDBOXES: GVR = gvrOf(sandbox);

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

/** The 503 Status a request that could not reach the server throws (formatError names the server). */
export function unreachable(e: Error) {
  return statusErrorFrom(
    503,
    JSON.stringify({
      kind: 'Status',
      code: 503,
      reason: 'ServiceUnavailable',
      message: `unable to connect to the server: ${e.message}`,
    }),
  );
}

/** A request to `path` with the kubeconfig's credentials (not sent yet); `headers` added. */
export async function prepare(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined>,
  headers: Record<string, string>,
): Promise<http.ClientRequest> {
  const url = new URL(c.client.server() + path);
  for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, v);
  const opts: https.RequestOptions = { method, headers: {} };
  await c.client.kc.applyToHTTPSOptions(opts);
  opts.headers = { ...(opts.headers as Record<string, string>), 'User-Agent': 'fluxctl', ...headers };
  return (url.protocol === 'https:' ? https : http).request(url, opts);
}

/** The body of a non-2xx answer as the StatusError it carries. */
export async function statusOf(res: http.IncomingMessage): Promise<Error> {
  const chunks: Buffer[] = [];
  for await (const b of res) chunks.push(b as Buffer);
  return statusErrorFrom(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'));
}

/** One request with the kubeconfig's credentials; raw bytes back; throws a StatusError on non-2xx. */
export async function call(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined>,
  body?: Buffer | object,
): Promise<Buffer> {
  const payload = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
  const r = await prepare(c, method, path, query, {
    Accept: 'application/json, */*',
    ...(payload
      ? {
          'Content-Type': Buffer.isBuffer(body) ? 'application/octet-stream' : 'application/json',
          'Content-Length': String(payload.length),
        }
      : {}),
  });
  const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
    r.on('response', resolve);
    r.on('error', (e) => reject(unreachable(e)));
    r.end(payload);
  });
  const status = res.statusCode ?? 0;
  if (status < 200 || status >= 300) throw await statusOf(res);
  const chunks: Buffer[] = [];
  for await (const b of res) chunks.push(b as Buffer);
  return Buffer.concat(chunks);
}

/** sandboxes/NAME/files's stat of one entry (and of each entry of a directory listing). */
export interface FileStat {
  name: string;
  path: string;
  type: string;
  mode: number;
  size: number;
  mtime: string | number;
  linkTarget?: string;
}

/** The JSON answer of a subresource, as the caller names it (T: what the subresource returns). */
export async function callJson<T>(
  c: Conn,
  method: string,
  path: string,
  query: Record<string, string | undefined>,
  body?: object,
): Promise<T> {
  return JSON.parse((await call(c, method, path, query, body)).toString('utf8')) as T;
}
