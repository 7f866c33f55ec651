// Built-in kinds served by the same machinery (no CRD): core/v1 Namespace, Event, Secret,
// ResourceQuota (resourcequota.ts) and coordination.k8s.io/v1 Lease. The schemas follow the
// upstream types field for field where tools rely on them (kubectl describe reads Events,
// leader election writes Leases, grants read Secrets) and preserve unknown fields where
// upstream has deep structures we never read.
import { arr, bool, enumOf, int, int32, obj, rules, str, time } from './common.js';
import { resourceQuota } from './resourcequota.js';
import type { KindDefinition, Schema, ValidationRule } from './types.js';

const API_VERSION = str('APIVersion defines the versioned schema of this representation of an object.');
const KIND = str('Kind is a string value representing the REST resource this object represents.');
const META: Schema = { type: 'object', description: "Standard object's metadata." };

function top(description: string, properties: Record<string, Schema>, required?: string[]): Schema {
  return {
    type: 'object',
    description,
    properties: { apiVersion: API_VERSION, kind: KIND, metadata: META, ...properties },
    ...(required ? { required } : {}),
  };
}

const preserve = (description: string): Schema => ({
  type: 'object',
  description,
  'x-kubernetes-preserve-unknown-fields': true,
});

export const namespace: KindDefinition = {
  group: '',
  version: 'v1',
  kind: 'Namespace',
  listKind: 'NamespaceList',
  plural: 'namespaces',
  singular: 'namespace',
  namespaced: false,
  shortNames: ['ns'],
  categories: [],
  schema: top('Namespace provides a scope for Names. A namespace is a tenant.', {
    spec: obj('Spec defines the behavior of the Namespace.', {
      finalizers: arr(
        'Finalizers is an opaque list of values that must be empty to permanently remove the namespace.',
        str('A finalizer.'),
        {
          'x-kubernetes-list-type': 'atomic',
        },
      ),
    }),
    status: obj('Status describes the current status of a Namespace.', {
      phase: enumOf('Phase is the current lifecycle phase of the namespace.', ['Active', 'Terminating']),
      conditions: arr(
        'Represents the latest available observations of a namespace current state.',
        {
          ...preserve('A namespace condition.'),
          properties: { type: str('Type of namespace controller condition.') },
          required: ['type'],
        },
        { 'x-kubernetes-list-type': 'map', 'x-kubernetes-list-map-keys': ['type'] },
      ),
    }),
  }),
  printerColumns: [
    { name: 'Status', type: 'string', jsonPath: '.status.phase', description: 'The phase of the namespace.' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: true,
  selectableFields: ['status.phase'],
  builtin: true,
};

const objectReference = (description: string): Schema =>
  obj(
    description,
    {
      kind: str('Kind of the referent.'),
      namespace: str('Namespace of the referent.'),
      name: str('Name of the referent.'),
      uid: str('UID of the referent.'),
      apiVersion: str('API version of the referent.'),
      resourceVersion: str('Specific resourceVersion to which this reference is made, if any.'),
      fieldPath: str('If referring to a piece of an object instead of an entire object, the JSON path of that piece.'),
    },
    { 'x-kubernetes-map-type': 'atomic' },
  );

export const event: KindDefinition = {
  group: '',
  version: 'v1',
  kind: 'Event',
  listKind: 'EventList',
  plural: 'events',
  singular: 'event',
  namespaced: true,
  shortNames: ['ev'],
  categories: [],
  schema: top(
    'Event is a report of an event somewhere in the cluster (core/v1, what kubectl describe shows).',
    {
      involvedObject: objectReference('The object that this event is about.'),
      reason: str(
        'A short, machine understandable string that gives the reason for the transition into the object current status (CamelCase).',
      ),
      message: str('A human-readable description of the status of this operation.'),
      source: obj('The component reporting this event.', {
        component: str('Component from which the event is generated.'),
        host: str('Node name on which the event is generated.'),
      }),
      firstTimestamp: time('The time at which the event was first recorded.'),
      lastTimestamp: time('The time at which the most recent occurrence of this event was recorded.'),
      count: int32('The number of times this event has occurred.'),
      type: str('Type of this event (Normal, Warning).'),
      eventTime: time('Time when this Event was first observed (MicroTime).'),
      series: preserve('Data about the Event series this event represents.'),
      action: str('What action was taken/failed regarding the involved object.'),
      related: objectReference('Optional secondary object for more complex actions.'),
      reportingComponent: str('Name of the controller that emitted this Event.'),
      reportingInstance: str('ID of the controller instance.'),
    },
    ['involvedObject'],
  ),
  printerColumns: [
    {
      name: 'Last Seen',
      type: 'date',
      jsonPath: '.lastTimestamp',
      description: 'The time of the most recent occurrence.',
    },
    { name: 'Type', type: 'string', jsonPath: '.type', description: 'Normal or Warning.' },
    { name: 'Reason', type: 'string', jsonPath: '.reason', description: 'Reason of the event.' },
    { name: 'Object', type: 'string', jsonPath: '.involvedObject.name', description: 'The object the event is about.' },
    { name: 'Source', type: 'string', jsonPath: '.source.component', description: 'Reporting component.', priority: 1 },
    { name: 'Message', type: 'string', jsonPath: '.message', description: 'Message of the event.' },
    {
      name: 'First Seen',
      type: 'date',
      jsonPath: '.firstTimestamp',
      description: 'The time of the first occurrence.',
      priority: 1,
    },
    { name: 'Count', type: 'integer', jsonPath: '.count', description: 'Number of occurrences.', priority: 1 },
  ],
  statusSubresource: false,
  selectableFields: [
    'involvedObject.kind',
    'involvedObject.namespace',
    'involvedObject.name',
    'involvedObject.uid',
    'involvedObject.apiVersion',
    'involvedObject.resourceVersion',
    'involvedObject.fieldPath',
    'reason',
    'reportingComponent',
    'type',
  ],
  builtin: true,
};

const SECRET_KEYS: ValidationRule = {
  rule: "self.all(k, k.matches('^[-._a-zA-Z0-9]+$') && size(k) <= 253)",
  message: "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
};

// An immutable Secret keeps its data and stays immutable (kube's ValidateSecretUpdate).
const SECRET_IMMUTABLE: ValidationRule[] = [
  {
    rule: '!has(oldSelf.immutable) || !oldSelf.immutable || (has(self.immutable) && self.immutable)',
    message: 'field is immutable when `immutable` is set',
    fieldPath: '.immutable',
    reason: 'FieldValueForbidden',
  },
  {
    rule: '!has(oldSelf.immutable) || !oldSelf.immutable || (has(self.data) == has(oldSelf.data) && (!has(self.data) || self.data == oldSelf.data))',
    message: 'field is immutable when `immutable` is set',
    fieldPath: '.data',
    reason: 'FieldValueForbidden',
  },
];

export const secret: KindDefinition = {
  group: '',
  version: 'v1',
  kind: 'Secret',
  listKind: 'SecretList',
  plural: 'secrets',
  singular: 'secret',
  namespaced: true,
  shortNames: [],
  categories: [],
  schema: {
    ...top('Secret holds secret data of a certain type. Grants reference one key of a Secret.', {
      data: {
        type: 'object',
        description:
          'Data contains the secret data, base64 encoded. Keys must consist of alphanumeric characters, -, _ or .',
        additionalProperties: { type: 'string', format: 'byte' },
        ...rules(SECRET_KEYS),
      },
      stringData: {
        type: 'object',
        description:
          'stringData allows specifying non-binary secret data in string form; merged into data on write, never output.',
        additionalProperties: { type: 'string' },
        ...rules(SECRET_KEYS),
      },
      type: str('Used to facilitate programmatic handling of secret data (default Opaque).', {
        default: 'Opaque',
        ...rules({ rule: 'self == oldSelf', message: 'field is immutable', reason: 'FieldValueForbidden' }),
      }),
      immutable: bool('If true, data cannot be updated.'),
    }),
    ...rules(...SECRET_IMMUTABLE),
  },
  printerColumns: [
    { name: 'Type', type: 'string', jsonPath: '.type', description: 'The type of the secret.' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: false,
  selectableFields: ['type'],
  builtin: true,
};

export const lease: KindDefinition = {
  group: 'coordination.k8s.io',
  version: 'v1',
  kind: 'Lease',
  listKind: 'LeaseList',
  plural: 'leases',
  singular: 'lease',
  namespaced: true,
  shortNames: [],
  categories: [],
  schema: top('Lease defines a lease concept (leader election).', {
    spec: obj('Spec contains the specification of the Lease.', {
      holderIdentity: str('Identity of the holder of a current lease.'),
      leaseDurationSeconds: int32(
        'Duration that candidates for a lease need to wait to force acquire it, measured against the time of last observed renewTime.',
      ),
      acquireTime: time('Time at which the current lease was acquired (MicroTime).'),
      renewTime: time('Time at which the current holder of the lease last updated it (MicroTime).'),
      leaseTransitions: int32('The number of transitions of a lease between holders.'),
      strategy: str('Strategy used for coordinated leader election.'),
      preferredHolder: str('Signals to a lease holder that the lease has a more optimal holder.'),
    }),
  }),
  printerColumns: [
    { name: 'Holder', type: 'string', jsonPath: '.spec.holderIdentity', description: 'Current holder.' },
    { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp', description: 'Time since creation.' },
  ],
  statusSubresource: false,
  builtin: true,
};

export const coreKinds: KindDefinition[] = [namespace, event, secret, lease, resourceQuota];
