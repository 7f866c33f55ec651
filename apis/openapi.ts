// The OpenAPI 3.0 group-version document, built from kind definitions the way kube-apiserver
// publishes CRDs under /openapi/v3/apis/<group>/<version> (docs/reference/kubernetes-api.md
// section 2). kubectl relies on three details: the PATCH operation carries
// x-kubernetes-group-version-kind as a single object and an INLINE `fieldValidation`
// parameter (then it validates server-side), its requestBody never lists
// strategic-merge-patch (then it sends JSON merge patches), and components.schemas holds
// dev.fluxvm.v1alpha1.<Kind> with x-kubernetes-group-version-kind as an array plus every
// schema it references (explain follows allOf:[{$ref}]). The API server serves exactly this
// document (hack/generate.ts writes the fluxvm.dev one to apis/zz_generated.openapi.json), so
// both are pure functions of the kinds: same input, same bytes, same hash.
import { createHash } from 'node:crypto';
import type { KindDefinition, Schema } from './types.js';

const META = 'io.k8s.apimachinery.pkg.apis.meta.v1';
const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });

/** `dev.fluxvm.v1alpha1.Sandbox`, `io.k8s.api.core.v1.Secret`, `io.k8s.api.coordination.v1.Lease`. */
export function schemaName(def: Pick<KindDefinition, 'group' | 'version'>, kind: string): string {
  if (def.group === '') return `io.k8s.api.core.${def.version}.${kind}`;
  if (def.group.endsWith('.k8s.io'))
    return `io.k8s.api.${def.group.slice(0, -'.k8s.io'.length)}.${def.version}.${kind}`;
  return `${def.group.split('.').reverse().join('.')}.${def.version}.${kind}`;
}

function camel(s: string): string {
  return s
    .split(/[.-]/)
    .map((p) => p.charAt(0).toUpperCase() + p.slice(1))
    .join('');
}

/** `FluxvmDevV1alpha1`, `CoreV1`, `CoordinationV1`: the operationId infix kube uses. */
function gvInfix(def: KindDefinition): string {
  const g =
    def.group === '' ? 'core' : def.group.endsWith('.k8s.io') ? def.group.slice(0, -'.k8s.io'.length) : def.group;
  return camel(g) + camel(def.version);
}

function tag(def: KindDefinition): string {
  const g =
    def.group === '' ? 'core' : def.group.endsWith('.k8s.io') ? def.group.slice(0, -'.k8s.io'.length) : def.group;
  const c = camel(g);
  return `${c.charAt(0).toLowerCase()}${c.slice(1)}_${def.version}`;
}

// --- parameters (always inline: kubectl does not resolve $ref parameters in v3) -------------

type Param = {
  name: string;
  in: 'path' | 'query';
  description: string;
  required?: boolean;
  schema: Record<string, unknown>;
};
const q = (name: string, type: string, description: string): Param => ({
  name,
  in: 'query',
  description,
  schema: { type, uniqueItems: true },
});

const P = {
  name: (kind: string): Param => ({
    name: 'name',
    in: 'path',
    description: `name of the ${kind}`,
    required: true,
    schema: { type: 'string', uniqueItems: true },
  }),
  namespace: (): Param => ({
    name: 'namespace',
    in: 'path',
    description: 'object name and auth scope, such as for teams and projects',
    required: true,
    schema: { type: 'string', uniqueItems: true },
  }),
  pretty: () => q('pretty', 'string', "If 'true', then the output is pretty printed."),
  dryRun: () =>
    q(
      'dryRun',
      'string',
      'When present, indicates that modifications should not be persisted. Valid values are: - All: all dry run stages will be processed',
    ),
  fieldManager: () =>
    q(
      'fieldManager',
      'string',
      'fieldManager is a name associated with the actor or entity that is making these changes.',
    ),
  fieldValidation: () =>
    q(
      'fieldValidation',
      'string',
      'fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: - Ignore: drops unknown fields silently. - Warn: drops them and sends a warning for each. - Strict: fails the request with a BadRequest error naming every unknown field.',
    ),
  force: () =>
    q(
      'force',
      'boolean',
      'Force is going to "force" Apply requests. It means user will re-acquire conflicting fields owned by other people. Must be unset for non-apply patch requests.',
    ),
  gracePeriodSeconds: () =>
    q('gracePeriodSeconds', 'integer', 'The duration in seconds before the object should be deleted.'),
  orphanDependents: () => q('orphanDependents', 'boolean', 'Deprecated: please use the PropagationPolicy.'),
  propagationPolicy: () =>
    q(
      'propagationPolicy',
      'string',
      "Whether and how garbage collection will be performed: 'Orphan', 'Background' or 'Foreground'.",
    ),
  list: (): Param[] => [
    q('allowWatchBookmarks', 'boolean', 'allowWatchBookmarks requests watch events with type "BOOKMARK".'),
    q('continue', 'string', 'The continue option should be set when retrieving more results from the server.'),
    q(
      'fieldSelector',
      'string',
      'A selector to restrict the list of returned objects by their fields. Defaults to everything.',
    ),
    q(
      'labelSelector',
      'string',
      'A selector to restrict the list of returned objects by their labels. Defaults to everything.',
    ),
    q('limit', 'integer', 'limit is a maximum number of responses to return for a list call.'),
    q(
      'resourceVersion',
      'string',
      'resourceVersion sets a constraint on what resource versions a request may be served from.',
    ),
    q(
      'resourceVersionMatch',
      'string',
      'resourceVersionMatch determines how resourceVersion is applied to list calls.',
    ),
    q(
      'sendInitialEvents',
      'boolean',
      '`sendInitialEvents=true` may be set together with `watch=true` to begin the watch stream with synthetic events.',
    ),
    q('timeoutSeconds', 'integer', 'Timeout for the list/watch call.'),
    q(
      'watch',
      'boolean',
      'Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.',
    ),
  ],
};

const JSON_YAML = ['application/json', 'application/yaml'];
function response(description: string, schema: object) {
  return { description, content: Object.fromEntries(JSON_YAML.map((t) => [t, { schema }])) };
}
function body(schema: object) {
  return { content: Object.fromEntries(['*/*'].map((t) => [t, { schema }])), required: true };
}
const PATCH_BODY = {
  content: Object.fromEntries(
    ['application/json-patch+json', 'application/merge-patch+json', 'application/apply-patch+yaml'].map((t) => [
      t,
      { schema: ref(`${META}.Patch`) },
    ]),
  ),
  required: true,
};
const UNAUTHORIZED = { description: 'Unauthorized' };

// --- paths ---------------------------------------------------------------------------------

function pathsFor(def: KindDefinition): Record<string, unknown> {
  const root = def.group === '' ? `/api/${def.version}` : `/apis/${def.group}/${def.version}`;
  const nsSeg = def.namespaced ? '/namespaces/{namespace}' : '';
  const coll = `${root}${nsSeg}/${def.plural}`;
  const item = `${coll}/{name}`;
  const gvk = { group: def.group, version: def.version, kind: def.kind };
  const kindRef = ref(schemaName(def, def.kind));
  const listRef = ref(schemaName(def, def.listKind));
  const statusRef = ref(`${META}.Status`);
  const ns = def.namespaced ? 'Namespaced' : '';
  const base = (action: string, verb: string, suffix = '') => ({
    tags: [tag(def)],
    operationId: `${verb}${gvInfix(def)}${ns}${def.kind}${suffix}`,
    'x-kubernetes-action': action,
    'x-kubernetes-group-version-kind': gvk,
  });
  const scope = (name: boolean): Param[] => [
    ...(name ? [P.name(def.kind)] : []),
    ...(def.namespaced ? [P.namespace()] : []),
  ];

  const out: Record<string, unknown> = {};
  out[coll] = {
    get: {
      ...base('list', 'list'),
      description: `list or watch objects of kind ${def.kind}`,
      parameters: [...scope(false), P.pretty(), ...P.list()],
      responses: { '200': response('OK', listRef), '401': UNAUTHORIZED },
    },
    post: {
      ...base('post', 'create'),
      description: `create a ${def.kind}`,
      parameters: [...scope(false), P.pretty(), P.dryRun(), P.fieldManager(), P.fieldValidation()],
      requestBody: body(kindRef),
      responses: {
        '200': response('OK', kindRef),
        '201': response('Created', kindRef),
        '202': response('Accepted', kindRef),
        '401': UNAUTHORIZED,
      },
    },
    delete: {
      ...base('deletecollection', 'deleteCollection'),
      description: `delete collection of ${def.kind}`,
      parameters: [
        ...scope(false),
        P.pretty(),
        P.dryRun(),
        P.gracePeriodSeconds(),
        P.orphanDependents(),
        P.propagationPolicy(),
        ...P.list().filter((p) => p.name !== 'watch' && p.name !== 'allowWatchBookmarks'),
      ],
      requestBody: { content: { '*/*': { schema: ref(`${META}.DeleteOptions`) } } },
      responses: { '200': response('OK', statusRef), '401': UNAUTHORIZED },
    },
  };
  const itemOps = (suffix: string, what: string) => ({
    get: {
      ...base('get', 'read', suffix),
      description: `read ${what} of the specified ${def.kind}`,
      parameters: [...scope(true), P.pretty()],
      responses: { '200': response('OK', kindRef), '401': UNAUTHORIZED },
    },
    put: {
      ...base('put', 'replace', suffix),
      description: `replace ${what} of the specified ${def.kind}`,
      parameters: [...scope(true), P.pretty(), P.dryRun(), P.fieldManager(), P.fieldValidation()],
      requestBody: body(kindRef),
      responses: { '200': response('OK', kindRef), '201': response('Created', kindRef), '401': UNAUTHORIZED },
    },
    patch: {
      ...base('patch', 'patch', suffix),
      description: `partially update ${what} of the specified ${def.kind}`,
      parameters: [...scope(true), P.pretty(), P.dryRun(), P.fieldManager(), P.fieldValidation(), P.force()],
      requestBody: PATCH_BODY,
      responses: { '200': response('OK', kindRef), '201': response('Created', kindRef), '401': UNAUTHORIZED },
    },
  });
  out[item] = {
    ...itemOps('', 'the'),
    delete: {
      ...base('delete', 'delete'),
      description: `delete a ${def.kind}`,
      parameters: [
        ...scope(true),
        P.pretty(),
        P.dryRun(),
        P.gracePeriodSeconds(),
        P.orphanDependents(),
        P.propagationPolicy(),
      ],
      requestBody: { content: { '*/*': { schema: ref(`${META}.DeleteOptions`) } } },
      responses: { '200': response('OK', kindRef), '202': response('Accepted', kindRef), '401': UNAUTHORIZED },
    },
  };
  // Reorder so get/put/delete/patch appear like kube's (cosmetic, but keeps diffs readable).
  const it = out[item] as Record<string, unknown>;
  out[item] = { get: it.get, put: it.put, delete: it.delete, patch: it.patch };
  if (def.statusSubresource) out[`${item}/status`] = itemOps('Status', 'status');
  for (const s of Object.keys(def.fieldSubresources ?? {}))
    out[`${item}/${s}`] = itemOps(s[0].toUpperCase() + s.slice(1), s);
  if (def.namespaced) {
    out[`${root}/${def.plural}`] = {
      get: {
        ...base('list', 'list', 'ForAllNamespaces'),
        operationId: `list${gvInfix(def)}${def.kind}ForAllNamespaces`,
        description: `list or watch objects of kind ${def.kind}`,
        parameters: [P.pretty(), ...P.list()],
        responses: { '200': response('OK', listRef), '401': UNAUTHORIZED },
      },
    };
  }
  return out;
}

// --- schemas -------------------------------------------------------------------------------

/** The kind's schema as published: metadata as a $ref to ObjectMeta, GVK as an array. */
function publishedKindSchema(def: KindDefinition): Schema & Record<string, unknown> {
  const s = structuredClone(def.schema) as Schema & Record<string, unknown>;
  s.properties = {
    ...s.properties,
    metadata: {
      description:
        "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
      allOf: [ref(`${META}.ObjectMeta`)],
    } as Schema,
  };
  s['x-kubernetes-group-version-kind'] = [{ group: def.group, kind: def.kind, version: def.version }];
  return s;
}

function listSchema(def: KindDefinition): Record<string, unknown> {
  return {
    description: `${def.listKind} is a list of ${def.kind}`,
    type: 'object',
    required: ['items'],
    properties: {
      apiVersion: {
        description: 'APIVersion defines the versioned schema of this representation of an object.',
        type: 'string',
      },
      items: { description: `List of ${def.plural}.`, type: 'array', items: ref(schemaName(def, def.kind)) },
      kind: {
        description: 'Kind is a string value representing the REST resource this object represents.',
        type: 'string',
      },
      metadata: { description: 'Standard list metadata.', allOf: [ref(`${META}.ListMeta`)] },
    },
    'x-kubernetes-group-version-kind': [{ group: def.group, kind: def.listKind, version: def.version }],
  };
}

const s = (type: string, description: string, extra: Record<string, unknown> = {}) => ({ type, description, ...extra });
const strMap = (description: string) => ({
  type: 'object',
  description,
  additionalProperties: { type: 'string', default: '' },
});
const strList = (description: string) => ({ type: 'array', description, items: { type: 'string', default: '' } });

/** The apimachinery schemas the paths and kinds reference, with kube's field documentation. */
function metaSchemas(): Record<string, unknown> {
  return {
    [`${META}.ObjectMeta`]: {
      description:
        'ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.',
      type: 'object',
      properties: {
        annotations: strMap(
          'Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata.',
        ),
        creationTimestamp: {
          description:
            'CreationTimestamp is a timestamp representing the server time when this object was created. Read-only.',
          allOf: [ref(`${META}.Time`)],
        },
        deletionGracePeriodSeconds: s(
          'integer',
          'Number of seconds allowed for this object to gracefully terminate before it will be removed from the system.',
          { format: 'int64' },
        ),
        deletionTimestamp: {
          description:
            'DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted. Set by the server when a graceful deletion is requested. Read-only.',
          allOf: [ref(`${META}.Time`)],
        },
        finalizers: {
          ...strList('Must be empty before the object is deleted from the registry.'),
          'x-kubernetes-list-type': 'set',
        },
        generateName: s(
          'string',
          'GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided.',
        ),
        generation: s(
          'integer',
          'A sequence number representing a specific generation of the desired state. Populated by the system. Read-only.',
          { format: 'int64' },
        ),
        labels: strMap(
          'Map of string keys and values that can be used to organize and categorize (scope and select) objects.',
        ),
        managedFields: {
          description:
            'ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow.',
          type: 'array',
          items: { default: {}, allOf: [ref(`${META}.ManagedFieldsEntry`)] },
          'x-kubernetes-list-type': 'atomic',
        },
        name: s('string', 'Name must be unique within a namespace. Cannot be updated.'),
        namespace: s('string', 'Namespace defines the space within which each name must be unique. Cannot be updated.'),
        ownerReferences: {
          description: 'List of objects depended by this object.',
          type: 'array',
          items: { default: {}, allOf: [ref(`${META}.OwnerReference`)] },
          'x-kubernetes-list-map-keys': ['uid'],
          'x-kubernetes-list-type': 'map',
          'x-kubernetes-patch-merge-key': 'uid',
          'x-kubernetes-patch-strategy': 'merge',
        },
        resourceVersion: s('string', 'An opaque value that represents the internal version of this object. Read-only.'),
        selfLink: s(
          'string',
          'Deprecated: selfLink is a legacy read-only field that is no longer populated by the system.',
        ),
        uid: s(
          'string',
          'UID is the unique in time and space value for this object. Populated by the system. Read-only.',
        ),
      },
    },
    [`${META}.ListMeta`]: {
      description:
        'ListMeta describes metadata that synthetic resources must have, including lists and various status objects.',
      type: 'object',
      properties: {
        continue: s('string', 'continue may be set if the user set a limit on the number of items returned.'),
        remainingItemCount: s(
          'integer',
          'The number of subsequent items in the list which are not included in this list response.',
          { format: 'int64' },
        ),
        resourceVersion: s('string', 'String that identifies the server internal version of this object.'),
        selfLink: s(
          'string',
          'Deprecated: selfLink is a legacy read-only field that is no longer populated by the system.',
        ),
      },
    },
    [`${META}.ManagedFieldsEntry`]: {
      description:
        'ManagedFieldsEntry is a workflow-id, a FieldSet and the group version of the resource that the fieldset applies to.',
      type: 'object',
      properties: {
        apiVersion: s('string', 'APIVersion defines the version of this resource that this field set applies to.'),
        fieldsType: s(
          'string',
          'FieldsType is the discriminator for the different fields format and version. There is currently only one possible value: "FieldsV1"',
        ),
        fieldsV1: {
          description: 'FieldsV1 holds the first JSON version format as described in the "FieldsV1" type.',
          allOf: [ref(`${META}.FieldsV1`)],
        },
        manager: s('string', 'Manager is an identifier of the workflow managing these fields.'),
        operation: s(
          'string',
          "Operation is the type of operation which lead to this ManagedFieldsEntry being created. The only valid values for this field are 'Apply' and 'Update'.",
        ),
        subresource: s(
          'string',
          'Subresource is the name of the subresource used to update that object, or empty string if the object was updated through the main resource.',
        ),
        time: {
          description: 'Time is the timestamp of when the ManagedFields entry was added.',
          allOf: [ref(`${META}.Time`)],
        },
      },
    },
    [`${META}.FieldsV1`]: {
      description: 'FieldsV1 stores a set of fields in a data structure like a Trie, in JSON format.',
      type: 'object',
    },
    [`${META}.Time`]: {
      description: 'Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON (RFC 3339).',
      type: 'string',
      format: 'date-time',
    },
    [`${META}.OwnerReference`]: {
      description: 'OwnerReference contains enough information to let you identify an owning object.',
      type: 'object',
      required: ['apiVersion', 'kind', 'name', 'uid'],
      properties: {
        apiVersion: s('string', 'API version of the referent.', { default: '' }),
        blockOwnerDeletion: s(
          'boolean',
          'If true, AND if the owner has the "foregroundDeletion" finalizer, then the owner cannot be deleted from the key-value store until this reference is removed.',
        ),
        controller: s('boolean', 'If true, this reference points to the managing controller.'),
        kind: s('string', 'Kind of the referent.', { default: '' }),
        name: s('string', 'Name of the referent.', { default: '' }),
        uid: s('string', 'UID of the referent.', { default: '' }),
      },
      'x-kubernetes-map-type': 'atomic',
    },
    [`${META}.Status`]: {
      description: 'Status is a return value for calls that do not return other objects.',
      type: 'object',
      properties: {
        apiVersion: s('string', 'APIVersion defines the versioned schema of this representation of an object.'),
        code: s('integer', 'Suggested HTTP return code for this status, 0 if not set.', { format: 'int32' }),
        details: {
          description: 'Extended data associated with the reason.',
          allOf: [ref(`${META}.StatusDetails`)],
          'x-kubernetes-list-type': 'atomic',
        },
        kind: s('string', 'Kind is a string value representing the REST resource this object represents.'),
        message: s('string', 'A human-readable description of the status of this operation.'),
        metadata: { description: 'Standard list metadata.', default: {}, allOf: [ref(`${META}.ListMeta`)] },
        reason: s('string', 'A machine-readable description of why this operation is in the "Failure" status.'),
        status: s('string', 'Status of the operation. One of: "Success" or "Failure".'),
      },
      'x-kubernetes-group-version-kind': [{ group: '', kind: 'Status', version: 'v1' }],
    },
    [`${META}.StatusDetails`]: {
      description:
        'StatusDetails is a set of additional properties that MAY be set by the server to provide additional information about a response.',
      type: 'object',
      properties: {
        causes: {
          description: 'The Causes array includes more details associated with the StatusReason failure.',
          type: 'array',
          items: { default: {}, allOf: [ref(`${META}.StatusCause`)] },
          'x-kubernetes-list-type': 'atomic',
        },
        group: s('string', 'The group attribute of the resource associated with the status StatusReason.'),
        kind: s('string', 'The kind attribute of the resource associated with the status StatusReason.'),
        name: s('string', 'The name attribute of the resource associated with the status StatusReason.'),
        retryAfterSeconds: s('integer', 'If specified, the time in seconds before the operation should be retried.', {
          format: 'int32',
        }),
        uid: s('string', 'UID of the resource.'),
      },
    },
    [`${META}.StatusCause`]: {
      description:
        'StatusCause provides more information about an api.Status failure, including cases when multiple errors are encountered.',
      type: 'object',
      properties: {
        field: s('string', 'The field of the resource that has caused this error, as named by its JSON serialization.'),
        message: s('string', 'A human-readable description of the cause of the error.'),
        reason: s('string', 'A machine-readable description of the cause of the error.'),
      },
    },
    [`${META}.DeleteOptions`]: {
      description: 'DeleteOptions may be provided when deleting an API object.',
      type: 'object',
      properties: {
        apiVersion: s('string', 'APIVersion defines the versioned schema of this representation of an object.'),
        dryRun: {
          ...strList('When present, indicates that modifications should not be persisted.'),
          'x-kubernetes-list-type': 'atomic',
        },
        gracePeriodSeconds: s('integer', 'The duration in seconds before the object should be deleted.', {
          format: 'int64',
        }),
        kind: s('string', 'Kind is a string value representing the REST resource this object represents.'),
        orphanDependents: s('boolean', 'Deprecated: please use the PropagationPolicy.'),
        preconditions: {
          description: 'Must be fulfilled before a deletion is carried out.',
          allOf: [ref(`${META}.Preconditions`)],
        },
        propagationPolicy: s(
          'string',
          "Whether and how garbage collection will be performed: 'Orphan', 'Background' or 'Foreground'.",
        ),
      },
    },
    [`${META}.Preconditions`]: {
      description: 'Preconditions must be fulfilled before an operation (update, delete, etc.) is carried out.',
      type: 'object',
      properties: {
        resourceVersion: s('string', 'Specifies the target ResourceVersion'),
        uid: s('string', 'Specifies the target UID.'),
      },
    },
    [`${META}.Patch`]: {
      description: 'Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.',
      type: 'object',
    },
  };
}

/**
 * The OpenAPI 3.0 document for `kinds`, which must all belong to one group-version (the API
 * server calls it once per group-version). Pure and deterministic: the same kinds give the
 * same document, key order included, so `openapiHash` is stable across processes.
 */
export function buildOpenAPIv3(kinds: KindDefinition[]): Record<string, unknown> {
  const first = kinds[0];
  const gv = first ? (first.group ? `${first.group}/${first.version}` : first.version) : '';
  for (const k of kinds) {
    const kgv = k.group ? `${k.group}/${k.version}` : k.version;
    if (kgv !== gv) throw new Error(`buildOpenAPIv3: kinds of different group-versions (${gv}, ${kgv})`);
  }
  const paths: Record<string, unknown> = {};
  const schemas: Record<string, unknown> = {};
  for (const def of kinds) {
    Object.assign(paths, pathsFor(def));
    schemas[schemaName(def, def.kind)] = publishedKindSchema(def);
    schemas[schemaName(def, def.listKind)] = listSchema(def);
  }
  Object.assign(schemas, metaSchemas());
  const sortedSchemas = Object.fromEntries(
    Object.keys(schemas)
      .sort()
      .map((k) => [k, schemas[k]]),
  );
  return {
    openapi: '3.0.0',
    info: { title: 'FluxVM', version: gv || 'unversioned' },
    paths,
    components: { schemas: sortedSchemas },
  };
}

/** The ETag of a document: upper-case hex sha512 of its JSON, as kube-openapi computes it. */
export function openapiHash(doc: unknown): string {
  return createHash('sha512').update(JSON.stringify(doc)).digest('hex').toUpperCase();
}
