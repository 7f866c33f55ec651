// JSON bytes of a large value without one large string: `jsonBytes(v)` equals
// `Buffer.from(JSON.stringify(v))` byte for byte, but stringifies big arrays in batches.
//
// Why not JSON.stringify: a provenance Statement of a 1,000-file change is ~300 KB of JSON. V8
// puts every string over 128 KiB in its large-object space, whose pages are mapped for that one
// string and unmapped after it, and Buffer.from(string) of that size takes fresh memory too. On
// the 2-core VM the bench runs on, the first touch of a fresh page costs ~11 us (a 100 MiB
// Buffer's first fill: 290 ms; its second: 2.6 ms), so those two copies cost ~1.6 ms of a
// Statement's signing (bench/provenance.ts). Batches of 64 elements stay small strings.
//
// Semantics kept: key order and skipped keys (undefined, functions, symbols) as JSON.stringify;
// `toJSON` and anything that is not a plain object or array is handed to JSON.stringify whole;
// array holes and undefined elements become null inside JSON.stringify's own batches. A cycle
// through plain objects throws a RangeError (JSON.stringify's would be a TypeError).
//
// JsonArrayText is an array given as its elements' JSON text, for a hot path that renders its
// elements itself: a 1,000-file change's provenance has 2,000 of them, and an object per element
// then JSON.stringify took 1.4x the time of the text written directly (0.61 against 0.44 ms for
// its dependencies; bench/RESULTS.md, round-1207f).

const BATCH = 64;

/**
 * An array as its elements' JSON text, kept in batches of BATCH. jsonBytes writes the text as
 * is; JSON.stringify sees it through toJSON (the elements parsed back). Whoever pushes answers
 * for each text being one JSON value (its tests compare it with JSON.stringify of the object).
 */
export class JsonArrayText {
  private readonly done: string[] = [];
  private open: string[] = [];
  length = 0;

  push(json: string): this {
    this.open.push(json);
    this.length++;
    if (this.open.length === BATCH) {
      this.done.push(this.open.join(','));
      this.open = [];
    }
    return this;
  }

  /** The batches: each is some elements' text joined by commas. */
  batches(): string[] {
    return this.open.length > 0 ? [...this.done, this.open.join(',')] : this.done;
  }

  toJSON(): unknown[] {
    return JSON.parse(`[${this.batches().join(',')}]`) as unknown[];
  }
}

function isPlain(v: object): boolean {
  const p = Object.getPrototypeOf(v) as unknown;
  return (p === Object.prototype || p === null) && typeof (v as { toJSON?: unknown }).toJSON !== 'function';
}

function pieces(v: unknown, out: string[]): boolean {
  if (v instanceof JsonArrayText) {
    out.push('[');
    v.batches().forEach((b, i) => out.push(i === 0 ? b : ',' + b));
    out.push(']');
    return true;
  }
  if (Array.isArray(v) && v.length > BATCH && typeof (v as { toJSON?: unknown }).toJSON !== 'function') {
    out.push('[');
    for (let i = 0; i < v.length; i += BATCH) {
      const s = JSON.stringify(v.slice(i, i + BATCH));
      out.push(i === 0 ? s.slice(1, -1) : ',' + s.slice(1, -1));
    }
    out.push(']');
    return true;
  }
  if (v !== null && typeof v === 'object' && isPlain(v)) {
    out.push('{');
    let first = true;
    for (const [k, x] of Object.entries(v)) {
      if (x === undefined || typeof x === 'function' || typeof x === 'symbol') continue;
      out.push((first ? '' : ',') + JSON.stringify(k) + ':');
      first = false;
      pieces(x, out);
    }
    out.push('}');
    return true;
  }
  const s = JSON.stringify(v) as string | undefined;
  if (s === undefined) return false;
  out.push(s);
  return true;
}

/**
 * JSON.stringify(s) for a string: quoted as is when nothing in it needs an escape (a quote, a
 * backslash, a control character, a surrogate: JSON.stringify escapes a lone one), which is
 * twice as fast for the paths of a provenance record.
 */
export function jsonString(s: string): string {
  return NEEDS_ESCAPE.test(s) ? JSON.stringify(s) : `"${s}"`;
}
// eslint-disable-next-line no-control-regex -- the control characters are what JSON escapes
const NEEDS_ESCAPE = /["\\\u0000-\u001f\ud800-\udfff]/;

/** `Buffer.from(JSON.stringify(v))`, built from small strings; throws where JSON.stringify returns undefined. */
export function jsonBytes(v: unknown): Buffer {
  const out: string[] = [];
  if (!pieces(v, out)) throw new TypeError(`a ${typeof v} has no JSON text`);
  let n = 0;
  for (const s of out) n += Buffer.byteLength(s);
  const bytes = Buffer.allocUnsafe(n);
  let at = 0;
  for (const s of out) at += bytes.write(s, at);
  return bytes;
}
