// Parsing of API paths into request info, the way apiserver's RequestInfoFactory does it:
//   /apis/<group>/<version>[/watch][/namespaces/<ns>]/<plural>[/<name>[/<subresource>[/<subpath>...]]]
//   /api/v1[/watch][/namespaces/<ns>]/<plural>[/<name>[/<subresource>[/<subpath>...]]]
// Segments after the subresource (as kube's `pods/NAME/proxy/PATH`) are the subpath: the
// subresource (its first segment) is what is authorized; `events/stream`, `files/watch` are
// served by handlers registered under that longer name (resources.ts).
// `namespaces/<ns>/status|finalize` is the namespace's own subresource, not a collection.
import { StatusError } from '../../meta/errors.js';

export interface ApiPath {
  group: string;
  version: string;
  /** Undefined for /apis/<group>/<version> itself (the APIResourceList). */
  resource?: string;
  namespace?: string;
  name?: string;
  subresource?: string;
  /** Segments after the subresource, joined with '/' (`stream` of `events/stream`); undefined without. */
  subpath?: string;
  /** The legacy /watch/ path prefix was used. */
  watchPrefix: boolean;
}

export function notFoundResource(): StatusError {
  return new StatusError(404, 'NotFound', 'the server could not find the requested resource', {});
}

const NAMESPACE_SUBRESOURCES = new Set(['status', 'finalize']);

/**
 * Splits `/apis/...` or `/api/...` (without query). Returns undefined for /api, /apis and
 * /apis/<group> (handled by discovery). Throws a 404 Status when the path has no API shape
 * and a 400 Status on a malformed percent-encoding.
 */
export function parseApiPath(pathname: string): ApiPath | { groupOnly: string } | undefined {
  let parts: string[];
  try {
    parts = pathname
      .split('/')
      .filter((p) => p !== '')
      .map((p) => decodeURIComponent(p));
  } catch {
    throw new StatusError(400, 'BadRequest', `malformed path ${JSON.stringify(pathname)}`);
  }
  let group: string;
  let version: string;
  let rest: string[];
  if (parts[0] === 'api') {
    if (parts.length === 1) return undefined;
    group = '';
    version = parts[1];
    rest = parts.slice(2);
  } else if (parts[0] === 'apis') {
    if (parts.length === 1) return undefined;
    if (parts.length === 2) return { groupOnly: parts[1] };
    group = parts[1];
    version = parts[2];
    rest = parts.slice(3);
  } else {
    throw notFoundResource();
  }
  let watchPrefix = false;
  if (rest[0] === 'watch') {
    watchPrefix = true;
    rest = rest.slice(1);
  }
  const out: ApiPath = { group, version, watchPrefix };
  if (rest.length === 0) {
    if (watchPrefix) throw notFoundResource();
    return out;
  }
  if (rest[0] === 'namespaces' && rest.length >= 3 && !NAMESPACE_SUBRESOURCES.has(rest[2])) {
    out.namespace = rest[1];
    rest = rest.slice(2);
  }
  if (rest.length > 3 && (watchPrefix || rest.length > 8)) throw notFoundResource();
  out.resource = rest[0];
  out.name = rest[1];
  out.subresource = rest[2];
  if (rest.length > 3) out.subpath = rest.slice(3).join('/');
  if (out.name === '' || out.namespace === '') throw notFoundResource();
  return out;
}
