// The type information field management needs, derived from a kind's OpenAPI schema the way
// kube-openapi's schemaconv derives structured-merge-diff types from a CRD:
//   - objects with properties are granular (each field owned separately) unless
//     `x-kubernetes-map-type: atomic`;
//   - `additionalProperties` maps are granular, their entries typed by the value schema;
//   - `x-kubernetes-preserve-unknown-fields` (and schema-less objects) are "deduced": maps
//     granular all the way down, lists atomic, as kube does for untyped content;
//   - arrays are atomic unless `x-kubernetes-list-type` is `set` or `map` (keyed by
//     `x-kubernetes-list-map-keys`).
// `metadata` always uses the ObjectMeta types below, whatever the kind's schema says, because
// that is what kube tracks (labels, annotations, finalizers as a set, ownerReferences keyed by uid).
import type { Schema } from '../../../apis/types.js';

export type TypeNode = ScalarType | MapType | ListType | DeducedType;

export interface ScalarType {
  kind: 'scalar';
}

export interface MapType {
  kind: 'map';
  /** Declared fields (struct fields in kube terms). */
  fields: Map<string, TypeNode>;
  /** Defaults of declared scalar fields, used to complete map-list keys. */
  defaults: Map<string, unknown>;
  /** Type of undeclared keys; undefined means "deduced". */
  elem?: TypeNode;
  atomic: boolean;
}

export interface ListType {
  kind: 'list';
  elem: TypeNode;
  listType: 'atomic' | 'set' | 'map';
  keys: string[];
}

/** Untyped content: resolved from the value (object: granular deduced map; array: atomic). */
export interface DeducedType {
  kind: 'deduced';
}

export const SCALAR: ScalarType = { kind: 'scalar' };
export const DEDUCED: DeducedType = { kind: 'deduced' };
export const DEDUCED_MAP: MapType = {
  kind: 'map',
  fields: new Map(),
  defaults: new Map(),
  elem: DEDUCED,
  atomic: false,
};
export const ATOMIC_LIST: ListType = { kind: 'list', elem: DEDUCED, listType: 'atomic', keys: [] };

const cache = new WeakMap<Schema, MapType>();

/** The root type of a kind's objects. Cached per schema object; safe to call repeatedly. */
export function rootType(schema: Schema): MapType {
  let t = cache.get(schema);
  if (!t) {
    const base = convert(schema);
    const root: MapType =
      base.kind === 'map' ? { ...base, fields: new Map(base.fields) } : { ...DEDUCED_MAP, fields: new Map() };
    root.atomic = false;
    root.fields.set('apiVersion', SCALAR);
    root.fields.set('kind', SCALAR);
    root.fields.set('metadata', OBJECT_META);
    t = root;
    cache.set(schema, t);
  }
  return t;
}

function convert(s: Schema | undefined): TypeNode {
  if (!s) return DEDUCED;
  if (s['x-kubernetes-int-or-string']) return SCALAR;
  const isArray = s.type === 'array' || (!s.type && s.items !== undefined);
  if (isArray) {
    const listType = s['x-kubernetes-list-type'] ?? 'atomic';
    return {
      kind: 'list',
      elem: s.items ? convert(s.items) : DEDUCED,
      listType,
      keys: listType === 'map' ? [...(s['x-kubernetes-list-map-keys'] ?? [])] : [],
    };
  }
  const isObject =
    s.type === 'object' || (!s.type && (s.properties !== undefined || s.additionalProperties !== undefined));
  if (isObject) {
    const fields = new Map<string, TypeNode>();
    const defaults = new Map<string, unknown>();
    for (const [name, ps] of Object.entries(s.properties ?? {})) {
      fields.set(name, convert(ps));
      if (ps.default !== undefined) defaults.set(name, ps.default);
    }
    let elem: TypeNode | undefined;
    if (typeof s.additionalProperties === 'object') elem = convert(s.additionalProperties);
    else elem = DEDUCED; // preserve-unknown-fields, `additionalProperties: true`, or undeclared content
    return { kind: 'map', fields, defaults, elem, atomic: s['x-kubernetes-map-type'] === 'atomic' };
  }
  if (s.type) return SCALAR;
  return DEDUCED;
}

function struct(fields: Record<string, TypeNode>): MapType {
  return { kind: 'map', fields: new Map(Object.entries(fields)), defaults: new Map(), elem: DEDUCED, atomic: false };
}

const STRING_MAP: MapType = { kind: 'map', fields: new Map(), defaults: new Map(), elem: SCALAR, atomic: false };

/** metav1.ObjectMeta as kube's schema declares it. */
export const OBJECT_META: MapType = struct({
  name: SCALAR,
  generateName: SCALAR,
  namespace: SCALAR,
  selfLink: SCALAR,
  uid: SCALAR,
  resourceVersion: SCALAR,
  generation: SCALAR,
  creationTimestamp: SCALAR,
  deletionTimestamp: SCALAR,
  deletionGracePeriodSeconds: SCALAR,
  labels: STRING_MAP,
  annotations: STRING_MAP,
  finalizers: { kind: 'list', elem: SCALAR, listType: 'set', keys: [] },
  ownerReferences: {
    kind: 'list',
    listType: 'map',
    keys: ['uid'],
    elem: struct({
      apiVersion: SCALAR,
      kind: SCALAR,
      name: SCALAR,
      uid: SCALAR,
      controller: SCALAR,
      blockOwnerDeletion: SCALAR,
    }),
  },
  managedFields: { kind: 'list', elem: DEDUCED, listType: 'atomic', keys: [] },
});

export function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/**
 * The effective type of `v` under `t`: deduced types resolve by the value, and a value whose
 * shape does not fit its type (a string where an object is declared) is handled as a scalar
 * leaf, so malformed input never throws here (admission reports it).
 */
export function resolve(t: TypeNode, v: unknown): TypeNode {
  if (t.kind === 'deduced') {
    if (isObject(v)) return DEDUCED_MAP;
    if (Array.isArray(v)) return ATOMIC_LIST;
    return SCALAR;
  }
  if (v === undefined || v === null) return t;
  if (t.kind === 'map' && !isObject(v)) return SCALAR;
  if (t.kind === 'list' && !Array.isArray(v)) return SCALAR;
  return t;
}

/** Type of a map entry and whether it is a declared (struct) field. */
export function fieldType(t: MapType, name: string): { type: TypeNode; declared: boolean } {
  const f = t.fields.get(name);
  if (f) return { type: f, declared: true };
  return { type: t.elem ?? DEDUCED, declared: false };
}
