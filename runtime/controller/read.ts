// Reads of related objects inside a reconcile: the shared informer's cache, the API on a miss.
// A miss (not in the cache, or the cache has not synced yet) is never taken for "absent": the
// object may be newer than the cache (just created), so the API answers. A hit may be a little
// stale; callers use this only for kinds their controller watches, so the newer version
// re-runs the key. Reads that must see what is stored now go to the API instead
// (controllers/README.md "Reads").
import { getIfExists, type Client } from '../client/client.js';
import type { GVR, KubeObject } from '../meta/types.js';
import { realClock, type Clock, type TimerHandle } from './clock.js';
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
 * controller's own last write of the object is not used (read-your-writes): the write's own
 * answer is, as what the API held when it answered (a write by someone else since then brings its
 * own watch event and pass, as with a cached copy), so the pass that a controller's writes echo back
 * to it costs no GET; over a remote API server (a node agent, `fluxctl controller`) that GET was a
 * round trip and a request at the server while it delivered the write to every watch. A delete's
 * answer is not kept (the object may be gone): the API answers. resourceVersions are compared as
 * the integers this server issues (runtime/apiserver: one global sequence); an object kube would
 * call opaque is ours to compare here. Only writes in flight are held: an entry goes once the
 * cache has caught up, its answer after KEEP_ANSWER_MS (then the API answers), and the entry itself
 * after FORGET_MS, by the next call or, for a controller gone idle, a timer. Without that last
 * bound a write whose object no pass reads back (a child the controller made) stayed, with its
 * answer, for the life of the process; a cache five minutes behind is a broken watch, which the
 * informer replaces by a relist.
 */
export class OwnWrites {
  // Both in the order written (an entry rewritten moves to the end), so the expired ones are at the front.
  private readonly written = new Map<string, { rv: bigint; at: number }>();
  private readonly answers = new Map<string, { answer: KubeObject; at: number }>();
  /** How long a write's answer stands in for a lagging cache (then the API answers). */
  static readonly KEEP_ANSWER_MS = 10_000;
  /** How long a write is remembered at all. */
  static readonly FORGET_MS = 300_000;

  private sweep: TimerHandle | undefined;
  private sweepDue = Infinity;

  constructor(private readonly clock: Clock = realClock) {}

  private now(): number {
    return this.clock.now();
  }

  /** Arms the timer for the first expiry (the oldest answer's or write's), unless one is armed for sooner. */
  private armSweep(): void {
    const a = this.answers.values().next().value;
    const w = this.written.values().next().value;
    const due = Math.min(
      a ? a.at + OwnWrites.KEEP_ANSWER_MS + 1 : Infinity,
      w ? w.at + OwnWrites.FORGET_MS + 1 : Infinity,
    );
    if (due === Infinity || due >= this.sweepDue) return;
    this.sweep?.cancel();
    this.sweepDue = due;
    this.sweep = this.clock.setTimeout(() => {
      this.sweep = undefined;
      this.sweepDue = Infinity;
      this.expire(this.now());
      this.armSweep();
    }, due - this.now());
  }

  private static key(gvr: GVR, namespace: string | undefined, name: string): string {
    return `${gvr.group}/${gvr.resource}/${namespace ?? ''}/${name}`;
  }

  private static rv(o: KubeObject | undefined): bigint | undefined {
    const v = o?.metadata?.resourceVersion;
    return v && /^\d+$/.test(v) ? BigInt(v) : undefined;
  }

  /** How many writes (and kept answers) are remembered. */
  get size(): { writes: number; answers: number } {
    this.expire(this.now());
    return { writes: this.written.size, answers: this.answers.size };
  }

  private expire(now: number): void {
    for (const [k, e] of this.answers) {
      if (now - e.at <= OwnWrites.KEEP_ANSWER_MS) break;
      this.answers.delete(k);
    }
    for (const [k, e] of this.written) {
      if (now - e.at <= OwnWrites.FORGET_MS) break;
      this.written.delete(k);
    }
  }

  /** Notes the object a write of this controller returned (`keep`: it may stand in for the cache). */
  record(gvr: GVR, o: KubeObject | undefined, keep = false): void {
    const rv = OwnWrites.rv(o);
    if (rv === undefined || !o?.metadata?.name) return;
    const now = this.now();
    this.expire(now);
    const k = OwnWrites.key(gvr, o.metadata.namespace, o.metadata.name);
    const prev = this.written.get(k);
    if (prev !== undefined && rv <= prev.rv) return;
    this.written.delete(k);
    this.written.set(k, { rv, at: now });
    this.answers.delete(k);
    if (keep) this.answers.set(k, { answer: o, at: now });
    this.armSweep();
  }

  /** Whether `cached` is older than this controller's last write of it (forgets writes it has caught up with). */
  behind(gvr: GVR, cached: KubeObject): boolean {
    return this.newer(gvr, cached) !== undefined;
  }

  /**
   * Undefined when `cached` is as new as this controller's last write of it (the entry is then
   * forgotten); else that write's answer while it is kept, or null (the API must answer).
   */
  newer(gvr: GVR, cached: KubeObject): KubeObject | null | undefined {
    this.expire(this.now());
    const k = OwnWrites.key(gvr, cached.metadata.namespace, cached.metadata.name!);
    const mine = this.written.get(k);
    if (mine === undefined) return undefined;
    const have = OwnWrites.rv(cached);
    if (have !== undefined && have >= mine.rv) {
      this.written.delete(k);
      this.answers.delete(k);
      return undefined;
    }
    return this.answers.get(k)?.answer ?? null;
  }

  /** `client` with every write's answer recorded. */
  wrap(client: Client): Client {
    const note = <T extends KubeObject>(gvr: GVR, p: Promise<T>, keep = true): Promise<T> =>
      p.then((o) => {
        this.record(gvr, o, keep);
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
      delete: (gvr, ns, name, opts) => note(gvr, client.delete(gvr, ns, name, opts), false),
    };
  }
}

/**
 * The object a reconcile pass works on: the informer's cached copy (deep-copied: a pass may
 * change what it read) when the cache has synced, holds it, and is not behind this
 * controller's own last write of it; when it is behind, that write's answer (OwnWrites);
 * otherwise the API (undefined only when it says NotFound).
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
  const copy = (o: KubeObject) => JSON.parse(JSON.stringify(o)) as T;
  if (!hit) return getIfExists<T>(client, gvr, key.namespace, key.name);
  if (!writes) return copy(hit);
  const newer = writes.newer(gvr, hit);
  if (newer === undefined) return copy(hit);
  if (newer) return copy(newer);
  return getIfExists<T>(client, gvr, key.namespace, key.name);
}
