// Field paths in Kubernetes' notation (`spec.staged[0].path`) and value lookups by path
// segments. Shared by the admission steps so every message names fields the same way.

export type Segment = string | number;

export function fieldPath(segs: Segment[]): string {
  let out = '';
  for (const s of segs) {
    if (typeof s === 'number') out += `[${s}]`;
    else out += out ? `.${s}` : s;
  }
  return out;
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The value at `segs` below `root`, or undefined when any step is missing. */
export function valueAt(root: unknown, segs: Segment[]): unknown {
  let cur: unknown = root;
  for (const s of segs) {
    if (typeof s === 'number') {
      if (!Array.isArray(cur)) return undefined;
      cur = cur[s];
    } else {
      if (!isPlainObject(cur)) return undefined;
      cur = cur[s];
    }
  }
  return cur;
}

export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    return a.every((x, i) => deepEqual(x, b[i]));
  }
  if (isPlainObject(a)) {
    if (!isPlainObject(b)) return false;
    const ka = Object.keys(a).filter((k) => a[k] !== undefined);
    const kb = Object.keys(b).filter((k) => b[k] !== undefined);
    if (ka.length !== kb.length) return false;
    return ka.every((k) => deepEqual(a[k], b[k]));
  }
  return false;
}

/** How Kubernetes prints a value in `Invalid value: ...`: strings quoted, objects by type. */
export function formatValue(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v);
  if (v === null || v === undefined) return 'null';
  if (Array.isArray(v)) return '"array"';
  if (typeof v === 'object') return '"object"';
  return String(v);
}

/**
 * A deep copy of JSON data (plain objects, arrays, primitives; `undefined` entries kept), much
 * cheaper than structuredClone for the small objects admission handles. Anything else (a Date,
 * a Map) is copied with structuredClone.
 */
export function cloneJSON<T>(v: T): T {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) {
    const out = new Array(v.length);
    for (let i = 0; i < v.length; i++) out[i] = cloneJSON(v[i]);
    return out as T;
  }
  const proto = Object.getPrototypeOf(v);
  if (proto !== Object.prototype && proto !== null) return structuredClone(v);
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v)) out[k] = cloneJSON((v as Record<string, unknown>)[k]);
  return out as T;
}
