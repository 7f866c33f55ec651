// Update, patch and server-side apply: one path (`modify`) that computes the proposed object
// from the stored one, applies the subresource split (status, the kind's registry
// subresources, field subresources) and the kind's strategy, admits it, bumps generation on a
// spec change, records managedFields and writes with compare-and-swap, recomputing on the
// newest state when a concurrent write won (kube's GuaranteedUpdate) unless the client gave a
// resourceVersion precondition (then 409).
import type { KindDefinition } from '../../apis/types.js';
import type { PatchOptions, PatchType, WriteOptions } from '../client/client.js';
import { errors, StatusError } from '../meta/errors.js';
import type { KubeObject, ManagedFieldsEntry, StatusCause } from '../meta/types.js';
import { StoreConflict } from '../store/store.js';
import { checkObjectDepth } from './limits.js';
import { applyJsonPatch, applyMergePatch, deepClone, deepEqual, isPlainObject } from './patch.js';
import { createObject } from './registry-create.js';
import { MAX_RETRIES, patchSetsRV, specPart } from './registry-meta.js';
import { checkShapeTypes } from './registry-shape.js';
import type { RequestContext, WriteResult } from './registry-types.js';
import {
  checkBodyShape,
  checkSize,
  managedFieldsFor,
  managerOf,
  notFound,
  objectKey,
  requireNamespace,
  validateMeta,
  type RegistryCore,
} from './registry-write.js';

const UNSUPPORTED_PATCH =
  'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml';

/** PUT of the object (subresource undefined) or of a subresource the registry serves. */
export async function updateObject(
  core: RegistryCore,
  def: KindDefinition,
  namespace: string | undefined,
  name: string,
  body: KubeObject,
  opts: WriteOptions & { subresource?: string },
  ctx: RequestContext,
): Promise<WriteResult> {
  checkSubresource(core, def, opts.subresource);
  const b = checkBodyShape(def, body);
  if (b.metadata.name !== undefined && b.metadata.name !== name)
    throw errors.badRequest(
      `the name of the object (${String(b.metadata.name)}) does not match the name on the URL (${name})`,
    );
  if (!core.strategy(def).allowUnconditionalUpdate && !b.metadata.resourceVersion)
    throw errors.invalid(def.kind, def.group, name, [
      {
        reason: 'FieldValueInvalid',
        field: 'metadata.resourceVersion',
        message: 'Invalid value: 0x0: must be specified for an update',
      },
    ]);
  return modify(core, def, namespace, name, opts, ctx, opts.subresource, () => ({ next: deepClone(b) }));
}

/** Merge, JSON and apply patches; strategic merge (and anything else) is 415. */
export async function patchObject(
  core: RegistryCore,
  def: KindDefinition,
  namespace: string | undefined,
  name: string,
  type: PatchType,
  patch: unknown,
  opts: PatchOptions,
  ctx: RequestContext,
): Promise<WriteResult> {
  checkSubresource(core, def, opts.subresource);
  if ((type as string) === 'strategic' || (type as string) === 'application/strategic-merge-patch+json')
    throw errors.unsupportedMediaType(UNSUPPORTED_PATCH);
  if (type === 'apply') {
    if (!opts.fieldManager)
      // docs/reference/kubernetes-api.md section 4: a 400 with the Invalid-style message kubectl prints.
      throw errors.badRequest(
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
        [
          {
            reason: 'FieldValueRequired',
            field: 'fieldManager',
            message: 'Required value: is required for apply patch',
          },
        ],
      );
    const cfg = checkBodyShape(def, patch);
    if (cfg.metadata.name !== undefined && cfg.metadata.name !== name)
      throw errors.badRequest(
        `the name of the object (${String(cfg.metadata.name)}) does not match the name on the URL (${name})`,
      );
    cfg.metadata.name = name;
    const manager = managerOf(opts, ctx);
    return modify(
      core,
      def,
      namespace,
      name,
      opts,
      ctx,
      opts.subresource,
      (old) => {
        const merged = core.fm.apply(
          def,
          old,
          deepClone(cfg),
          manager,
          !!opts.force,
          opts.subresource,
          core.timestamp(),
        );
        return { next: merged, managedFieldsComputed: true, precondition: cfg.metadata.resourceVersion || null };
      },
      { manager, force: !!opts.force, cfg },
    );
  }
  if (type !== 'merge' && type !== 'json') throw errors.unsupportedMediaType(UNSUPPORTED_PATCH);
  return modify(core, def, namespace, name, opts, ctx, opts.subresource, (old) => {
    const next =
      type === 'merge' ? applyMergePatch(old, patch) : applyJsonPatch(old, patch, { maxBytes: core.maxBytes });
    if (!isPlainObject(next)) throw errors.badRequest('the patch result is not an object');
    if (!isPlainObject(next.metadata)) throw errors.badRequest('the patch result has no metadata object');
    checkObjectDepth(next);
    checkShapeTypes(def, next);
    // The result inherits the stored resourceVersion; only one the patch itself sets is a
    // precondition (else concurrent patches would 409 instead of being retried).
    const rv = next.metadata.resourceVersion;
    return {
      next,
      precondition:
        rv !== undefined && rv !== old.metadata.resourceVersion
          ? String(rv)
          : patchSetsRV(type, patch)
            ? String(rv)
            : null,
    };
  });
}

function checkSubresource(core: RegistryCore, def: KindDefinition, sub: string | undefined): void {
  if (sub === undefined || sub === '') return;
  if (sub === 'status' && def.statusSubresource) return;
  if (Object.hasOwn(core.strategy(def).subresources, sub)) return;
  if (def.fieldSubresources?.[sub]) return;
  throw new StatusError(404, 'NotFound', 'the server could not find the requested resource', {});
}

type Compute = (old: KubeObject) => { next: KubeObject; managedFieldsComputed?: boolean; precondition?: string | null };

/**
 * The shared update path (PUT, patches, apply). `compute` builds the proposed object from
 * the stored one; it is re-run when a concurrent write wins the compare-and-swap.
 * `precondition`: null = none; undefined = the body's metadata.resourceVersion (PUT).
 */
async function modify(
  core: RegistryCore,
  def: KindDefinition,
  namespace: string | undefined,
  name: string,
  opts: WriteOptions,
  ctx: RequestContext,
  subresource: string | undefined,
  compute: Compute,
  applyCreate?: { manager: string; force: boolean; cfg: KubeObject },
): Promise<WriteResult> {
  const ns = requireNamespace(def, namespace);
  const key = objectKey(def, ns, name);
  const strategy = core.strategy(def);
  for (let attempt = 0; ; attempt++) {
    const old = core.store.getLatest(key);
    if (!old) {
      if (applyCreate && !subresource) {
        if (applyCreate.cfg.metadata.resourceVersion) throw errors.conflict(def.plural, def.group, name);
        return createObject(core, def, ns, applyCreate.cfg, opts, ctx, {
          manager: applyCreate.manager,
          force: applyCreate.force,
        });
      }
      throw notFound(def, name);
    }
    const oldRV = old.metadata.resourceVersion!;
    const c = compute(deepClone(old));
    const next = checkBodyShape(def, c.next);
    const userRV = c.precondition === null ? undefined : (c.precondition ?? next.metadata.resourceVersion);
    if (userRV !== undefined && userRV !== '' && userRV !== oldRV) throw errors.conflict(def.plural, def.group, name);
    const prepared = await prepareUpdate(core, def, old, next, opts, ctx, subresource, !!c.managedFieldsComputed);
    if (prepared.noop) return { object: old, created: false, warnings: prepared.warnings };
    const obj = prepared.object;
    const finalize =
      !!obj.metadata.deletionTimestamp && (obj.metadata.finalizers ?? []).length === 0 && !strategy.holdsDeletion(obj);
    // Quota (spec changes only): 403 past a ResourceQuota; no await from here to the staging below.
    const charged = subresource || finalize ? undefined : core.quota?.charge(def, key, obj, old);
    if (opts.dryRun) {
      checkSize(core, obj);
      return { object: obj, created: false, warnings: prepared.warnings };
    }
    try {
      if (finalize) {
        // The last finalizer is gone: store the final state's deletion (DELETED event).
        const gone = await core.store.enqueueDelete(key, oldRV, obj);
        return { object: gone, created: false, warnings: prepared.warnings };
      }
      // A write to an object being deleted (its finalizer's controller reporting Terminating)
      // is a step of the deletion: on a full disk it must get through, or the space the
      // finalizer would free never comes back.
      const staged = core.store.enqueueUpdate(key, obj, oldRV, {
        maxBytes: core.maxBytes,
        deletion: !!old.metadata.deletionTimestamp,
      });
      const out = await (charged ? charged(staged) : staged);
      return { object: out, created: false, warnings: prepared.warnings, json: core.store.writtenJSON(out) };
    } catch (e) {
      if (!(e instanceof StoreConflict)) throw e;
      if (e.kind === 'missing') throw notFound(def, name);
      // Someone else wrote first: a client precondition is now stale; otherwise try again
      // on the newest state (getLatest sees the competing staged write).
      if ((userRV !== undefined && userRV !== '') || attempt >= MAX_RETRIES)
        throw errors.conflict(def.plural, def.group, name);
    }
  }
}

async function prepareUpdate(
  core: RegistryCore,
  def: KindDefinition,
  old: KubeObject,
  next: KubeObject,
  opts: WriteOptions,
  ctx: RequestContext,
  subresource: string | undefined,
  managedFieldsComputed: boolean,
): Promise<{ object: KubeObject; warnings: string[]; noop: boolean }> {
  const name = old.metadata.name!;
  const m = next.metadata;
  if (m.name !== undefined && m.name !== name)
    throw errors.badRequest(`the name of the object (${String(m.name)}) does not match the name on the URL (${name})`);
  if (def.namespaced && m.namespace !== undefined && m.namespace !== old.metadata.namespace)
    throw errors.badRequest('the namespace of the provided object does not match the namespace sent on the request');
  const clientMF = m.managedFields;
  const manager = managerOf(opts, ctx);
  const strategy = core.strategy(def);
  let obj: KubeObject;
  const registrySub =
    subresource !== undefined && Object.hasOwn(strategy.subresources, subresource)
      ? strategy.subresources[subresource]
      : undefined;
  if (registrySub) {
    obj = registrySub(old, next);
  } else if (subresource === 'status') {
    // The status subresource changes .status only (plus managedFields for it).
    obj = deepClone(old);
    if (next.status === undefined) delete obj.status;
    else obj.status = deepClone(next.status);
    if (managedFieldsComputed && next.metadata.managedFields) obj.metadata.managedFields = next.metadata.managedFields;
  } else if (subresource && def.fieldSubresources?.[subresource]) {
    // A field subresource (changesets/approval) changes its fields only; the rest of the
    // body is ignored, as the status subresource ignores everything but .status.
    obj = deepClone(old);
    for (const path of def.fieldSubresources[subresource]) copyField(obj, next, path.split('.'));
    if (managedFieldsComputed && next.metadata.managedFields) obj.metadata.managedFields = next.metadata.managedFields;
  } else {
    obj = mainResourceUpdate(def, old, next);
    validateMeta(def, strategy, obj);
    strategy.prepareForUpdate(obj, old);
    strategy.canonicalize(obj);
  }
  obj.metadata.resourceVersion = old.metadata.resourceVersion;
  const computedMF = obj.metadata.managedFields;
  // Client-sent managedFields are the field manager's business, not admission's.
  if (managedFieldsComputed || old.metadata.managedFields === undefined) delete obj.metadata.managedFields;
  else obj.metadata.managedFields = old.metadata.managedFields;
  if (core.guard && subresource !== 'status') await core.guard(def, old, obj, ctx, subresource);
  const admitted = await core.admit(def, obj, old, { fieldValidation: opts.fieldValidation, subresource });
  obj = admitted.object;
  if (subresource !== 'status' && !deepEqual(specPart(old), specPart(obj)))
    obj.metadata.generation = (old.metadata.generation ?? 0) + 1;
  else obj.metadata.generation = old.metadata.generation;
  let mf: ManagedFieldsEntry[] | undefined;
  if (managedFieldsComputed) mf = computedMF;
  else
    mf = managedFieldsFor(core, def, old, obj, subresource === 'status' ? undefined : clientMF, manager, subresource);
  if (mf && mf.length) obj.metadata.managedFields = mf;
  else delete obj.metadata.managedFields;
  if (deepEqual(old, obj)) return { object: old, warnings: admitted.warnings, noop: true };
  return { object: obj, warnings: admitted.warnings, noop: false };
}

/**
 * `next` as a write of the main resource: 422 for a changed uid or deletionTimestamp and for
 * finalizers added to an object being deleted; server-owned metadata and a status
 * subresource's .status are taken from `old`. Mutates and returns `next`.
 */
function mainResourceUpdate(def: KindDefinition, old: KubeObject, next: KubeObject): KubeObject {
  const name = old.metadata.name!;
  const m = next.metadata;
  const om = old.metadata;
  const causes: StatusCause[] = [];
  if (m.uid !== undefined && m.uid !== '' && m.uid !== om.uid)
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'metadata.uid',
      message: `Invalid value: ${JSON.stringify(m.uid)}: field is immutable`,
    });
  if (m.deletionTimestamp !== undefined && m.deletionTimestamp !== null && m.deletionTimestamp !== om.deletionTimestamp)
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'metadata.deletionTimestamp',
      message: `Invalid value: ${JSON.stringify(m.deletionTimestamp)}: field is immutable; may only be changed via deletion`,
    });
  if (om.deletionTimestamp) {
    const added = (Array.isArray(m.finalizers) ? m.finalizers : []).filter((f) => !(om.finalizers ?? []).includes(f));
    if (added.length)
      causes.push({
        reason: 'FieldValueForbidden',
        field: 'metadata.finalizers',
        message: `Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{${added.map((f) => JSON.stringify(f)).join(', ')}}`,
      });
  }
  if (causes.length) throw errors.invalid(def.kind, def.group, name, causes);
  m.uid = om.uid;
  m.creationTimestamp = om.creationTimestamp;
  m.generation = om.generation;
  m.namespace = om.namespace;
  m.name = name;
  if (om.deletionTimestamp) {
    m.deletionTimestamp = om.deletionTimestamp;
    m.deletionGracePeriodSeconds = om.deletionGracePeriodSeconds;
  } else {
    delete m.deletionTimestamp;
    delete m.deletionGracePeriodSeconds;
  }
  delete (m as Record<string, unknown>).selfLink;
  if (def.statusSubresource) {
    if (old.status === undefined) delete next.status;
    else next.status = deepClone(old.status);
  }
  return next;
}

/** Sets `path` of `to` to its value in `from`, or deletes it there when `from` has none. */
function copyField(to: object, from: object, path: string[]): void {
  let src: unknown = from;
  for (const p of path) src = isPlainObject(src) ? src[p] : undefined;
  let dst = to as Record<string, unknown>;
  for (const p of path.slice(0, -1)) {
    let child = dst[p];
    if (!isPlainObject(child)) {
      if (src === undefined) return;
      child = dst[p] = {};
    }
    dst = child as Record<string, unknown>;
  }
  const last = path[path.length - 1];
  if (src === undefined) delete dst[last];
  else dst[last] = deepClone(src);
}
