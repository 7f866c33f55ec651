// The store's in-memory copy of every object: per resource, the objects and their sorted keys,
// and the frozen copies readers share (see the contracts in README.md).
import { hash } from 'node:crypto';
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

// managedFields' fieldsV1 trees, shared between the objects whose trees are equal. Most of an
// object's parsed size is its managedFields (one nested object per field a manager set: about 60
// objects for a Grant with a status), and objects of a kind written by the same managers carry
// equal trees: 10,000 Grants hold a handful of distinct ones. A tree is frozen like the rest, so
// sharing it changes nothing a reader can see. A tree is shared from the second time it is seen
// (keyed by its JSON; an entry goes with its tree): a tree no other object has (a label key of its
// own) costs a hash in a bounded set, not its JSON kept beside it. Only within a namespace: a
// tree can name values (`v:` entries of a set), and whether a write found its tree already there
// (a little faster) must tell a tenant nothing about another namespace's objects.
const sharedTrees = new Map<string, WeakRef<object>>();
const treeGone = new FinalizationRegistry<string>((key) => {
  if (sharedTrees.get(key)?.deref() === undefined) sharedTrees.delete(key);
});
/** Hashes of trees seen once (oldest first), at most SEEN_ONCE. */
const seenOnce = new Set<string>();
const SEEN_ONCE = 4096;

/** The shared frozen copy of a fieldsV1 tree of an object in namespace `ns` (NOT_JSON when it is not JSON data). */
function sharedTree(v: unknown, ns: string, copy: (v: unknown) => unknown): unknown {
  if (v === null || typeof v !== 'object') return copy(v);
  const key = `${ns}\u0000${JSON.stringify(v)}`;
  const hit = sharedTrees.get(key)?.deref();
  if (hit) return hit;
  const c = copy(v);
  if (c === NOT_JSON || c === null || typeof c !== 'object') return c;
  const h = hash('md5', key, 'base64'); // a fingerprint: a collision only shares a tree one sight early
  if (seenOnce.delete(h)) {
    sharedTrees.set(key, new WeakRef(c));
    treeGone.register(c, key);
  } else {
    if (seenOnce.size >= SEEN_ONCE) seenOnce.delete(seenOnce.values().next().value!);
    seenOnce.add(h);
  }
  return c;
}

/** How many distinct fieldsV1 trees are shared now (for tests). */
export const sharedTreeCount = (): number => sharedTrees.size;

// Where a value sits, as far as sharing cares: the object, its metadata, managedFields, one entry.
const enum At {
  Root,
  Metadata,
  Managed,
  Entry,
  Other,
}

const childAt = (at: At, k: string): At =>
  at === At.Root && k === 'metadata'
    ? At.Metadata
    : at === At.Metadata && k === 'managedFields'
      ? At.Managed
      : At.Other;

/**
 * A deeply frozen copy of JSON data, equal to JSON.parse(JSON.stringify(v)) (undefined entries
 * dropped, -0 as 0), or NOT_JSON when `v` holds anything else (then the caller parses).
 */
function freezeCopy(v: unknown, at: At = At.Other, ns = ''): unknown {
  if (v === null || typeof v === 'string' || typeof v === 'boolean') return v;
  if (typeof v === 'number') return Number.isFinite(v) ? v + 0 : NOT_JSON;
  if (typeof v !== 'object') return NOT_JSON;
  if (Array.isArray(v)) {
    const inner = at === At.Managed ? At.Entry : At.Other;
    const out = new Array(v.length);
    for (let i = 0; i < v.length; i++) {
      const x = v[i] === undefined ? null : freezeCopy(v[i], inner, ns);
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
    const c =
      at === At.Entry && k === 'fieldsV1' ? sharedTree(x, ns, (t) => freezeCopy(t)) : freezeCopy(x, childAt(at, k), ns);
    if (c === NOT_JSON) return NOT_JSON;
    out[k] = c;
  }
  return Object.freeze(out);
}

/** Parsed JSON text, its fieldsV1 trees swapped for the shared ones, deeply frozen. */
function parseFrozen(data: string): unknown {
  const v = JSON.parse(data) as { metadata?: { managedFields?: unknown; namespace?: unknown } } | null;
  const entries = v?.metadata?.managedFields;
  const ns = typeof v?.metadata?.namespace === 'string' ? v.metadata.namespace : '';
  if (Array.isArray(entries)) {
    for (const e of entries as unknown[]) {
      if (e && typeof e === 'object' && 'fieldsV1' in e) {
        const entry = e as { fieldsV1: unknown };
        entry.fieldsV1 = sharedTree(entry.fieldsV1, ns, (t) => deepFreeze(t));
      }
    }
  }
  return deepFreeze(v);
}

/**
 * The private frozen copy of a write (of `obj`, serialized as `data`), its text (and its
 * metadata's) remembered. Copied directly when `obj` is plain JSON data, else parsed.
 */
export function frozenCopy(data: string, metadata: [number, number] | undefined, obj?: unknown): KubeObject {
  const ns = (obj as { metadata?: { namespace?: unknown } } | undefined)?.metadata?.namespace;
  const copied = obj === undefined ? NOT_JSON : freezeCopy(obj, At.Root, typeof ns === 'string' ? ns : '');
  const frozen = (copied === NOT_JSON ? parseFrozen(data) : copied) as KubeObject;
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
