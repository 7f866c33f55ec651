// What every write path of the registry shares (registry-create.ts, registry-update.ts,
// registry-delete.ts): the registry's dependencies as one `RegistryCore`, and the checks of a
// proposed object (body shape, metadata, size), the field manager's name and managedFields.
import type { KindDefinition } from '../../apis/types.js';
import type { WriteOptions } from '../client/client.js';
import { errors, type StatusError } from '../meta/errors.js';
import type { KubeObject, ManagedFieldsEntry, StatusCause } from '../meta/types.js';
import type { ObjectKey, Store } from '../store/store.js';
import type { QuotaAdmission } from './admission/quota.js';
import { checkObjectDepth } from './limits.js';
import { isPlainObject } from './patch.js';
import type { FieldManagerHooks } from './registry-fields.js';
import { apiVersionOfDef } from './registry-meta.js';
import { checkShapeTypes } from './registry-shape.js';
import type { KindStrategy } from './registry-strategy.js';
import type { AdmitOptions, CreateCoWriter, RequestContext, WriteGuard } from './registry-types.js';

/** The registry's state and dependencies, as the write paths see them (built by Registry). */
export interface RegistryCore {
  readonly store: Store;
  readonly fm: FieldManagerHooks;
  readonly guard?: WriteGuard;
  /** Largest stored object, serialized. */
  readonly maxBytes: number;
  /** Now, as metav1.Time serializes it (RFC 3339, seconds). */
  timestamp(): string;
  /** Admission (defaults, schema, CEL); throws 400/422. */
  admit(
    def: KindDefinition,
    obj: KubeObject,
    old: KubeObject | undefined,
    opts: AdmitOptions,
  ): Promise<{ object: KubeObject; warnings: string[] }>;
  strategy(def: KindDefinition): KindStrategy;
  /**
   * ResourceQuota admission (admission/quota.ts): 403 past a namespace's quota; the function it
   * returns wraps the store's staging promise and must be called in the same synchronous run.
   */
  readonly quota?: Pick<QuotaAdmission, 'charge'>;
  /** Namespace must exist (404 naming the namespace) and, when creating, not be terminating (403). */
  checkNamespaceWritable(def: KindDefinition, namespace: string, creating: boolean): void;
  /** Kinds' create co-writes (registry-cowrite.ts). */
  readonly coWriters?: readonly CreateCoWriter[];
}

export function objectKey(def: KindDefinition, namespace: string | undefined, name: string): ObjectKey {
  return { group: def.group, resource: def.plural, namespace: def.namespaced ? (namespace ?? '') : '', name };
}

/** The namespace of a request for `def`: '' for cluster-scoped kinds, 400 when a namespaced kind has none. */
export function requireNamespace(def: KindDefinition, namespace: string | undefined): string {
  if (!def.namespaced) return '';
  if (!namespace) throw errors.badRequest('the namespace must be provided for namespaced resources');
  return namespace;
}

export function notFound(def: KindDefinition, name: string): StatusError {
  return errors.notFound(def.plural, def.group, name);
}

/** The field manager of a write: `fieldManager` (at most 128 bytes, else 422) or the user agent's product. */
export function managerOf(opts: WriteOptions, ctx: RequestContext): string {
  if (opts.fieldManager) {
    if (opts.fieldManager.length > 128)
      throw errors.invalid('PatchOptions', 'meta.k8s.io', '', [
        { reason: 'FieldValueTooLong', field: 'fieldManager', message: 'Too long: may not be more than 128 bytes' },
      ]);
    return opts.fieldManager;
  }
  const ua = ctx.userAgent ?? 'unknown';
  return ua.split('/')[0] || 'unknown';
}

/**
 * A body (or patch result) as an object of `def`: 400 unless it is an object whose apiVersion
 * and kind, when given, are the kind's; 422 for ObjectMeta fields of the wrong type. Returns a
 * shallow copy with apiVersion, kind and a copied metadata set.
 */
export function checkBodyShape(def: KindDefinition, body: unknown): KubeObject {
  if (!isPlainObject(body)) throw errors.badRequest(`the body of the request was not a ${def.kind} object`);
  // Patch results reach here too: they may nest deeper than any body could (copy ops).
  checkObjectDepth(body);
  checkShapeTypes(def, body);
  const b = body as unknown as KubeObject;
  const av = apiVersionOfDef(def);
  if (b.apiVersion !== undefined && b.apiVersion !== av)
    throw errors.badRequest(
      `the API version in the data (${String(b.apiVersion)}) does not match the expected API version (${av})`,
    );
  if (b.kind !== undefined && b.kind !== def.kind)
    throw errors.badRequest(`the kind in the data (${String(b.kind)}) does not match the expected kind (${def.kind})`);
  if (b.metadata !== undefined && !isPlainObject(b.metadata)) throw errors.badRequest('metadata must be an object');
  return { ...b, apiVersion: av, kind: def.kind, metadata: { ...(b.metadata ?? {}) } };
}

/** The name (the kind's rule) and the metadata shapes the registry relies on; 422 naming each bad field. */
export function validateMeta(def: KindDefinition, strategy: KindStrategy, obj: KubeObject): void {
  const causes: StatusCause[] = [];
  const name = obj.metadata.name ?? '';
  const bad = strategy.validateName(name);
  if (bad !== undefined) causes.push({ reason: 'FieldValueInvalid', field: 'metadata.name', message: bad });
  // Label and annotation syntax is admission's (kube's wording); here only the shapes the
  // registry itself relies on (selectors, finalizer logic).
  const m = obj.metadata;
  for (const field of ['labels', 'annotations'] as const) {
    const map = m[field];
    if (map !== undefined && (!isPlainObject(map) || Object.values(map).some((v) => typeof v !== 'string')))
      causes.push({
        reason: 'FieldValueInvalid',
        field: `metadata.${field}`,
        message: 'Invalid value: must be a map of string keys to string values',
      });
  }
  if (
    m.finalizers !== undefined &&
    (!Array.isArray(m.finalizers) || m.finalizers.some((f) => typeof f !== 'string' || f === ''))
  )
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'metadata.finalizers',
      message: 'Invalid value: must be a list of non-empty strings',
    });
  // The garbage collector acts on one propagation at a time (kube's ValidateFinalizers).
  else if (m.finalizers?.includes('orphan') && m.finalizers.includes('foregroundDeletion'))
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'metadata.finalizers',
      message: `Invalid value: []string{${m.finalizers.map((f) => JSON.stringify(f)).join(', ')}}: finalizer orphan and foregroundDeletion cannot be both set`,
    });
  if (causes.length) throw errors.invalid(def.kind, def.group, name, causes);
}

/** 413 when `obj` serialized is larger than the limit (the store checks what it writes itself). */
export function checkSize(core: RegistryCore, obj: KubeObject): void {
  const n = Buffer.byteLength(JSON.stringify(obj));
  if (n > core.maxBytes) throw errors.tooLarge(`Request entity too large: limit is ${core.maxBytes}`);
}

/**
 * managedFields after a non-apply write. `clientMF` is what the client sent (kept out of
 * admission); the field manager applies kube's rule: a non-empty valid value replaces the
 * stored entries, `[{}]` clears them, then the writer's changes are recorded.
 */
export function managedFieldsFor(
  core: RegistryCore,
  def: KindDefinition,
  prev: KubeObject | undefined,
  next: KubeObject,
  clientMF: unknown,
  manager: string,
  subresource: string | undefined,
): ManagedFieldsEntry[] | undefined {
  const withClient = {
    ...next,
    metadata: {
      ...next.metadata,
      managedFields: Array.isArray(clientMF) ? (clientMF as ManagedFieldsEntry[]) : undefined,
    },
  };
  const mf = core.fm.update(def, prev, withClient, manager, subresource, core.timestamp());
  return mf && mf.length ? mf : undefined;
}

/** How an apply that finds no object creates it (server-side apply upserts). */
export interface AppliedCreate {
  manager: string;
  force: boolean;
  subresource?: string;
}
