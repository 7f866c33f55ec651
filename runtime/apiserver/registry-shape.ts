// The JSON types of the fields the registry itself reads before admission: apiVersion, kind
// and ObjectMeta. kube's decoder refuses a body whose typed fields have the wrong JSON type;
// checking them first means no later step ever meets an object where it expects a string
// (a `{"toString":1}` name once reached String() and gave a 500). Pure; never mutates.
import type { KindDefinition } from '../../apis/types.js';
import { errors } from '../meta/errors.js';
import type { StatusCause } from '../meta/types.js';
import { isPlainObject } from './patch.js';

type JSONType = 'string' | 'integer' | 'map' | 'strings' | 'objects';

const META_TYPES: Record<string, JSONType> = {
  name: 'string',
  generateName: 'string',
  namespace: 'string',
  uid: 'string',
  resourceVersion: 'string',
  creationTimestamp: 'string',
  deletionTimestamp: 'string',
  selfLink: 'string',
  generation: 'integer',
  deletionGracePeriodSeconds: 'integer',
  labels: 'map',
  annotations: 'map',
  finalizers: 'strings',
  ownerReferences: 'objects',
};

/** The JSON type name of a value, as kube's schema errors print it. */
export function jsonTypeOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

function typeCause(field: string, v: unknown, want: string): StatusCause {
  const t = jsonTypeOf(v);
  return {
    reason: 'FieldValueTypeInvalid',
    field,
    message: `Invalid value: "${t}": ${field} in body must be of type ${want}: "${t}"`,
  };
}

function metaCauses(meta: Record<string, unknown>): StatusCause[] {
  const causes: StatusCause[] = [];
  for (const [k, want] of Object.entries(META_TYPES)) {
    const v = meta[k];
    if (v === undefined || v === null) continue;
    const field = `metadata.${k}`;
    switch (want) {
      case 'string':
        if (typeof v !== 'string') causes.push(typeCause(field, v, 'string'));
        break;
      case 'integer':
        if (typeof v !== 'number' || !Number.isSafeInteger(v)) causes.push(typeCause(field, v, 'integer'));
        break;
      case 'map':
        if (!isPlainObject(v)) causes.push(typeCause(field, v, 'object'));
        else
          for (const [mk, mv] of Object.entries(v))
            if (typeof mv !== 'string') causes.push(typeCause(`${field}.${mk}`, mv, 'string'));
        break;
      case 'strings':
        if (!Array.isArray(v)) causes.push(typeCause(field, v, 'array'));
        else v.forEach((x, i) => typeof x !== 'string' && causes.push(typeCause(`${field}[${i}]`, x, 'string')));
        break;
      case 'objects':
        if (!Array.isArray(v)) causes.push(typeCause(field, v, 'array'));
        else v.forEach((x, i) => !isPlainObject(x) && causes.push(typeCause(`${field}[${i}]`, x, 'object')));
        break;
    }
  }
  return causes;
}

/**
 * Checks the body of a create, update or apply (or a patch result): `apiVersion` and `kind`
 * must be strings (else 400, as kube's decoder answers, naming the field), `metadata` an
 * object whose typed fields have their JSON types (else 422 Invalid, one cause per field).
 */
export function checkShapeTypes(def: KindDefinition, body: Record<string, unknown>): void {
  for (const f of ['apiVersion', 'kind'] as const) {
    const v = body[f];
    if (v !== undefined && v !== null && typeof v !== 'string')
      throw errors.badRequest(`json: cannot unmarshal ${jsonTypeOf(v)} into Go struct field .${f} of type string`, [
        {
          reason: 'FieldValueTypeInvalid',
          field: f,
          message: `Invalid value: "${jsonTypeOf(v)}": ${f} in body must be of type string`,
        },
      ]);
  }
  const m = body.metadata;
  if (m === undefined || m === null) return;
  if (!isPlainObject(m)) throw errors.badRequest('metadata must be an object', [typeCause('metadata', m, 'object')]);
  const causes = metaCauses(m);
  if (causes.length) throw errors.invalid(def.kind, def.group, typeof m.name === 'string' ? m.name : '', causes);
}
