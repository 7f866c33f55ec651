// metav1 shapes shared by the store, the API server, the clients and the controllers.
// These mirror k8s.io/apimachinery/pkg/apis/meta/v1 field for field (JSON names).

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export interface ManagedFieldsEntry {
  manager: string;
  operation: 'Apply' | 'Update';
  apiVersion: string;
  time?: string;
  fieldsType: 'FieldsV1';
  fieldsV1: Record<string, unknown>;
  subresource?: string;
}

export interface ObjectMeta {
  name?: string;
  generateName?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  deletionGracePeriodSeconds?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: OwnerReference[];
  managedFields?: ManagedFieldsEntry[];
}

export interface ListMeta {
  resourceVersion?: string;
  continue?: string;
  remainingItemCount?: number;
}

/**
 * An API object: apiVersion/kind/metadata plus the kind's spec and status. A kind's own type
 * (apis/zz_generated.types.ts, or `KubeObject<WidgetSpec, WidgetStatus>`) says what they hold;
 * the defaults are `unknown`, so code that only knows "some object" must narrow before it
 * reads a field. No index signature: other top-level fields (a Secret's data, an Event's
 * involvedObject) belong to the kind's type.
 */
export interface KubeObject<Spec = unknown, Status = unknown> {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  spec?: Spec;
  status?: Status;
}

export interface KubeList<T extends KubeObject = KubeObject> {
  apiVersion: string;
  kind: string;
  metadata: ListMeta;
  items: T[];
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

export interface WatchEvent<T = KubeObject> {
  type: WatchEventType;
  object: T;
}

export interface StatusCause {
  reason?: string;
  message?: string;
  field?: string;
}

export interface StatusDetails {
  name?: string;
  group?: string;
  kind?: string;
  uid?: string;
  causes?: StatusCause[];
  retryAfterSeconds?: number;
}

/** metav1.Status: the body of every API error. */
export interface Status {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: ListMeta;
  status: 'Success' | 'Failure';
  message?: string;
  reason?: string;
  details?: StatusDetails;
  code: number;
}

/** metav1.Condition. */
export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  observedGeneration?: number;
  lastTransitionTime: string;
  reason: string;
  message: string;
}

/** Group/version/resource: how clients and the server name a collection. */
export interface GVR {
  group: string; // '' for core
  version: string;
  resource: string; // plural, lower case
}

/** The GVR of a kind from its definition (apis/<kind>.ts): the one way to build one. */
export function gvrOf(def: { group: string; version: string; plural: string }): GVR {
  return { group: def.group, version: def.version, resource: def.plural };
}

export function apiVersionOf(gvr: Pick<GVR, 'group' | 'version'>): string {
  return gvr.group ? `${gvr.group}/${gvr.version}` : gvr.version;
}
