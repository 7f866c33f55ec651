// The one Client interface controllers (and fluxctl) use to talk to the API. Two
// implementations: in-process (calls the API server's registry directly, same admission and
// storage path as HTTP) and HTTP via @kubernetes/client-node. Every method throws a
// StatusError (runtime/meta/errors.ts) carrying the server's metav1.Status on failure.
import { isNotFound } from '../meta/errors.js';
import type { GVR, KubeList, KubeObject, WatchEvent } from '../meta/types.js';

export type PatchType = 'merge' | 'json' | 'apply';

export interface WriteOptions {
  dryRun?: boolean;
  fieldManager?: string;
  /** Strict | Warn | Ignore; the in-process client defaults to Strict. */
  fieldValidation?: 'Strict' | 'Warn' | 'Ignore';
}

export interface PatchOptions extends WriteOptions {
  /** Only for apply patches: take ownership of conflicting fields. */
  force?: boolean;
  /** e.g. 'status'. */
  subresource?: string;
}

export interface DeleteOptions {
  dryRun?: boolean;
  propagationPolicy?: 'Background' | 'Foreground' | 'Orphan';
  gracePeriodSeconds?: number;
  preconditions?: { uid?: string; resourceVersion?: string };
}

export interface ListOptions {
  labelSelector?: string;
  fieldSelector?: string;
  limit?: number;
  continue?: string;
  resourceVersion?: string;
  resourceVersionMatch?: 'NotOlderThan' | 'Exact';
  /**
   * The caller only reads the objects and never changes them (an informer's cache, client-go's
   * rule): a client that can share its own objects hands them over without a private copy (the
   * in-process client: the store's deeply frozen objects, so a change throws). Not sent to a server.
   */
  readOnly?: boolean;
}

export interface WatchOptions {
  labelSelector?: string;
  fieldSelector?: string;
  /** Unset or '0': synthetic ADDED events for the current state first; 'N': changes after N. */
  resourceVersion?: string;
  allowWatchBookmarks?: boolean;
  sendInitialEvents?: boolean;
  timeoutSeconds?: number;
  /** As ListOptions.readOnly: the delivered objects may be shared and frozen. */
  readOnly?: boolean;
}

/** A running watch. `done` resolves when the stream ends (server close, timeout, stop()). */
export interface WatchHandle {
  stop(): void;
  done: Promise<void>;
}

export interface Client {
  get<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    subresource?: string,
  ): Promise<T>;
  list<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    opts?: ListOptions,
  ): Promise<KubeList<T>>;
  /** Events arrive in order; an ERROR event with a 410 Status means: relist. */
  watch<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    opts: WatchOptions,
    onEvent: (ev: WatchEvent<T>) => void,
  ): WatchHandle;
  create<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts?: WriteOptions,
  ): Promise<T>;
  /** PUT: metadata.resourceVersion, when set, is a precondition (409 Conflict on mismatch). */
  update<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts?: WriteOptions,
  ): Promise<T>;
  /** PUT to the status subresource: only .status changes. */
  updateStatus<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    obj: T,
    opts?: WriteOptions,
  ): Promise<T>;
  patch<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    type: PatchType,
    patch: unknown,
    opts?: PatchOptions,
  ): Promise<T>;
  /** Returns the object (with deletionTimestamp set when finalizers hold it) or the last state. */
  delete<T extends KubeObject = KubeObject>(
    gvr: GVR,
    namespace: string | undefined,
    name: string,
    opts?: DeleteOptions,
  ): Promise<T>;
}

/**
 * The object, or undefined when it does not exist (404 NotFound); every other error is
 * thrown as get throws it. A read: safe to call any number of times.
 */
export async function getIfExists<T extends KubeObject = KubeObject>(
  client: Client,
  gvr: GVR,
  namespace: string | undefined,
  name: string,
): Promise<T | undefined> {
  try {
    return await client.get<T>(gvr, namespace, name);
  } catch (e) {
    if (isNotFound(e)) return undefined;
    throw e;
  }
}
