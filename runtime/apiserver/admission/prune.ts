// Structural pruning, as the Kubernetes API server does for custom resources: fields the
// schema does not know are dropped, and their paths reported so fieldValidation can decide
// between an error (Strict), a warning (Warn) or silence (Ignore). Also drops `null` for
// fields that are not nullable (kube does the same before defaulting). Mutates in place.
import type { Schema } from '../../../apis/types.js';
import { SERVER_OWNED_META_FIELDS } from './metadata.js';
import { fieldPath, isPlainObject, type Segment } from './paths.js';

/** Top-level ObjectMeta fields (k8s.io/apimachinery ObjectMeta, JSON names). */
const OBJECT_META_FIELDS = new Set<string>([
  'name',
  'generateName',
  'namespace',
  'labels',
  'annotations',
  'ownerReferences',
  'finalizers',
  'managedFields',
  ...SERVER_OWNED_META_FIELDS,
]);

/** Prunes `obj` (a whole object) against its kind schema; returns the pruned field paths, sorted. */
export function pruneObject(obj: Record<string, unknown>, schema: Schema): string[] {
  const out: string[] = [];
  for (const key of Object.keys(obj)) {
    if (key === 'apiVersion' || key === 'kind') continue;
    if (key === 'metadata') {
      pruneMeta(obj.metadata, ['metadata'], out);
      continue;
    }
    const sub = schema.properties?.[key];
    if (!sub) {
      if (!schema['x-kubernetes-preserve-unknown-fields']) {
        delete obj[key];
        out.push(key);
      }
      continue;
    }
    if (obj[key] === null && !sub.nullable) {
      delete obj[key];
      continue;
    }
    pruneNode(obj[key], sub, [key], out);
  }
  return out.sort();
}

function pruneMeta(meta: unknown, path: Segment[], out: string[]): void {
  if (!isPlainObject(meta)) return;
  for (const k of Object.keys(meta)) {
    if (!OBJECT_META_FIELDS.has(k)) {
      delete meta[k];
      out.push(fieldPath([...path, k]));
    } else if (meta[k] === null) {
      delete meta[k];
    }
  }
}

function pruneNode(value: unknown, schema: Schema, path: Segment[], out: string[]): void {
  if (Array.isArray(value)) {
    if (schema.items) value.forEach((v, i) => pruneNode(v, schema.items!, [...path, i], out));
    return;
  }
  if (!isPlainObject(value)) return;
  const preserve = schema['x-kubernetes-preserve-unknown-fields'] === true;
  const embedded = schema['x-kubernetes-embedded-resource'] === true;
  const addl = typeof schema.additionalProperties === 'object' ? schema.additionalProperties : undefined;
  for (const k of Object.keys(value)) {
    const sub = schema.properties?.[k] ?? addl;
    if (sub) {
      if (value[k] === null && !sub.nullable) {
        delete value[k];
        continue;
      }
      pruneNode(value[k], sub, [...path, k], out);
      continue;
    }
    if (embedded && (k === 'apiVersion' || k === 'kind')) continue;
    if (embedded && k === 'metadata') {
      pruneMeta(value[k], [...path, k], out);
      continue;
    }
    if (preserve || schema.additionalProperties === true) continue;
    delete value[k];
    out.push(fieldPath([...path, k]));
  }
}
