// The garbage collector: ownerReferences across every served kind, with kube's semantics
// (kubernetes/pkg/controller/garbagecollector), level-based.
//
// Each object that has ownerReferences, or the `foregroundDeletion` / `orphan` finalizer, is
// a key of one work queue; a pass re-reads it live and:
//   - deleting with `orphan`: strips its uid from every dependent's ownerReferences, then
//     removes the finalizer (the owner goes, the dependents stay);
//   - deleting with `foregroundDeletion`: deletes its dependents; removes the finalizer once
//     no dependent whose reference has `blockOwnerDeletion: true` is left;
//   - not deleting, with owners: each reference is classified by a live GET of the owner:
//     absent (404, or the same name with another uid: "dangling"), waiting (deleting with
//     `foregroundDeletion`) or solid. With a solid owner, the dangling and waiting references
//     are removed; with none, the object is deleted (Foreground when a waiting owner needs
//     its dependents gone first and it has dependents of its own, else by its own finalizers;
//     when one of those dependents waits for its own dependents, a possible cycle, its
//     references are made non-blocking first, as kube's collector does).
// The dependents of an owner come from an index over every informer (owner uid -> keys),
// so a deleted owner enqueues its dependents, and a changed dependent its owners.
// A reference to a kind this server does not serve counts as solid (never deleted).
import type { Client } from '../client/client.js';
import { isNotFound, StatusError } from '../meta/errors.js';
import type { GVR, KubeObject, OwnerReference } from '../meta/types.js';
import { realClock, type Clock } from './clock.js';
import type { Informer } from './informer.js';
import type { Manager, Runnable } from './manager.js';
import { silentLogger, type Logger } from './reconciler.js';
import { WorkQueue } from './workqueue.js';

export const FOREGROUND_FINALIZER = 'foregroundDeletion';
export const ORPHAN_FINALIZER = 'orphan';

/** One served kind, as the collector needs it. */
export interface GcResource {
  gvr: GVR;
  kind: string;
  namespaced: boolean;
}

/** The GcResources of kind definitions (anything with group, version, kind, plural, namespaced). */
export function gcResources(
  defs: { group: string; version: string; kind: string; plural: string; namespaced: boolean }[],
): GcResource[] {
  return defs.map((d) => ({
    gvr: { group: d.group, version: d.version, resource: d.plural },
    kind: d.kind,
    namespaced: d.namespaced,
  }));
}

export interface GarbageCollectorOptions {
  manager: Manager;
  client: Client;
  resources: GcResource[];
  clock?: Clock;
  log?: Logger;
  concurrency?: number;
}

interface Located {
  res: number;
  namespace: string;
  name: string;
}

type RefClass = 'solid' | 'dangling' | 'waiting';

const apiVersionOf = (g: GVR) => (g.group ? `${g.group}/${g.version}` : g.version);
const hasGcFinalizer = (o: KubeObject) =>
  (o.metadata.finalizers ?? []).some((f) => f === FOREGROUND_FINALIZER || f === ORPHAN_FINALIZER);
/** What of an object's deletion the collector acts on: deleting or not, and its GC finalizers. */
const deletionState = (o: KubeObject) =>
  `${o.metadata.deletionTimestamp ? 'd' : ''}:${(o.metadata.finalizers ?? [])
    .filter((f) => f === FOREGROUND_FINALIZER || f === ORPHAN_FINALIZER)
    .join(',')}`;

export class GarbageCollector implements Runnable {
  readonly name = 'garbage-collector';
  private readonly client: Client;
  private readonly resources: GcResource[];
  private readonly informers: Informer[];
  private readonly clock: Clock;
  private readonly log: Logger;
  private queue: WorkQueue;
  /** uid -> where the object is (every object of every informer). */
  private readonly byUid = new Map<string, Located>();
  /** owner uid -> queue keys of the objects that reference it. */
  private readonly dependents = new Map<string, Set<string>>();
  /** Passes finished, by outcome (tests, metrics). */
  readonly stats = { ok: 0, errors: 0 };
  /** Successful passes per existing object, keyed `resource/namespace/name` (tests, metrics). */
  readonly passes = new Map<string, number>();

  /** Registers the informers of every resource on `manager`; call before manager.start(). */
  constructor(private readonly opts: GarbageCollectorOptions) {
    this.client = opts.client;
    this.resources = opts.resources;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log ?? silentLogger;
    this.queue = new WorkQueue({ clock: this.clock });
    // Metadata only: the collector never reads more, and must not hold a copy of every object.
    this.informers = this.resources.map((r) => opts.manager.informer(r.gvr, { metadataOnly: true }));
    this.informers.forEach((inf, i) =>
      inf.addHandler({
        add: (o) => this.observe(i, undefined, o),
        update: (old, o) => this.observe(i, old, o),
        delete: (o) => this.forgetObject(i, o),
      }),
    );
  }

  private qkey(res: number, namespace: string, name: string): string {
    return `${res}\u0000${namespace}\u0000${name}`;
  }

  private keyOf(res: number, o: KubeObject): string {
    return this.qkey(res, o.metadata.namespace ?? '', o.metadata.name ?? '');
  }

  /**
   * An add or update seen by an informer. As kube's graph builder, only what can change a pass's
   * outcome enqueues work: an object that is new, or whose owner references, deletion or GC
   * finalizers changed, gets a pass; its dependents get one when its own deletion state changed
   * (their owner's classification); its owners get one when it changed its references and they
   * are deleting (a foreground owner waits for it). A status write, a label, a spec change, and a
   * relist's unchanged copy enqueue nothing: a pool's status write would otherwise re-read every
   * one of its sandboxes and the pool once per sandbox.
   */
  private observe(res: number, old: KubeObject | undefined, o: KubeObject): void {
    const k = this.keyOf(res, o);
    if (o.metadata.uid)
      this.byUid.set(o.metadata.uid, { res, namespace: o.metadata.namespace ?? '', name: o.metadata.name ?? '' });
    for (const r of old?.metadata.ownerReferences ?? []) this.unlink(r.uid, k);
    for (const r of o.metadata.ownerReferences ?? []) {
      let s = this.dependents.get(r.uid);
      if (!s) this.dependents.set(r.uid, (s = new Set()));
      s.add(k);
    }
    const refsChanged =
      !old || JSON.stringify(old.metadata.ownerReferences ?? []) !== JSON.stringify(o.metadata.ownerReferences ?? []);
    const deletionChanged = !old || deletionState(old) !== deletionState(o);
    if ((refsChanged || deletionChanged) && ((o.metadata.ownerReferences ?? []).length || hasGcFinalizer(o)))
      this.queue.add(k);
    // An owner that appeared or is now deleting affects its dependents' classification.
    if (deletionChanged) this.enqueueDependents(o.metadata.uid);
    // A dependent that changed its references may unblock its foreground-deleting owners.
    if (refsChanged || deletionChanged) {
      this.enqueueOwners(old, true);
      this.enqueueOwners(o, true);
    }
  }

  private passKey(key: string): string {
    const [res, ns, name] = key.split('\u0000');
    return `${this.resources[Number(res)].gvr.resource}/${ns}/${name}`;
  }

  private forgetObject(res: number, o: KubeObject): void {
    const k = this.keyOf(res, o);
    this.passes.delete(this.passKey(k));
    const uid = o.metadata.uid;
    if (uid && this.byUid.get(uid)?.res === res) this.byUid.delete(uid);
    for (const r of o.metadata.ownerReferences ?? []) this.unlink(r.uid, k);
    this.enqueueDependents(uid);
    this.enqueueOwners(o, true); // a foreground owner may have waited for it
  }

  private unlink(ownerUid: string, k: string): void {
    const s = this.dependents.get(ownerUid);
    if (!s) return;
    s.delete(k);
    if (s.size === 0) this.dependents.delete(ownerUid);
  }

  private enqueueDependents(uid: string | undefined): void {
    if (!uid) return;
    for (const d of this.dependents.get(uid) ?? []) this.queue.add(d);
  }

  /** Enqueues the owners of `o` (with `deletingOnly`: those the informers show deleting, or have not seen). */
  private enqueueOwners(o: KubeObject | undefined, deletingOnly = false): void {
    for (const r of o?.metadata.ownerReferences ?? []) {
      const at = this.byUid.get(r.uid);
      if (!at) continue;
      if (deletingOnly) {
        const cached = this.informers[at.res].cache.get(at.namespace || undefined, at.name);
        if (cached && cached.metadata.uid === r.uid && !cached.metadata.deletionTimestamp) continue;
      }
      this.queue.add(this.qkey(at.res, at.namespace, at.name));
    }
  }

  /** Waits for the informers, enqueues every candidate, then works until signal aborts. */
  async start(signal: AbortSignal): Promise<void> {
    for (const inf of this.informers) if (!(await inf.waitForSync(signal))) return;
    if (this.queue.isShuttingDown) this.queue = new WorkQueue({ clock: this.clock });
    this.informers.forEach((inf, i) => {
      for (const o of inf.cache.list())
        if ((o.metadata.ownerReferences ?? []).length || hasGcFinalizer(o)) this.queue.add(this.keyOf(i, o));
    });
    await this.queue.run((k) => this.process(k), { concurrency: this.opts.concurrency ?? 2, signal });
  }

  private async process(key: string): Promise<void> {
    try {
      await this.sync(key);
      this.queue.forget(key);
      this.stats.ok++;
      const pk = this.passKey(key);
      this.passes.set(pk, (this.passes.get(pk) ?? 0) + 1);
    } catch (e) {
      this.stats.errors++;
      this.log.error('garbage collection failed; retrying', { key: key.replaceAll('\u0000', '/'), error: String(e) });
      this.queue.addRateLimited(key);
    }
  }

  /** One level-based pass over one object (see the file comment). Idempotent. */
  private async sync(key: string): Promise<void> {
    const [resS, namespace, name] = key.split('\u0000');
    const res = this.resources[Number(resS)];
    const ns = namespace || undefined;
    let obj: KubeObject;
    try {
      obj = await this.client.get(res.gvr, ns, name);
    } catch (e) {
      if (isNotFound(e)) return;
      throw e;
    }
    const fin = obj.metadata.finalizers ?? [];
    if (obj.metadata.deletionTimestamp) {
      if (fin.includes(ORPHAN_FINALIZER)) await this.orphanDependents(obj, res);
      else if (fin.includes(FOREGROUND_FINALIZER)) await this.deleteDependents(obj, res);
      return;
    }
    const refs = obj.metadata.ownerReferences ?? [];
    if (!refs.length) return;
    const classes = await Promise.all(refs.map((r) => this.classify(r, obj, res)));
    const solid = refs.filter((_, i) => classes[i] === 'solid');
    if (solid.length) {
      const drop = new Set(refs.filter((_, i) => classes[i] !== 'solid').map((r) => r.uid));
      if (drop.size)
        await this.setOwnerRefs(
          res,
          obj,
          refs.filter((r) => !drop.has(r.uid)),
        );
      return;
    }
    const waiting = classes.includes('waiting');
    let policy: 'Background' | 'Foreground' | 'Orphan' = 'Background';
    const deps = waiting ? await this.liveDependents(obj, res) : [];
    if (deps.length) {
      policy = 'Foreground';
      // A dependent that waits for its own dependents may be waiting for this object (a
      // cycle of blocking references): as kube, this object's references stop blocking its
      // owners first, so neither waits for the other (false positives are harmless).
      if (
        deps.some(
          (d) => d.obj.metadata.deletionTimestamp && (d.obj.metadata.finalizers ?? []).includes(FOREGROUND_FINALIZER),
        )
      )
        await this.setOwnerRefs(
          res,
          obj,
          refs.map((r) => (r.blockOwnerDeletion ? { ...r, blockOwnerDeletion: false } : r)),
        );
    } else if (fin.includes(ORPHAN_FINALIZER)) policy = 'Orphan';
    else if (fin.includes(FOREGROUND_FINALIZER)) policy = 'Foreground';
    this.log.info('garbage collecting', { resource: res.gvr.resource, namespace, name, policy });
    await this.deleteObject(res, obj, policy);
  }

  /** Where an owner reference points: the resource serving its apiVersion and kind. */
  private resolve(ref: OwnerReference): GcResource | undefined {
    return this.resources.find((r) => r.kind === ref.kind && apiVersionOf(r.gvr) === ref.apiVersion);
  }

  private async classify(ref: OwnerReference, dependent: KubeObject, depRes: GcResource): Promise<RefClass> {
    const res = this.resolve(ref);
    if (!res) return 'solid';
    // A cluster-scoped dependent cannot have a namespaced owner (kube: OwnerRefInvalidNamespace).
    if (res.namespaced && !depRes.namespaced) return 'dangling';
    const ns = res.namespaced ? dependent.metadata.namespace : undefined;
    let owner: KubeObject;
    try {
      owner = await this.client.get(res.gvr, ns, ref.name);
    } catch (e) {
      if (isNotFound(e)) return 'dangling';
      throw e;
    }
    if (owner.metadata.uid !== ref.uid) return 'dangling';
    if (owner.metadata.deletionTimestamp && (owner.metadata.finalizers ?? []).includes(FOREGROUND_FINALIZER))
      return 'waiting';
    return 'solid';
  }

  /** The dependents of owner that exist now and still reference its uid (live reads). */
  private async liveDependents(
    owner: KubeObject,
    ownerRes: GcResource,
  ): Promise<{ res: GcResource; obj: KubeObject; ref: OwnerReference }[]> {
    const uid = owner.metadata.uid!;
    const out: { res: GcResource; obj: KubeObject; ref: OwnerReference }[] = [];
    for (const k of [...(this.dependents.get(uid) ?? [])]) {
      const [resS, namespace, name] = k.split('\u0000');
      const res = this.resources[Number(resS)];
      // Owners and dependents share a namespace, or the owner is cluster-scoped.
      if (ownerRes.namespaced && namespace !== (owner.metadata.namespace ?? '')) continue;
      let obj: KubeObject;
      try {
        obj = await this.client.get(res.gvr, namespace || undefined, name);
      } catch (e) {
        if (isNotFound(e)) continue;
        throw e;
      }
      const ref = (obj.metadata.ownerReferences ?? []).find((r) => r.uid === uid);
      if (ref) out.push({ res, obj, ref });
    }
    return out;
  }

  private async orphanDependents(owner: KubeObject, ownerRes: GcResource): Promise<void> {
    const uid = owner.metadata.uid!;
    for (const d of await this.liveDependents(owner, ownerRes))
      await this.setOwnerRefs(
        d.res,
        d.obj,
        (d.obj.metadata.ownerReferences ?? []).filter((r) => r.uid !== uid),
      );
    await this.removeFinalizer(ownerRes, owner, ORPHAN_FINALIZER);
  }

  private async deleteDependents(owner: KubeObject, ownerRes: GcResource): Promise<void> {
    const deps = await this.liveDependents(owner, ownerRes);
    // Dependents are deleted by their own pass (their owner now counts as waiting); here the
    // owner only waits for the ones that block it.
    for (const d of deps)
      if (!d.obj.metadata.deletionTimestamp) this.queue.add(this.keyOf(this.resources.indexOf(d.res), d.obj));
    if (deps.some((d) => d.ref.blockOwnerDeletion)) return;
    await this.removeFinalizer(ownerRes, owner, FOREGROUND_FINALIZER);
  }

  private async setOwnerRefs(res: GcResource, obj: KubeObject, refs: OwnerReference[]): Promise<void> {
    await this.client.patch(res.gvr, obj.metadata.namespace || undefined, obj.metadata.name!, 'merge', {
      metadata: { resourceVersion: obj.metadata.resourceVersion, ownerReferences: refs.length ? refs : null },
    });
  }

  private async removeFinalizer(res: GcResource, obj: KubeObject, f: string): Promise<void> {
    const rest = (obj.metadata.finalizers ?? []).filter((x) => x !== f);
    await this.client.patch(res.gvr, obj.metadata.namespace || undefined, obj.metadata.name!, 'merge', {
      metadata: { resourceVersion: obj.metadata.resourceVersion, finalizers: rest.length ? rest : null },
    });
  }

  private async deleteObject(
    res: GcResource,
    obj: KubeObject,
    policy: 'Background' | 'Foreground' | 'Orphan',
  ): Promise<void> {
    try {
      await this.client.delete(res.gvr, obj.metadata.namespace || undefined, obj.metadata.name!, {
        propagationPolicy: policy,
        preconditions: { uid: obj.metadata.uid },
      });
    } catch (e) {
      // Gone already, or replaced by a new object of the same name (another uid): not ours.
      if (isNotFound(e) || (e instanceof StatusError && e.code === 409 && /UID in precondition/.test(e.message)))
        return;
      throw e;
    }
  }
}
