// The registry: every semantic of the API between decoded requests and the object store
// (see registry-types.ts for the contract and docs/reference/kubernetes-api.md for the
// behaviour). Server-owned metadata, namespaces, admission, generation, the status split,
// preconditions, finalizers, managedFields, dryRun, selectors, pagination and watch.
//
// Concurrency: writes are staged in the store synchronously with compare-and-swap on the
// resourceVersion they were computed from, and acknowledged once their group commit is
// durable. Admission may be async, so a write whose base changed meanwhile is recomputed on
// the newest state (kube's GuaranteedUpdate), unless the client gave a resourceVersion
// precondition: then 409 Conflict. Reads (get/list/watch) see committed state only.
//
// This file is the facade and the namespace bookkeeping; the parts live beside it:
// registry-strategy.ts (every kind-specific rule), registry-write.ts (what the writes share),
// registry-create.ts, registry-update.ts (update, patch, apply), registry-delete.ts,
// registry-read.ts (list, watch), registry-meta.ts (pure helpers).
//
// Errors: every failure is a StatusError; malformed input is 4xx, never 500.
import { randomUUID } from 'node:crypto';
import type { KindDefinition } from '../../apis/types.js';
import type {
  DeleteOptions,
  ListOptions,
  PatchOptions,
  PatchType,
  WatchOptions,
  WriteOptions,
} from '../client/client.js';
import { errors, StatusError } from '../meta/errors.js';
import type { GVR, KubeList, KubeObject } from '../meta/types.js';
import { StoreConflict, type Store } from '../store/store.js';
import { admit as schemaAdmit } from './admission/index.js';
import type { QuotaAdmission } from './admission/quota.js';
import { createObject } from './registry-create.js';
import { requestDigest, type CreateIdempotency } from './idempotency.js';
import { deleteCollection, deleteObject } from './registry-delete.js';
import { defaultFieldManager, type FieldManagerHooks } from './registry-fields.js';
import { DEFAULT_MAX_BYTES, NAMESPACE_KIND } from './registry-meta.js';
import { listObjects, startWatch } from './registry-read.js';
import { strategyFor } from './registry-strategy.js';
import type {
  AdmitFn,
  CreateCoWriter,
  DeleteResult,
  RegistryApi,
  RequestContext,
  WatchStream,
  WriteGuard,
  WriteResult,
} from './registry-types.js';
import { patchObject, updateObject } from './registry-update.js';
import { notFound, objectKey, requireNamespace, type RegistryCore } from './registry-write.js';

export { NAMESPACE_KIND, INITIAL_EVENTS_END } from './registry-meta.js';
export { FOREGROUND_FINALIZER, ORPHAN_FINALIZER } from './registry-delete.js';
export type { AdmitFn, AdmitOptions, WriteGuard } from './registry-types.js';
export type { CoWriteReads, CoWriteUpdate, CreateCoWriter } from './registry-types.js';

export interface RegistryOptions {
  store: Store;
  /** Refuses writes the requesting user may not make (field-level authorization). */
  guard?: WriteGuard;
  kinds: KindDefinition[];
  /** Defaults to runtime/apiserver/admission (prune, defaults, schema, CEL). */
  admit?: AdmitFn;
  /** managedFields computation; defaults to runtime/apiserver/fieldmanager through registry-fields.ts. */
  fieldManager?: FieldManagerHooks;
  now?: () => Date;
  /** Interval of BOOKMARK events for watches that allow them (default 60 s). */
  bookmarkIntervalMs?: number;
  /** Largest stored object, serialized (default 3 MiB, as etcd). */
  maxObjectBytes?: number;
  /** Where creates with an Idempotency-Key are recorded (idempotency.ts); without it the header is ignored. */
  idempotency?: CreateIdempotency;
  /** ResourceQuota admission (admission/quota.ts); without it quotas are stored but not enforced. */
  quota?: Pick<QuotaAdmission, 'charge'>;
  /** Kinds' create co-writes (registry-cowrite.ts), e.g. a SandboxClaim bound to a warm Sandbox at its create. */
  coWriters?: CreateCoWriter[];
}

export class Registry implements RegistryApi {
  private readonly store: Store;
  private readonly defs: KindDefinition[];
  private readonly now: () => Date;
  private readonly bookmarkMs: number;
  private readonly nsDef: KindDefinition;
  private readonly core: RegistryCore;
  private readonly idempotency?: CreateIdempotency;
  /** Namespace name -> terminating. */
  private readonly namespaces = new Map<string, boolean>();

  /**
   * Builds the registry over an open store and ensures the `default` namespace exists
   * (idempotent across restarts). Throws only if the store fails.
   */
  constructor(opts: RegistryOptions) {
    this.store = opts.store;
    this.idempotency = opts.idempotency;
    const ns = opts.kinds.find((k) => k.group === '' && k.plural === 'namespaces');
    this.nsDef = ns ?? NAMESPACE_KIND;
    this.defs = ns ? [...opts.kinds] : [NAMESPACE_KIND, ...opts.kinds];
    const admitFn: AdmitFn =
      opts.admit ??
      ((def, obj, old, o) =>
        schemaAdmit(def, obj, old, { fieldValidation: o.fieldValidation ?? 'Warn', subresource: o.subresource }));
    this.now = opts.now ?? (() => new Date());
    this.bookmarkMs = opts.bookmarkIntervalMs ?? 60_000;
    this.core = {
      store: this.store,
      fm: opts.fieldManager ?? defaultFieldManager,
      guard: opts.guard,
      quota: opts.quota,
      coWriters: opts.coWriters,
      maxBytes: opts.maxObjectBytes ?? DEFAULT_MAX_BYTES,
      timestamp: () => this.timestamp(),
      admit: async (def, obj, old, o) => {
        const r = await admitFn(def, obj, old, o);
        return { object: r.object, warnings: r.warnings ?? [] };
      },
      strategy: strategyFor,
      checkNamespaceWritable: (def, namespace, creating) => this.checkNamespaceWritable(def, namespace, creating),
    };
    // Namespace existence is checked on every namespaced write: keep it in memory, fed by the
    // store's synchronous fan-out so it is never stale.
    for (const o of this.store.iterate('', this.nsDef.plural))
      this.namespaces.set(o.metadata.name!, !!o.metadata.deletionTimestamp);
    this.store.subscribe((ev) => {
      if (ev.key.group !== '' || ev.key.resource !== this.nsDef.plural) return;
      if (ev.type === 'DELETED') this.namespaces.delete(ev.key.name);
      else this.namespaces.set(ev.key.name, !!ev.object.metadata.deletionTimestamp);
    });
    this.ensureNamespace('default');
  }

  /** Creates a namespace directly in the store when missing (start-up, not an API call). */
  ensureNamespace(name: string): void {
    const key = objectKey(this.nsDef, undefined, name);
    if (this.store.get(key)) return;
    const obj: KubeObject = {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name, uid: randomUUID(), creationTimestamp: this.timestamp(), generation: 1 },
    };
    // The namespace as a create through the API would make it (finalizer, phase, name label).
    const strategy = strategyFor(this.nsDef);
    strategy.prepareForCreate(obj);
    strategy.canonicalize(obj);
    try {
      this.store.create(key, obj);
    } catch (e) {
      // Exists already; or the disk is full (the store serves reads and deletes only): later.
      if (!(e instanceof StoreConflict) && !(e instanceof StatusError && e.code === 507)) throw e;
    }
  }

  kinds(): KindDefinition[] {
    return [...this.defs];
  }

  kindFor(gvr: GVR): KindDefinition | undefined {
    const r = gvr.resource.toLowerCase();
    const inGV = this.defs.filter((d) => d.group === gvr.group && d.version === gvr.version);
    return (
      inGV.find((d) => d.plural === r) ??
      inGV.find((d) => d.singular === r) ??
      inGV.find((d) => d.shortNames.includes(r))
    );
  }

  private def(gvr: GVR): KindDefinition {
    const d = this.kindFor(gvr);
    if (!d || d.plural !== gvr.resource.toLowerCase())
      throw new StatusError(404, 'NotFound', 'the server could not find the requested resource', {});
    return d;
  }

  /** The last second formatted, and its text: a create asks for a timestamp two or more times. */
  private stamp: { second: number; text: string } = { second: NaN, text: '' };

  private timestamp(): string {
    // RFC 3339 with second precision, as metav1.Time serializes; formatted once per second.
    const d = this.now();
    const second = Math.floor(d.getTime() / 1000);
    if (second !== this.stamp.second) this.stamp = { second, text: `${d.toISOString().slice(0, 19)}Z` };
    return this.stamp.text;
  }

  /** Namespace must exist (404 naming the namespace) and not be terminating (403). */
  private checkNamespaceWritable(def: KindDefinition, namespace: string, creating: boolean): void {
    if (!def.namespaced) return;
    const terminating = this.namespaces.get(namespace);
    if (terminating === undefined) throw errors.notFound('namespaces', '', namespace);
    if (creating && terminating)
      throw new StatusError(
        403,
        'Forbidden',
        `${def.kind.toLowerCase()} "" is forbidden: unable to create new content in namespace ${namespace} because it is being terminated`,
        {
          group: def.group,
          kind: def.plural,
          causes: [
            {
              reason: 'NamespaceTerminating',
              message: `namespace ${namespace} is being terminated`,
              field: 'metadata.namespace',
            },
          ],
        },
      );
  }

  // ---------------------------------------------------------------- reads

  async get(gvr: GVR, namespace: string | undefined, name: string, _ctx: RequestContext): Promise<KubeObject> {
    const def = this.def(gvr);
    const ns = requireNamespace(def, namespace);
    const obj = this.store.get(objectKey(def, ns, name));
    if (!obj) throw notFound(def, name);
    return obj;
  }

  async list(gvr: GVR, namespace: string | undefined, opts: ListOptions, _ctx: RequestContext): Promise<KubeList> {
    const def = this.def(gvr);
    return listObjects(this.store, def, namespace, opts);
  }

  /**
   * Starts a watch. Throws synchronously (400) for a malformed selector or resourceVersion;
   * a resourceVersion older than the compaction point yields one ERROR event (410 Expired)
   * and then the stream closes.
   */
  watch(gvr: GVR, namespace: string | undefined, opts: WatchOptions, _ctx: RequestContext): WatchStream {
    return startWatch(this.store, this.def(gvr), namespace, opts, this.bookmarkMs);
  }

  // ---------------------------------------------------------------- writes

  async create(
    gvr: GVR,
    namespace: string | undefined,
    body: KubeObject,
    opts: WriteOptions,
    ctx: RequestContext,
  ): Promise<WriteResult> {
    const def = this.def(gvr);
    const key = ctx.idempotencyKey;
    if (!key || !this.idempotency || opts.dryRun)
      return createObject(this.core, def, namespace, body, opts, ctx, undefined);
    // Idempotency-Key (idempotency.ts): once per user and key; the digest covers what the create asks.
    const ns = def.namespaced
      ? namespace || (typeof body?.metadata?.namespace === 'string' ? body.metadata.namespace : '')
      : '';
    const digest = requestDigest({
      group: def.group,
      resource: def.plural,
      namespace: ns,
      body,
      fieldManager: opts.fieldManager,
      fieldValidation: opts.fieldValidation,
    });
    const lookup = (n: string, name: string) => this.store.get(objectKey(def, n, name));
    const out = await this.idempotency.run(
      { user: ctx.user?.name ?? '', key, digest, kind: def.kind, group: def.group },
      ns,
      lookup,
      (beforeStore) => createObject(this.core, def, namespace, body, opts, { ...ctx, beforeStore }, undefined),
    );
    if (out.result) return out.result;
    return {
      object: JSON.parse(out.replay!) as KubeObject,
      created: true,
      warnings: [],
      json: out.replay,
      replayed: true,
    };
  }

  async update(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    body: KubeObject,
    opts: WriteOptions & { subresource?: string },
    ctx: RequestContext,
  ): Promise<WriteResult> {
    return updateObject(this.core, this.def(gvr), namespace, name, body, opts, ctx);
  }

  async patch(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    type: PatchType,
    patch: unknown,
    opts: PatchOptions,
    ctx: RequestContext,
  ): Promise<WriteResult> {
    return patchObject(this.core, this.def(gvr), namespace, name, type, patch, opts, ctx);
  }

  async delete(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    opts: DeleteOptions,
    _ctx: RequestContext,
  ): Promise<DeleteResult> {
    const def = this.def(gvr);
    const ns = requireNamespace(def, namespace);
    return deleteObject(this.core, def, objectKey(def, ns, name), opts);
  }

  async deleteCollection(
    gvr: GVR,
    namespace: string | undefined,
    opts: ListOptions & DeleteOptions,
    _ctx: RequestContext,
  ): Promise<KubeList> {
    return deleteCollection(this.core, this.def(gvr), namespace, opts);
  }
}
