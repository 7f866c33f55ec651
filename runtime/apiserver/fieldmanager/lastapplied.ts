// kube's lastAppliedUpdater: keeps kubectl's client-side apply annotation in step with what
// `kubectl apply --server-side` applies, so a later client-side apply computes the right patch.
import type { KubeObject } from '../../meta/types.js';
import { goJSON } from './fieldset.js';
import { isObject } from './schema.js';
import { clone } from './value.js';

export const LAST_APPLIED_ANNOTATION = 'kubectl.kubernetes.io/last-applied-configuration';
/** kube's total annotation size limit; the last-applied annotation is dropped rather than exceed it. */
const TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024;

/**
 * kube's lastAppliedUpdater: when `obj` (the result of an apply by `kubectl`) carries a
 * non-empty last-applied-configuration annotation, rewrite it from the applied `config`
 * (without that annotation), encoded as kubectl and the apiserver do (JSON, sorted keys,
 * trailing newline). The annotation is dropped if it would push the annotations past 256 KiB.
 * Returns a new object; objects without the annotation come back unchanged. Pure.
 */
export function updateLastApplied<T extends KubeObject>(obj: T, config: KubeObject): T {
  const ann = obj.metadata?.annotations;
  if (!ann || !ann[LAST_APPLIED_ANNOTATION]) return obj;
  const cfg: Record<string, unknown> = { ...clone(config) };
  const md = cfg.metadata;
  if (isObject(md) && isObject(md.annotations)) delete md.annotations[LAST_APPLIED_ANNOTATION];
  const value = goJSON(cfg) + '\n';
  const annotations: Record<string, string> = { ...ann, [LAST_APPLIED_ANNOTATION]: value };
  let size = 0;
  for (const [k, v] of Object.entries(annotations)) size += Buffer.byteLength(k) + Buffer.byteLength(v);
  if (size > TOTAL_ANNOTATION_SIZE_LIMIT) delete annotations[LAST_APPLIED_ANNOTATION];
  return { ...obj, metadata: { ...obj.metadata, annotations } };
}
