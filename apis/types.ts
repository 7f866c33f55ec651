// The shape of a kind's definition. Each kind has one schema file in apis/ that exports a
// KindDefinition; apis/registry.ts lists them. Everything else (TypeScript types, CRDs,
// /openapi/v3, admission, discovery, Table output) is derived from these definitions.

/** A structural OpenAPI v3 schema node (the subset CRDs allow, plus Kubernetes extensions). */
export interface Schema {
  type?: 'object' | 'array' | 'string' | 'integer' | 'number' | 'boolean';
  description?: string;
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  additionalProperties?: Schema | boolean;
  enum?: unknown[];
  default?: unknown;
  format?: string;
  pattern?: string;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: boolean;
  exclusiveMaximum?: boolean;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  minProperties?: number;
  maxProperties?: number;
  nullable?: boolean;
  'x-kubernetes-preserve-unknown-fields'?: boolean;
  'x-kubernetes-int-or-string'?: boolean;
  'x-kubernetes-embedded-resource'?: boolean;
  'x-kubernetes-list-type'?: 'atomic' | 'set' | 'map';
  'x-kubernetes-list-map-keys'?: string[];
  'x-kubernetes-map-type'?: 'atomic' | 'granular';
  'x-kubernetes-validations'?: ValidationRule[];
}

/** A CEL rule, exactly as in a CRD. `oldSelf` makes it a transition rule. */
export interface ValidationRule {
  rule: string;
  message?: string;
  messageExpression?: string;
  reason?: 'FieldValueInvalid' | 'FieldValueForbidden' | 'FieldValueRequired' | 'FieldValueDuplicate';
  fieldPath?: string;
  optionalOldSelf?: boolean;
}

export interface PrinterColumn {
  name: string;
  type: 'string' | 'integer' | 'number' | 'boolean' | 'date';
  format?: string;
  jsonPath: string;
  description?: string;
  /** 0: always shown; 1: only with -o wide. */
  priority?: number;
}

export interface KindDefinition {
  group: string; // '' for core/v1
  version: string;
  kind: string;
  listKind: string;
  plural: string;
  singular: string;
  namespaced: boolean;
  shortNames: string[];
  categories: string[];
  /** openAPIV3Schema of the whole object (apiVersion, kind, metadata, spec, status). */
  schema: Schema;
  printerColumns: PrinterColumn[];
  /** Whether `status` is a subresource (writes to the main resource ignore .status). */
  statusSubresource: boolean;
  /**
   * Subresources that alone may change some spec fields (as `certificatesigningrequests/approval`
   * alone changes the approval conditions): name -> the dotted paths of the fields, e.g.
   * `{approval: ['spec.decision', 'spec.apply']}`. A write through the subresource changes only
   * those fields; a write of the main resource that changes them needs the subresource's
   * permission (the server's field guard). Served by the registry like `status`.
   */
  fieldSubresources?: Record<string, string[]>;
  /** Imperative subresources served by handlers registered at start-up (exec, files, ...). */
  customSubresources?: string[];
  /**
   * JSON paths usable in fieldSelector besides metadata.name and metadata.namespace, written
   * as the selector names them, without a leading dot (`spec.sandboxRef.name`); the CRD
   * generator adds the dot for `selectableFields[].jsonPath`.
   */
  selectableFields?: string[];
  /** Verbs served; defaults to the full set. */
  verbs?: string[];
  /** True for built-in kinds (core/v1, coordination.k8s.io) that get no CRD. */
  builtin?: boolean;
}
