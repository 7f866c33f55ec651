// The one finalizer helper (after kube-rs `finalizer()`): every reconcile of a kind with
// cleanup work goes through it, with two idempotent branches.
//   not deleting: make sure `name` is in metadata.finalizers (a patch), then apply(obj);
//   deleting:     if `name` is still there, cleanup(obj), then remove `name` (a patch);
//                 if it is gone already, nothing to do.
// Both patches carry the resourceVersion read, so a concurrent change answers 409 and the
// reconcile is retried on fresh data instead of clobbering another finalizer list.
import type { Client } from '../client/client.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { done, type Result } from './reconciler.js';

export interface FinalizerHandlers<T extends KubeObject> {
  /** Converge the live object. Runs only when the finalizer is in place. */
  apply(obj: T): Promise<Result>;
  /** Release what apply created. Must be idempotent: it may run again after a crash. */
  cleanup(obj: T): Promise<Result | void>;
}

/**
 * Runs the right branch for obj. Errors from apply/cleanup or the patches propagate (the
 * controller retries). A cleanup that returns requeueAfter keeps the finalizer and asks to
 * be called again (cleanup still in progress). Safe to call any number of times.
 */
export async function finalize<T extends KubeObject>(
  client: Client,
  gvr: GVR,
  obj: T,
  name: string,
  handlers: FinalizerHandlers<T>,
): Promise<Result> {
  const finalizers = obj.metadata.finalizers ?? [];
  const has = finalizers.includes(name);
  const ns = obj.metadata.namespace || undefined;
  if (obj.metadata.deletionTimestamp) {
    if (!has) return done();
    const r = await handlers.cleanup(obj);
    if (r && r.requeueAfterMs !== undefined) return r;
    await client.patch(gvr, ns, obj.metadata.name!, 'merge', {
      metadata: { resourceVersion: obj.metadata.resourceVersion, finalizers: finalizers.filter((f) => f !== name) },
    });
    return done();
  }
  if (!has) {
    obj = await client.patch<T>(gvr, ns, obj.metadata.name!, 'merge', {
      metadata: { resourceVersion: obj.metadata.resourceVersion, finalizers: [...finalizers, name] },
    });
  }
  return handlers.apply(obj);
}
