// JSON encoding with a per-object cache. Objects the store hands out are deep-frozen and
// shared between reads, so their JSON never changes: it is computed once per object version
// and spliced into lists, Tables and watch events (one stringify per event, however many
// watchers; a repeated list of 10k objects costs a join instead of a full stringify).
// Objects that are not frozen are stringified every time.

const cache = new WeakMap<object, string>();

/** JSON.stringify(v), memoized for frozen objects (treated as deeply immutable). */
export function jsonOf(v: unknown): string {
  if (v === null || typeof v !== 'object' || !Object.isFrozen(v)) return JSON.stringify(v) ?? 'null';
  let s = cache.get(v);
  if (s === undefined) {
    s = JSON.stringify(v);
    cache.set(v, s);
  }
  return s;
}

/** Serializes a list object (kind, apiVersion, metadata, items) splicing cached item JSON; same bytes as JSON.stringify. */
export function listJSON(list: object): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(list)) {
    if (v === undefined) continue;
    const val = k === 'items' && Array.isArray(v) ? `[${v.map(jsonOf).join(',')}]` : JSON.stringify(v);
    parts.push(`${JSON.stringify(k)}:${val}`);
  }
  return `{${parts.join(',')}}`;
}
