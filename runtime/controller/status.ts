// The one status write of every controller (controllers/ and the namespace controller).
//
// Style: optimistic concurrency. Every write is a PUT of the status subresource carrying the
// resourceVersion of the object the new status was computed from. A 409 Conflict means the
// object changed underneath (another controller's pass, a spec.decision through a
// subresource, a label, a concurrent status write): the helper re-reads the object from the
// API (not the informer cache, which may still hold the stale copy and would conflict again)
// and calls the caller's mutation again on what is really stored, a bounded number of times
// (MAX_STATUS_ATTEMPTS). After that the last Conflict is thrown and the controller's
// rate-limited retry takes over.
//
// Why this and not a merge patch without a precondition, or server-side apply: a blind merge
// patch overwrites whatever another writer put into the same field (a conditions list is
// replaced whole), so one of two concurrent writes is silently lost; server-side apply would
// need managedFields ownership the registry does not track for status. With the precondition
// nothing is lost: the mutation is recomputed from the newest object, so the other writer's
// change (a label, a condition, spec.decision) survives next to ours.
//
// The mutation is a function of the current object and must be pure (it may run more than
// once); it returns the complete next status, or undefined for "nothing to write" (the
// current object is returned, no request is made).
import type { Client } from '../client/client.js';
import { isConflict } from '../meta/errors.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { silentLogger, type Logger } from './reconciler.js';

/** Attempts of one writeStatus call (the first write plus re-read-and-retry rounds). */
export const MAX_STATUS_ATTEMPTS = 5;

export type StatusOf<T extends KubeObject> = NonNullable<T['status']>;

export interface WriteStatusOptions {
  /** Attempts before the Conflict is thrown (default MAX_STATUS_ATTEMPTS). */
  attempts?: number;
  /** Conflicts are logged at debug level through it (the controller's logger). */
  log?: Logger;
}

/**
 * Writes mutate(obj)'s status with obj's resourceVersion as precondition; on 409 Conflict
 * re-reads the object from the API and writes mutate(newest), up to `attempts` times.
 * Returns the stored object. Errors other than Conflict (NotFound, Invalid) are thrown at once.
 */
export async function writeStatus<T extends KubeObject>(
  client: Client,
  gvr: GVR,
  obj: T,
  mutate: (current: T) => StatusOf<T> | undefined,
  opts: WriteStatusOptions = {},
): Promise<T> {
  const attempts = Math.max(1, opts.attempts ?? MAX_STATUS_ATTEMPTS);
  const log = opts.log ?? silentLogger;
  const ns = obj.metadata.namespace || undefined;
  let current = obj;
  for (let attempt = 1; ; attempt++) {
    const next = mutate(current);
    if (next === undefined) return current;
    try {
      return await client.updateStatus<T>(gvr, ns, { ...current, status: next });
    } catch (e) {
      if (!isConflict(e) || attempt >= attempts) throw e;
      log.debug?.('status write conflicted; re-reading and re-applying', {
        resource: gvr.resource,
        namespace: ns,
        name: obj.metadata.name,
        resourceVersion: current.metadata.resourceVersion,
        attempt,
      });
      current = await client.get<T>(gvr, ns, obj.metadata.name!);
    }
  }
}
