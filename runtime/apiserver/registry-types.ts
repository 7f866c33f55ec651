// The contract between the HTTP layer (runtime/apiserver/http/) and the storage logic
// (runtime/apiserver/registry.ts). The registry holds every semantic of the API (admission,
// generation, finalizers, preconditions, managedFields, dryRun, selectors, pagination, watch);
// the HTTP layer only decodes requests, negotiates content and encodes responses. The
// in-process Client (runtime/client/inprocess.ts) calls the registry directly, so embedded
// controllers take the same path as kubectl.
import type { KindDefinition } from '../../apis/types.js';
import type {
  DeleteOptions,
  ListOptions,
  PatchOptions,
  PatchType,
  WatchOptions,
  WriteOptions,
} from '../client/client.js';
import type { GVR, KubeList, KubeObject, WatchEvent } from '../meta/types.js';
import type { ObjectKey } from '../store/store.js';

export interface UserInfo {
  name: string;
  uid?: string;
  groups: string[];
  extra?: Record<string, string[]>;
}

export interface RequestContext {
  user?: UserInfo;
  /** Used as the field manager when `fieldManager` is not given (prefix before '/'). */
  userAgent?: string;
  /** The request's Idempotency-Key (creates honour it: idempotency.ts). */
  idempotencyKey?: string;
  /** Called with the object right before the store commits a create (idempotency.ts records its name and uid). */
  beforeStore?: (obj: KubeObject) => void;
}

export interface WriteResult<T extends KubeObject = KubeObject> {
  object: T;
  /** 201 vs 200: true when the write created the object (create, upserting apply). */
  created: boolean;
  /** Sent as `Warning: 299 - "..."` headers (fieldValidation=Warn and similar). */
  warnings: string[];
  /** `object` as JSON exactly as stored, when known: the HTTP layer sends it instead of serializing again. */
  json?: string;
  /** The first answer of a create retried with its Idempotency-Key (nothing was written now). */
  replayed?: boolean;
}

export interface DeleteResult<T extends KubeObject = KubeObject> {
  object: T;
  /** False while finalizers hold the object (deletionTimestamp set). */
  deleted: boolean;
}

/** A live watch; events are delivered in resourceVersion order. */
export interface WatchStream<T extends KubeObject = KubeObject> {
  /** Called for each event; an ERROR event (410 Expired) is followed by `onClose`. */
  onEvent(cb: (ev: WatchEvent<T>) => void): void;
  onClose(cb: () => void): void;
  close(): void;
}

export interface RegistryApi {
  kinds(): KindDefinition[];
  /** Resolves a plural (or short name / singular, for the CLI) within a group-version. */
  kindFor(gvr: GVR): KindDefinition | undefined;

  get(gvr: GVR, namespace: string | undefined, name: string, ctx: RequestContext): Promise<KubeObject>;
  list(gvr: GVR, namespace: string | undefined, opts: ListOptions, ctx: RequestContext): Promise<KubeList>;
  watch(gvr: GVR, namespace: string | undefined, opts: WatchOptions, ctx: RequestContext): WatchStream;
  create(
    gvr: GVR,
    namespace: string | undefined,
    body: KubeObject,
    opts: WriteOptions,
    ctx: RequestContext,
  ): Promise<WriteResult>;
  /** PUT of the object (subresource undefined) or of its status (subresource 'status'). */
  update(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    body: KubeObject,
    opts: WriteOptions & { subresource?: string },
    ctx: RequestContext,
  ): Promise<WriteResult>;
  patch(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    type: PatchType,
    patch: unknown,
    opts: PatchOptions,
    ctx: RequestContext,
  ): Promise<WriteResult>;
  delete(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    opts: DeleteOptions,
    ctx: RequestContext,
  ): Promise<DeleteResult>;
  deleteCollection(
    gvr: GVR,
    namespace: string | undefined,
    opts: ListOptions & DeleteOptions,
    ctx: RequestContext,
  ): Promise<KubeList>;
}

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
export type WriteGuard = (
  def: KindDefinition,
  old: KubeObject | undefined,
  next: KubeObject,
  ctx: RequestContext,
  subresource: string | undefined,
) => void | Promise<void>;

// Create co-writes (registry-cowrite.ts).
export interface CoWriteReads {
  /** The newest state of an object, writes staged and not yet committed included. */
  get(key: ObjectKey): KubeObject | undefined;
  /** The committed objects of a resource in a namespace (re-read each with get for its newest state). */
  list(group: string, resource: string, namespace: string): Iterable<KubeObject>;
}

export interface CoWriteUpdate {
  def: KindDefinition;
  key: ObjectKey;
  /**
   * The object as `get` returned it (same resourceVersion), with only metadata.labels,
   * metadata.annotations and metadata.ownerReferences changed.
   */
  object: KubeObject;
  /** The field manager the change is recorded under. */
  manager: string;
}

export interface CreateCoWriter {
  group: string;
  /** The plural of the kind whose creates this writer sees. */
  resource: string;
  /**
   * Called synchronously at a create of the kind (never on a dry run), after admission and quota,
   * right before the create is staged, with the admitted object (do not mutate it). Returns the
   * object's status and the updates to stage with it, or undefined for a plain create. Must not
   * throw.
   */
  plan(obj: KubeObject, reads: CoWriteReads): { status: unknown; updates: CoWriteUpdate[] } | undefined;
}
