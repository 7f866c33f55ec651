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
export async function cachedGet<T extends KubeObject>(
  client: Client,
  gvr: GVR,
  namespace: string | undefined,
  name: string,
  informer?: Informer<T>,
): Promise<T | undefined> {
  const hit = informer?.hasSynced() ? informer.cache.get(namespace, name) : undefined;
  return hit ?? getIfExists<T>(client, gvr, namespace, name);
}

/**
 * The resourceVersions a controller's own writes produced, per object. An informer delivers
 * a write some time after the write returns; background work that ends re-enqueues its key at
 * once, so the next pass can find the cache one write behind. A cached copy older than the
 * controller's own last write of the object is not used (read-your-writes); the API answers.
 * resourceVersions are compared as the integers this server issues (runtime/apiserver: one
 * global sequence); an object kube would call opaque is ours to compare here. Entries go once
 * the cache has caught up, so the map holds only writes in flight.
 */
export class OwnWrites {
  private readonly written = new Map<string, bigint>();

  private static key(gvr: GVR, namespace: string | undefined, name: string): string {
    return `${gvr.group}/${gvr.resource}/${namespace ?? ''}/${name}`;
  }

  private static rv(o: KubeObject | undefined): bigint | undefined {
    const v = o?.metadata?.resourceVersion;
    return v && /^\d+$/.test(v) ? BigInt(v) : undefined;
  }

  /** Notes the object a write of this controller returned. */
  record(gvr: GVR, o: KubeObject | undefined): void {
    const rv = OwnWrites.rv(o);
    if (rv === undefined || !o?.metadata?.name) return;
    const k = OwnWrites.key(gvr, o.metadata.namespace, o.metadata.name);
    const prev = this.written.get(k);
    if (prev === undefined || rv > prev) this.written.set(k, rv);
  }

  /** Whether `cached` is older than this controller's last write of it (forgets writes it has caught up with). */
  behind(gvr: GVR, cached: KubeObject): boolean {
    const k = OwnWrites.key(gvr, cached.metadata.namespace, cached.metadata.name!);
    const mine = this.written.get(k);
    if (mine === undefined) return false;
    const have = OwnWrites.rv(cached);
    if (have !== undefined && have >= mine) {
      this.written.delete(k);
      return false;
    }
    return true;
  }

  /** `client` with every write's answer recorded. */
  wrap(client: Client): Client {
    const note = <T extends KubeObject>(gvr: GVR, p: Promise<T>): Promise<T> =>
      p.then((o) => {
        this.record(gvr, o);
        return o;
      });
    return {
      get: (...a) => client.get(...a),
      list: (...a) => client.list(...a),
      watch: (...a) => client.watch(...a),
      create: (gvr, ns, obj, opts) => note(gvr, client.create(gvr, ns, obj, opts)),
      update: (gvr, ns, obj, opts) => note(gvr, client.update(gvr, ns, obj, opts)),
      updateStatus: (gvr, ns, obj, opts) => note(gvr, client.updateStatus(gvr, ns, obj, opts)),
      patch: (gvr, ns, name, type, patch, opts) => note(gvr, client.patch(gvr, ns, name, type, patch, opts)),
      delete: (gvr, ns, name, opts) => note(gvr, client.delete(gvr, ns, name, opts)),
    };
  }
}

/**
 * The object a reconcile pass works on: the informer's cached copy (deep-copied: a pass may
 * change what it read) when the cache has synced, holds it, and is not behind this
 * controller's own last write of it; otherwise the API (undefined only when it says NotFound).
 */
export async function primaryGet<T extends KubeObject>(
  client: Client,
  gvr: GVR,
  key: { namespace?: string; name: string },
  informer?: Informer<T>,
  writes?: OwnWrites,
): Promise<T | undefined> {
  const hit = informer?.hasSynced() ? informer.cache.get(key.namespace, key.name) : undefined;
  // A private copy (the pass may mutate it): a JSON round trip, about twice as fast as structuredClone on these plain
  // objects.
  if (hit && !writes?.behind(gvr, hit)) return JSON.parse(JSON.stringify(hit)) as T;
  return getIfExists<T>(client, gvr, key.namespace, key.name);
}
