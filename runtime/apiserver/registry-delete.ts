// Delete and deletecollection: preconditions, propagation policy (the garbage collector's
// finalizers), finalizers holding the object (deletionTimestamp set, the kind's strategy may
// hold it too: a namespace's spec.finalizers), dryRun.
import type { KindDefinition } from '../../apis/types.js';
import type { DeleteOptions, ListOptions } from '../client/client.js';
import { errors, StatusError } from '../meta/errors.js';
import type { KubeList, KubeObject } from '../meta/types.js';
import { StoreConflict, type ObjectKey } from '../store/store.js';
import { deepClone } from './patch.js';
import { apiVersionOfDef, MAX_RETRIES } from './registry-meta.js';
import { listObjects } from './registry-read.js';
import type { DeleteResult } from './registry-types.js';
import { notFound, objectKey, type RegistryCore } from './registry-write.js';

/** The finalizers a DELETE with propagationPolicy Foreground / Orphan adds (kube's names). */
export const FOREGROUND_FINALIZER = 'foregroundDeletion';
export const ORPHAN_FINALIZER = 'orphan';

/**
 * Deletes the object at `key`, or marks it (deletionTimestamp, the propagation policy's
 * finalizer) while finalizers hold it. Calling it again on a marked object changes nothing.
 * Throws 404, 409 (preconditions), 422 (propagationPolicy), the strategy's 403.
 */
export async function deleteObject(
  core: RegistryCore,
  def: KindDefinition,
  key: ObjectKey,
  opts: DeleteOptions,
): Promise<DeleteResult> {
  if (opts.propagationPolicy !== undefined && !['Background', 'Foreground', 'Orphan'].includes(opts.propagationPolicy))
    throw errors.invalid('DeleteOptions', 'meta.k8s.io', '', [
      {
        reason: 'FieldValueNotSupported',
        field: 'propagationPolicy',
        message: `Unsupported value: "${String(opts.propagationPolicy)}": supported values: "Foreground", "Background", "Orphan"`,
      },
    ]);
  const strategy = core.strategy(def);
  strategy.validateDelete(key.name);
  for (let attempt = 0; ; attempt++) {
    const old = core.store.getLatest(key);
    if (!old) throw notFound(def, key.name);
    const pre = opts.preconditions;
    if (pre?.uid && pre.uid !== old.metadata.uid)
      throw errors.conflict(
        def.plural,
        def.group,
        key.name,
        `Precondition failed: UID in precondition: ${pre.uid}, UID in object meta: ${old.metadata.uid}`,
      );
    if (pre?.resourceVersion && pre.resourceVersion !== old.metadata.resourceVersion)
      throw errors.conflict(
        def.plural,
        def.group,
        key.name,
        `Precondition failed: ResourceVersion in precondition: ${pre.resourceVersion}, ResourceVersion in object meta: ${old.metadata.resourceVersion}`,
      );
    const rv = old.metadata.resourceVersion!;
    const { finalizers, changed: finalizersChanged } = withPropagationFinalizer(old, opts.propagationPolicy);
    // Foreground/Orphan hand the object to the garbage collector through its finalizer
    // (runtime/controller/gc.ts); a namespace is held by spec.finalizers until the
    // namespace controller (runtime/controller/namespace.ts) has removed its content.
    const holds = finalizers.length > 0 || strategy.holdsDeletion(old);
    try {
      if (holds) {
        if (old.metadata.deletionTimestamp && !finalizersChanged) return { object: old, deleted: false };
        const obj = deepClone(old);
        if (finalizers.length) obj.metadata.finalizers = finalizers;
        else delete obj.metadata.finalizers;
        if (!old.metadata.deletionTimestamp) {
          obj.metadata.deletionTimestamp = core.timestamp();
          obj.metadata.deletionGracePeriodSeconds = 0;
          obj.metadata.generation = (old.metadata.generation ?? 0) + 1;
        }
        strategy.prepareForDelete(obj);
        if (opts.dryRun) return { object: obj, deleted: false };
        const out = await core.store.enqueueUpdate(key, obj, rv, { deletion: true });
        return { object: out, deleted: false };
      }
      if (opts.dryRun) return { object: old, deleted: true };
      // The answer carries the deletion's resourceVersion, as the DELETED watch event does.
      const gone = await core.store.enqueueDelete(key, rv);
      return { object: gone, deleted: true };
    } catch (e) {
      if (!(e instanceof StoreConflict)) throw e;
      if (e.kind === 'missing') throw notFound(def, key.name);
      if (pre?.resourceVersion || attempt >= MAX_RETRIES) throw errors.conflict(def.plural, def.group, key.name);
    }
  }
}

/**
 * The finalizers a delete leaves on `old`, as kube's deletionFinalizersForGarbageCollection:
 * an explicit policy decides (Orphan: `orphan`, Foreground: `foregroundDeletion`, Background:
 * neither); without one, the garbage-collection finalizer the object carries stays. Applied to
 * an object already being deleted too, so a second DELETE switches the policy (a Background one
 * ends a foreground wait; with no finalizer left the object goes at once).
 */
function withPropagationFinalizer(
  old: KubeObject,
  policy: DeleteOptions['propagationPolicy'],
): { finalizers: string[]; changed: boolean } {
  const current = old.metadata.finalizers ?? [];
  const carried = current.find((f) => f === FOREGROUND_FINALIZER || f === ORPHAN_FINALIZER);
  const orphan = policy === undefined ? carried === ORPHAN_FINALIZER : policy === 'Orphan';
  const foreground = policy === undefined ? carried === FOREGROUND_FINALIZER : policy === 'Foreground';
  const next = current.filter((f) => f !== FOREGROUND_FINALIZER && f !== ORPHAN_FINALIZER);
  if (orphan) next.push(ORPHAN_FINALIZER);
  if (foreground) next.push(FOREGROUND_FINALIZER);
  const same = next.length === current.length && next.every((f) => current.includes(f));
  return same ? { finalizers: current, changed: false } : { finalizers: next, changed: true };
}

/** Deletes every object the selectors match (each as `deleteObject`; one gone meanwhile is skipped). */
export async function deleteCollection(
  core: RegistryCore,
  def: KindDefinition,
  namespace: string | undefined,
  opts: ListOptions & DeleteOptions,
): Promise<KubeList> {
  const listed = listObjects(core.store, def, namespace, {
    labelSelector: opts.labelSelector,
    fieldSelector: opts.fieldSelector,
  });
  const items: KubeObject[] = [];
  for (const o of listed.items) {
    try {
      const r = await deleteObject(core, def, objectKey(def, o.metadata.namespace, o.metadata.name!), {
        dryRun: opts.dryRun,
        propagationPolicy: opts.propagationPolicy,
        gracePeriodSeconds: opts.gracePeriodSeconds,
      });
      items.push(r.object);
    } catch (e) {
      if (!(e instanceof StatusError && e.code === 404)) throw e;
    }
  }
  return {
    apiVersion: apiVersionOfDef(def),
    kind: def.listKind,
    metadata: { resourceVersion: String(core.store.currentRV) },
    items,
  };
}
