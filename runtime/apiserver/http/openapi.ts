// /openapi/v3 served the way kube-openapi's handler3 does: an index of group-version paths
// with `?hash=<etag>` URLs, and per group-version documents that are immutable (one year)
// under a matching hash, 301 to the current hash on a mismatch, 304 on If-None-Match.
// The documents come from apis/openapi.ts (built once, on first request).
import type { FastifyReply, FastifyRequest } from 'fastify';
import { buildOpenAPIv3, openapiHash } from '../../../apis/openapi.js';
import type { KindDefinition } from '../../../apis/types.js';
import type { GroupVersion } from './discovery.js';
import { notFoundResource } from './paths.js';

export interface OpenAPIBuilder {
  /** The OpenAPI 3.0 document for the kinds of one group-version. */
  build(kinds: KindDefinition[]): unknown;
  /** A hash that changes whenever the document changes (used as the ETag). */
  hash(doc: unknown): string;
}

interface Doc {
  body: string;
  hash: string;
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
            out.set(pathKey(gv), { body: JSON.stringify(doc), hash: b.hash(doc) });
          }
        }
        return out;
      })();
      this.docs.catch(() => (this.docs = undefined));
    }
    return this.docs;
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
