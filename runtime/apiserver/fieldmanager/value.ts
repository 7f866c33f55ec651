// Typed operations on JSON values, after structured-merge-diff's typed package: the field set of
// a value, the comparison of two values (added / modified / removed paths), the apply merge, and
// removal of paths. All functions are pure: they never modify their inputs.
import { FieldSet, comparePE, compareStrings, makeKey, type Path, type PathElement, peKey } from './fieldset.js';
import { type ListType, type MapType, type TypeNode, fieldType, isObject, resolve } from './schema.js';

export function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!deepEqual(a[i], b[i])) return false;
    return true;
  }
  if (isObject(a)) {
    if (!isObject(b)) return false;
    const ka = Object.keys(a).filter((k) => a[k] !== undefined);
    const kb = Object.keys(b).filter((k) => b[k] !== undefined);
    if (ka.length !== kb.length) return false;
    for (const k of ka) if (!(k in b) || !deepEqual(a[k], b[k])) return false;
    return true;
  }
  return false;
}

export function clone<T>(v: T): T {
  return v === undefined ? v : (JSON.parse(JSON.stringify(v)) as T);
}

/**
 * The path element naming a list item: `k:{...}` for map-lists (missing key fields are taken
 * from the schema default, or left out), `v:<json>` for set-lists and for items that cannot
 * be keyed (not an object, or no key field present).
 */
export function itemPE(t: ListType, item: unknown, index: number): PathElement {
  if (t.listType === 'map') {
    if (isObject(item) && t.keys.length > 0) {
      const defaults = t.elem.kind === 'map' ? t.elem.defaults : undefined;
      const pairs: Array<[string, unknown]> = [];
      for (const k of t.keys) {
        const v = item[k] !== undefined ? item[k] : defaults?.get(k);
        if (v !== undefined) pairs.push([k, v]);
      }
      if (pairs.length > 0) return makeKey(pairs);
    }
    return { value: item };
  }
  if (t.listType === 'set') return { value: item };
  return { index };
}

/** Items of a list indexed by path element; later duplicates are ignored (kube does the same). */
function indexItems(t: ListType, list: unknown[]): Array<{ pe: PathElement; key: string; item: unknown }> {
  const seen = new Set<string>();
  const out: Array<{ pe: PathElement; key: string; item: unknown }> = [];
  list.forEach((item, i) => {
    const pe = itemPE(t, item, i);
    const key = peKey(pe);
    if (seen.has(key)) return;
    seen.add(key);
    out.push({ pe, key, item });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// toFieldSet

/**
 * Every field the value sets: leaves (scalars, atomic lists and maps, null and empty objects),
 * plus list items and undeclared map entries as members of their own (so `k:{...}` and map
 * entries of objects carry `.`). Declared object fields with children are not members.
 */
export function toFieldSet(v: unknown, t: TypeNode): FieldSet {
  const set = new FieldSet();
  walkSet(v, t, [], set);
  return set;
}

// `path` is a stack shared by the whole walk (insert copies what it keeps).
function walkSet(v: unknown, t0: TypeNode, path: Path, set: FieldSet): void {
  if (v === undefined) return;
  const t = resolve(t0, v);
  if (v === null || t.kind === 'scalar' || t.kind === 'deduced') {
    set.insert(path);
    return;
  }
  if (t.kind === 'map') {
    if (t.atomic) {
      set.insert(path);
      return;
    }
    for (const k in v as Record<string, unknown>) {
      const cv = (v as Record<string, unknown>)[k];
      if (cv === undefined) continue;
      const { type, declared } = fieldType(t, k);
      path.push({ field: k });
      walkSet(cv, type, path, set);
      if (cv === null || !declared || (isObject(cv) && isEmptyObject(cv))) set.insert(path);
      path.pop();
    }
    return;
  }
  if (t.listType === 'atomic') {
    set.insert(path);
    return;
  }
  for (const { pe, item } of indexItems(t, v as unknown[])) {
    path.push(pe);
    walkSet(item, t.elem, path, set);
    set.insert(path);
    path.pop();
  }
}

function isEmptyObject(o: Record<string, unknown>): boolean {
  for (const _k in o) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// compare

export interface Comparison {
  added: FieldSet;
  modified: FieldSet;
  removed: FieldSet;
}

/**
 * What changed from `lhs` to `rhs`: leaves added, modified (value differs) or removed; a
 * non-leaf node (object, list item, map entry) is added or removed when it appears or
 * disappears as a whole. `undefined` means absent.
 */
export function compare(lhs: unknown, rhs: unknown, t: TypeNode): Comparison {
  const c: Comparison = { added: new FieldSet(), modified: new FieldSet(), removed: new FieldSet() };
  if (lhs === undefined && rhs === undefined) return c;
  walkCompare(lhs, rhs, t, [], c);
  return c;
}

function emptyMap(v: unknown): boolean {
  return v === undefined || v === null || (isObject(v) && Object.keys(v).length === 0);
}
function emptyList(v: unknown): boolean {
  return v === undefined || v === null || (Array.isArray(v) && v.length === 0);
}

// `path` is a stack shared by the whole walk (insert copies what it keeps).
function walkCompare(l: unknown, r: unknown, t0: TypeNode, path: Path, c: Comparison): void {
  const tl = l === undefined ? undefined : resolve(t0, l);
  const tr = r === undefined ? undefined : resolve(t0, r);
  const t = tr ?? tl!;
  const sameShape = !tl || !tr || tl.kind === tr.kind;
  let leaf =
    !sameShape ||
    t.kind === 'scalar' ||
    t.kind === 'deduced' ||
    l === null ||
    r === null ||
    (t.kind === 'map' && (t.atomic || (emptyMap(l) && emptyMap(r)))) ||
    (t.kind === 'list' && (t.listType === 'atomic' || (emptyList(l) && emptyList(r))));
  if (leaf) {
    if (l === undefined) c.added.insert(path);
    else if (r === undefined) c.removed.insert(path);
    else if (!deepEqual(l, r)) c.modified.insert(path);
    return;
  }
  if (t.kind === 'map') {
    const lm = (l ?? {}) as Record<string, unknown>;
    const rm = (r ?? {}) as Record<string, unknown>;
    const keys = new Set([...Object.keys(lm), ...Object.keys(rm)]);
    for (const k of keys) {
      const lv = lm[k];
      const rv = rm[k];
      if (lv === undefined && rv === undefined) continue;
      path.push({ field: k });
      walkCompare(lv, rv, fieldType(t, k).type, path, c);
      path.pop();
    }
  } else if (t.kind === 'list') {
    const li = indexItems(t, (l ?? []) as unknown[]);
    const ri = indexItems(t, (r ?? []) as unknown[]);
    const lByKey = new Map(li.map((x) => [x.key, x]));
    const rKeys = new Set(ri.map((x) => x.key));
    for (const x of ri) {
      path.push(x.pe);
      walkCompare(lByKey.get(x.key)?.item, x.item, t.elem, path, c);
      path.pop();
    }
    for (const x of li) {
      if (rKeys.has(x.key)) continue;
      path.push(x.pe);
      walkCompare(x.item, undefined, t.elem, path, c);
      path.pop();
    }
  }
  if (l === undefined) c.added.insert(path);
  else if (r === undefined) c.removed.insert(path);
}

/**
 * FieldsV1 of `compare(undefined-everywhere, v).added` for an object created as a whole: the
 * same tree FieldSet.toFieldsV1 emits for that set (keys in kube order, `.` on every node that
 * is itself added and has children), built in one walk. The root is not a member.
 */
export function createdFieldsV1(v: Record<string, unknown>, root: MapType): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v).sort(compareStrings))
    if (v[k] !== undefined) out[`f:${k}`] = addedNode(v[k], fieldType(root, k).type);
  return out;
}

// The node of a value added at some path (walkCompare with an absent left side): `{}` for a
// leaf, else `.` plus its children in kube order.
function addedNode(v: unknown, t0: TypeNode): Record<string, unknown> {
  const t = resolve(t0, v);
  if (v === null || t.kind === 'scalar' || t.kind === 'deduced') return {};
  const out: Record<string, unknown> = { '.': {} };
  if (t.kind === 'map') {
    if (t.atomic || emptyMap(v)) return {};
    const m = v as Record<string, unknown>;
    for (const k of Object.keys(m).sort(compareStrings))
      if (m[k] !== undefined) out[`f:${k}`] = addedNode(m[k], fieldType(t, k).type);
    // Only undefined entries: a member without children.
    for (const k in out) if (k !== '.') return out;
    return {};
  }
  if (t.listType === 'atomic' || emptyList(v)) return {};
  const items = indexItems(t, v as unknown[]).sort((a, b) => comparePE(a.pe, b.pe));
  for (const x of items) out[x.key] = addedNode(x.item, t.elem);
  return out;
}

/** The comparison without the paths `keep` rejects (see scope filtering in the field manager). */
export function filterComparison(c: Comparison, f: (s: FieldSet) => FieldSet): Comparison {
  return { added: f(c.added), modified: f(c.modified), removed: f(c.removed) };
}

// ---------------------------------------------------------------------------------------------
// merge (apply)

/**
 * `rhs` (the applied configuration) merged onto `lhs` (the live object): leaves and atomic
 * values take rhs; objects merge field by field; set- and map-lists merge item by item (items
 * of both keep rhs order, lhs-only items keep their place). Absent values (`undefined`) are
 * "not specified".
 */
export function merge(lhs: unknown, rhs: unknown, t0: TypeNode): unknown {
  if (rhs === undefined) return clone(lhs);
  if (lhs === undefined) return clone(rhs);
  const tl = resolve(t0, lhs);
  const t = resolve(t0, rhs);
  if (tl.kind !== t.kind || lhs === null || rhs === null) return clone(rhs);
  if (t.kind === 'map') {
    if (t.atomic || (emptyMap(lhs) && emptyMap(rhs))) return clone(rhs);
    const lm = lhs as Record<string, unknown>;
    const rm = rhs as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(lm))
      out[k] = k in rm && rm[k] !== undefined ? merge(lm[k], rm[k], fieldType(t, k).type) : clone(lm[k]);
    for (const k of Object.keys(rm)) if (!(k in lm) && rm[k] !== undefined) out[k] = clone(rm[k]);
    return out;
  }
  if (t.kind === 'list') {
    if (t.listType === 'atomic' || (emptyList(lhs) && emptyList(rhs))) return clone(rhs);
    return mergeList(t, lhs as unknown[], rhs as unknown[]);
  }
  return clone(rhs);
}

function mergeList(t: ListType, lhs: unknown[], rhs: unknown[]): unknown[] {
  const li = indexItems(t, lhs);
  const ri = indexItems(t, rhs);
  const lByKey = new Map(li.map((x) => [x.key, x]));
  const rByKey = new Map(ri.map((x) => [x.key, x]));
  // The shared items in rhs order: an lhs item that is shared but not the next one rhs
  // wants is skipped here and emitted when rhs reaches it (kube's ordering rule).
  const shared = ri.filter((x) => lByKey.has(x.key)).map((x) => x.key);
  let nextShared = 0;
  const emitted = new Set<string>();
  const out: unknown[] = [];
  const emit = (key: string) => {
    emitted.add(key);
    const l = lByKey.get(key)?.item;
    const r = rByKey.get(key)?.item;
    out.push(merge(l, r, t.elem));
    if (shared[nextShared] === key) nextShared++;
  };
  let a = 0;
  let b = 0;
  while (a < li.length || b < ri.length) {
    if (a < li.length && emitted.has(li[a].key)) {
      a++;
      continue;
    }
    if (a < li.length && b < ri.length) {
      if (li[a].key === ri[b].key) {
        emit(ri[b].key);
        a++;
        b++;
        continue;
      }
      if (rByKey.has(li[a].key) && shared[nextShared] !== li[a].key) {
        a++;
        continue;
      }
    }
    if (a < li.length && !rByKey.has(li[a].key)) {
      out.push(clone(li[a].item));
      emitted.add(li[a].key);
      a++;
      continue;
    }
    if (b < ri.length) {
      if (!emitted.has(ri[b].key)) emit(ri[b].key);
      b++;
      continue;
    }
    a++;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// removeItems

/**
 * The value without the members of `set`: a member removes the field, list item or map entry
 * with everything below it; atomic values are only removed as a whole. An object or list that
 * removals leave empty disappears too (kube leaves a null there, which storage then drops), so
 * no empty shell of a removed configuration stays behind. Containers that were empty before
 * are kept.
 */
export function removeItems(v: unknown, set: FieldSet, t: TypeNode): unknown {
  const out = removeWalk(v, set, t);
  return out === EMPTIED ? (Array.isArray(v) ? [] : {}) : out;
}

const EMPTIED = Symbol('emptied');

function removeWalk(v: unknown, set: FieldSet, t0: TypeNode): unknown {
  if (set.isEmpty() || v === undefined || v === null) return clone(v);
  const t = resolve(t0, v);
  if (t.kind === 'map') {
    if (t.atomic) return clone(v);
    const out: Record<string, unknown> = {};
    let kept = 0;
    let any = false;
    for (const [k, cv] of Object.entries(v as Record<string, unknown>)) {
      any = true;
      const pe = { field: k };
      if (set.hasMember(pe)) continue;
      const sub = set.withPrefix(pe);
      const r = sub.isEmpty() ? clone(cv) : removeWalk(cv, sub, fieldType(t, k).type);
      if (r === EMPTIED) continue;
      out[k] = r;
      kept++;
    }
    return any && kept === 0 ? EMPTIED : out;
  }
  if (t.kind === 'list') {
    if (t.listType === 'atomic') return clone(v);
    const list = v as unknown[];
    const out: unknown[] = [];
    list.forEach((item, i) => {
      const pe = itemPE(t, item, i);
      if (set.hasMember(pe)) return;
      const sub = set.withPrefix(pe);
      const r = sub.isEmpty() ? clone(item) : removeWalk(item, sub, t.elem);
      if (r !== EMPTIED) out.push(r);
    });
    return list.length > 0 && out.length === 0 ? EMPTIED : out;
  }
  return clone(v);
}

/**
 * The set plus, as members, every declared (struct) field that has owned descendants: removing
 * such a set removes the whole field, and the caller adds back what others still own.
 * (structured-merge-diff's EnsureNamedFieldsAreMembers.)
 */
export function ensureNamedFieldsAreMembers(set: FieldSet, t: TypeNode): FieldSet {
  const out = new FieldSet();
  for (const pe of set.memberElements()) out.addMember(pe);
  for (const { pe, set: sub } of set.childElements()) {
    let childType: TypeNode;
    if ('field' in pe && t.kind === 'map') {
      const ft = fieldType(t, pe.field);
      if (ft.declared) out.addMember(pe);
      childType = ft.type;
    } else if (t.kind === 'list') {
      childType = t.elem;
    } else {
      childType = { kind: 'deduced' };
    }
    out.setChild(
      pe,
      childType.kind === 'map' || childType.kind === 'list' ? ensureNamedFieldsAreMembers(sub, childType) : sub,
    );
  }
  return out;
}

export type { MapType };
