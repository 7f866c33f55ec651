// The resource verbs over HTTP: get, list, watch, create, update, patch, delete,
// deletecollection, the status subresource and registered custom subresources. Requests are
// decoded here and handed to the RegistryApi; responses are shaped by Accept (object, Table,
// PartialObjectMetadata).
import { Readable } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { KindDefinition } from '../../../apis/types.js';
import type { PatchOptions } from '../../client/client.js';
import { errors, isStatusError } from '../../meta/errors.js';
import type { GVR, KubeList, KubeObject, WatchEvent } from '../../meta/types.js';
import type { RegistryApi, RequestContext, WatchStream, WriteResult } from '../registry-types.js';
import { jsonOf, listJSONChunks } from './encode.js';
import type { Metrics } from '../../metrics/metrics.js';
import { decodeBody, objectShape, patchTypeOf, strategicToMerge, type Shape } from './negotiate.js';
import { deleteOptions, listOptions, parseBool, q1, watchOptions, writeOptions, type Query } from './options.js';
import { notFoundResource, type ApiPath } from './paths.js';
import { SubresourceResponse, type SubresourceRegistry } from './subresources.js';
import { idempotencyKeyOf } from '../idempotency.js';
import { partialObjectMetadata, TableConvertor, type IncludeObject } from './table.js';

export interface Resolved {
  path: ApiPath;
  kind: KindDefinition;
  gvr: GVR;
}

export interface ResourceHandlerDeps {
  registry: RegistryApi;
  kinds: KindDefinition[];
  subresources: SubresourceRegistry;
  metrics: Metrics;
  watchHoldSeconds: [number, number];
  /** Bytes a watch may have buffered unsent before it is ended. */
  maxWatchBuffer: number;
  now: () => number;
}

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

const METHOD_NOT_ALLOWED = 'the server does not allow this method on the requested resource';

/**
 * A warning as an RFC 7234 warn-text: quotes and backslashes escaped; control and non-ASCII characters (which Node
 * refuses in headers) as \uXXXX.
 */
function escapeWarning(w: string): string {
  return w
    .replace(/\\/g, '\\\\')
    .replace(/"/g, '\\"')
    .replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

export class ResourceHandler {
  private readonly tables = new Map<string, TableConvertor>();
  private readonly openWatches = new Set<() => void>();

  constructor(private readonly d: ResourceHandlerDeps) {
    for (const k of d.kinds) this.tables.set(`${k.group}/${k.version}/${k.plural}`, new TableConvertor(k, d.now));
  }

  /** Ends every open watch stream (server shutdown). Safe to call twice. */
  closeAllWatches(): void {
    for (const finish of [...this.openWatches]) finish();
  }

  private table(gvr: GVR): TableConvertor {
    return this.tables.get(`${gvr.group}/${gvr.version}/${gvr.resource}`)!;
  }

  async handle(req: FastifyRequest, reply: FastifyReply, r: Resolved): Promise<unknown> {
    const { path, kind, gvr } = r;
    const method = req.method as Method;
    const query = (req.query ?? {}) as Query;
    const ns = path.namespace;
    const ctx: RequestContext = {
      userAgent: req.headers['user-agent'],
      ...(req.fluxUser ? { user: req.fluxUser } : {}),
    };
    const isWatch = path.watchPrefix || parseBool(query, 'watch') === true;
    const verb = resourceVerb(method, path, isWatch);
    req.fluxLabels = {
      verb: metricVerb(method, verb, req.headers['content-type']),
      group: gvr.group,
      version: gvr.version,
      resource: gvr.resource,
      subresource: path.subresource ?? '',
      scope: path.name !== undefined ? 'resource' : ns !== undefined ? 'namespace' : 'cluster',
    };
    if (!path.subresource && kind.verbs && !kind.verbs.includes(verb)) {
      throw errors.methodNotAllowed(METHOD_NOT_ALLOWED);
    }
    // Verbs per path, as kube installs routes: /watch/ paths serve only watch, and the
    // all-namespaces path of a namespaced kind only list and watch (no create, and above all
    // no deletecollection across every namespace).
    if (
      (method !== 'GET' && (path.watchPrefix || (kind.namespaced && ns === undefined))) ||
      (path.watchPrefix && path.subresource !== undefined)
    ) {
      throw errors.methodNotAllowed(METHOD_NOT_ALLOWED);
    }

    if (path.subresource !== undefined) return this.subresource(req, reply, r, method, query, ctx);

    if (path.name === undefined) {
      switch (method) {
        case 'GET':
          if (isWatch) return this.watch(req, reply, r, query, ctx);
          return this.list(req, reply, r, query, ctx);
        case 'POST': {
          const body = decodeBody(req.headers['content-type'], req.body as Buffer | undefined) as KubeObject;
          checkObject(body);
          const key = idempotencyKeyOf(req.headers);
          const res = await this.d.registry.create(
            gvr,
            ns,
            body,
            writeOptions(query, 'CreateOptions'),
            key ? { ...ctx, idempotencyKey: key } : ctx,
          );
          return this.sendWrite(reply, res);
        }
        case 'DELETE': {
          const body = this.optionalBody(req);
          const opts = { ...listOptions(query), ...deleteOptions(query, body) };
          const list = await this.d.registry.deleteCollection(gvr, ns, opts, ctx);
          return sendJSON(reply, 200, list);
        }
        default:
          throw errors.methodNotAllowed(METHOD_NOT_ALLOWED);
      }
    }

    const name = path.name;
    switch (method) {
      case 'GET': {
        if (isWatch) {
          // Watching one object (/watch/.../<name> or ?watch=true on the item) is a watch of
          // the collection narrowed to that name, as the apiserver does it.
          const fs = q1(query, 'fieldSelector');
          const narrowed = { ...query, fieldSelector: `${fs ? `${fs},` : ''}metadata.name=${name}` };
          return this.watch(req, reply, r, narrowed, ctx);
        }
        const obj = await this.d.registry.get(gvr, ns, name, ctx);
        return this.sendObject(req, reply, r, obj, query);
      }
      case 'PUT': {
        const body = decodeBody(req.headers['content-type'], req.body as Buffer | undefined) as KubeObject;
        checkObject(body);
        const res = await this.d.registry.update(gvr, ns, name, body, writeOptions(query, 'UpdateOptions'), ctx);
        return this.sendWrite(reply, res);
      }
      case 'PATCH': {
        const res = await this.patch(req, gvr, ns, name, query, ctx);
        return this.sendWrite(reply, res);
      }
      case 'DELETE': {
        const { orphanDependents, ...opts } = deleteOptions(query, this.optionalBody(req));
        const res = await this.d.registry.delete(gvr, ns, name, opts, ctx);
        // kube's delete handler: 202 only for an object still there after a delete that set
        // orphanDependents: false (kept for old clients); 200 otherwise, with the object.
        return sendRaw(reply, !res.deleted && orphanDependents === false ? 202 : 200, jsonOf(res.object));
      }
      default:
        throw errors.methodNotAllowed(METHOD_NOT_ALLOWED);
    }
  }

  private optionalBody(req: FastifyRequest): unknown {
    const b = req.body as Buffer | undefined;
    if (!b || b.length === 0 || b.toString('utf8').trim() === '') return undefined;
    return decodeBody(req.headers['content-type'], b);
  }

  private async patch(
    req: FastifyRequest,
    gvr: GVR,
    ns: string | undefined,
    name: string,
    query: Query,
    ctx: RequestContext,
    subresource?: string,
  ): Promise<WriteResult> {
    const kind = this.d.kinds.find(
      (k) => k.group === gvr.group && k.version === gvr.version && k.plural === gvr.resource,
    );
    const t = patchTypeOf(req.headers['content-type'], kind?.builtin === true);
    let patch = decodeBody(req.headers['content-type'], req.body as Buffer | undefined, true);
    const type = t === 'strategic' ? 'merge' : t;
    if (t === 'strategic') patch = strategicToMerge(patch);
    const opts: PatchOptions = writeOptions(query, 'PatchOptions');
    const force = parseBool(query, 'force');
    if (force !== undefined) {
      if (type !== 'apply') {
        throw errors.invalid('PatchOptions', 'meta.k8s.io', '', [
          {
            reason: 'FieldValueForbidden',
            field: 'force',
            message: 'Forbidden: may not be specified for non-apply patch',
          },
        ]);
      }
      opts.force = force;
    }
    if (subresource) opts.subresource = subresource;
    if (type === 'apply' && !checkIsObject(patch)) throw errors.badRequest('apply patch body must be an object');
    return this.d.registry.patch(gvr, ns, name, type, patch, opts, ctx);
  }

  private sendWrite(reply: FastifyReply, res: WriteResult): FastifyReply {
    if (res.warnings.length)
      reply.header(
        'warning',
        res.warnings.map((w) => `299 - "${escapeWarning(w)}"`),
      );
    if (res.replayed) reply.header('idempotent-replayed', 'true');
    return sendRaw(reply, res.created ? 201 : 200, res.json ?? jsonOf(res.object));
  }

  private includeObject(query: Query): IncludeObject {
    const v = q1(query, 'includeObject');
    if (v === undefined || v === '') return 'Metadata';
    if (v === 'None' || v === 'Metadata' || v === 'Object') return v;
    throw errors.badRequest(`includeObject: Unsupported value: "${v}": supported values: "None", "Metadata", "Object"`);
  }

  private sendObject(
    req: FastifyRequest,
    reply: FastifyReply,
    r: Resolved,
    obj: KubeObject,
    query: Query,
  ): FastifyReply {
    const shape = objectShape(req.headers.accept);
    if (shape.kind === 'table') {
      const t = this.table(r.gvr).tableJSON([obj], {
        include: this.includeObject(query),
        metaVersion: shape.version,
        listMeta: { resourceVersion: obj.metadata?.resourceVersion },
      });
      return sendRaw(reply, 200, t);
    }
    if (shape.kind === 'partial') return sendJSON(reply, 200, partialObjectMetadata(obj, shape.version));
    return sendRaw(reply, 200, jsonOf(obj));
  }

  private async list(req: FastifyRequest, reply: FastifyReply, r: Resolved, query: Query, ctx: RequestContext) {
    const shape = objectShape(req.headers.accept);
    const include = shape.kind === 'table' ? this.includeObject(query) : 'Object';
    const list: KubeList = await this.d.registry.list(r.gvr, r.path.namespace, listOptions(query), ctx);
    if (shape.kind === 'table') {
      return sendChunks(
        reply,
        200,
        this.table(r.gvr).tableChunks(list.items, { include, metaVersion: shape.version, listMeta: list.metadata }),
      );
    }
    if (shape.kind === 'partial') {
      return sendJSON(reply, 200, {
        kind: 'PartialObjectMetadataList',
        apiVersion: `meta.k8s.io/${shape.version}`,
        metadata: list.metadata,
        items: list.items.map((o) => partialObjectMetadata(o, shape.version)),
      });
    }
    return sendChunks(reply, 200, listJSONChunks(list));
  }

  /**
   * Streams a watch: 200 with headers flushed at once, then one JSON event per line. Ends
   * on timeoutSeconds (or the default hold), when the registry closes the stream (after a
   * 410 ERROR event, say), when the client goes away, or on server close.
   */
  private watch(req: FastifyRequest, reply: FastifyReply, r: Resolved, query: Query, ctx: RequestContext) {
    const shape = objectShape(req.headers.accept);
    const include = shape.kind === 'table' ? this.includeObject(query) : 'Object';
    const opts = watchOptions(query);
    // Errors before the stream starts (bad selector, ...) are plain Status responses, except
    // 410 Expired: clients (reflectors) expect it as an ERROR event in a 200 stream.
    let stream: WatchStream;
    try {
      stream = this.d.registry.watch(r.gvr, r.path.namespace, opts, ctx);
    } catch (e) {
      if (!isStatusError(e) || e.code !== 410) throw e;
      reply.hijack();
      reply.raw.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-cache, private' });
      reply.raw.end(JSON.stringify({ type: 'ERROR', object: e.status }) + '\n');
      return reply;
    }
    const { metrics } = this.d;
    const started = process.hrtime.bigint();
    const labels = req.fluxLabels!;
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, {
      'content-type': 'application/json',
      'cache-control': 'no-cache, private',
      'transfer-encoding': 'chunked',
    });
    res.flushHeaders();
    metrics.watchStarted(r.gvr.group, r.gvr.version, r.gvr.resource);

    const [min, max] = this.d.watchHoldSeconds;
    const holdMs = (opts.timeoutSeconds ?? min + Math.random() * (max - min)) * 1000;
    let first = true;
    let closed = false;
    const table = shape.kind === 'table' ? this.table(r.gvr) : undefined;
    const finish = () => {
      if (closed) return;
      closed = true;
      clearTimeout(timer);
      this.openWatches.delete(finish);
      // A stream we end is counted by the server's onResponse hook (on 'finish'); one the
      // client abandoned never finishes, so it is counted here.
      const abandoned = res.destroyed && !res.writableFinished;
      try {
        stream.close();
      } finally {
        if (!res.writableEnded) res.end();
        if (abandoned) metrics.observe(labels, 200, Number(process.hrtime.bigint() - started) / 1e9);
        metrics.watchEnded(r.gvr.group, r.gvr.version, r.gvr.resource);
      }
    };
    const timer = setTimeout(finish, holdMs);
    this.openWatches.add(finish);

    const encode = (ev: WatchEvent): string => {
      if (ev.type === 'BOOKMARK' || ev.type === 'ERROR') return JSON.stringify(ev);
      if (table) {
        const object = table.tableJSON([ev.object], {
          include,
          metaVersion: (shape as Extract<Shape, { kind: 'table' }>).version,
          listMeta: { resourceVersion: ev.object.metadata?.resourceVersion },
          headers: first,
        });
        first = false;
        return `{"type":${JSON.stringify(ev.type)},"object":${object}}`;
      }
      if (shape.kind === 'partial')
        return JSON.stringify({ type: ev.type, object: partialObjectMetadata(ev.object, shape.version) });
      return `{"type":${JSON.stringify(ev.type)},"object":${jsonOf(ev.object)}}`;
    };
    stream.onEvent((ev) => {
      if (closed) return;
      res.write(encode(ev) + '\n');
      // A client that stops reading would make us buffer without bound: end its watch (as
      // the apiserver drops slow watchers); the client re-watches from its last RV.
      if (res.writableLength > this.d.maxWatchBuffer) finish();
    });
    stream.onClose(finish);
    res.on('close', finish);
    return reply;
  }

  private async subresource(
    req: FastifyRequest,
    reply: FastifyReply,
    r: Resolved,
    method: Method,
    query: Query,
    ctx: RequestContext,
  ): Promise<unknown> {
    const { gvr, kind, path } = r;
    const ns = path.namespace;
    const name = path.name!;
    const sub = path.subresource!;
    // status and the field subresources (changesets/approval) are served by the registry.
    if ((sub === 'status' && kind.statusSubresource) || kind.fieldSubresources?.[sub]) {
      switch (method) {
        case 'GET':
          return this.sendObject(req, reply, r, await this.d.registry.get(gvr, ns, name, ctx), query);
        case 'PUT': {
          const body = decodeBody(req.headers['content-type'], req.body as Buffer | undefined) as KubeObject;
          checkObject(body);
          const opts = { ...writeOptions(query, 'UpdateOptions'), subresource: sub };
          return this.sendWrite(reply, await this.d.registry.update(gvr, ns, name, body, opts, ctx));
        }
        case 'PATCH':
          return this.sendWrite(reply, await this.patch(req, gvr, ns, name, query, ctx, sub));
        default:
          throw errors.methodNotAllowed(METHOD_NOT_ALLOWED);
      }
    }
    const h = this.d.subresources.resolve(kind.plural, sub, path.subpath);
    if (!h) throw notFoundResource();
    if (!h.handle) throw errors.methodNotAllowed(METHOD_NOT_ALLOWED);
    const result = await h.handle({
      method,
      gvr,
      kind,
      namespace: ns,
      name,
      subresource: sub,
      ...(path.subpath !== undefined ? { subpath: path.subpath } : {}),
      query,
      headers: req.headers,
      ctx,
      body: req.body as Buffer | undefined,
      req: req.raw,
      reply,
    });
    if (reply.sent || (reply.raw.headersSent && result === undefined)) return reply;
    if (result instanceof SubresourceResponse) return sendResponse(reply, result);
    if (result === undefined) {
      return sendJSON(reply, 200, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', code: 200 });
    }
    return sendJSON(reply, 200, result);
  }
}

/**
 * Sends a handler's response value. A stream body is piped into the socket (pipe() stops
 * reading while the socket is full, so a client that never reads holds at most the socket's
 * buffers) and destroyed when the client goes away, which ends the handler's producer.
 */
function sendResponse(reply: FastifyReply, r: SubresourceResponse): FastifyReply {
  if (!(r.body instanceof Readable)) {
    void reply
      .code(r.status)
      .headers(r.headers)
      .send(r.body ?? Buffer.alloc(0));
    return reply;
  }
  const body = r.body;
  reply.hijack();
  const res = reply.raw;
  res.writeHead(r.status, r.headers);
  res.flushHeaders();
  const stop = (): void => {
    if (!body.destroyed) body.destroy();
  };
  res.on('close', stop);
  body.on('error', () => res.destroy());
  body.pipe(res);
  return reply;
}

/** The authorization verb of a resource request (kube's RequestInfo rules). */
export function resourceVerb(method: Method, path: Pick<ApiPath, 'name' | 'subresource'>, isWatch: boolean): string {
  const collection = path.name === undefined;
  switch (method) {
    case 'GET':
      return isWatch ? 'watch' : collection ? 'list' : 'get';
    case 'POST':
      return 'create';
    case 'PUT':
      return 'update';
    case 'PATCH':
      return 'patch';
    case 'DELETE':
      return collection ? 'deletecollection' : 'delete';
    default:
      return String(method).toLowerCase();
  }
}

/** kube-apiserver's reported verbs: GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION. */
function metricVerb(method: Method, verb: string, contentType: string | undefined): string {
  if (verb === 'list' || verb === 'watch' || verb === 'deletecollection') return verb.toUpperCase();
  if (method === 'PATCH' && (contentType ?? '').startsWith('application/apply-patch')) return 'APPLY';
  return method;
}

function checkIsObject(v: unknown): boolean {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A create/update body must be a JSON object; anything else is a 400 (never a 500 later). */
function checkObject(v: unknown): asserts v is KubeObject {
  if (!checkIsObject(v)) throw errors.badRequest('the request body must be a JSON object');
  const m = (v as Record<string, unknown>).metadata;
  if (m !== undefined && m !== null && !checkIsObject(m)) throw errors.badRequest('metadata must be an object');
}

/**
 * Sends a JSON body given as text chunks: one buffer when it is small, else streamed chunk by
 * chunk as the socket drains (no single huge string or Buffer for a list of 10k objects).
 */
export function sendChunks(reply: FastifyReply, code: number, chunks: Iterator<string>): FastifyReply {
  const first = chunks.next();
  const second = first.done ? first : chunks.next();
  if (second.done) return sendRaw(reply, code, first.done ? '' : first.value);
  function* all(): Generator<string> {
    yield first.value as string;
    yield second.value as string;
    for (let c = chunks.next(); !c.done; c = chunks.next()) yield c.value;
  }
  return reply
    .code(code)
    .header('content-type', 'application/json')
    .header('cache-control', 'no-cache, private')
    .send(Readable.from(all(), { objectMode: false }));
}

/** Sends an already serialized JSON body. */
export function sendRaw(reply: FastifyReply, code: number, json: string): FastifyReply {
  return reply
    .code(code)
    .header('content-type', 'application/json')
    .header('cache-control', 'no-cache, private')
    .send(Buffer.from(json));
}

export function sendJSON(reply: FastifyReply, code: number, body: unknown): FastifyReply {
  return reply
    .code(code)
    .header('content-type', 'application/json')
    .header('cache-control', 'no-cache, private')
    .send(Buffer.from(JSON.stringify(body)));
}
