// JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as kube-apiserver applies them.
// Pure functions: inputs are never mutated. A malformed patch document is 400 BadRequest;
// a well-formed patch that cannot be applied (missing path, failed `test`) is 422 Invalid,
// the codes kube-apiserver answers.
import { errors, StatusError } from '../meta/errors.js';
import { jsonOf } from '../store/json-text.js';
import { MAX_JSON_PATCH_OPS } from './limits.js';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A deep copy of a JSON value. The store's frozen objects come with their JSON text (json-text.ts): only parsed. */
export function deepClone<T>(v: T): T {
  return v === undefined ? v : (JSON.parse(jsonOf(v)) as T);
}

/** Structural equality of JSON values (key order ignored). */
export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((x, i) => deepEqual(x, bb[i]));
  }
  const ao = a as Record<string, unknown>;
  const bo = b as Record<string, unknown>;
  const ak = Object.keys(ao).filter((k) => ao[k] !== undefined);
  const bk = Object.keys(bo).filter((k) => bo[k] !== undefined);
  return (
    ak.length === bk.length && ak.every((k) => Object.prototype.hasOwnProperty.call(bo, k) && deepEqual(ao[k], bo[k]))
  );
}

/** RFC 7386: null deletes, objects merge recursively, anything else replaces. */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isPlainObject(patch)) return deepClone(patch);
  const out: Record<string, unknown> = isPlainObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** Applies a merge patch document to an object; the document must be a JSON object. */
export function applyMergePatch<T>(target: T, patch: unknown): T {
  if (!isPlainObject(patch)) throw errors.badRequest('a merge patch must be a JSON object');
  return mergePatch(deepClone(target), patch) as T;
}

export interface JsonPatchOp {
  op: 'add' | 'remove' | 'replace' | 'move' | 'copy' | 'test';
  path: string;
  from?: string;
  value?: unknown;
}

function parsePointer(ptr: string, what: string): string[] {
  if (typeof ptr !== 'string') throw errors.badRequest(`json patch: ${what} must be a string`);
  if (ptr === '') return [];
  if (!ptr.startsWith('/')) throw errors.badRequest(`json patch: ${what} "${ptr}" is not a JSON pointer`);
  return ptr
    .slice(1)
    .split('/')
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
}

const unprocessable = (message: string) => new StatusError(422, 'Invalid', message);

function arrayIndex(arr: unknown[], tok: string, ptr: string, forAdd: boolean): number {
  if (forAdd && tok === '-') return arr.length;
  if (!/^(0|[1-9][0-9]*)$/.test(tok)) throw unprocessable(`json patch: invalid array index "${tok}" in "${ptr}"`);
  const i = Number(tok);
  if (i > arr.length || (!forAdd && i === arr.length))
    throw unprocessable(`json patch: array index ${i} out of bounds in "${ptr}"`);
  return i;
}

function parentOf(doc: Json, toks: string[], ptr: string): Json {
  let cur: Json = doc;
  for (const t of toks.slice(0, -1)) {
    if (Array.isArray(cur)) cur = cur[arrayIndex(cur, t, ptr, false)];
    else if (isPlainObject(cur) && Object.prototype.hasOwnProperty.call(cur, t)) cur = cur[t];
    else throw unprocessable(`json patch: path "${ptr}" does not exist`);
  }
  if (cur === null || typeof cur !== 'object') throw unprocessable(`json patch: path "${ptr}" does not exist`);
  return cur;
}

function getAt(doc: Json, toks: string[], ptr: string): Json {
  if (toks.length === 0) return doc;
  const parent = parentOf(doc, toks, ptr);
  const last = toks[toks.length - 1];
  if (Array.isArray(parent)) return parent[arrayIndex(parent, last, ptr, false)];
  const o = parent as Record<string, Json>;
  if (!Object.prototype.hasOwnProperty.call(o, last)) throw unprocessable(`json patch: path "${ptr}" does not exist`);
  return o[last];
}

function removeAt(doc: Json, toks: string[], ptr: string): Json {
  if (toks.length === 0) throw unprocessable('json patch: cannot remove the whole document');
  const parent = parentOf(doc, toks, ptr);
  const last = toks[toks.length - 1];
  if (Array.isArray(parent)) return parent.splice(arrayIndex(parent, last, ptr, false), 1)[0];
  const o = parent as Record<string, Json>;
  if (!Object.prototype.hasOwnProperty.call(o, last)) throw unprocessable(`json patch: path "${ptr}" does not exist`);
  const v = o[last];
  delete o[last];
  return v;
}

/** Returns the new document (the root may be replaced). */
function addAt(doc: Json, toks: string[], value: Json, ptr: string, replace: boolean): Json {
  if (toks.length === 0) return value;
  const parent = parentOf(doc, toks, ptr);
  const last = toks[toks.length - 1];
  if (Array.isArray(parent)) {
    const i = arrayIndex(parent, last, ptr, !replace);
    if (replace) parent[i] = value;
    else parent.splice(i, 0, value);
  } else {
    const o = parent as Record<string, Json>;
    if (replace && !Object.prototype.hasOwnProperty.call(o, last))
      throw unprocessable(`json patch: path "${ptr}" does not exist`);
    o[last] = value;
  }
  return doc;
}

/** Validates the shape of a JSON patch document; throws 400 when it is not one. */
export function parseJsonPatch(patch: unknown): JsonPatchOp[] {
  if (!Array.isArray(patch)) throw errors.badRequest('json patch: the document must be a JSON array of operations');
  return patch.map((op, i) => {
    if (!isPlainObject(op)) throw errors.badRequest(`json patch: operation ${i} is not an object`);
    const kind = op.op;
    if (!['add', 'remove', 'replace', 'move', 'copy', 'test'].includes(kind as string))
      throw errors.badRequest(`json patch: operation ${i}: unexpected op ${JSON.stringify(kind)}`);
    if (typeof op.path !== 'string') throw errors.badRequest(`json patch: operation ${i}: missing path`);
    if ((kind === 'move' || kind === 'copy') && typeof op.from !== 'string')
      throw errors.badRequest(`json patch: operation ${i}: missing from`);
    if ((kind === 'add' || kind === 'replace' || kind === 'test') && !('value' in op))
      throw errors.badRequest(`json patch: operation ${i}: missing value`);
    return op as unknown as JsonPatchOp;
  });
}

export interface JsonPatchLimits {
  /** Operations allowed in one patch; more is 413 before any is applied (kube: 10,000). */
  maxOps?: number;
  /** Largest the document may grow to, in serialized characters, checked after every operation (413). */
  maxBytes?: number;
}

/** Serialized size of a JSON value, in UTF-16 units (a cheap bound of its bytes for this check). */
const sizeOf = (v: unknown): number => (v === undefined ? 0 : JSON.stringify(v).length);

/**
 * RFC 6902. Operations apply in order to a copy; any failure aborts the whole patch. With
 * limits, a patch of more than maxOps operations is 413 at once, and the document's size is
 * tracked after every operation (each value added, copied or removed is measured once), so
 * repeated `copy` amplification stops at maxBytes with 413 instead of filling memory.
 */
export function applyJsonPatch<T>(target: T, patch: unknown, limits: JsonPatchLimits = {}): T {
  if (Array.isArray(patch) && patch.length > (limits.maxOps ?? MAX_JSON_PATCH_OPS))
    throw errors.tooLarge(
      `The allowed maximum operations in a JSON patch is ${limits.maxOps ?? MAX_JSON_PATCH_OPS}, got ${patch.length}`,
    );
  const ops = parseJsonPatch(patch);
  let doc = deepClone(target) as unknown as Json;
  const maxBytes = limits.maxBytes;
  let size = maxBytes === undefined ? 0 : sizeOf(doc);
  let copied = 0;
  const grow = (delta: number, i: number) => {
    if (maxBytes === undefined) return;
    size += delta;
    if (size > maxBytes)
      throw errors.tooLarge(
        `Request entity too large: the patched object would exceed the limit of ${maxBytes} bytes (json patch operation ${i})`,
      );
  };
  const keyCost = (toks: string[]) => (toks.length ? toks[toks.length - 1].length + 4 : 0);
  ops.forEach((op, i) => {
    const toks = parsePointer(op.path, 'path');
    switch (op.op) {
      case 'add': {
        const v = deepClone(op.value) as Json;
        grow(sizeOf(v) + keyCost(toks), i);
        doc = addAt(doc, toks, v, op.path, false);
        break;
      }
      case 'replace': {
        const v = deepClone(op.value) as Json;
        const before = maxBytes === undefined ? 0 : sizeOf(getAt(doc, toks, op.path));
        doc = addAt(doc, toks, v, op.path, true);
        grow(sizeOf(v) - before, i);
        break;
      }
      case 'remove': {
        const v = removeAt(doc, toks, op.path);
        grow(-(sizeOf(v) + keyCost(toks)), i);
        break;
      }
      case 'move': {
        const from = parsePointer(op.from!, 'from');
        if (op.path.startsWith(op.from! + '/'))
          throw unprocessable(`json patch: cannot move "${op.from}" into its own child`);
        const v = removeAt(doc, from, op.from!);
        doc = addAt(doc, toks, v, op.path, false);
        grow(keyCost(toks) - keyCost(from), i);
        break;
      }
      case 'copy': {
        const src = getAt(doc, parsePointer(op.from!, 'from'), op.from!);
        // Measured before it is cloned: an amplifying copy is refused without the copy. The
        // bytes copied are bounded in total too (kube's AccumulatedCopySizeLimit), so copy and
        // remove pairs cannot make the server measure the same large value over and over.
        const n = maxBytes === undefined ? 0 : sizeOf(src);
        copied += n;
        if (maxBytes !== undefined && copied > maxBytes)
          throw errors.tooLarge(
            `Unable to copy, the accumulated size increase of copy is ${copied}, exceeding the limit ${maxBytes}`,
          );
        grow(n + keyCost(toks), i);
        doc = addAt(doc, toks, deepClone(src), op.path, false);
        break;
      }
      case 'test': {
        const v = getAt(doc, toks, op.path);
        if (!deepEqual(v, op.value)) throw unprocessable(`testing value ${op.path} failed: test failed`);
        break;
      }
    }
  });
  return doc as unknown as T;
}
