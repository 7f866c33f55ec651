// Small builders and shared sub-schemas for the kind definitions. They only build plain
// Schema objects (no behaviour), so a kind file reads like the CRD it becomes. Every builder
// takes the field description first: descriptions feed `kubectl explain`, and a test checks
// that no property is left without one.
import type { Schema, ValidationRule } from './types.js';

export const GROUP = 'fluxvm.dev';
export const VERSION = 'v1alpha1';
export const CATEGORIES = ['fluxvm'];
/**
 * The categories of the kinds a user thinks of as what runs (Sandbox, AgentSession, Changeset),
 * as kube puts pods, deployments and jobs in `all`: `kubectl get all` lists them. Checkpoints,
 * Grants and Approvals stay out, as kube keeps volume snapshots, secrets and CSRs out.
 */
export const WORKLOAD_CATEGORIES = [...CATEGORIES, 'all'];

type Extra = Partial<Schema>;

export function str(description: string, extra: Extra = {}): Schema {
  return { type: 'string', description, ...extra };
}

export function int(description: string, extra: Extra = {}): Schema {
  return { type: 'integer', format: 'int64', description, ...extra };
}

export function int32(description: string, extra: Extra = {}): Schema {
  return { type: 'integer', format: 'int32', description, ...extra };
}

export function bool(description: string, extra: Extra = {}): Schema {
  return { type: 'boolean', description, ...extra };
}

export function enumOf(description: string, values: string[], extra: Extra = {}): Schema {
  return { type: 'string', description, enum: values, ...extra };
}

/** An RFC 3339 timestamp (status times are strings, as metav1.Time is on the wire). */
export function time(description: string): Schema {
  return { type: 'string', format: 'date-time', description };
}

export function obj(description: string, properties: Record<string, Schema>, extra: Extra = {}): Schema {
  return { type: 'object', description, properties, ...extra };
}

export function arr(description: string, items: Schema, extra: Extra = {}): Schema {
  return { type: 'array', description, items, ...extra };
}

/** A list of unique strings (x-kubernetes-list-type: set). */
export function strSet(description: string, item: Schema, maxItems: number, extra: Extra = {}): Schema {
  return { type: 'array', description, items: item, maxItems, 'x-kubernetes-list-type': 'set', ...extra };
}

/** A list of objects keyed by `keys` (x-kubernetes-list-type: map); keys must be required. */
export function mapList(description: string, item: Schema, keys: string[], extra: Extra = {}): Schema {
  return {
    type: 'array',
    description,
    items: item,
    'x-kubernetes-list-type': 'map',
    'x-kubernetes-list-map-keys': keys,
    ...extra,
  };
}

export function rules(...r: ValidationRule[]): Extra {
  return { 'x-kubernetes-validations': r };
}

/** `self == oldSelf` on a field: it may not change once set (transition rule). */
export function immutable(what: string): ValidationRule {
  return { rule: 'self == oldSelf', message: `${what} is immutable` };
}

/**
 * A rule for the parent object that forbids adding or removing an optional field after
 * creation. Needed beside `immutable()` because a transition rule on the field itself only
 * runs when both the old and the new object have it.
 */
export function presenceImmutable(field: string): ValidationRule {
  return {
    rule: `has(self.${field}) == has(oldSelf.${field})`,
    message: `${field} cannot be added or removed after creation`,
    fieldPath: `.${field}`,
  };
}

// DNS-1123 label / subdomain, the names Kubernetes uses for objects it references.
export const DNS1123_LABEL = '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$';
export const DNS1123_SUBDOMAIN = '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$';

/** An absolute path: starts with '/', no control characters (`..` is checked by a CEL rule). */
export const ABS_PATH = '^/[^\\x00-\\x1f\\x7f]*$';

/** A rule for a string path node: no `..` component. */
export const NO_DOTDOT: ValidationRule = {
  rule: "!self.contains('/../') && !self.endsWith('/..')",
  message: "must not contain a '..' component",
};

export function absPath(description: string, extra: Extra = {}): Schema {
  return str(description, { pattern: ABS_PATH, maxLength: 4096, ...rules(NO_DOTDOT), ...extra });
}

/** `{name}`: a reference to an object of `kind` in the same namespace. */
export function localRef(description: string, kind: string): Schema {
  return obj(
    description,
    {
      name: str(`Name of the ${kind} in the same namespace.`, {
        minLength: 1,
        maxLength: 253,
        pattern: DNS1123_SUBDOMAIN,
      }),
    },
    { required: ['name'], 'x-kubernetes-map-type': 'atomic' },
  );
}

/** `{name, key}`: one key of a core/v1 Secret in the same namespace. */
export function secretKeyRef(description: string): Schema {
  return obj(
    description,
    {
      name: str('Name of the Secret in the same namespace.', {
        minLength: 1,
        maxLength: 253,
        pattern: DNS1123_SUBDOMAIN,
      }),
      key: str('Key inside the Secret data whose value is used.', {
        minLength: 1,
        maxLength: 253,
        pattern: '^[-._a-zA-Z0-9]+$',
      }),
    },
    { required: ['name', 'key'], 'x-kubernetes-map-type': 'atomic' },
  );
}

/** metav1.Condition, with the validation a `+listType=map` conditions field has upstream. */
export function conditionSchema(): Schema {
  return obj(
    'Condition contains details for one aspect of the current state of this resource.',
    {
      type: str('Type of condition in CamelCase or in foo.example.com/CamelCase (Ready, Conflict, ...).', {
        maxLength: 316,
        pattern:
          '^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$',
      }),
      status: enumOf('Status of the condition, one of True, False, Unknown.', ['True', 'False', 'Unknown']),
      observedGeneration: int('The .metadata.generation that the condition was set based upon.', { minimum: 0 }),
      lastTransitionTime: time('Last time the condition transitioned from one status to another.'),
      reason: str("A programmatic identifier in CamelCase indicating the reason for the condition's last transition.", {
        minLength: 1,
        maxLength: 1024,
        pattern: '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$',
      }),
      message: str('A human readable message indicating details about the transition. May be empty.', {
        maxLength: 32768,
      }),
    },
    { required: ['type', 'status', 'lastTransitionTime', 'reason', 'message'] },
  );
}

export function conditions(description: string): Schema {
  return mapList(description, conditionSchema(), ['type'], { maxItems: 32 });
}

export function observedGeneration(): Schema {
  return int('The most recent metadata.generation the controller has acted on.', { minimum: 0 });
}

/**
 * The top-level object schema every kind shares: apiVersion, kind, metadata (validated by the
 * API machinery, so only `type: object` here, as CRDs require), spec and status.
 */
export function objectSchema(description: string, spec: Schema, status: Schema, specRequired = true): Schema {
  return {
    type: 'object',
    description,
    properties: {
      apiVersion: str(
        'APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values.',
      ),
      kind: str(
        'Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. In CamelCase.',
      ),
      metadata: { type: 'object', description: "Standard object's metadata." },
      spec,
      status,
    },
    ...(specRequired ? { required: ['spec'] } : {}),
  };
}

/**
 * Resource quantities, as Kubernetes writes them. A quantity is either an integer or a string.
 * memory: an integer is bytes; a string is a number with an optional binary (Ki, Mi, Gi, Ti)
 * or decimal (k, M, G, T) suffix, e.g. "512Mi", "2G". cpu: an integer is whole cores; a string
 * is cores ("1.5") or millicores ("500m"). pids: an integer. See apis/quantity.ts for parsing.
 */
export function resourcesSchema(): Schema {
  return obj(
    'Resource limits of the sandbox. Enforced with cgroup v2 where the host allows (status.capabilities.limits says which).',
    {
      memory: {
        description:
          'Memory limit. An integer is bytes; a string is a number with an optional suffix Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000), e.g. "512Mi".',
        'x-kubernetes-int-or-string': true,
        pattern: '^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$',
        maxLength: 32,
      },
      cpu: {
        description: 'CPU limit. An integer is whole cores; a string is cores ("1.5") or millicores ("500m").',
        'x-kubernetes-int-or-string': true,
        pattern: '^([0-9]+m|[0-9]+(\\.[0-9]{1,3})?)$',
        maxLength: 32,
      },
      pids: int('Maximum number of processes and threads in the sandbox.', { minimum: 1, maximum: 1048576 }),
      disk: {
        description:
          'Disk quota of the workspace (its writable layer; also bounds the number of files), a quantity like memory, e.g. "20Gi". Absent: the node default (10Gi).',
        'x-kubernetes-int-or-string': true,
        pattern: '^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$',
        maxLength: 32,
      },
    },
  );
}
