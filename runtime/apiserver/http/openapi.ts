// /openapi/v3 served the way kube-openapi's handler3 does: an index of group-version paths
// with `?hash=<etag>` URLs, and per group-version documents that are immutable (one year)
// under a matching hash, 301 to the current hash on a mismatch, 304 on If-None-Match.
// The documents come from apis/openapi.ts (built once, on first request).
import type { FastifyReply, FastifyRequest } from 'fastify';
import { buildOpenAPIv3, openapiHash } from '../../../apis/openapi.js';
import type { KindDefinition } from '../../../apis/types.js';
import type { GroupVersion } from './discovery.js';
import { notFoundResource } from './paths.js';
import { encodeOpenAPIv2, OPENAPI_V2_PROTOBUF } from './openapiv2pb.js';

export interface OpenAPIBuilder {
  /** The OpenAPI 3.0 document for the kinds of one group-version. */
  build(kinds: KindDefinition[]): unknown;
  /** A hash that changes whenever the document changes (used as the ETag). */
  hash(doc: unknown): string;
}

interface Doc {
  body: string;
  hash: string;
  doc: unknown;
}

/** Keywords of OpenAPI 3 schemas that Swagger 2.0 lacks; kube drops them when it publishes CRDs in v2. */
const V3_ONLY = ['oneOf', 'anyOf', 'not'];

/**
 * One schema node made what kube publishes for CRDs in v2 and kubectl's v2 parser accepts
 * (apiextensions' ToStructuralOpenAPIV2): a lone allOf ref becomes the ref, nullable and
 * preserve-unknown-fields nodes lose what kubectl cannot type, an array without items and an
 * object with neither properties nor an additionalProperties schema become untyped.
 */
function v2Node(rec: Record<string, unknown>): void {
  for (const k of V3_ONLY) delete rec[k];
  if (Array.isArray(rec.allOf)) {
    const only = rec.allOf.length === 1 ? (rec.allOf[0] as Record<string, unknown>) : undefined;
    if (only && typeof only.$ref === 'string' && rec.$ref === undefined) rec.$ref = only.$ref;
    delete rec.allOf;
  }
  if (rec.nullable === true) {
    delete rec.type;
    delete rec.items;
    delete rec.properties;
  }
  delete rec.nullable;
  if (rec['x-kubernetes-preserve-unknown-fields'] === true) {
    delete rec.items;
    delete rec.properties;
  }
  if (typeof rec.additionalProperties === 'boolean') delete rec.additionalProperties;
  if (rec.type === 'array' && rec.items === undefined) delete rec.type;
  if (rec.type === 'object' && rec.properties === undefined && rec.additionalProperties === undefined) delete rec.type;
}

/**
 * A v3 value with `#/components/schemas/` refs pointed at `#/definitions/` and its schema nodes made v2 (v2Node).
 * Iterative.
 */
function toV2Value(v: unknown): unknown {
  const root = { v: structuredClone(v) } as Record<string, unknown>;
  const stack: unknown[] = [root.v];
  while (stack.length) {
    const o = stack.pop();
    if (o === null || typeof o !== 'object') continue;
    if (Array.isArray(o)) {
      stack.push(...o);
      continue;
    }
    const rec = o as Record<string, unknown>;
    if (typeof rec.$ref === 'string') rec.$ref = rec.$ref.replace('#/components/schemas/', '#/definitions/');
    if ('type' in rec || 'properties' in rec || 'allOf' in rec || 'nullable' in rec || '$ref' in rec) v2Node(rec);
    if (typeof rec.$ref === 'string') rec.$ref = rec.$ref.replace('#/components/schemas/', '#/definitions/');
    for (const [k, c] of Object.entries(rec)) {
      // Property maps: every value is a schema, the keys are field names.
      if (k === 'properties' && c && typeof c === 'object') stack.push(...Object.values(c as object));
      else if (k !== 'enum' && k !== 'default' && k !== 'example' && !k.startsWith('x-')) stack.push(c);
    }
  }
  return root.v;
}

/** One v3 operation as a Swagger 2.0 operation: requestBody to a body parameter, content to consumes/produces. */
function toV2Operation(op: Record<string, unknown>): Record<string, unknown> {
  const { requestBody, responses, parameters, ...rest } = op as {
    requestBody?: { content?: Record<string, { schema?: unknown }>; required?: boolean };
    responses?: Record<string, { description?: string; content?: Record<string, { schema?: unknown }> }>;
    parameters?: Array<Record<string, unknown>>;
  };
  const params: Array<Record<string, unknown>> = (parameters ?? []).map((p) => {
    const { schema, ...pr } = p as { schema?: Record<string, unknown> };
    return { ...pr, ...(schema ?? {}) };
  });
  const out: Record<string, unknown> = { ...rest };
  if (requestBody?.content) {
    const types = Object.keys(requestBody.content);
    const schema = requestBody.content[types[0]]?.schema;
    params.unshift({ name: 'body', in: 'body', required: requestBody.required ?? false, schema });
    if (!types.includes('*/*')) out.consumes = types;
    else out.consumes = ['*/*'];
  }
  const produces = new Set<string>();
  const res: Record<string, unknown> = {};
  for (const [code, r] of Object.entries(responses ?? {})) {
    const types = Object.keys(r.content ?? {});
    for (const t of types) produces.add(t);
    res[code] = { description: r.description ?? '', ...(types.length ? { schema: r.content![types[0]].schema } : {}) };
  }
  if (produces.size) out.produces = [...produces];
  out.schemes = ['https'];
  if (params.length) out.parameters = params;
  out.responses = res;
  return toV2Value(out) as Record<string, unknown>;
}

/**
 * The Swagger 2.0 document of every group-version (what /openapi/v2 serves), converted from
 * the v3 documents: definitions from components.schemas, operations with body parameters.
 * Like the v3 documents it never lists strategic-merge-patch, so clients send merge patches.
 */
export function swaggerFromV3(docs: unknown[]): Record<string, unknown> {
  const paths: Record<string, unknown> = {};
  const definitions: Record<string, unknown> = {};
  for (const d of docs as Array<{
    paths?: Record<string, Record<string, unknown>>;
    components?: { schemas?: Record<string, unknown> };
  }>) {
    for (const [p, item] of Object.entries(d.paths ?? {})) {
      const ops: Record<string, unknown> = {};
      for (const [m, op] of Object.entries(item)) ops[m] = toV2Operation(op as Record<string, unknown>);
      paths[p] = ops;
    }
    for (const [n, sch] of Object.entries(d.components?.schemas ?? {})) definitions[n] = toV2Value(sch);
  }
  const sorted = (o: Record<string, unknown>) =>
    Object.fromEntries(
      Object.keys(o)
        .sort()
        .map((k) => [k, o[k]]),
    );
  return {
    swagger: '2.0',
    info: { title: 'FluxVM', version: 'v1alpha1' },
    paths: sorted(paths),
    definitions: sorted(definitions),
  };
}

const defaultBuilder: OpenAPIBuilder = { build: buildOpenAPIv3, hash: openapiHash };

function pathKey(gv: GroupVersion): string {
  return gv.group ? `apis/${gv.group}/${gv.version}` : `api/${gv.version}`;
}

export class OpenAPIServer {
  private docs?: Promise<Map<string, Doc>>;

  constructor(
    private readonly groups: Map<string, GroupVersion[]>,
    private readonly builder?: OpenAPIBuilder,
  ) {}

  /** Builds every document once; a failed build is retried on the next request. */
  private load(): Promise<Map<string, Doc>> {
    if (!this.docs) {
      this.docs = (async () => {
        const b = this.builder ?? defaultBuilder;
        const out = new Map<string, Doc>();
        for (const versions of this.groups.values()) {
          for (const gv of versions) {
            const doc = b.build(gv.kinds);
            out.set(pathKey(gv), { body: JSON.stringify(doc), hash: b.hash(doc), doc });
          }
        }
        return out;
      })();
      this.docs.catch(() => (this.docs = undefined));
    }
    return this.docs;
  }

  private v2doc?: Promise<{ body: Buffer; pb: Buffer; etag: string }>;

  /**
   * /openapi/v2: one Swagger 2.0 document of every group-version (built once), as JSON, or as
   * gnostic protobuf when the Accept asks for it (client-go, kubectl explain); ETag and 304.
   */
  async serveV2(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    if (!this.v2doc) {
      this.v2doc = this.load().then((docs) => {
        const doc = swaggerFromV3([...docs.values()].map((d) => d.doc));
        return { body: Buffer.from(JSON.stringify(doc)), pb: encodeOpenAPIv2(doc), etag: openapiHash(doc) };
      });
      this.v2doc.catch(() => (this.v2doc = undefined));
    }
    const d = await this.v2doc;
    const pb = /proto-openapi\.spec\.v2[^,]*\+protobuf/i.test(req.headers.accept ?? '');
    const etag = `"${d.etag}${pb ? '-pb' : ''}"`;
    reply.header('etag', etag).header('vary', 'Accept');
    if (req.headers['if-none-match'] === etag) return reply.code(304).send();
    return reply
      .code(200)
      .header('content-type', pb ? OPENAPI_V2_PROTOBUF : 'application/json')
      .send(pb ? d.pb : d.body);
  }

  async index(): Promise<unknown> {
    const docs = await this.load();
    const paths: Record<string, { serverRelativeURL: string }> = {};
    for (const [k, d] of docs) paths[k] = { serverRelativeURL: `/openapi/v3/${k}?hash=${d.hash}` };
    return { paths };
  }

  async serve(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const [pathname, qs] = (req.raw.url ?? '').split('?');
    const key = pathname.replace(/^\/openapi\/v3\//, '').replace(/\/$/, '');
    const docs = await this.load();
    const d = docs.get(key);
    if (!d) throw notFoundResource();
    const hash = new URLSearchParams(qs ?? '').get('hash');
    const etag = `"${d.hash}"`;
    if (hash) {
      if (hash !== d.hash) {
        return reply.code(301).header('location', `/openapi/v3/${key}?hash=${d.hash}`).send();
      }
      reply
        .header('vary', 'Accept')
        .header('cache-control', 'public, immutable')
        .header('expires', new Date(Date.now() + 365 * 24 * 3600 * 1000).toUTCString());
    }
    reply.header('etag', etag);
    if (req.headers['if-none-match'] === etag) return reply.code(304).send();
    return reply.code(200).header('content-type', 'application/json').send(Buffer.from(d.body));
  }
}
