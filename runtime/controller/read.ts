// Reads of related objects inside a reconcile: the shared informer's cache, the API on a miss.
// A miss (not in the cache, or the cache has not synced yet) is never taken for "absent": the
// object may be newer than the cache (just created), so the API answers. A hit may be a little
// stale; callers use this only for kinds their controller watches, so the newer version
// re-runs the key. Reads that must see what is stored now go to the API instead
// (controllers/README.md "Reads").
import { getIfExists, type Client } from '../client/client.js';
import type { GVR, KubeObject } from '../meta/types.js';
import type { Informer } from './informer.js';

/**
 * The object from `informer`'s cache, else from the API (also when no informer is given or it
 * has not synced); undefined only when the API says NotFound. Errors are thrown as get throws them.
 */
export async function cachedGet<T extends KubeObject>(client: Client, gvr: GVR, namespace: string | undefined, name: string, informer?: Informer<T>): Promise<T | undefined> {
  const hit = informer?.hasSynced() ? informer.cache.get(namespace, name) : undefined;
  return hit ?? getIfExists<T>(client, gvr, namespace, name);
}
