// The Client over @kubernetes/client-node 1.4.0: what fluxctl and cluster-mode controllers
// use. KubeConfig supplies the server, credentials and TLS settings; requests go through
// node:http(s) with the agent and headers client-node builds; watches go through its Watch
// class (newline-delimited JSON). Patch content types are always explicit (client-node
// defaults to strategic merge, which the server refuses with 415). Every failure is a
// StatusError rebuilt from the server's Status body (or synthesized from the HTTP code).
import http from 'node:http';
import https from 'node:https';
import { createRequire } from 'node:module';
import type * as K8s from '@kubernetes/client-node';
import type { KubeConfig } from '@kubernetes/client-node';
import { REASON_BY_CODE, StatusError } from '../meta/errors.js';
import type { GVR, KubeList, KubeObject, Status, WatchEvent } from '../meta/types.js';
import type {
  Client,
  DeleteOptions,
  ListOptions,
  PatchOptions,
  PatchType,
  WatchHandle,
  WatchOptions,
  WriteOptions,
} from './client.js';

/** The part of client-node FluxVM uses: all that the build's bundle (below) exports. */
export type ClientNode = Pick<typeof K8s, 'KubeConfig' | 'Watch'>;

let k8s: ClientNode | undefined;
/**
 * @kubernetes/client-node, loaded on first use (synchronous require), which `fluxctl serve`
 * (in-process client) never needs. Built code loads the build's tree-shaken bundle of it
 * (dist/vendor/client-node.cjs, hack/bundle-client-node.mjs: 0.15 s of CPU instead of 0.7 s for
 * the package's ~800 modules); sources run through tsx, or a dist without it, load the package.
 */
export function clientNode(): ClientNode {
  if (k8s) return k8s;
  const require = createRequire(import.meta.url);
  let bundled: string | undefined;
  try {
    bundled = require.resolve('../../vendor/client-node.cjs');
  } catch {
    bundled = undefined;
  }
  k8s = require(bundled ?? '@kubernetes/client-node') as ClientNode;
  return k8s;
}

export const patchContentTypes: Record<PatchType, string> = {
  merge: 'application/merge-patch+json',
  json: 'application/json-patch+json',
  apply: 'application/apply-patch+yaml',
};

export interface ClientNodeOptions {
  /** Sent as User-Agent; the server derives the default field manager from its prefix. */
  userAgent?: string;
  /** Default fieldManager for writes that do not name one. */
  fieldManager?: string;
  /**
   * A request (not a watch or stream) that has not finished after this long fails with 504 (kubectl's
   * --request-timeout).
   */
  requestTimeoutMs?: number;
}

export interface RawRequest {
  method?: string;
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  contentType?: string;
  accept?: string;
  headers?: Record<string, string>;
}

export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** The error of a request that never got an answer (connection refused, reset, TLS failure). */
function unreachable(e: Error): StatusError {
  return new StatusError(503, 'ServiceUnavailable', `unable to connect to the server: ${e.message}`);
}

/** Builds the StatusError for a failed response: the Status body when there is one. */
export function statusErrorFrom(code: number, body: string): StatusError {
  try {
    const s = JSON.parse(body) as Partial<Status>;
    if (s && s.kind === 'Status') return StatusError.fromStatus(s, code);
  } catch {
    // not JSON: fall through
  }
  const text = body.trim() || http.STATUS_CODES[code] || 'unknown error';
  return new StatusError(
    code,
    REASON_BY_CODE[code] ?? 'InternalError',
    `the server responded with status ${code}: ${text}`,
  );
}

export function resourcePath(gvr: GVR, namespace?: string, name?: string, subresource?: string): string {
  let p = gvr.group ? `/apis/${gvr.group}/${gvr.version}` : `/api/${gvr.version}`;
  if (namespace) p += `/namespaces/${encodeURIComponent(namespace)}`;
  p += `/${gvr.resource}`;
  if (name !== undefined) p += `/${encodeURIComponent(name)}`;
  if (subresource) p += `/${subresource}`;
  return p;
}

export class ClientNodeClient implements Client {
  readonly kc: KubeConfig;
  private readonly userAgent: string;
  private readonly fieldManager?: string;
  private readonly requestTimeoutMs?: number;
  private agent?: http.Agent;

  constructor(kc: KubeConfig, opts: ClientNodeOptions = {}) {
    this.kc = kc;
    this.userAgent = opts.userAgent ?? 'fluxvm-client';
    this.fieldManager = opts.fieldManager;
    this.requestTimeoutMs = opts.requestTimeoutMs || undefined;
    if (!kc.getCurrentCluster()) throw new Error('kubeconfig has no current cluster');
  }

  /** Loads a kubeconfig file (throws if it cannot be read or has no current cluster). */
  static fromFile(file: string, opts?: ClientNodeOptions): ClientNodeClient {
    const kc = new (clientNode().KubeConfig)();
    kc.loadFromFile(file);
    return new ClientNodeClient(kc, opts);
  }

  /** From a kubeconfig object (the YAML's shape, parsed) or its text. */
  static fromConfig(config: string | object, opts?: ClientNodeOptions): ClientNodeClient {
    const kc = new (clientNode().KubeConfig)();
    kc.loadFromString(typeof config === 'string' ? config : JSON.stringify(config));
    return new ClientNodeClient(kc, opts);
  }

  /** The namespace of the current context, or 'default'. */
  defaultNamespace(): string {
    const ctx = this.kc.getContextObject(this.kc.getCurrentContext());
    return ctx?.namespace || 'default';
  }

  server(): string {
    return this.kc.getCurrentCluster()!.server.replace(/\/+$/, '');
  }

  /** One HTTP request to the server with the kubeconfig's credentials; never throws on a status code. */
  async raw(path: string, req: RawRequest = {}): Promise<RawResponse> {
    const { url, opts, mod } = await this.prepare(path, req, req.method ?? 'GET');
    // client-node builds a fresh agent each time; keep the first one so connections are reused.
    if (!this.agent) {
      this.agent = opts.agent as http.Agent;
      (this.agent as http.Agent & { keepAlive: boolean }).keepAlive = true;
    }
    opts.agent = this.agent;
    const headers: Record<string, string> = { ...(opts.headers as Record<string, string>), ...(req.headers ?? {}) };
    let payload: Buffer | undefined;
    if (req.body !== undefined) {
      payload = Buffer.from(typeof req.body === 'string' ? req.body : JSON.stringify(req.body));
      headers['Content-Type'] = req.contentType ?? 'application/json';
      headers['Content-Length'] = String(payload.length);
    }
    opts.headers = headers;
    return new Promise((resolve, reject) => {
      const r = mod.request(url, opts, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }),
        );
        res.on('error', reject);
      });
      r.on('error', (e) => reject(unreachable(e)));
      if (this.requestTimeoutMs) {
        const ms = this.requestTimeoutMs;
        r.setTimeout(ms, () => {
          reject(
            new StatusError(
              504,
              'Timeout',
              `the request to ${url.origin} did not finish within ${ms} ms (--request-timeout)`,
            ),
          );
          r.destroy();
        });
      }
      if (payload) r.write(payload);
      r.end();
    });
  }

  /**
   * A streaming GET of newline-delimited JSON (a watch with a chosen Accept, e.g. Table rows).
   * onLine gets each parsed line. `done` resolves when the stream ends, rejects with a
   * StatusError for a non-2xx answer. stop() ends it (safe to call twice).
   */
  stream<L = unknown>(path: string, req: RawRequest, onLine: (obj: L) => void): { stop(): void; done: Promise<void> } {
    let stopRequest: (() => void) | undefined;
    let stopped = false;
    const done = (async () => {
      const { url, opts, mod } = await this.prepare(path, req, 'GET');
      await new Promise<void>((resolve, reject) => {
        const r = mod.request(url, opts, (res) => {
          if ((res.statusCode ?? 0) >= 300) {
            const chunks: Buffer[] = [];
            res.on('data', (c: Buffer) => chunks.push(c));
            res.on('end', () => reject(statusErrorFrom(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
            return;
          }
          let buf = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => {
            buf += c;
            let nl: number;
            while ((nl = buf.indexOf('\n')) >= 0) {
              const line = buf.slice(0, nl).trim();
              buf = buf.slice(nl + 1);
              if (!line || stopped) continue;
              try {
                onLine(JSON.parse(line));
              } catch {
                // a malformed line is skipped, as client-node's Watch does
              }
            }
          });
          res.on('end', () => resolve());
          res.on('close', () => resolve());
          res.on('error', () => resolve());
        });
        stopRequest = () => {
          r.destroy();
          resolve();
        };
        if (stopped) stopRequest();
        r.on('error', (e) => (stopped ? resolve() : reject(unreachable(e))));
        r.end();
      });
    })();
    return {
      stop: () => {
        stopped = true;
        stopRequest?.();
      },
      done,
    };
  }

  /**
   * The URL (path plus the query's non-empty values), options (the kubeconfig's credentials, User-Agent, Accept) and
   * module of one request.
   */
  private async prepare(path: string, req: RawRequest, method: string) {
    const url = new URL(this.server() + path);
    for (const [k, v] of Object.entries(req.query ?? {}))
      if (v !== undefined && v !== '') url.searchParams.set(k, String(v));
    const opts: https.RequestOptions = { method, headers: {} };
    await this.kc.applyToHTTPSOptions(opts);
    opts.headers = {
      ...(opts.headers as Record<string, string>),
      'User-Agent': this.userAgent,
      Accept: req.accept ?? 'application/json',
    };
    return { url, opts, mod: url.protocol === 'https:' ? https : http };
  }

  /** raw() that parses JSON and throws a StatusError for any non-2xx answer. */
  async request<T>(path: string, req: RawRequest = {}): Promise<T> {
    const res = await this.raw(path, req);
    if (res.status < 200 || res.status >= 300) throw statusErrorFrom(res.status, res.body);
    try {
      return JSON.parse(res.body) as T;
    } catch {
      throw new StatusError(500, 'InternalError', `invalid JSON from the server: ${res.body.slice(0, 200)}`);
    }
  }

  get<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    subresource?: string,
  ): Promise<T> {
    return this.request<T>(resourcePath(gvr, namespace, name, subresource));
  }

  list<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    opts: ListOptions = {},
  ): Promise<KubeList<T>> {
    // readOnly is a promise of the caller, not a query parameter (every object here is a fresh parse).
    const { readOnly: _readOnly, ...query } = opts;
    return this.request<KubeList<T>>(resourcePath(gvr, namespace), { query });
  }

  watch<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    opts: WatchOptions,
    onEvent: (ev: WatchEvent<T>) => void,
  ): WatchHandle {
    let stopped = false;
    let controller: AbortController | undefined;
    const query: Record<string, string | number | boolean | undefined> = {
      labelSelector: opts.labelSelector || undefined,
      fieldSelector: opts.fieldSelector || undefined,
      resourceVersion: opts.resourceVersion || undefined,
      allowWatchBookmarks: opts.allowWatchBookmarks || undefined,
      sendInitialEvents: opts.sendInitialEvents,
      timeoutSeconds: opts.timeoutSeconds,
    };
    if (opts.sendInitialEvents) query.resourceVersionMatch = 'NotOlderThan';
    const done = new Promise<void>((resolve) => {
      const finish = (err?: { statusCode?: unknown; message?: string } | null) => {
        if (err && !stopped) {
          // An HTTP-level failure becomes an ERROR event, as the server would send in-stream.
          const code = typeof err.statusCode === 'number' ? err.statusCode : 503;
          const st =
            code === 503 && typeof err.statusCode !== 'number'
              ? new StatusError(503, 'ServiceUnavailable', `watch failed: ${err.message ?? err}`)
              : statusErrorFrom(code, '');
          try {
            onEvent({ type: 'ERROR', object: st.status as unknown as T });
          } catch {
            // the consumer's problem
          }
        }
        resolve();
      };
      new (clientNode().Watch)(this.kc)
        .watch(
          resourcePath(gvr, namespace),
          query,
          (type, obj) => {
            if (stopped) return;
            onEvent({ type: type as WatchEvent['type'], object: obj });
          },
          finish,
        )
        .then((c) => {
          controller = c;
          if (stopped) c.abort();
        }, finish);
    });
    return {
      stop: () => {
        stopped = true;
        controller?.abort();
      },
      done,
    };
  }

  create<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts: WriteOptions = {},
  ): Promise<T> {
    return this.request<T>(resourcePath(gvr, namespace), { method: 'POST', query: this.writeQuery(opts), body: obj });
  }

  update<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts: WriteOptions = {},
  ): Promise<T> {
    return this.request<T>(resourcePath(gvr, namespace, obj.metadata.name), {
      method: 'PUT',
      query: this.writeQuery(opts),
      body: obj,
    });
  }

  updateStatus<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts: WriteOptions = {},
  ): Promise<T> {
    return this.request<T>(resourcePath(gvr, namespace, obj.metadata.name, 'status'), {
      method: 'PUT',
      query: this.writeQuery(opts),
      body: obj,
    });
  }

  patch<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    type: PatchType,
    patch: unknown,
    opts: PatchOptions = {},
  ): Promise<T> {
    const query: Record<string, string | boolean | undefined> = {
      ...this.writeQuery(opts),
      force: type === 'apply' && opts.force !== undefined ? opts.force : undefined,
    };
    if (type === 'apply' && !query.fieldManager) query.fieldManager = 'fluxvm';
    return this.request<T>(resourcePath(gvr, namespace, name, opts.subresource), {
      method: 'PATCH',
      query,
      body: typeof patch === 'string' ? patch : JSON.stringify(patch),
      contentType: patchContentTypes[type],
    });
  }

  delete<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    opts: DeleteOptions = {},
  ): Promise<T> {
    const body: Record<string, unknown> = { kind: 'DeleteOptions', apiVersion: 'v1' };
    if (opts.propagationPolicy) body.propagationPolicy = opts.propagationPolicy;
    if (opts.gracePeriodSeconds !== undefined) body.gracePeriodSeconds = opts.gracePeriodSeconds;
    if (opts.preconditions) body.preconditions = opts.preconditions;
    if (opts.dryRun) body.dryRun = ['All'];
    return this.request<T>(resourcePath(gvr, namespace, name), { method: 'DELETE', body });
  }

  private writeQuery(opts: WriteOptions): Record<string, string | undefined> {
    return {
      dryRun: opts.dryRun ? 'All' : undefined,
      fieldManager: opts.fieldManager ?? this.fieldManager,
      fieldValidation: opts.fieldValidation,
    };
  }
}

/** A kubeconfig object for a plain-http local server (what `fluxctl serve` writes). */
export function localKubeconfig(server: string, namespace = 'default', name = 'fluxvm'): object {
  return {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name, cluster: { server, 'insecure-skip-tls-verify': true } }],
    users: [{ name, user: {} }],
    contexts: [{ name, context: { cluster: name, user: name, namespace } }],
    'current-context': name,
    preferences: {},
  };
}
