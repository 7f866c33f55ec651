// The registry: every semantic of the API between decoded requests and the object store
// (see registry-types.ts for the contract and shared/reference/kubernetes-api.md for the
// behaviour). Server-owned metadata, namespaces, admission, generation, the status split,
// preconditions, finalizers, managedFields, dryRun, selectors, pagination and watch.
//
// Concurrency: writes are staged in the store synchronously with compare-and-swap on the
// resourceVersion they were computed from, and acknowledged once their group commit is
// durable. Admission may be async, so a write whose base changed meanwhile is recomputed on
// the newest state (kube's GuaranteedUpdate), unless the client gave a resourceVersion
// precondition: then 409 Conflict. Reads (get/list/watch) see committed state only.
//
// The read side (list, watch) lives in registry-read.ts, pure helpers in registry-meta.ts.
//
// Errors: every failure is a StatusError; malformed input is 4xx, never 500.
import { randomUUID } from 'node:crypto';
import type { KindDefinition } from '../../apis/types.js';
import type { DeleteOptions, ListOptions, PatchOptions, PatchType, WatchOptions, WriteOptions } from '../client/client.js';
import { errors, StatusError } from '../meta/errors.js';
import type { GVR, KubeList, KubeObject, ManagedFieldsEntry, StatusCause } from '../meta/types.js';
import { StoreConflict, type ObjectKey, type Store } from '../store/store.js';
import { admit as schemaAdmit } from './admission/index.js';
import { SERVER_OWNED_META_FIELDS } from './admission/metadata.js';
import { applyJsonPatch, applyMergePatch, deepClone, deepEqual, isPlainObject } from './patch.js';
import { defaultFieldManager, type FieldManagerHooks } from './registry-fields.js';
import type { DeleteResult, RegistryApi, RequestContext, WatchStream, WriteResult } from './registry-types.js';
import {
  apiVersionOfDef,
  DEFAULT_MAX_BYTES,
  DNS1123_LABEL,
  DNS1123_SUBDOMAIN,
  GENERATE_SUFFIX,
  LABEL_MSG,
  MAX_RETRIES,
  NAMESPACE_KIND,
  patchSetsRV,
  specPart,
  SUBDOMAIN_MSG,
} from './registry-meta.js';
import { listObjects, startWatch } from './registry-read.js';
import { prepareForWrite } from './registry-strategy.js';
import { checkShapeTypes } from './registry-shape.js';
import { checkObjectDepth } from './limits.js';

export { NAMESPACE_KIND, INITIAL_EVENTS_END } from './registry-meta.js';

/** The finalizers a DELETE with propagationPolicy Foreground / Orphan adds (kube's names). */
export const FOREGROUND_FINALIZER = 'foregroundDeletion';
export const ORPHAN_FINALIZER = 'orphan';

export interface AdmitOptions {
  fieldValidation?: 'Strict' | 'Warn' | 'Ignore';
  subresource?: string;
}

/**
 * Admission: defaults, schema and CEL validation. Returns the (defaulted) object and
 * warnings; throws StatusError 400 (strict decoding) or 422 (Invalid). `old` is the stored
 * object on update (for transition rules), undefined on create.
 */
export type AdmitFn = (
  def: KindDefinition,
  obj: KubeObject,
  old: KubeObject | undefined,
  opts: AdmitOptions,
) => { object: KubeObject; warnings: string[] } | Promise<{ object: KubeObject; warnings: string[] }>;

/**
 * Called on every create and update of the main resource (or a field subresource) before
 * admission (a 403 before a 422), with the stored object (undefined on create) and the proposed one; throws a
 * StatusError (403) to refuse. The server's field guard uses it: a write of fields owned by a
 * field subresource (changesets/approval) needs that subresource's permission.
 */
export type WriteGuard = (def: KindDefinition, old: KubeObject | undefined, next: KubeObject, ctx: RequestContext, subresource: string | undefined) => void | Promise<void>;

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
}

export class Registry implements RegistryApi {
  private readonly store: Store;
  private readonly defs: KindDefinition[];
  private readonly admitFn: AdmitFn;
  private readonly guard?: WriteGuard;
  private readonly fm: FieldManagerHooks;
  private readonly now: () => Date;
  private readonly bookmarkMs: number;
  private readonly maxBytes: number;
  private readonly nsDef: KindDefinition;
  /** Namespace name -> terminating. */
  private readonly namespaces = new Map<string, boolean>();

  /**
   * Builds the registry over an open store and ensures the `default` namespace exists
   * (idempotent across restarts). Throws only if the store fails.
   */
  constructor(opts: RegistryOptions) {
    this.store = opts.store;
    const ns = opts.kinds.find((k) => k.group === '' && k.plural === 'namespaces');
    this.nsDef = ns ?? NAMESPACE_KIND;
    this.defs = ns ? [...opts.kinds] : [NAMESPACE_KIND, ...opts.kinds];
    this.admitFn =
      opts.admit ??
      ((def, obj, old, o) => schemaAdmit(def, obj, old, { fieldValidation: o.fieldValidation ?? 'Warn', subresource: o.subresource }));
    this.fm = opts.fieldManager ?? defaultFieldManager;
    this.guard = opts.guard;
    this.now = opts.now ?? (() => new Date());
    this.bookmarkMs = opts.bookmarkIntervalMs ?? 60_000;
    this.maxBytes = opts.maxObjectBytes ?? DEFAULT_MAX_BYTES;
    // Namespace existence is checked on every namespaced write: keep it in memory, fed by the
    // store's synchronous fan-out so it is never stale.
    for (const o of this.store.iterate('', this.nsDef.plural)) this.namespaces.set(o.metadata.name!, !!o.metadata.deletionTimestamp);
    this.store.subscribe((ev) => {
      if (ev.key.group !== '' || ev.key.resource !== this.nsDef.plural) return;
      if (ev.type === 'DELETED') this.namespaces.delete(ev.key.name);
      else this.namespaces.set(ev.key.name, !!ev.object.metadata.deletionTimestamp);
    });
    this.ensureNamespace('default');
  }

  /** Creates a namespace directly in the store when missing (start-up, not an API call). */
  ensureNamespace(name: string): void {
    const key = { group: '', resource: 'namespaces', namespace: '', name };
    if (this.store.get(key)) return;
    const obj: KubeObject = {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: {
        name,
        uid: randomUUID(),
        creationTimestamp: this.timestamp(),
        generation: 1,
        labels: { 'kubernetes.io/metadata.name': name },
      },
      spec: { finalizers: ['kubernetes'] },
      status: { phase: 'Active' },
    };
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
    return inGV.find((d) => d.plural === r) ?? inGV.find((d) => d.singular === r) ?? inGV.find((d) => d.shortNames.includes(r));
  }

  private def(gvr: GVR): KindDefinition {
    const d = this.kindFor(gvr);
    if (!d || d.plural !== gvr.resource.toLowerCase())
      throw new StatusError(404, 'NotFound', 'the server could not find the requested resource', {});
    return d;
  }

  private timestamp(): string {
    // RFC 3339 with second precision, as metav1.Time serializes.
    return this.now()
      .toISOString()
      .replace(/\.\d{3}Z$/, 'Z');
  }

  private key(def: KindDefinition, namespace: string | undefined, name: string): ObjectKey {
    return { group: def.group, resource: def.plural, namespace: def.namespaced ? (namespace ?? '') : '', name };
  }

  private requireNamespace(def: KindDefinition, namespace: string | undefined): string {
    if (!def.namespaced) return '';
    if (!namespace) throw errors.badRequest('the namespace must be provided for namespaced resources');
    return namespace;
  }

  private notFound(def: KindDefinition, name: string): StatusError {
    return errors.notFound(def.plural, def.group, name);
  }

  private manager(opts: WriteOptions, ctx: RequestContext): string {
    if (opts.fieldManager) {
      if (opts.fieldManager.length > 128)
        throw errors.invalid('PatchOptions', 'meta.k8s.io', '', [
          { reason: 'FieldValueTooLong', field: 'fieldManager', message: 'Too long: may not be more than 128 bytes' },
        ]);
      return opts.fieldManager;
    }
    const ua = ctx.userAgent ?? 'unknown';
    return ua.split('/')[0] || 'unknown';
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
          causes: [{ reason: 'NamespaceTerminating', message: `namespace ${namespace} is being terminated`, field: 'metadata.namespace' }],
        },
      );
  }

  private checkBodyShape(def: KindDefinition, body: unknown): KubeObject {
    if (!isPlainObject(body)) throw errors.badRequest(`the body of the request was not a ${def.kind} object`);
    // Patch results reach here too: they may nest deeper than any body could (copy ops).
    checkObjectDepth(body);
    checkShapeTypes(def, body);
    const b = body as KubeObject;
    const av = apiVersionOfDef(def);
    if (b.apiVersion !== undefined && b.apiVersion !== av)
      throw errors.badRequest(`the API version in the data (${String(b.apiVersion)}) does not match the expected API version (${av})`);
    if (b.kind !== undefined && b.kind !== def.kind)
      throw errors.badRequest(`the kind in the data (${String(b.kind)}) does not match the expected kind (${def.kind})`);
    if (b.metadata !== undefined && !isPlainObject(b.metadata)) throw errors.badRequest('metadata must be an object');
    return { ...b, apiVersion: av, kind: def.kind, metadata: { ...(b.metadata ?? {}) } };
  }

  private validateMeta(def: KindDefinition, obj: KubeObject): void {
    const causes: StatusCause[] = [];
    const name = obj.metadata.name ?? '';
    const re = def.plural === 'namespaces' ? DNS1123_LABEL : DNS1123_SUBDOMAIN;
    const max = def.plural === 'namespaces' ? 63 : 253;
    if (def.group === 'rbac.authorization.k8s.io') {
      // RBAC names are path segments (kube's ValidatePathSegmentName): `system:discovery` is valid.
      if (typeof name !== 'string' || name === '' || name === '.' || name === '..' || /[/%]/.test(name))
        causes.push({ reason: 'FieldValueInvalid', field: 'metadata.name', message: `Invalid value: ${JSON.stringify(name)}: may not be '.' or '..' and may not contain '/' or '%'` });
    } else if (typeof name !== 'string' || !re.test(name) || name.length > max)
      causes.push({
        reason: 'FieldValueInvalid',
        field: 'metadata.name',
        message: `Invalid value: ${JSON.stringify(name)}: ${def.plural === 'namespaces' ? LABEL_MSG : SUBDOMAIN_MSG}`,
      });
    // Label and annotation syntax is admission's (kube's wording); here only the shapes the
    // registry itself relies on (selectors, finalizer logic).
    const m = obj.metadata;
    for (const field of ['labels', 'annotations'] as const) {
      const map = m[field];
      if (map !== undefined && (!isPlainObject(map) || Object.values(map).some((v) => typeof v !== 'string')))
        causes.push({
          reason: 'FieldValueInvalid',
          field: `metadata.${field}`,
          message: 'Invalid value: must be a map of string keys to string values',
        });
    }
    if (m.finalizers !== undefined && (!Array.isArray(m.finalizers) || m.finalizers.some((f) => typeof f !== 'string' || f === '')))
      causes.push({
        reason: 'FieldValueInvalid',
        field: 'metadata.finalizers',
        message: 'Invalid value: must be a list of non-empty strings',
      });
    if (causes.length) throw errors.invalid(def.kind, def.group, name, causes);
  }

  private checkSize(obj: KubeObject): void {
    const n = Buffer.byteLength(JSON.stringify(obj));
    if (n > this.maxBytes) throw errors.tooLarge(`Request entity too large: limit is ${this.maxBytes}`);
  }

  private async admit(def: KindDefinition, obj: KubeObject, old: KubeObject | undefined, opts: AdmitOptions) {
    const r = await this.admitFn(def, obj, old, opts);
    return { object: r.object, warnings: r.warnings ?? [] };
  }

  /**
   * managedFields after a non-apply write. `clientMF` is what the client sent (kept out of
   * admission); the field manager applies kube's rule: a non-empty valid value replaces the
   * stored entries, `[{}]` clears them, then the writer's changes are recorded.
   */
  private managedFieldsFor(
    def: KindDefinition,
    prev: KubeObject | undefined,
    next: KubeObject,
    clientMF: unknown,
    manager: string,
    subresource: string | undefined,
  ): ManagedFieldsEntry[] | undefined {
    const withClient = {
      ...next,
      metadata: { ...next.metadata, managedFields: Array.isArray(clientMF) ? (clientMF as ManagedFieldsEntry[]) : undefined },
    };
    const mf = this.fm.update(def, prev, withClient, manager, subresource, this.timestamp());
    return mf && mf.length ? mf : undefined;
  }

  // ---------------------------------------------------------------- reads

  async get(gvr: GVR, namespace: string | undefined, name: string, _ctx: RequestContext): Promise<KubeObject> {
    const def = this.def(gvr);
    const ns = this.requireNamespace(def, namespace);
    const obj = this.store.get(this.key(def, ns, name));
    if (!obj) throw this.notFound(def, name);
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

  // ---------------------------------------------------------------- create

  async create(gvr: GVR, namespace: string | undefined, body: KubeObject, opts: WriteOptions, ctx: RequestContext): Promise<WriteResult> {
    const def = this.def(gvr);
    return this.createIn(def, namespace, body, opts, ctx, undefined);
  }

  private async createIn(
    def: KindDefinition,
    namespace: string | undefined,
    body: KubeObject,
    opts: WriteOptions,
    ctx: RequestContext,
    applied: { manager: string; force: boolean; subresource?: string } | undefined,
  ): Promise<WriteResult> {
    let obj = this.checkBodyShape(def, body);
    const m = obj.metadata;
    let ns = '';
    if (def.namespaced) {
      if (namespace && m.namespace && m.namespace !== namespace)
        throw errors.badRequest('the namespace of the provided object does not match the namespace sent on the request');
      ns = this.requireNamespace(def, namespace || m.namespace);
      m.namespace = ns;
    } else {
      delete m.namespace;
    }
    if (!m.name) {
      if (m.generateName && typeof m.generateName === 'string') {
        m.name =
          m.generateName + Array.from({ length: 5 }, () => GENERATE_SUFFIX[Math.floor(Math.random() * GENERATE_SUFFIX.length)]).join('');
      } else {
        throw errors.invalid(def.kind, def.group, '', [
          { reason: 'FieldValueRequired', field: 'metadata.name', message: 'Required value: name or generateName is required' },
        ]);
      }
    }
    this.validateMeta(def, obj);
    this.checkNamespaceWritable(def, ns, true);
    const clientMF = m.managedFields;
    // As on update (the field manager's rule): an applied configuration carries no managedFields.
    if (applied && clientMF !== undefined && clientMF !== null) throw errors.badRequest('metadata.managedFields must be nil');
    for (const f of [...SERVER_OWNED_META_FIELDS, 'managedFields']) delete (m as Record<string, unknown>)[f];
    if (def.statusSubresource && def.plural !== 'namespaces') delete obj.status;
    const manager = applied?.manager ?? this.manager(opts, ctx);
    if (applied) {
      obj = this.fm.apply(def, undefined, obj, manager, applied.force, applied.subresource, this.timestamp());
    }
    const appliedMF = obj.metadata.managedFields;
    obj.metadata.uid = randomUUID();
    obj.metadata.creationTimestamp = this.timestamp();
    obj.metadata.generation = 1;
    if (def.plural === 'namespaces') {
      // kube's namespace strategy: the `kubernetes` finalizer is always there on create.
      const spec = isPlainObject(obj.spec) ? obj.spec : {};
      const fins = Array.isArray(spec.finalizers) ? (spec.finalizers as unknown[]) : [];
      obj.spec = { ...spec, finalizers: fins.includes('kubernetes') ? fins : [...fins, 'kubernetes'] };
      obj.status = { phase: 'Active' };
      obj.metadata.labels = { ...(obj.metadata.labels ?? {}), 'kubernetes.io/metadata.name': obj.metadata.name! };
    }
    prepareForWrite(def, obj);
    // Field-level authorization before admission: a 403 comes before a 422, as in kube.
    if (this.guard) await this.guard(def, undefined, obj, ctx, undefined);
    const admitted = await this.admit(def, obj, undefined, { fieldValidation: opts.fieldValidation, subresource: undefined });
    obj = admitted.object;
    delete obj.metadata.managedFields;
    const mf = applied ? appliedMF : this.managedFieldsFor(def, undefined, obj, clientMF, manager, undefined);
    if (mf && mf.length) obj.metadata.managedFields = mf;
    if (opts.dryRun) {
      this.checkSize(obj);
      return { object: obj, created: true, warnings: admitted.warnings };
    }
    const key = this.key(def, ns, obj.metadata.name!);
    // Re-check the namespace after the await: it may have been deleted meanwhile.
    this.checkNamespaceWritable(def, ns, true);
    try {
      // The store checks the size on the JSON it writes anyway (413, nothing staged).
      const out = await this.store.enqueueCreate(key, obj, { maxBytes: this.maxBytes });
      return { object: out, created: true, warnings: admitted.warnings, json: this.store.writtenJSON(out) };
    } catch (e) {
      if (e instanceof StoreConflict) throw errors.alreadyExists(def.plural, def.group, obj.metadata.name!);
      throw e;
    }
  }

  // ---------------------------------------------------------------- update / patch

  async update(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    body: KubeObject,
    opts: WriteOptions & { subresource?: string },
    ctx: RequestContext,
  ): Promise<WriteResult> {
    const def = this.def(gvr);
    this.checkSubresource(def, opts.subresource);
    const b = this.checkBodyShape(def, body);
    if (b.metadata.name !== undefined && b.metadata.name !== name)
      throw errors.badRequest(`the name of the object (${String(b.metadata.name)}) does not match the name on the URL (${name})`);
    // Custom resources do not allow unconditional updates (kube's CRD strategy,
    // AllowUnconditionalUpdate false); the built-in core kinds keep kube's behaviour for them.
    if (!def.builtin && !b.metadata.resourceVersion)
      throw errors.invalid(def.kind, def.group, name, [
        { reason: 'FieldValueInvalid', field: 'metadata.resourceVersion', message: 'Invalid value: 0x0: must be specified for an update' },
      ]);
    return this.modify(def, namespace, name, opts, ctx, opts.subresource, () => ({ next: deepClone(b) }));
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
    const def = this.def(gvr);
    this.checkSubresource(def, opts.subresource);
    if ((type as string) === 'strategic' || (type as string) === 'application/strategic-merge-patch+json')
      throw errors.unsupportedMediaType(
        `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml`,
      );
    if (type === 'apply') {
      if (!opts.fieldManager)
        // kubernetes-api.md section 4: a 400 with the Invalid-style message kubectl prints.
        throw errors.badRequest('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch', [
          { reason: 'FieldValueRequired', field: 'fieldManager', message: 'Required value: is required for apply patch' },
        ]);
      const cfg = this.checkBodyShape(def, patch);
      if (cfg.metadata.name !== undefined && cfg.metadata.name !== name)
        throw errors.badRequest(`the name of the object (${String(cfg.metadata.name)}) does not match the name on the URL (${name})`);
      cfg.metadata.name = name;
      const manager = this.manager(opts, ctx);
      return this.modify(
        def,
        namespace,
        name,
        opts,
        ctx,
        opts.subresource,
        (old) => {
          const merged = this.fm.apply(def, old, deepClone(cfg), manager, !!opts.force, opts.subresource, this.timestamp());
          return { next: merged, managedFieldsComputed: true, precondition: cfg.metadata.resourceVersion || null };
        },
        { manager, force: !!opts.force, cfg },
      );
    }
    if (type !== 'merge' && type !== 'json')
      throw errors.unsupportedMediaType(
        `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml`,
      );
    return this.modify(def, namespace, name, opts, ctx, opts.subresource, (old) => {
      const next = type === 'merge' ? applyMergePatch(old, patch) : applyJsonPatch(old, patch, { maxBytes: this.maxBytes });
      if (!isPlainObject(next)) throw errors.badRequest('the patch result is not an object');
      if (!isPlainObject(next.metadata)) throw errors.badRequest('the patch result has no metadata object');
      checkObjectDepth(next);
      checkShapeTypes(def, next);
      // The result inherits the stored resourceVersion; only one the patch itself sets is a
      // precondition (else concurrent patches would 409 instead of being retried).
      const rv = next.metadata.resourceVersion;
      return {
        next,
        precondition: rv !== undefined && rv !== old.metadata.resourceVersion ? String(rv) : patchSetsRV(type, patch) ? String(rv) : null,
      };
    });
  }

  private checkSubresource(def: KindDefinition, sub: string | undefined): void {
    if (sub === undefined || sub === '') return;
    if (sub === 'status' && def.statusSubresource) return;
    if (sub === 'finalize' && def.group === '' && def.plural === this.nsDef.plural) return;
    if (def.fieldSubresources?.[sub]) return;
    throw new StatusError(404, 'NotFound', 'the server could not find the requested resource', {});
  }

  /**
   * The shared update path (PUT, patches, apply). `compute` builds the proposed object from
   * the stored one; it is re-run when a concurrent write wins the compare-and-swap.
   */
  private async modify(
    def: KindDefinition,
    namespace: string | undefined,
    name: string,
    opts: WriteOptions,
    ctx: RequestContext,
    subresource: string | undefined,
    /** `precondition`: null = none; undefined = the body's metadata.resourceVersion (PUT). */
    compute: (old: KubeObject) => { next: KubeObject; managedFieldsComputed?: boolean; precondition?: string | null },
    applyCreate?: { manager: string; force: boolean; cfg: KubeObject },
  ): Promise<WriteResult> {
    const ns = this.requireNamespace(def, namespace);
    const key = this.key(def, ns, name);
    for (let attempt = 0; ; attempt++) {
      const old = this.store.getLatest(key);
      if (!old) {
        if (applyCreate && !subresource) {
          if (applyCreate.cfg.metadata.resourceVersion) throw errors.conflict(def.plural, def.group, name);
          return this.createIn(def, ns, applyCreate.cfg, opts, ctx, { manager: applyCreate.manager, force: applyCreate.force });
        }
        throw this.notFound(def, name);
      }
      const oldRV = old.metadata.resourceVersion!;
      const c = compute(deepClone(old));
      const next = this.checkBodyShape(def, c.next);
      const userRV = c.precondition === null ? undefined : (c.precondition ?? next.metadata.resourceVersion);
      if (userRV !== undefined && userRV !== '' && userRV !== oldRV) throw errors.conflict(def.plural, def.group, name);
      const prepared = await this.prepareUpdate(def, old, next, opts, ctx, subresource, !!c.managedFieldsComputed);
      if (prepared.noop) return { object: old, created: false, warnings: prepared.warnings };
      const obj = prepared.object;
      const finalize =
        !!obj.metadata.deletionTimestamp &&
        (obj.metadata.finalizers ?? []).length === 0 &&
        !(def.group === '' && def.plural === this.nsDef.plural && Array.isArray(obj.spec?.finalizers) && obj.spec!.finalizers.length > 0);
      if (opts.dryRun) {
        this.checkSize(obj);
        return { object: obj, created: false, warnings: prepared.warnings };
      }
      try {
        if (finalize) {
          // The last finalizer is gone: store the final state's deletion (DELETED event).
          const gone = await this.store.enqueueDelete(key, oldRV, obj);
          return { object: gone, created: false, warnings: prepared.warnings };
        }
        const out = await this.store.enqueueUpdate(key, obj, oldRV, { maxBytes: this.maxBytes });
        return { object: out, created: false, warnings: prepared.warnings, json: this.store.writtenJSON(out) };
      } catch (e) {
        if (!(e instanceof StoreConflict)) throw e;
        if (e.kind === 'missing') throw this.notFound(def, name);
        // Someone else wrote first: a client precondition is now stale; otherwise try again
        // on the newest state (getLatest sees the competing staged write).
        if ((userRV !== undefined && userRV !== '') || attempt >= MAX_RETRIES) throw errors.conflict(def.plural, def.group, name);
      }
    }
  }

  private async prepareUpdate(
    def: KindDefinition,
    old: KubeObject,
    next: KubeObject,
    opts: WriteOptions,
    ctx: RequestContext,
    subresource: string | undefined,
    managedFieldsComputed: boolean,
  ): Promise<{ object: KubeObject; warnings: string[]; noop: boolean }> {
    const name = old.metadata.name!;
    const m = next.metadata;
    if (m.name !== undefined && m.name !== name)
      throw errors.badRequest(`the name of the object (${String(m.name)}) does not match the name on the URL (${name})`);
    if (def.namespaced && m.namespace !== undefined && m.namespace !== old.metadata.namespace)
      throw errors.badRequest('the namespace of the provided object does not match the namespace sent on the request');
    const clientMF = m.managedFields;
    const manager = this.manager(opts, ctx);
    let obj: KubeObject;
    if (subresource === 'finalize') {
      // namespaces/finalize changes spec.finalizers only (what the namespace controller does).
      obj = deepClone(old);
      obj.spec = { ...(obj.spec ?? {}), finalizers: Array.isArray(next.spec?.finalizers) ? deepClone(next.spec!.finalizers) : [] };
    } else if (subresource === 'status') {
      // The status subresource changes .status only (plus managedFields for it).
      obj = deepClone(old);
      if (next.status === undefined) delete obj.status;
      else obj.status = deepClone(next.status);
      if (managedFieldsComputed && next.metadata.managedFields) obj.metadata.managedFields = next.metadata.managedFields;
    } else if (subresource && def.fieldSubresources?.[subresource]) {
      // A field subresource (changesets/approval) changes its fields only; the rest of the
      // body is ignored, as the status subresource ignores everything but .status.
      obj = deepClone(old);
      for (const path of def.fieldSubresources[subresource]) copyField(obj, next, path.split('.'));
      if (managedFieldsComputed && next.metadata.managedFields) obj.metadata.managedFields = next.metadata.managedFields;
    } else {
      obj = next;
      const om = old.metadata;
      const causes: StatusCause[] = [];
      if (m.uid !== undefined && m.uid !== '' && m.uid !== om.uid)
        causes.push({
          reason: 'FieldValueInvalid',
          field: 'metadata.uid',
          message: `Invalid value: ${JSON.stringify(m.uid)}: field is immutable`,
        });
      if (m.deletionTimestamp !== undefined && m.deletionTimestamp !== null && m.deletionTimestamp !== om.deletionTimestamp)
        causes.push({
          reason: 'FieldValueInvalid',
          field: 'metadata.deletionTimestamp',
          message: `Invalid value: ${JSON.stringify(m.deletionTimestamp)}: field is immutable; may only be changed via deletion`,
        });
      if (om.deletionTimestamp) {
        const added = (Array.isArray(m.finalizers) ? m.finalizers : []).filter((f) => !(om.finalizers ?? []).includes(f));
        if (added.length)
          causes.push({
            reason: 'FieldValueForbidden',
            field: 'metadata.finalizers',
            message: `Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{${added.map((f) => JSON.stringify(f)).join(', ')}}`,
          });
      }
      if (causes.length) throw errors.invalid(def.kind, def.group, name, causes);
      m.uid = om.uid;
      m.creationTimestamp = om.creationTimestamp;
      m.generation = om.generation;
      m.namespace = om.namespace;
      m.name = name;
      if (om.deletionTimestamp) {
        m.deletionTimestamp = om.deletionTimestamp;
        m.deletionGracePeriodSeconds = om.deletionGracePeriodSeconds;
      } else {
        delete m.deletionTimestamp;
        delete m.deletionGracePeriodSeconds;
      }
      delete (m as Record<string, unknown>).selfLink;
      if (def.statusSubresource) {
        if (old.status === undefined) delete obj.status;
        else obj.status = deepClone(old.status);
      }
      // spec.finalizers of a namespace changes only through namespaces/finalize (kube's strategy).
      if (def.group === '' && def.plural === this.nsDef.plural)
        obj.spec = { ...(isPlainObject(obj.spec) ? obj.spec : {}), finalizers: deepClone(old.spec?.finalizers ?? []) };
      this.validateMeta(def, obj);
      prepareForWrite(def, obj);
    }
    obj.metadata.resourceVersion = old.metadata.resourceVersion;
    const computedMF = obj.metadata.managedFields;
    // Client-sent managedFields are the field manager's business, not admission's.
    if (managedFieldsComputed || old.metadata.managedFields === undefined) delete obj.metadata.managedFields;
    else obj.metadata.managedFields = old.metadata.managedFields;
    if (this.guard && subresource !== 'status') await this.guard(def, old, obj, ctx, subresource);
    const admitted = await this.admit(def, obj, old, { fieldValidation: opts.fieldValidation, subresource });
    obj = admitted.object;
    if (subresource !== 'status' && !deepEqual(specPart(old), specPart(obj))) obj.metadata.generation = (old.metadata.generation ?? 0) + 1;
    else obj.metadata.generation = old.metadata.generation;
    let mf: ManagedFieldsEntry[] | undefined;
    if (managedFieldsComputed) mf = computedMF;
    else {
      mf = this.managedFieldsFor(def, old, obj, subresource === 'status' ? undefined : clientMF, manager, subresource);
    }
    if (mf && mf.length) obj.metadata.managedFields = mf;
    else delete obj.metadata.managedFields;
    if (deepEqual(old, obj)) return { object: old, warnings: admitted.warnings, noop: true };
    return { object: obj, warnings: admitted.warnings, noop: false };
  }

  // ---------------------------------------------------------------- delete

  async delete(gvr: GVR, namespace: string | undefined, name: string, opts: DeleteOptions, _ctx: RequestContext): Promise<DeleteResult> {
    const def = this.def(gvr);
    const ns = this.requireNamespace(def, namespace);
    return this.deleteKey(def, this.key(def, ns, name), opts);
  }

  private async deleteKey(def: KindDefinition, key: ObjectKey, opts: DeleteOptions): Promise<DeleteResult> {
    if (opts.propagationPolicy !== undefined && !['Background', 'Foreground', 'Orphan'].includes(opts.propagationPolicy))
      throw errors.invalid('DeleteOptions', 'meta.k8s.io', '', [
        {
          reason: 'FieldValueNotSupported',
          field: 'propagationPolicy',
          message: `Unsupported value: "${String(opts.propagationPolicy)}": supported values: "Foreground", "Background", "Orphan"`,
        },
      ]);
    if (def.group === '' && def.plural === this.nsDef.plural && key.name === 'default')
      throw new StatusError(403, 'Forbidden', 'namespaces "default" is forbidden: this namespace may not be deleted', {
        name: 'default',
        kind: 'namespaces',
      });
    for (let attempt = 0; ; attempt++) {
      const old = this.store.getLatest(key);
      if (!old) throw this.notFound(def, key.name);
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
      const isNamespace = def.group === '' && def.plural === this.nsDef.plural;
      // Foreground/Orphan hand the object to the garbage collector through its finalizer
      // (runtime/controller/gc.ts); a namespace is held by spec.finalizers until the
      // namespace controller (runtime/controller/namespace.ts) has removed its content.
      const gcFinalizer = opts.propagationPolicy === 'Foreground' ? FOREGROUND_FINALIZER : opts.propagationPolicy === 'Orphan' ? ORPHAN_FINALIZER : undefined;
      const finalizers = [...(old.metadata.finalizers ?? [])];
      let finalizersChanged = false;
      if (gcFinalizer) {
        // One propagation policy at a time, as kube's deletion strategy does.
        const other = gcFinalizer === FOREGROUND_FINALIZER ? ORPHAN_FINALIZER : FOREGROUND_FINALIZER;
        const i = finalizers.indexOf(other);
        if (i >= 0 && !old.metadata.deletionTimestamp) {
          finalizers.splice(i, 1);
          finalizersChanged = true;
        }
        if (!finalizers.includes(gcFinalizer) && !old.metadata.deletionTimestamp) {
          finalizers.push(gcFinalizer);
          finalizersChanged = true;
        }
      }
      const specFinalizers = isNamespace && Array.isArray(old.spec?.finalizers) ? (old.spec!.finalizers as unknown[]) : [];
      const holds = finalizers.length > 0 || specFinalizers.length > 0;
      try {
        if (holds) {
          if (old.metadata.deletionTimestamp && !finalizersChanged) return { object: old, deleted: false };
          const obj = deepClone(old);
          obj.metadata.finalizers = finalizers;
          if (!old.metadata.deletionTimestamp) {
            obj.metadata.deletionTimestamp = this.timestamp();
            obj.metadata.deletionGracePeriodSeconds = 0;
            obj.metadata.generation = (old.metadata.generation ?? 0) + 1;
          }
          if (isNamespace) obj.status = { ...(obj.status ?? {}), phase: 'Terminating' };
          if (opts.dryRun) return { object: obj, deleted: false };
          const out = await this.store.enqueueUpdate(key, obj, rv, { deletion: true });
          return { object: out, deleted: false };
        }
        if (opts.dryRun) return { object: old, deleted: true };
        // The answer carries the deletion's resourceVersion, as the DELETED watch event does.
        const gone = await this.store.enqueueDelete(key, rv);
        return { object: gone, deleted: true };
      } catch (e) {
        if (!(e instanceof StoreConflict)) throw e;
        if (e.kind === 'missing') throw this.notFound(def, key.name);
        if (pre?.resourceVersion || attempt >= MAX_RETRIES) throw errors.conflict(def.plural, def.group, key.name);
      }
    }
  }

  async deleteCollection(
    gvr: GVR,
    namespace: string | undefined,
    opts: ListOptions & DeleteOptions,
    _ctx: RequestContext,
  ): Promise<KubeList> {
    const def = this.def(gvr);
    const listed = listObjects(this.store, def, namespace, { labelSelector: opts.labelSelector, fieldSelector: opts.fieldSelector });
    const items: KubeObject[] = [];
    for (const o of listed.items) {
      try {
        const r = await this.deleteKey(def, this.key(def, o.metadata.namespace, o.metadata.name!), {
          dryRun: opts.dryRun,
          propagationPolicy: opts.propagationPolicy,
          gracePeriodSeconds: opts.gracePeriodSeconds,
        });
        items.push(r.object);
      } catch (e) {
        if (!(e instanceof StatusError && e.code === 404)) throw e;
      }
    }
    return { apiVersion: apiVersionOfDef(def), kind: def.listKind, metadata: { resourceVersion: String(this.store.currentRV) }, items };
  }
}

/** Sets `path` of `to` to its value in `from`, or deletes it there when `from` has none. */
function copyField(to: Record<string, any>, from: Record<string, any>, path: string[]): void {
  let src: any = from;
  for (const p of path) src = isPlainObject(src) ? src[p] : undefined;
  let dst: any = to;
  for (const p of path.slice(0, -1)) {
    if (!isPlainObject(dst[p])) {
      if (src === undefined) return;
      dst[p] = {};
    }
    dst = dst[p];
  }
  const last = path[path.length - 1];
  if (src === undefined) delete dst[last];
  else dst[last] = deepClone(src);
}
