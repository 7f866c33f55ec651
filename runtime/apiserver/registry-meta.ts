// Pure helpers of the registry: built-in kinds, object-name rules, continue tokens,
// resourceVersion parsing and the pieces of an object whose change bumps generation.
import type { KindDefinition } from '../../apis/types.js';
import type { PatchType } from '../client/client.js';
import { errors, StatusError } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';
import { isPlainObject } from './patch.js';

/** The core/v1 Namespace kind, used when the kind list does not define one. */
export const NAMESPACE_KIND: KindDefinition = {
  group: '',
  version: 'v1',
  kind: 'Namespace',
  listKind: 'NamespaceList',
  plural: 'namespaces',
  singular: 'namespace',
  namespaced: false,
  shortNames: ['ns'],
  categories: [],
  schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
  printerColumns: [
    { name: 'Status', type: 'string', jsonPath: '.status.phase' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' },
  ],
  statusSubresource: true,
  selectableFields: [],
  builtin: true,
};

export const DEFAULT_MAX_BYTES = 3 * 1024 * 1024;
// kube's GuaranteedUpdate retries until it wins; one writer wins every round, so this only
// bounds pathological cases.
export const MAX_RETRIES = 200;
export const GENERATE_SUFFIX = 'bcdfghjklmnpqrstvwxz2456789';
export const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
export const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
export const SUBDOMAIN_MSG =
  "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
export const LABEL_MSG =
  "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
export const INITIAL_EVENTS_END = 'k8s.io/initial-events-end';

export const apiVersionOfDef = (def: KindDefinition) => (def.group ? `${def.group}/${def.version}` : def.version);

export interface ContinueToken {
  rv: number;
  ns: string;
  name: string;
}

export function encodeContinue(t: ContinueToken): string {
  return Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v1', rv: t.rv, start: `${t.ns}/${t.name}\u0000` })).toString(
    'base64url',
  );
}

export function decodeContinue(s: string): ContinueToken {
  try {
    const o = JSON.parse(Buffer.from(s, 'base64url').toString('utf8'));
    if (
      o.v !== 'meta.k8s.io/v1' ||
      !Number.isInteger(o.rv) ||
      typeof o.start !== 'string' ||
      !o.start.endsWith('\u0000')
    )
      throw new Error();
    const start = o.start.slice(0, -1) as string;
    const slash = start.indexOf('/');
    if (slash < 0) throw new Error();
    return { rv: o.rv, ns: start.slice(0, slash), name: start.slice(slash + 1) };
  } catch {
    throw errors.badRequest('continue key is not valid: the continue parameter is not a valid token');
  }
}

const MAX_UINT64 = (1n << 64n) - 1n;

/**
 * A resourceVersion as kube parses it: an unsigned 64-bit decimal (etcd revisions), compared
 * exactly as a BigInt, never through float rounding. Garbage, and numbers past 2^64-1, are
 * 400 BadRequest. Returns the value and whether it is ahead of `current` (the caller answers
 * that with tooLargeResourceVersion).
 */
export function parseRV(
  rv: string,
  current: number,
  what = 'resourceVersion',
): { rv: number; ahead: boolean; exact: bigint } {
  const bad = () =>
    errors.badRequest(`invalid ${what}: ${JSON.stringify(rv)}: must be an unsigned 64-bit decimal integer`);
  if (!/^[0-9]{1,20}$/.test(rv)) throw bad();
  const exact = BigInt(rv);
  if (exact > MAX_UINT64) throw bad();
  const ahead = exact > BigInt(current);
  return { rv: ahead ? current : Number(exact), ahead, exact };
}

/** kube's storage.NewTooLargeResourceVersionError: 504 Timeout, retry after 1 s. */
export function tooLargeResourceVersion(want: bigint, current: number): StatusError {
  return new StatusError(504, 'Timeout', `Timeout: Too large resource version: ${want}, current: ${current}`, {
    causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }],
    retryAfterSeconds: 1,
  });
}

/** Everything but metadata and status: the part whose change bumps generation. */
export function specPart(o: KubeObject): Record<string, unknown> {
  const { metadata: _m, status: _s, apiVersion: _a, kind: _k, ...rest } = o;
  return rest;
}

/** Whether a merge or JSON patch document itself sets metadata.resourceVersion. */
export function patchSetsRV(type: PatchType, patch: unknown): boolean {
  if (type === 'merge')
    return isPlainObject(patch) && isPlainObject(patch.metadata) && typeof patch.metadata.resourceVersion === 'string';
  return (
    Array.isArray(patch) &&
    patch.some(
      (op) => isPlainObject(op) && op.path === '/metadata/resourceVersion' && op.op !== 'remove' && op.op !== 'test',
    )
  );
}
