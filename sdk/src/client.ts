// The connection of @fluxvm/sdk: one keep-alive HTTPS agent (node:https, no other HTTP
// library), the credentials of a kubeconfig or of {server, token, ca}, and the calls every
// resource class uses: buffered (send/call/json), streamed (open), and Kubernetes watches.
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { StringDecoder } from 'node:string_decoder';
import yaml from 'js-yaml';
import { abortError, errorOf, statusOf } from './errors.js';

export const GROUP = 'fluxvm.dev';
export const VERSION = 'v1alpha1';

export interface ClientOptions {
  /** https://host:port of the API server (http:// for a plain-HTTP serve). */
  server: string;
  /** Bearer token: the admin token, a user token or a session token (fxst_...). */
  token?: string;
  /** PEM of the CA that signed the server's certificate. */
  ca?: string | Buffer;
  /** Client certificate and key (PEM). */
  cert?: string | Buffer;
  key?: string | Buffer;
  insecureSkipTLSVerify?: boolean;
  /** The namespace calls use when they name none (default "default"). */
  namespace?: string;
  /** Sockets kept per host (default 16). */
  maxSockets?: number;
}

export type Query = Record<string, string | number | boolean | string[] | undefined>;

export interface CallOptions {
  query?: Query;
  /** Sent as JSON. */
  body?: unknown;
  /** Sent as is (with `contentType`). */
  raw?: Buffer | string;
  contentType?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

export interface WatchEvent<T> {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: T;
}

interface KubeConfig {
  'current-context'?: string;
  contexts?: { name?: string; context?: { cluster?: string; user?: string; namespace?: string } }[];
  clusters?: {
    name?: string;
    cluster?: {
      server?: string;
      'certificate-authority-data'?: string;
      'certificate-authority'?: string;
      'insecure-skip-tls-verify'?: boolean;
    };
  }[];
  users?: {
    name?: string;
    user?: {
      token?: string;
      tokenFile?: string;
      'client-certificate-data'?: string;
      'client-key-data'?: string;
      'client-certificate'?: string;
      'client-key'?: string;
    };
  }[];
}

const fromB64 = (s: string | undefined) => (s ? Buffer.from(s, 'base64') : undefined);

/** A connection to a FluxVM API server. */
export class FluxClient {
  readonly server: string;
  readonly namespace: string;
  /** The keep-alive agent every call goes through (close() destroys its sockets). */
  readonly agent: http.Agent;
  private readonly token?: string;
  private readonly mod: typeof https | typeof http;

  constructor(o: ClientOptions) {
    const u = new URL(o.server);
    if (u.protocol !== 'https:' && u.protocol !== 'http:')
      throw new Error(`server must be https:// or http://, got ${o.server}`);
    this.server = o.server.replace(/\/+$/, '');
    this.namespace = o.namespace ?? 'default';
    this.token = o.token;
    this.mod = u.protocol === 'https:' ? https : http;
    const keep = { keepAlive: true, maxSockets: o.maxSockets ?? 16, maxFreeSockets: o.maxSockets ?? 16 };
    this.agent =
      u.protocol === 'https:'
        ? new https.Agent({
            ...keep,
            ...(o.ca ? { ca: o.ca } : {}),
            ...(o.cert ? { cert: o.cert } : {}),
            ...(o.key ? { key: o.key } : {}),
            rejectUnauthorized: !o.insecureSkipTLSVerify,
          })
        : new http.Agent(keep);
  }

  /**
   * A client from a kubeconfig file (default $KUBECONFIG's first file, else ~/.kube/config):
   * its current context (or `context`), the cluster's server and CA, the user's token or client
   * certificate, the context's namespace.
   */
  static fromKubeconfig(file?: string, o: { context?: string; namespace?: string } = {}): FluxClient {
    const f = file ?? process.env.KUBECONFIG?.split(path.delimiter)[0] ?? path.join(os.homedir(), '.kube', 'config');
    const kc = yaml.load(fs.readFileSync(f, 'utf8')) as KubeConfig;
    const ctxName = o.context ?? kc['current-context'];
    const ctx = kc.contexts?.find((c) => c.name === ctxName)?.context;
    if (!ctx) throw new Error(`kubeconfig ${f}: no context ${JSON.stringify(ctxName)}`);
    const cluster = kc.clusters?.find((c) => c.name === ctx.cluster)?.cluster;
    if (!cluster?.server) throw new Error(`kubeconfig ${f}: the cluster ${JSON.stringify(ctx.cluster)} has no server`);
    const user = kc.users?.find((u) => u.name === ctx.user)?.user ?? {};
    const rel = (p: string) => path.resolve(path.dirname(f), p);
    const read = (p?: string) => (p ? fs.readFileSync(rel(p)) : undefined);
    return new FluxClient({
      server: cluster.server,
      token: user.token ?? (user.tokenFile ? fs.readFileSync(rel(user.tokenFile), 'utf8').trim() : undefined),
      ca: fromB64(cluster['certificate-authority-data']) ?? read(cluster['certificate-authority']),
      cert: fromB64(user['client-certificate-data']) ?? read(user['client-certificate']),
      key: fromB64(user['client-key-data']) ?? read(user['client-key']),
      insecureSkipTLSVerify: cluster['insecure-skip-tls-verify'] === true,
      namespace: o.namespace ?? ctx.namespace,
    });
  }

  /** The path of a fluxvm.dev resource: the collection, one object, or its subresource. */
  path(plural: string, namespace: string, name?: string, sub?: string): string {
    let p = `/apis/${GROUP}/${VERSION}/namespaces/${encodeURIComponent(namespace)}/${plural}`;
    if (name !== undefined) p += `/${encodeURIComponent(name)}`;
    if (sub) p += `/${sub}`;
    return p;
  }

  /** Opens a request and resolves with the response (any status), its body not read yet. */
  open(method: string, p: string, o: CallOptions = {}): Promise<http.IncomingMessage> {
    const url = new URL(this.server + p);
    for (const [k, v] of Object.entries(o.query ?? {})) {
      if (v === undefined) continue;
      for (const x of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(x));
    }
    const headers: Record<string, string> = { Accept: 'application/json', ...(o.headers ?? {}) };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let payload: Buffer | undefined;
    if (o.raw !== undefined) {
      payload = Buffer.from(o.raw);
      headers['Content-Type'] = o.contentType ?? 'application/octet-stream';
    } else if (o.body !== undefined) {
      payload = Buffer.from(JSON.stringify(o.body));
      headers['Content-Type'] = o.contentType ?? 'application/json';
    }
    if (payload) headers['Content-Length'] = String(payload.length);
    const signal = o.signal;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    return new Promise((resolve, reject) => {
      const req = this.mod.request(url, { method, headers, agent: this.agent, ...(signal ? { signal } : {}) }, resolve);
      req.on('error', (e) => reject(signal?.aborted ? abortError(signal) : e));
      req.end(payload);
    });
  }

  /** A buffered call; never rejects on a status code. */
  async send(method: string, p: string, o: CallOptions = {}): Promise<Answer> {
    const res = await this.open(method, p, o);
    try {
      const chunks: Buffer[] = [];
      for await (const c of res) chunks.push(c as Buffer);
      return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) };
    } catch (e) {
      throw o.signal?.aborted ? abortError(o.signal) : e;
    }
  }

  /** A buffered call; a status outside 2xx rejects with its typed error (errors.ts). */
  async call(method: string, p: string, o: CallOptions = {}): Promise<Answer> {
    const a = await this.send(method, p, o);
    if (a.status < 200 || a.status >= 300) throw errorOf(statusOf(a.status, a.body));
    return a;
  }

  /** A call whose 2xx answer is JSON. */
  async json<T>(method: string, p: string, o: CallOptions = {}): Promise<T> {
    const a = await this.call(method, p, o);
    return (a.body.length ? JSON.parse(a.body.toString('utf8')) : {}) as T;
  }

  /** A streamed call: resolves with a 2xx response to read; any other status rejects typed. */
  async stream(method: string, p: string, o: CallOptions = {}): Promise<http.IncomingMessage> {
    const res = await this.open(method, p, o);
    const code = res.statusCode ?? 0;
    if (code >= 200 && code < 300) return res;
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    throw errorOf(statusOf(code, Buffer.concat(chunks)));
  }

  /**
   * A Kubernetes watch of one collection (newline-delimited JSON events), from `resourceVersion`;
   * ends when the server ends it or `signal` aborts. An ERROR event rejects with its Status.
   */
  async *watch<T>(
    plural: string,
    namespace: string,
    o: { fieldSelector?: string; labelSelector?: string; resourceVersion?: string; signal?: AbortSignal } = {},
  ): AsyncGenerator<WatchEvent<T>> {
    const res = await this.stream('GET', this.path(plural, namespace), {
      query: {
        watch: 'true',
        allowWatchBookmarks: 'true',
        fieldSelector: o.fieldSelector,
        labelSelector: o.labelSelector,
        resourceVersion: o.resourceVersion,
      },
      signal: o.signal,
    });
    const dec = new StringDecoder('utf8');
    let buf = '';
    try {
      for await (const chunk of res) {
        buf += dec.write(chunk as Buffer);
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i).trim();
          buf = buf.slice(i + 1);
          if (!line) continue;
          const ev = JSON.parse(line) as WatchEvent<T>;
          if (ev.type === 'ERROR') throw errorOf(ev.object as unknown as Parameters<typeof errorOf>[0]);
          yield ev;
        }
      }
    } catch (e) {
      throw o.signal?.aborted ? abortError(o.signal) : e;
    } finally {
      res.destroy();
    }
  }

  /** Closes the kept-alive sockets. */
  close(): void {
    this.agent.destroy();
  }
}
