// JSON encoding that reuses the text of the store's frozen objects. Objects the store hands
// out are deep-frozen and shared between reads, so their JSON never changes: the store keeps
// the text it wrote (runtime/store/json-text.ts) and it is spliced into lists, Tables and watch
// events (one serialization per object version, however many readers and watchers; a repeated
// list of 10k objects costs a join instead of a full stringify). Objects that are not frozen
// are stringified every time.
import { jsonOf } from '../../store/json-text.js';

export { jsonOf };

/** Roughly how much text one chunk of a streamed list carries. */
export const CHUNK_CHARS = 64 * 1024;

/**
 * `head`, then `items` mapped through `item` and separated by commas, then `tail`, as text
 * chunks of about CHUNK_CHARS: a large list is sent piece by piece (with backpressure) instead
 * of being built as one huge string and one huge Buffer.
 */
export function* chunked<T>(
  head: string,
  items: readonly T[],
  item: (x: T) => string,
  tail: string,
): Generator<string> {
  let parts: string[] = [head];
  let size = head.length;
  for (let i = 0; i < items.length; i++) {
    const s = item(items[i]);
    parts.push(i === 0 ? s : `,${s}`);
    size += s.length + 1;
    if (size >= CHUNK_CHARS) {
      yield parts.join('');
      parts = [];
      size = 0;
    }
  }
  parts.push(tail);
  yield parts.join('');
}

/** listJSON(list) as chunks (see chunked); the same bytes once joined. */
export function listJSONChunks(list: object): Generator<string> {
  const fields: string[] = [];
  let items: unknown[] | undefined;
  let after: string[] = [];
  for (const [k, v] of Object.entries(list)) {
    if (v === undefined) continue;
    if (k === 'items' && Array.isArray(v) && items === undefined) {
      items = v;
      continue;
    }
    (items === undefined ? fields : after).push(`${JSON.stringify(k)}:${JSON.stringify(v)}`);
  }
  if (items === undefined) return chunked(`{${fields.join(',')}}`, [], jsonOf, '');
  const head = `{${fields.map((f) => `${f},`).join('')}"items":[`;
  after = after.map((f) => `,${f}`);
  return chunked(head, items, jsonOf, `]${after.join('')}}`);
}

/**
 * Serializes a list object (kind, apiVersion, metadata, items) splicing cached item JSON; same bytes as JSON.stringify.
 */
export function listJSON(list: object): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(list)) {
    if (v === undefined) continue;
    const val = k === 'items' && Array.isArray(v) ? `[${v.map(jsonOf).join(',')}]` : JSON.stringify(v);
    parts.push(`${JSON.stringify(k)}:${val}`);
  }
  return `{${parts.join(',')}}`;
}
