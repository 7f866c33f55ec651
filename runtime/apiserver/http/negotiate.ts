// Content negotiation: which representation a response takes (from Accept) and how a request
// body is decoded (from Content-Type). Everything we answer is JSON; the Accept header only
// picks the shape (plain object, Table, PartialObjectMetadata, aggregated discovery).
import yaml from 'js-yaml';
import type { PatchType } from '../../client/client.js';
import { errors } from '../../meta/errors.js';
import { checkJSONDepth, checkValueDepth, checkYAMLValue, MAX_DEPTH } from '../limits.js';
import { decodeProtobuf, PROTOBUF } from './protobuf.js';

export interface MediaRange {
  type: string; // e.g. application/json
  params: Record<string, string>;
}

/** Parses an Accept header into media ranges, in the client's order (q values ignored except q=0). */
export function parseAccept(accept: string | undefined): MediaRange[] {
  if (!accept) return [];
  const out: MediaRange[] = [];
  for (const part of accept.split(',')) {
    const [type, ...ps] = part.split(';').map((x) => x.trim());
    if (!type) continue;
    const params: Record<string, string> = {};
    for (const p of ps) {
      const eq = p.indexOf('=');
      if (eq > 0)
        params[p.slice(0, eq).trim().toLowerCase()] = p
          .slice(eq + 1)
          .trim()
          .replace(/^"|"$/g, '');
    }
    if (params.q === '0') continue;
    out.push({ type: type.toLowerCase(), params });
  }
  return out;
}

export type Shape =
  { kind: 'object' } | { kind: 'table'; version: 'v1' | 'v1beta1' } | { kind: 'partial'; version: 'v1' | 'v1beta1' };

/**
 * The response shape for an object read: the first Accept entry asking for a Table or for
 * PartialObjectMetadata[List] (meta.k8s.io v1/v1beta1) wins; anything else is the plain object.
 */
export function objectShape(accept: string | undefined): Shape {
  for (const r of parseAccept(accept)) {
    if (r.type !== 'application/json' && r.type !== '*/*') continue;
    const { as, g, v } = r.params;
    if (!as) {
      if (r.type === 'application/json') return { kind: 'object' };
      continue;
    }
    if (g !== 'meta.k8s.io' || (v !== 'v1' && v !== 'v1beta1')) continue;
    if (as === 'Table') return { kind: 'table', version: v };
    if (as === 'PartialObjectMetadata' || as === 'PartialObjectMetadataList') return { kind: 'partial', version: v };
  }
  return { kind: 'object' };
}

export type DiscoveryShape = { kind: 'legacy' } | { kind: 'aggregated'; version: 'v2' | 'v2beta1' };

/** Aggregated discovery is chosen only when asked for by as=APIGroupDiscoveryList. */
export function discoveryShape(accept: string | undefined): DiscoveryShape {
  for (const r of parseAccept(accept)) {
    if (r.type !== 'application/json' && r.type !== '*/*') continue;
    const { as, g, v } = r.params;
    if (!as) {
      if (r.type === 'application/json') return { kind: 'legacy' };
      continue;
    }
    if (as === 'APIGroupDiscoveryList' && g === 'apidiscovery.k8s.io' && (v === 'v2' || v === 'v2beta1')) {
      return { kind: 'aggregated', version: v };
    }
  }
  return { kind: 'legacy' };
}

export function aggregatedContentType(version: 'v2' | 'v2beta1'): string {
  return `application/json;g=apidiscovery.k8s.io;v=${version};as=APIGroupDiscoveryList`;
}

function mediaType(contentType: string | undefined): string {
  return (contentType ?? '').split(';')[0].trim().toLowerCase();
}

const PATCH_TYPES: Record<string, PatchType> = {
  'application/json-patch+json': 'json',
  'application/merge-patch+json': 'merge',
  'application/apply-patch+yaml': 'apply',
};
const ACCEPTED_PATCH = 'application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml';

const STRATEGIC = 'application/strategic-merge-patch+json';

/**
 * The patch type for a PATCH Content-Type; 415 UnsupportedMediaType otherwise. Strategic
 * merge is 415 (as for CRDs) unless `builtin`: kubectl sends it for the core kinds, and it is
 * then taken as a JSON merge patch once its directives are rewritten (strategicToMerge).
 */
export function patchTypeOf(contentType: string | undefined, builtin = false): PatchType | 'strategic' {
  const mt = mediaType(contentType);
  if (builtin && mt === STRATEGIC) return 'strategic';
  const t = PATCH_TYPES[mt];
  if (!t) {
    throw errors.unsupportedMediaType(
      `the body of the request was in an unknown format - accepted media types include: ${ACCEPTED_PATCH}`,
    );
  }
  return t;
}

/**
 * Decodes a request body. JSON for application/json and the JSON patch types (and a missing
 * Content-Type, which `kubectl create --raw` sends); YAML for application/yaml and
 * apply-patch+yaml. Malformed input is a 400 BadRequest; an unknown media type is 415.
 */
export function decodeBody(contentType: string | undefined, body: Buffer | undefined, forPatch = false): unknown {
  const mt = mediaType(contentType);
  if (mt === PROTOBUF && !forPatch) {
    // Fixed message shapes, except managedFields' fieldsV1 (JSON inside): bounded too.
    const v = decodeProtobuf(body);
    checkValueDepth(v, MAX_DEPTH);
    return v;
  }
  let isYaml: boolean;
  if (mt === STRATEGIC && forPatch) {
    isYaml = false;
  } else if (
    mt === '' ||
    mt === 'application/json' ||
    mt === 'application/json-patch+json' ||
    mt === 'application/merge-patch+json'
  ) {
    isYaml = false;
  } else if (mt === 'application/yaml' || mt === 'application/apply-patch+yaml') {
    isYaml = true;
  } else {
    throw errors.unsupportedMediaType(
      forPatch
        ? `the body of the request was in an unknown format - accepted media types include: ${ACCEPTED_PATCH}`
        : `the body of the request was in an unknown format - accepted media types include: application/json, application/yaml`,
    );
  }
  // Depth first, on the bytes (a scan that stops at the first level too deep): everything
  // after the parser walks values recursively.
  if (!isYaml && body) checkJSONDepth(body, MAX_DEPTH);
  const text = body ? body.toString('utf8') : '';
  if (text.trim() === '') throw errors.badRequest('the body of the request was empty');
  if (!isYaml) {
    try {
      return JSON.parse(text);
    } catch (e) {
      throw errors.badRequest(`json parse error: ${(e as Error).message}`);
    }
  }
  let docs: unknown[];
  try {
    // js-yaml's own depth cap (default 100) is set past ours, which checkYAMLValue applies
    // below: js-yaml counts a compact block sequence (`- - x`) twice. Past ~1600 levels its
    // recursion runs out of stack (RangeError, below): still a 400.
    docs = yaml.loadAll(text, undefined, { schema: yaml.CORE_SCHEMA, maxDepth: 2 * MAX_DEPTH + 2 } as yaml.LoadOptions);
  } catch (e) {
    // js-yaml's parser recurses per nesting level: a deeper document runs out of stack.
    if (e instanceof RangeError || /exceeded maxDepth/.test(String((e as Error).message)))
      throw errors.badRequest(`yaml: the document nests deeper than the limit of ${MAX_DEPTH} levels`);
    throw errors.badRequest(`yaml: ${(e as yaml.YAMLException).reason ?? (e as Error).message}`);
  }
  docs = docs.filter((d) => d !== null && d !== undefined);
  if (docs.length !== 1) throw errors.badRequest(`yaml: expected exactly one document, got ${docs.length}`);
  // Aliases are shared objects here: refuse excessive expansion and depth before anything copies them.
  checkYAMLValue(docs[0], { maxDepth: MAX_DEPTH });
  return docs[0];
}

/**
 * Rewrites a strategic-merge patch into a JSON merge patch, approximately: `$patch: delete`
 * maps become null, `$patch: replace` and the ordering/retain/delete-from-list directives are
 * dropped, and lists replace lists (no merge keys). Good for the core kinds' common edits
 * (labels, annotations, data); lists of merge-keyed items are replaced whole.
 */
export function strategicToMerge(patch: unknown): unknown {
  if (Array.isArray(patch)) {
    return patch
      .filter((e) => !(e && typeof e === 'object' && (e as Record<string, unknown>).$patch === 'delete'))
      .map(strategicToMerge);
  }
  if (!patch || typeof patch !== 'object') return patch;
  const o = patch as Record<string, unknown>;
  if (o.$patch === 'delete') return null;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) {
    if (
      k === '$patch' ||
      k === '$retainKeys' ||
      k.startsWith('$setElementOrder/') ||
      k.startsWith('$deleteFromPrimitiveList/')
    )
      continue;
    out[k] = strategicToMerge(v);
  }
  return out;
}
