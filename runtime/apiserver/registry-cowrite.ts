// Create co-writes: a kind's server-side step at create that also writes other objects in the same
// store batch, as kube-apiserver's REST storage of a Pod binding or a ServiceAccount token writes
// more than the one object. The registry knows nothing of the kinds involved: a `CreateCoWriter`
// (given in RegistryOptions by the composition root) reads the store's newest state, and returns
// the created object's status and metadata-only updates of other objects. The registry checks
// each update (only labels, annotations and ownerReferences changed, valid metadata, the
// resourceVersion it was read at), records managedFields, and stages the updates with
// compare-and-swap on that resourceVersion, in the same synchronous run as the read and right
// before the create itself: nothing can write between the read and the staging (one event loop),
// and the create and its co-writes are committed in one transaction (one fsync).
//
// A plan the checks refuse is dropped whole: the create is stored as it would be without a
// co-writer (its controller does the rest). Dry runs never reach a co-writer.
import type { KindDefinition } from '../../apis/types.js';
import { validateMetadata } from './admission/metadata.js';
import type { KubeObject } from '../meta/types.js';
import type { ObjectKey } from '../store/store.js';
import { deepEqual } from './patch.js';
import type { CoWriteUpdate, CreateCoWriter } from './registry-types.js';
import { managedFieldsFor, type RegistryCore } from './registry-write.js';

const FREE_META = ['labels', 'annotations', 'ownerReferences'] as const;

/** The object without the metadata a co-write may change (and without managedFields). */
function fixedPart(o: KubeObject): KubeObject {
  const meta: Record<string, unknown> = { ...o.metadata };
  for (const f of FREE_META) delete meta[f];
  delete meta.managedFields;
  return { ...o, metadata: meta } as KubeObject;
}

/**
 * Runs the co-writer of `def` (if any) for the create of `obj` under `key`: stages its checked
 * updates and sets `obj.status` to the plan's. Returns whether it did. Synchronous by contract.
 */
export function stageCoWrites(
  core: RegistryCore,
  writers: readonly CreateCoWriter[] | undefined,
  def: KindDefinition,
  key: ObjectKey,
  obj: KubeObject,
): boolean {
  const w = writers?.find((x) => x.group === def.group && x.resource === def.plural);
  if (!w) return false;
  const store = core.store;
  // The create itself would fail (AlreadyExists): stage nothing for it.
  if (store.getLatest(key)) return false;
  const reads: Parameters<CreateCoWriter['plan']>[1] = {
    get: (k) => store.getLatest(k),
    list: (group, resource, namespace) => store.iterate(group, resource, { namespace }),
  };
  let plan: ReturnType<CreateCoWriter['plan']>;
  try {
    plan = w.plan(obj, reads);
  } catch {
    return false; // a writer's bug: the plain create
  }
  if (!plan) return false;
  const staged: { u: CoWriteUpdate; next: KubeObject; rv: string }[] = [];
  for (const u of plan.updates) {
    const old = store.getLatest(u.key);
    const rv = old?.metadata.resourceVersion;
    if (!old || !rv || u.object.metadata.resourceVersion !== rv) return false;
    if (!deepEqual(fixedPart(old), fixedPart(u.object))) return false;
    if (
      validateMetadata(u.object.metadata, {
        namespaced: u.def.namespaced,
        isNamespace: false,
        pathSegmentNames: core.strategy(u.def).nameRule === 'pathSegment',
      }).length
    )
      return false;
    const next = JSON.parse(JSON.stringify(u.object)) as KubeObject;
    const mf = managedFieldsFor(core, u.def, old, next, old.metadata.managedFields, u.manager, undefined);
    if (mf) next.metadata.managedFields = mf;
    else delete next.metadata.managedFields;
    staged.push({ u, next, rv });
  }
  staged.forEach((s, i) => {
    // Compare-and-swap on the resourceVersion read above, in this same synchronous run: it cannot
    // conflict. A failure of the batch fails the create too (same transaction).
    try {
      core.store.enqueueUpdate(s.u.key, s.next, s.rv, { maxBytes: core.maxBytes }).catch(() => undefined);
    } catch (e) {
      if (i > 0) throw e; // some staged already: the create must not go on as if none were
      staged.length = 0;
    }
  });
  if (!staged.length && plan.updates.length) return false;
  (obj as { status?: unknown }).status = plan.status;
  return true;
}
