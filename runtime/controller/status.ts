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
// A re-read can still show the version that just conflicted: the newer write is staged in the
// store and not yet committed (visible to reads once its fsync is done). Re-applying on that
// would conflict again at once, so the helper then waits for the object's next watch event
// (from the resourceVersion it holds, at most STAGED_WAIT_MS on the clock) and reads again:
// event-driven, no polling.
//
// The mutation is a function of the current object and must be pure (it may run more than
// once); it returns the complete next status, or undefined for "nothing to write" (the
// current object is returned, no request is made).
import type { Client, WatchHandle } from '../client/client.js';
import { isConflict } from '../meta/errors.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { realClock, type Clock } from './clock.js';
import { silentLogger, type Logger } from './reconciler.js';

/** Attempts of one writeStatus call (the first write plus re-read-and-retry rounds). */
export const MAX_STATUS_ATTEMPTS = 5;
/** How long a re-read that still shows the conflicting version waits for the newer one's event. */
export const STAGED_WAIT_MS = 2000;

export type StatusOf<T extends KubeObject> = NonNullable<T['status']>;

export interface WriteStatusOptions {
  /** Attempts before the Conflict is thrown (default MAX_STATUS_ATTEMPTS). */
  attempts?: number;
  /** Conflicts are logged at debug level through it (the controller's logger). */
  log?: Logger;
  /** The clock of the wait for a staged write (default: real time). */
  clock?: Clock;
  /** The field manager the write is recorded under (default: the client's). */
  fieldManager?: string;
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
      const wo = opts.fieldManager ? { fieldManager: opts.fieldManager } : undefined;
      return await client.updateStatus<T>(gvr, ns, { ...current, status: next }, wo);
    } catch (e) {
      if (!isConflict(e) || attempt >= attempts) throw e;
      log.debug?.('status write conflicted; re-reading and re-applying', {
        resource: gvr.resource,
        namespace: ns,
        name: obj.metadata.name,
        resourceVersion: current.metadata.resourceVersion,
        attempt,
      });
      const stale = current.metadata.resourceVersion;
      current = await client.get<T>(gvr, ns, obj.metadata.name!);
      if (stale !== undefined && current.metadata.resourceVersion === stale) {
        await nextVersion(client, gvr, ns, obj.metadata.name!, stale, opts.clock ?? realClock);
        current = await client.get<T>(gvr, ns, obj.metadata.name!);
      }
    }
  }
}

/**
 * Resolves once the object changed after resourceVersion `rv` (its watch delivers an event),
 * the watch ended, or STAGED_WAIT_MS passed on the clock: the caller reads it again.
 */
function nextVersion(
  client: Client,
  gvr: GVR,
  ns: string | undefined,
  name: string,
  rv: string,
  clock: Clock,
): Promise<void> {
  return new Promise<void>((resolve) => {
    let settled = false;
    let w: WatchHandle | undefined;
    const finish = () => {
      if (settled) return;
      settled = true;
      timer.cancel();
      w?.stop();
      resolve();
    };
    const timer = clock.setTimeout(finish, STAGED_WAIT_MS);
    w = client.watch(gvr, ns, { fieldSelector: `metadata.name=${name}`, resourceVersion: rv }, (ev) => {
      if (ev.type !== 'BOOKMARK') finish();
    });
    if (settled) w.stop();
    void w.done.then(finish);
  });
}
