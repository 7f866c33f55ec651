// Admission: everything the API server does to a written object before it is stored, driven
// only by the kind's schema (apis/): prune unknown fields (fieldValidation), apply defaults,
// validate metadata, the OpenAPI schema (ajv) and the CEL rules, and report every problem at
// once as one 422 Invalid.
//
// Contract:
// - `admit` never mutates its inputs; it returns a pruned, defaulted deep copy.
// - Bad input only ever throws a StatusError: 400 BadRequest for a body that is not an object
//   or for unknown fields under Strict, 422 Invalid (errors.invalid) listing every cause.
//   Any other exception is a bug: it is rethrown as a plain Error (a 500), never a 4xx.
// - On update (`old` given) validation ratchets like kube: a schema error or a rule without
//   oldSelf on a value that did not change is not reported, so a status write is never refused
//   for a spec that an older schema accepted; transition rules (oldSelf) run only on update.
// - Calling it twice on its own output is safe and gives the same object (idempotent).
import type { KindDefinition } from '../../../apis/types.js';
import { errors, StatusError } from '../../meta/errors.js';
import type { KubeObject, StatusCause } from '../../meta/types.js';
import { checkRules } from './cel.js';
import { applyDefaults } from './defaults.js';
import { validateMetadata } from './metadata.js';
import { cloneJSON, deepEqual, isPlainObject, valueAt } from './paths.js';
import { pruneObject } from './prune.js';
import { checkSameNamespaceRefs } from './refs.js';
import { validateSchema } from './validate.js';
import { strategyFor } from '../registry-strategy.js';

export type FieldValidation = 'Strict' | 'Warn' | 'Ignore';

export interface AdmitOptions {
  fieldValidation: FieldValidation;
  /** 'status' for writes through the status subresource; undefined for the main resource. */
  subresource?: string;
}

export interface AdmitResult<T = Record<string, unknown>> {
  object: T;
  /** `unknown field "spec.foo"` per pruned field under Warn; sent as Warning headers. */
  warnings: string[];
}

export function admit<T = KubeObject>(
  def: KindDefinition,
  obj: unknown,
  old: object | undefined,
  opts: AdmitOptions,
): AdmitResult<T> {
  try {
    return admitInner(def, obj, old, opts) as AdmitResult<T>;
  } catch (e) {
    if (e instanceof StatusError) throw e;
    // Anything else is a bug here, not bad input: it surfaces as a logged, counted 500 (the
    // HTTP layer's toStatusError) instead of a 400 that would hide it.
    throw new Error(`${def.kind} could not be admitted: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
  }
}

function admitInner(def: KindDefinition, input: unknown, old: object | undefined, opts: AdmitOptions): AdmitResult {
  if (!isPlainObject(input))
    throw errors.badRequest(
      `${def.kind} in version "${def.version}" cannot be handled as a ${def.kind}: the body must be a JSON object`,
    );
  const obj = cloneJSON(input) as Record<string, unknown>;
  const oldObj = old === undefined ? undefined : (old as Record<string, unknown>);

  const pruned = pruneObject(obj, def.schema);
  const warnings: string[] = [];
  if (pruned.length && opts.fieldValidation === 'Strict') {
    throw errors.badRequest(
      `${def.kind} in version "${def.version}" cannot be handled as a ${def.kind}: strict decoding error: ${pruned.map((p) => `unknown field "${p}"`).join(', ')}`,
    );
  }
  if (opts.fieldValidation === 'Warn') for (const p of pruned) warnings.push(`unknown field "${p}"`);

  applyDefaults(obj, def.schema);

  // The kind's name rule is its registry strategy's (registry-strategy.ts), with kube's wording.
  const nameRule = strategyFor(def).nameRule;
  const causes: StatusCause[] = validateMetadata(obj.metadata, {
    namespaced: def.namespaced,
    isNamespace: nameRule === 'label',
    pathSegmentNames: nameRule === 'pathSegment',
  });

  const schemaCauses = validateSchema(def, obj).filter((c) => !(oldObj && ratchets(c.segs, obj, oldObj)));
  for (const { segs: _segs, ...c } of schemaCauses) causes.push(c);

  const ruleCauses: StatusCause[] = [];
  for (const [k, sub] of Object.entries(def.schema.properties ?? {})) {
    if (k === 'metadata' || k === 'apiVersion' || k === 'kind') continue;
    checkRules(obj[k], oldObj?.[k], sub, [k], { reportEvalErrors: schemaCauses.length === 0 }, ruleCauses);
  }
  if (def.schema['x-kubernetes-validations']?.length) {
    // Rules on the root see the whole object; none of ours use them, but CRDs may.
    const rootOnly = { ...def.schema, properties: {} };
    checkRules(obj, oldObj, rootOnly, [], { reportEvalErrors: schemaCauses.length === 0 }, ruleCauses);
  }
  causes.push(...ruleCauses);
  causes.push(...checkSameNamespaceRefs(def, obj));

  if (causes.length) {
    const meta = isPlainObject(obj.metadata) ? obj.metadata : {};
    const name =
      typeof meta.name === 'string' && meta.name
        ? meta.name
        : typeof meta.generateName === 'string'
          ? meta.generateName
          : '';
    throw errors.invalid(def.kind, def.group, name, causes);
  }
  return { object: obj, warnings };
}

/**
 * Validation ratcheting: an error on a value that is the same in the old object is not
 * reported. Paths through lists do not ratchet (items of atomic lists do not correlate).
 */
function ratchets(segs: (string | number)[], obj: unknown, old: unknown): boolean {
  if (segs.some((s) => typeof s === 'number')) return false;
  return deepEqual(valueAt(obj, segs), valueAt(old, segs));
}
