// The JSON text of frozen (immutable) objects, remembered per object for the whole process.
// The store serializes every write once (the text goes to SQLite) and remembers that text for
// the frozen copy readers get (and a slice of it for the copy's metadata), so the HTTP layer
// splices it into responses, lists, Tables and watch events instead of serializing again.
// Keyed weakly: an entry lives exactly as long as its object. Only ever holds text for frozen
// objects, whose JSON cannot change.
const texts = new WeakMap<object, string>();

/** Remembers `json` as the JSON text of the frozen object `obj` (the caller guarantees they match). */
export function rememberJSON(obj: object, json: string): void {
  texts.set(obj, json);
}

/** JSON.stringify(v), remembered for frozen objects (treated as deeply immutable). */
export function jsonOf(v: unknown): string {
  if (v === null || typeof v !== 'object' || !Object.isFrozen(v)) return JSON.stringify(v) ?? 'null';
  let s = texts.get(v);
  if (s === undefined) {
    s = JSON.stringify(v);
    texts.set(v, s);
  }
  return s;
}

/**
 * JSON.stringify(obj) of a plain object, with the [start, end) offsets of its `metadata`
 * value in the text (undefined when it has none): one serialization serves both.
 */
export function stringifyWithMetadata(obj: Record<string, unknown>): { json: string; metadata?: [number, number] } {
  let s = '{';
  let metadata: [number, number] | undefined;
  for (const k of Object.keys(obj)) {
    const v = JSON.stringify(obj[k]);
    if (v === undefined) continue;
    if (s.length > 1) s += ',';
    s += `${JSON.stringify(k)}:`;
    if (k === 'metadata') metadata = [s.length, s.length + v.length];
    s += v;
  }
  return { json: `${s}}`, metadata };
}
