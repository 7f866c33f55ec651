// Structural defaulting, as kube does for custom resources: a property with a `default` is
// set when its parent object is present and the property is absent; defaulting then
// continues inside every present value (including values that were just defaulted), so
// `workspace: {default: {}}` also gets `workspace.path`. Mutates in place; idempotent.
import type { Schema } from '../../../apis/types.js';
import { isPlainObject } from './paths.js';

export function applyDefaults(value: unknown, schema: Schema): void {
  if (Array.isArray(value)) {
    if (schema.items) for (const v of value) applyDefaults(v, schema.items);
    return;
  }
  if (!isPlainObject(value)) return;
  if (schema.properties) {
    for (const [k, sub] of Object.entries(schema.properties)) {
      if (value[k] === undefined && sub.default !== undefined) value[k] = structuredClone(sub.default);
    }
  }
  const addl = typeof schema.additionalProperties === 'object' ? schema.additionalProperties : undefined;
  for (const [k, v] of Object.entries(value)) {
    const sub = schema.properties?.[k] ?? addl;
    if (sub) applyDefaults(v, sub);
  }
}
