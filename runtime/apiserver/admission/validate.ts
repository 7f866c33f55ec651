// OpenAPI schema validation with ajv, compiled once per kind and cached, and the mapping of
// ajv's errors to StatusCauses worded as the Kubernetes API server words them for custom
// resources (apiextensions-apiserver validation -> field.Error).
import _Ajv, { type ErrorObject, type ValidateFunction } from 'ajv';
import _addFormats from 'ajv-formats';
import type { KindDefinition, Schema } from '../../../apis/types.js';
import type { StatusCause } from '../../meta/types.js';
import { fieldPath, formatValue, type Segment } from './paths.js';

// ajv and ajv-formats are CommonJS with a `default` property; take whichever is the function.
type AjvClass = typeof _Ajv.default;
type AddFormats = typeof _addFormats.default;
const AjvCtor: AjvClass = (_Ajv as unknown as { default?: AjvClass }).default ?? (_Ajv as unknown as AjvClass);
const addFormats: AddFormats =
  (_addFormats as unknown as { default?: AddFormats }).default ?? (_addFormats as unknown as AddFormats);

const ajv = new AjvCtor({ allErrors: true, strict: false, verbose: true, validateFormats: true });
addFormats(ajv, ['date-time', 'date', 'uri', 'email', 'hostname', 'ipv4', 'ipv6', 'uuid', 'byte']);
// `type: integer` already refuses fractions; the formats only bound the range.
ajv.addFormat('int32', {
  type: 'number',
  validate: (n: number) => !Number.isInteger(n) || (n >= -(2 ** 31) && n < 2 ** 31),
});
ajv.addFormat('int64', { type: 'number', validate: () => true });
ajv.addFormat('double', { type: 'number', validate: () => true });
ajv.addFormat('float', { type: 'number', validate: () => true });

const cache = new WeakMap<KindDefinition, ValidateFunction>();

/** Turns a structural schema into plain JSON Schema for ajv (int-or-string, no extensions). */
export function toAjvSchema(s: Schema): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s)) {
    if (k.startsWith('x-kubernetes-') || k === 'description' || k === 'default') continue;
    if (k === 'properties')
      out.properties = Object.fromEntries(
        Object.entries(v as Record<string, Schema>).map(([p, ps]) => [p, toAjvSchema(ps)]),
      );
    else if (k === 'items') out.items = toAjvSchema(v as Schema);
    else if (k === 'additionalProperties' && typeof v === 'object') out.additionalProperties = toAjvSchema(v as Schema);
    else out[k] = v;
  }
  if (s['x-kubernetes-int-or-string']) out.type = ['integer', 'string'];
  // Format keywords for int32/int64 apply to numbers only; ajv checks them as declared above.
  return out;
}

function validatorFor(def: KindDefinition): ValidateFunction {
  const hit = cache.get(def);
  if (hit) return hit;
  const v = ajv.compile(toAjvSchema(def.schema));
  cache.set(def, v);
  return v;
}

function segments(instancePath: string): Segment[] {
  if (!instancePath) return [];
  return instancePath
    .slice(1)
    .split('/')
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))
    .map((p) => (/^[0-9]+$/.test(p) ? Number(p) : p));
}

export interface SchemaCause extends StatusCause {
  /** Path segments of the bad value, for ratcheting on update. */
  segs: Segment[];
}

/**
 * Validates `obj` against the kind schema. Returns one cause per problem; kube reports every
 * problem of a field, so several causes can name one field.
 */
export function validateSchema(def: KindDefinition, obj: unknown): SchemaCause[] {
  const validate = validatorFor(def);
  if (validate(obj)) return [];
  const causes: SchemaCause[] = [];
  const seen = new Set<string>();
  for (const e of validate.errors ?? []) {
    const c = toCause(e);
    if (!c) continue;
    const key = `${c.field}\0${c.message}`;
    if (seen.has(key)) continue;
    seen.add(key);
    causes.push(c);
  }
  return causes;
}

/** The params of the ajv keywords toCause maps (ajv gives each keyword its own; one shape covers these). */
interface KeywordParams {
  missingProperty: string;
  allowedValues: unknown[];
  type: string | string[];
  limit: number;
  pattern: string;
  format: string;
  additionalProperty: string;
}

function toCause(e: ErrorObject): SchemaCause | undefined {
  let segs = segments(e.instancePath);
  const p = e.params as KeywordParams;
  const v = e.data;
  let field = fieldPath(segs);
  const inBody = `${field} in body`;
  const invalid = (msg: string, shown: unknown = v): SchemaCause => ({
    reason: 'FieldValueInvalid',
    field,
    segs,
    message: `Invalid value: ${formatValue(shown)}: ${msg}`,
  });
  switch (e.keyword) {
    case 'required':
      segs = [...segs, p.missingProperty];
      field = fieldPath(segs);
      return { reason: 'FieldValueRequired', field, segs, message: 'Required value' };
    case 'enum':
      return {
        reason: 'FieldValueNotSupported',
        field,
        segs,
        message: `Unsupported value: ${formatValue(v)}: supported values: ${(p.allowedValues as unknown[]).map((x) => JSON.stringify(x)).join(', ')}`,
      };
    case 'type': {
      const want = Array.isArray(p.type) ? p.type.join(',') : String(p.type);
      const got =
        v === null
          ? 'null'
          : Array.isArray(v)
            ? 'array'
            : typeof v === 'number'
              ? Number.isInteger(v)
                ? 'integer'
                : 'number'
              : typeof v;
      return {
        reason: 'FieldValueTypeInvalid',
        field,
        segs,
        message: `Invalid value: ${JSON.stringify(got)}: ${inBody} must be of type ${want}: ${JSON.stringify(got)}`,
      };
    }
    case 'minimum':
      return invalid(`${inBody} should be greater than or equal to ${p.limit}`);
    case 'exclusiveMinimum':
      return invalid(`${inBody} should be greater than ${p.limit}`);
    case 'maximum':
      return invalid(`${inBody} should be less than or equal to ${p.limit}`);
    case 'exclusiveMaximum':
      return invalid(`${inBody} should be less than ${p.limit}`);
    case 'pattern':
      return invalid(`${inBody} should match '${p.pattern}'`);
    case 'minLength':
      return invalid(`${inBody} should be at least ${p.limit} chars long`);
    case 'maxLength':
      return {
        reason: 'FieldValueTooLong',
        field,
        segs,
        message: `Too long: may not be more than ${p.limit} ${p.limit === 1 ? 'byte' : 'bytes'}`,
      };
    case 'minItems':
      return invalid(`${inBody} should have at least ${p.limit} items`, Array.isArray(v) ? v.length : v);
    case 'maxItems':
      return {
        reason: 'FieldValueTooMany',
        field,
        segs,
        message: `Too many: ${Array.isArray(v) ? v.length : '?'}: must have at most ${p.limit} ${p.limit === 1 ? 'item' : 'items'}`,
      };
    case 'minProperties':
      return invalid(`${inBody} should have at least ${p.limit} properties`);
    case 'maxProperties':
      return {
        reason: 'FieldValueTooMany',
        field,
        segs,
        message: `Too many: ${v && typeof v === 'object' ? Object.keys(v).length : '?'}: must have at most ${p.limit} items`,
      };
    case 'format':
      return invalid(`${inBody} must be of type ${p.format}: ${JSON.stringify(v)}`);
    case 'additionalProperties':
      // Pruning removed unknown fields before validation; a leftover means a typed map.
      return {
        reason: 'FieldValueForbidden',
        field: fieldPath([...segs, p.additionalProperty]),
        segs,
        message: 'Forbidden: field not declared in schema',
      };
    case 'if':
    case 'anyOf':
    case 'oneOf':
      return undefined;
    default:
      return invalid(`${inBody} ${e.message ?? 'is invalid'}`);
  }
}
