// Structural defaulting, as kube does for custom resources: a property with a `default` is
// set when its parent object is present and the property is absent; defaulting then
// continues inside every present value (including values that were just defaulted), so
// `workspace: {default: {}}` also gets `workspace.path`. Mutates in place; idempotent.
// Per schema node, the defaulted properties and whether any default exists below are worked
// out once (schemas are immutable), so subtrees without defaults are not walked.
import type { Schema } from '../../../apis/types.js';
import { cloneJSON, isPlainObject } from './paths.js';

interface DefaultsPlan {
  /** Properties of this node with a default. */
  own: Array<[string, unknown]>;
  /** Whether this node or anything below it declares a default. */
  any: boolean;
}

const plans = new WeakMap<Schema, DefaultsPlan>();

function plan(schema: Schema): DefaultsPlan {
  let p = plans.get(schema);
  if (p) return p;
  // Placeholder first: a recursive schema (none today) terminates, walked conservatively.
  p = { own: [], any: true };
  plans.set(schema, p);
  const own: Array<[string, unknown]> = [];
  let any = false;
  for (const [k, sub] of Object.entries(schema.properties ?? {})) {
    if (sub.default !== undefined) own.push([k, sub.default]);
    if (plan(sub).any) any = true;
  }
  if (schema.items && plan(schema.items).any) any = true;
  if (typeof schema.additionalProperties === 'object' && plan(schema.additionalProperties).any) any = true;
  p.own = own;
  p.any = any || own.length > 0;
  return p;
}

export function applyDefaults(value: unknown, schema: Schema): void {
  if (!plan(schema).any) return;
  if (Array.isArray(value)) {
    if (schema.items) for (const v of value) applyDefaults(v, schema.items);
    return;
  }
  if (!isPlainObject(value)) return;
  for (const [k, d] of plan(schema).own) if (value[k] === undefined) value[k] = cloneJSON(d);
  const addl = typeof schema.additionalProperties === 'object' ? schema.additionalProperties : undefined;
  for (const k of Object.keys(value)) {
    const sub = schema.properties?.[k] ?? addl;
    if (sub) applyDefaults(value[k], sub);
  }
}
