// JSON encoding that reuses the text of the store's frozen objects. Objects the store hands
// out are deep-frozen and shared between reads, so their JSON never changes: the store keeps
// the text it wrote (runtime/store/json-text.ts) and it is spliced into lists, Tables and watch
// events (one serialization per object version, however many readers and watchers; a repeated
// list of 10k objects costs a join instead of a full stringify). Objects that are not frozen
// are stringified every time.
import { jsonOf } from '../../store/json-text.js';

export { jsonOf };

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
