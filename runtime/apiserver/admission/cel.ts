// x-kubernetes-validations (CEL) and x-kubernetes-list-type checks, evaluated the way the
// Kubernetes API server evaluates them for custom resources:
// - `self` is the value of the node the rule is on, `oldSelf` the old value of that node;
// - a transition rule (one that mentions oldSelf) runs only when an old value exists (update,
//   and the node correlates: object properties by name, map-list items by their keys);
// - a rule without oldSelf is skipped when the value did not change (validation ratcheting);
// - integers are CEL ints, objects are maps, so `has(self.x)`, `size()`, `all()` work;
// - the cause names `<node path><fieldPath>` with the rule's reason (FieldValueInvalid
//   by default) and `message` (or messageExpression, or "failed rule: <rule>").
// - not supported: `optionalOldSelf` (the evaluator has no optional types; such a rule is
//   run as an ordinary transition rule, i.e. skipped on create) and kube's CEL libraries
//   (quantity, url, format): apis/README.md keeps schema rules to standard CEL;
// - strings with format date-time stay strings (kube makes them timestamps); no schema rule
//   touches one (tested in test/apis).
// Planned programs are cached by rule text; evaluation never throws.
import { celEnv, isCelError, parse, plan, type CelInput } from '@bufbuild/cel';
import { strings } from '@bufbuild/cel/ext';
import type { Schema, ValidationRule } from '../../../apis/types.js';
import type { StatusCause } from '../../meta/types.js';
import { deepEqual, fieldPath, isPlainObject, type Segment } from './paths.js';

type Program = (ctx: Record<string, CelInput>) => unknown;
const env = celEnv({ funcs: strings });
const programs = new Map<string, Program | Error>();

function program(expr: string): Program | Error {
  let p = programs.get(expr);
  if (!p) {
    try {
      p = plan(env, parse(expr)) as unknown as Program;
    } catch (e) {
      p = e instanceof Error ? e : new Error(String(e));
    }
    programs.set(expr, p);
  }
  return p;
}

/** Evaluates one CEL expression; returns the value or an Error (never throws). */
export function evalCel(expr: string, bindings: Record<string, unknown>): unknown {
  const p = program(expr);
  if (p instanceof Error) return p;
  try {
    const r = p(bindings as Record<string, CelInput>);
    return isCelError(r) ? new Error(r.message) : r;
  } catch (e) {
    return e instanceof Error ? e : new Error(String(e));
  }
}

/** Values converted by toCel (each node counts): what the presence-only rules skip (tests read it). */
export const celConversions = { nodes: 0 };

/** JSON value -> CEL input, typed by the schema (integers become CEL ints, objects maps). */
export function toCel(v: unknown, s: Schema | undefined): unknown {
  celConversions.nodes++;
  if (v === null || v === undefined) return null;
  if (typeof v === 'number') {
    const wantsDouble = s?.type === 'number';
    return !wantsDouble && Number.isInteger(v) ? BigInt(v) : v;
  }
  if (Array.isArray(v)) return v.map((x) => toCel(x, s?.items));
  if (isPlainObject(v)) {
    const addl = s && typeof s.additionalProperties === 'object' ? s.additionalProperties : undefined;
    const m = new Map<string, unknown>();
    for (const [k, x] of Object.entries(v)) if (x !== undefined) m.set(k, toCel(x, s?.properties?.[k] ?? addl));
    return m;
  }
  return v;
}

const TRANSITION = /\boldSelf\b/;

// A rule whose every mention of self and oldSelf is `has(self.<field>)` / `has(oldSelf.<field>)`
// reads only which fields are present. For an object it gets a one-level map of those fields
// (true, or null where the field is null) instead of the converted subtree: the same CEL
// program, the same result, as has() on a map reads only the entry's presence and nullness.
// Mentions inside string literals count as uses (the whole conversion then, never a wrong shortcut).
const PRESENCE = /\bhas\(\s*(?:self|oldSelf)\s*\.\s*[A-Za-z_][A-Za-z0-9_]*\s*\)/g;
const presenceRules = new Map<string, boolean>();

export function isPresenceOnlyRule(rule: string): boolean {
  let p = presenceRules.get(rule);
  if (p === undefined) {
    p = !/\b(?:self|oldSelf)\b/.test(rule.replace(PRESENCE, ''));
    presenceRules.set(rule, p);
  }
  return p;
}

/** What a presence-only rule sees of `v`: an object's defined fields (true, or null); anything else converted. */
function presenceOf(v: unknown, s: Schema): unknown {
  if (!isPlainObject(v)) return toCel(v, s);
  const m = new Map<string, unknown>();
  // A null field stays null (has() of a null entry is false in this evaluator, as for the converted map).
  for (const k of Object.keys(v)) if (v[k] !== undefined) m.set(k, v[k] === null ? null : true);
  return m;
}

export function isTransitionRule(r: ValidationRule): boolean {
  return TRANSITION.test(r.rule);
}

export interface RuleOptions {
  /** Report CEL evaluation errors (off when schema validation already failed: types may be wrong). */
  reportEvalErrors: boolean;
}

// Whether a schema node or anything below it has rules or a set/map list type: subtrees
// without any are not walked. Computed once per (immutable) schema node.
const checked = new WeakMap<Schema, boolean>();

function needsCheck(schema: Schema): boolean {
  let n = checked.get(schema);
  if (n !== undefined) return n;
  checked.set(schema, true); // a recursive schema (none today) is walked conservatively
  n =
    !!schema['x-kubernetes-validations']?.length ||
    schema['x-kubernetes-list-type'] === 'set' ||
    schema['x-kubernetes-list-type'] === 'map' ||
    Object.values(schema.properties ?? {}).some(needsCheck) ||
    (!!schema.items && needsCheck(schema.items)) ||
    (typeof schema.additionalProperties === 'object' && needsCheck(schema.additionalProperties));
  checked.set(schema, n);
  return n;
}

/** Walks `value` (and `old`) under `schema`; returns the causes of every failed rule. */
export function checkRules(
  value: unknown,
  old: unknown,
  schema: Schema,
  segs: Segment[],
  opts: RuleOptions,
  out: StatusCause[] = [],
): StatusCause[] {
  if (value === undefined || value === null || !needsCheck(schema)) return out;
  const rulesHere = schema['x-kubernetes-validations'];
  if (rulesHere?.length) {
    const unchanged = old !== undefined && deepEqual(value, old);
    let self: unknown;
    let oldSelf: unknown;
    let presentSelf: unknown;
    let presentOld: unknown;
    for (const r of rulesHere) {
      const transition = isTransitionRule(r);
      if (transition && old === undefined) continue;
      if (!transition && unchanged) continue;
      let res: unknown;
      if (isPresenceOnlyRule(r.rule)) {
        presentSelf ??= presenceOf(value, schema);
        if (transition) presentOld ??= presenceOf(old, schema);
        res = evalCel(r.rule, transition ? { self: presentSelf, oldSelf: presentOld } : { self: presentSelf });
      } else {
        self ??= toCel(value, schema);
        if (transition) oldSelf ??= toCel(old, schema);
        res = evalCel(r.rule, transition ? { self, oldSelf } : { self });
      }
      if (res === true) continue;
      if (res instanceof Error && !opts.reportEvalErrors) continue;
      // The cause's messageExpression sees the whole values, as it would have without the shortcut.
      self ??= toCel(value, schema);
      if (transition || presentOld !== undefined) oldSelf ??= toCel(old, schema);
      out.push(ruleCause(r, schema, segs, res, { self, oldSelf }));
    }
  }
  if (Array.isArray(value)) {
    listTypeCauses(value, schema, segs, out);
    if (schema.items) {
      const oldByKey = correlate(old, schema);
      value.forEach((item, i) => checkRules(item, oldByKey?.(item), schema.items!, [...segs, i], opts, out));
    }
    return out;
  }
  if (isPlainObject(value)) {
    const addl = typeof schema.additionalProperties === 'object' ? schema.additionalProperties : undefined;
    const oldObj = isPlainObject(old) ? old : undefined;
    for (const [k, v] of Object.entries(value)) {
      const sub = schema.properties?.[k] ?? addl;
      if (sub) checkRules(v, oldObj?.[k], sub, [...segs, k], opts, out);
    }
  }
  return out;
}

/** For a map list, a function finding the old item with the same keys; otherwise undefined. */
function correlate(old: unknown, schema: Schema): ((item: unknown) => unknown) | undefined {
  if (!Array.isArray(old) || schema['x-kubernetes-list-type'] !== 'map') return undefined;
  const keys = schema['x-kubernetes-list-map-keys'] ?? [];
  return (item) => {
    if (!isPlainObject(item)) return undefined;
    return old.find((o) => isPlainObject(o) && keys.every((k) => deepEqual(o[k], item[k])));
  };
}

function listTypeCauses(list: unknown[], schema: Schema, segs: Segment[], out: StatusCause[]): void {
  const type = schema['x-kubernetes-list-type'];
  if (type === 'set') {
    list.forEach((item, i) => {
      if (list.findIndex((x) => deepEqual(x, item)) < i)
        out.push({
          reason: 'FieldValueDuplicate',
          field: fieldPath([...segs, i]),
          message: `Duplicate value: ${JSON.stringify(item)}`,
        });
    });
  } else if (type === 'map') {
    const keys = schema['x-kubernetes-list-map-keys'] ?? [];
    const keyOf = (x: unknown) => (isPlainObject(x) ? Object.fromEntries(keys.map((k) => [k, x[k]])) : x);
    list.forEach((item, i) => {
      const key = keyOf(item);
      if (list.findIndex((x) => deepEqual(keyOf(x), key)) < i)
        out.push({
          reason: 'FieldValueDuplicate',
          field: fieldPath([...segs, i]),
          message: `Duplicate value: ${JSON.stringify(key)}`,
        });
    });
  }
}

function ruleCause(
  r: ValidationRule,
  schema: Schema,
  segs: Segment[],
  res: unknown,
  bindings: Record<string, unknown>,
): StatusCause {
  const base = fieldPath(segs);
  const rel = r.fieldPath ?? '';
  const field = base ? base + rel : rel.replace(/^\./, '');
  let msg: string;
  if (res instanceof Error) msg = `${res.message} evaluating rule: ${r.rule}`;
  else if (typeof res !== 'boolean') msg = `rule did not evaluate to a bool: ${r.rule}`;
  else {
    msg = r.message ?? `failed rule: ${r.rule}`;
    if (r.messageExpression) {
      const m = evalCel(r.messageExpression, bindings);
      if (typeof m === 'string' && m.trim() !== '' && !m.includes('\n')) msg = m;
    }
  }
  const reason = res instanceof Error ? 'FieldValueInvalid' : (r.reason ?? 'FieldValueInvalid');
  const typeName = schema['x-kubernetes-int-or-string'] ? 'object' : (schema.type ?? 'object');
  switch (reason) {
    case 'FieldValueForbidden':
      return { reason, field, message: `Forbidden: ${msg}` };
    case 'FieldValueRequired':
      return { reason, field, message: `Required value: ${msg}` };
    case 'FieldValueDuplicate':
      return { reason, field, message: `Duplicate value: ${JSON.stringify(typeName)}: ${msg}` };
    default:
      return { reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(typeName)}: ${msg}` };
  }
}
