// Bounds on hostile request content, checked before any recursive code sees it: nesting
// depth (JSON text, decoded values, patch results) and YAML alias expansion (go-yaml's rule
// from its CVE-2019-11253 fix). Every walk here is iterative, so a value of any depth or any
// amount of aliasing is refused without using the call stack. Pure functions; they throw a
// StatusError (400 BadRequest) and never mutate their input.
import { errors } from '../meta/errors.js';

/**
 * Deepest nesting of objects/arrays accepted in a request body or produced by a patch. kube's
 * decoder stops at 10,000; ours is lower so that every recursive walk behind it (admission,
 * pruning, CEL, the field manager, merge patch, JSON.stringify) survives it with Node's
 * default stack, which test/runtime/apiserver/limits.test.ts checks at the edge.
 */
export const MAX_DEPTH = 1000;

/** Upper bound of JSON patch operations in one request (kube's maxJSONPatchOperations). */
export const MAX_JSON_PATCH_OPS = 10_000;

const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

export function depthError(max: number): Error {
  return errors.badRequest(`the request body nests deeper than the limit of ${max} levels (json: exceeded max depth)`);
}

/**
 * Throws 400 when the JSON text nests objects/arrays deeper than `max`. A byte scan outside
 * strings; a text shorter than `max` bytes cannot be that deep and is not scanned. Malformed
 * JSON is left to the parser.
 */
export function checkJSONDepth(text: Buffer | string, max = MAX_DEPTH): void {
  if (text.length <= max) return;
  const b = typeof text === 'string' ? Buffer.from(text) : text;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < b.length; i++) {
    const c = b[i];
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) inString = true;
    else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > max) throw depthError(max);
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) depth--;
  }
}

/**
 * The nesting depth of a decoded value (a scalar is 0, `{}` and `[]` are 1), or `max + 1` as
 * soon as it is known to be deeper than `max`. Iterative.
 */
export function valueDepth(v: unknown, max = MAX_DEPTH): number {
  if (v === null || typeof v !== 'object') return 0;
  let deepest = 0;
  const stack: Array<[object, number]> = [[v as object, 1]];
  while (stack.length) {
    const [o, d] = stack.pop()!;
    if (d > deepest) {
      deepest = d;
      if (d > max) return d;
    }
    const children = Array.isArray(o) ? o : Object.values(o);
    for (const c of children) if (c !== null && typeof c === 'object') stack.push([c, d + 1]);
  }
  return deepest;
}

/** Throws 400 when a decoded value nests deeper than `max`. */
export function checkValueDepth(v: unknown, max = MAX_DEPTH): void {
  if (valueDepth(v, max) > max) throw depthError(max);
}

/**
 * Throws 400 when an object to be stored nests deeper than `max`, not counting
 * metadata.managedFields: the server derives those from the object (a few levels deeper
 * than the deepest field), and a client's own were bounded when its body was decoded.
 */
export function checkObjectDepth(obj: Record<string, unknown>, max = MAX_DEPTH): void {
  const m = obj.metadata;
  if (m !== null && typeof m === 'object' && !Array.isArray(m) && 'managedFields' in m) {
    const { managedFields: _mf, ...rest } = m as Record<string, unknown>;
    checkValueDepth({ ...obj, metadata: rest }, max);
  } else checkValueDepth(obj, max);
}

/** go-yaml's allowed share of nodes that come from alias expansion, by decoded node count. */
function allowedAliasRatio(decoded: number): number {
  const low = 400_000;
  const high = 4_000_000;
  if (decoded <= low) return 0.99;
  if (decoded >= high) return 0.1;
  return 0.99 - 0.89 * ((decoded - low) / (high - low));
}

export interface YAMLLimits {
  maxDepth?: number;
  /** Alias expansions allowed before the ratio rule applies (go-yaml: 100). */
  maxAliases?: number;
}

/**
 * Checks a value a YAML parser built, where an alias is the same object reached again
 * (js-yaml shares the anchored node): walks it as it would be expanded, counting every node
 * reached through an alias, and refuses it with 400 "excessive aliasing" by go-yaml's rule
 * (more than 100 alias nodes, more than 1000 nodes, and an alias share above 99%, falling to
 * 10% for documents of 4M nodes), or when the expansion nests deeper than maxDepth. The walk
 * stops at the first violation, so an alias bomb costs about as much as its refused prefix.
 */
export function checkYAMLValue(v: unknown, limits: YAMLLimits = {}): void {
  const maxDepth = limits.maxDepth ?? MAX_DEPTH;
  const maxAliases = limits.maxAliases ?? 100;
  if (v === null || typeof v !== 'object') return;
  const seen = new Set<object>();
  let decoded = 0;
  let aliased = 0;
  const stack: Array<[object, number, boolean]> = [[v as object, 1, false]];
  while (stack.length) {
    const [o, d, viaAlias] = stack.pop()!;
    if (d > maxDepth) throw depthError(maxDepth);
    const alias = viaAlias || seen.has(o);
    seen.add(o);
    decoded++;
    if (alias) aliased++;
    if (aliased > maxAliases && decoded > 1000 && aliased / decoded > allowedAliasRatio(decoded)) {
      throw errors.badRequest('yaml: document contains excessive aliasing');
    }
    const children = Array.isArray(o) ? o : Object.values(o);
    for (const c of children) {
      if (c !== null && typeof c === 'object') stack.push([c, d + 1, alias]);
      else {
        decoded++;
        if (alias) aliased++;
      }
    }
  }
}
