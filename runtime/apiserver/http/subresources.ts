// The hook through which controllers serve a kind's imperative subresources (exec, files,
// baseline, changes, dryrun, diff, ...) on the API server. The HTTP layer resolves the path,
// the kind and the verb; the handler does the I/O, streaming or upgrading to a WebSocket.
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import type { Duplex, Readable } from 'node:stream';
import type { FastifyReply } from 'fastify';
import type { KindDefinition } from '../../../apis/types.js';
import type { GVR } from '../../meta/types.js';
import type { RequestContext } from '../registry-types.js';
import type { Query } from './options.js';

export interface SubresourceTarget {
  gvr: GVR;
  kind: KindDefinition;
  namespace: string | undefined;
  name: string;
  subresource: string;
  /**
   * Segments after the subresource (`stream` of `events/stream`, `JOB/stream` of `jobs/JOB/stream`); undefined without.
   */
  subpath?: string;
  query: Query;
  headers: IncomingHttpHeaders;
  ctx: RequestContext;
}

export interface SubresourceRequest extends SubresourceTarget {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  /** The raw request body (undefined without one); decode it per Content-Type as you need. */
  body: Buffer | undefined;
  req: IncomingMessage;
  /**
   * The fastify reply. To stream, call `reply.hijack()` and write to `reply.raw` (flush
   * headers first: clients wait for them). Otherwise return a value.
   */
  reply: FastifyReply;
}

/**
 * What a handler answers when a JSON 200 is not enough: a status, headers and a body (bytes, or
 * a stream the HTTP layer pipes with backpressure and destroys when the client goes away).
 * Build it with `respond(...)`; plain objects of the same shape are sent as JSON, not as this.
 */
export class SubresourceResponse {
  constructor(
    readonly status: number,
    readonly headers: Record<string, string>,
    readonly body: Buffer | Readable | undefined,
  ) {}
}

/** A response value for a subresource handler (see SubresourceResponse). */
export function respond(r: {
  status?: number;
  headers?: Record<string, string>;
  body?: Buffer | Readable | string;
}): SubresourceResponse {
  const body = typeof r.body === 'string' ? Buffer.from(r.body) : r.body;
  return new SubresourceResponse(r.status ?? 200, r.headers ?? {}, body);
}

export interface SubresourceUpgradeRequest extends SubresourceTarget {
  req: IncomingMessage;
  socket: Duplex;
  head: Buffer;
}

/**
 * A custom subresource. The HTTP layer resolves the kind and path but does not read the parent
 * object: the handler gets it from the registry (and answers 404 when it is missing).
 */
export interface SubresourceHandler {
  /** Verbs shown in discovery (e.g. ['create', 'get'] for exec); default ['create', 'get']. */
  verbs?: string[];
  /** The kind discovery reports for the subresource; default the parent kind. */
  responseKind?: { group: string; version: string; kind: string };
  /**
   * Serves a plain HTTP request. A SubresourceResponse (`respond(...)`) is sent as it says
   * (streams piped with backpressure); any other value other than undefined is sent as JSON
   * with 200 (`{statusCode, body}`-shaped results are not special). Handlers return values
   * and do not touch `reply` (the jobs' and tokens' handlers still do: being migrated). Return
   * undefined only after answering through `reply` yourself. A thrown StatusError becomes its Status; anything
   * else is a 500. Absent: plain requests get 405 MethodNotAllowed.
   */
  handle?(r: SubresourceRequest): unknown | Promise<unknown>;
  /**
   * Takes over an HTTP Upgrade (WebSocket) request; the handler owns the socket from then on
   * and must close it. Absent: upgrades are refused with 404.
   */
  upgrade?(r: SubresourceUpgradeRequest): void;
  /**
   * Accepts paths below it (`jobs/JOB/stream`), given as `subpath`. Without it, a path with
   * segments after the subresource reaches only a handler registered under the longer name.
   */
  subpaths?: boolean;
}

/** Registered handlers by `<plural>/<subresource>`; registering the same pair twice replaces it. */
export class SubresourceRegistry {
  private readonly handlers = new Map<string, SubresourceHandler>();
  private version = 0;

  register(plural: string, name: string, handler: SubresourceHandler): void {
    if (name === 'status') throw new Error('the status subresource is served by the registry; it cannot be registered');
    this.handlers.set(`${plural}/${name}`, handler);
    this.version++;
  }

  get(plural: string, name: string): SubresourceHandler | undefined {
    return this.handlers.get(`${plural}/${name}`);
  }

  /**
   * The handler of a request path: one registered under `<subresource>/<subpath>` (e.g.
   * `events/stream`, `files/watch`), else the subresource's own when it takes subpaths (or
   * when there is no subpath). Authorization is by the subresource alone, as kube's proxy.
   */
  resolve(plural: string, sub: string, subpath: string | undefined): SubresourceHandler | undefined {
    if (subpath === undefined) return this.get(plural, sub);
    const exact = this.get(plural, `${sub}/${subpath}`);
    if (exact) return exact;
    const h = this.get(plural, sub);
    return h?.subpaths ? h : undefined;
  }

  /** The subresources discovery lists (handlers of longer paths, `events/stream`, are not listed). */
  names(plural: string): string[] {
    const out: string[] = [];
    for (const k of this.handlers.keys())
      if (k.startsWith(`${plural}/`) && !k.slice(plural.length + 1).includes('/')) out.push(k.slice(plural.length + 1));
    return out;
  }

  /** Changes whenever a handler is registered (discovery caches key on it). */
  get generation(): number {
    return this.version;
  }
}
