// The store's in-memory copy of every object: per resource, the objects and their sorted keys,
// and the frozen copies readers share (see the contracts in README.md).
import type { KubeObject } from '../meta/types.js';
import { rememberJSON } from './json-text.js';
import type { ListRange } from './types.js';

/** Objects of one resource, with their keys (`ns\0name`) kept sorted as SQLite orders them. */
export interface ResourceCache {
  objs: Map<string, KubeObject>;
  keys: string[];
}

export const ck = (ns: string, name: string) => `${ns}\u0000${name}`;

/** First index whose key is >= k. */
export function lowerBound(keys: string[], k: string): number {
  let lo = 0;
  let hi = keys.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (keys[mid] < k) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function deepFreeze<T>(v: T): T {
  if (v && typeof v === 'object' && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const k in v) deepFreeze((v as Record<string, unknown>)[k]);
  }
  return v;
}

const NOT_JSON = Symbol('not JSON data');

/**
 * A deeply frozen copy of JSON data, equal to JSON.parse(JSON.stringify(v)) (undefined entries
 * dropped, -0 as 0), or NOT_JSON when `v` holds anything else (then the caller parses).
 */
function freezeCopy(v: unknown): unknown {
  if (v === null || typeof v === 'string' || typeof v === 'boolean') return v;
  if (typeof v === 'number') return Number.isFinite(v) ? v + 0 : NOT_JSON;
  if (typeof v !== 'object') return NOT_JSON;
  if (Array.isArray(v)) {
    const out = new Array(v.length);
    for (let i = 0; i < v.length; i++) {
      const x = v[i] === undefined ? null : freezeCopy(v[i]);
      if (x === NOT_JSON) return NOT_JSON;
      out[i] = x;
    }
    return Object.freeze(out);
  }
  if (Object.getPrototypeOf(v) !== Object.prototype) return NOT_JSON;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v)) {
    const x = (v as Record<string, unknown>)[k];
    if (x === undefined) continue;
    const c = freezeCopy(x);
    if (c === NOT_JSON) return NOT_JSON;
    out[k] = c;
  }
  return Object.freeze(out);
}

/**
 * The private frozen copy of a write (of `obj`, serialized as `data`), its text (and its
 * metadata's) remembered. Copied directly when `obj` is plain JSON data, else parsed.
 */
export function frozenCopy(data: string, metadata: [number, number] | undefined, obj?: unknown): KubeObject {
  const copied = obj === undefined ? NOT_JSON : freezeCopy(obj);
  const frozen = (copied === NOT_JSON ? deepFreeze(JSON.parse(data)) : copied) as KubeObject;
  rememberJSON(frozen, data);
  if (metadata && frozen.metadata) rememberJSON(frozen.metadata, data.slice(metadata[0], metadata[1]));
  return frozen;
}

/** [start, end) indexes of a range in the sorted keys. */
export function span(c: ResourceCache, range: ListRange): [number, number] {
  let start = 0;
  let end = c.keys.length;
  if (range.namespace !== undefined) {
    start = lowerBound(c.keys, ck(range.namespace, ''));
    end = lowerBound(c.keys, `${range.namespace}\u0001`);
  }
  if (range.after) {
    const a = ck(range.after.namespace, range.after.name);
    let i = lowerBound(c.keys, a);
    if (c.keys[i] === a) i++;
    start = Math.max(start, i);
  }
  return [start, Math.max(start, end)];
}
