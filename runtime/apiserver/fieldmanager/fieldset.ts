// Field sets: the sets of field paths that managedFields entries record, and their wire form,
// kube's FieldsV1 (`{"f:spec":{"f:image":{}}}`).
//
// A path is a list of path elements:
//   f:<name>        a field of an object (struct field or map key)
//   k:<json>        an item of a map-list, named by its key fields (JSON object, keys sorted)
//   v:<json>        an item of a set-list, named by its value
//   i:<index>       an item of a list by position (only read, never produced from a schema)
// A set holds members (paths that are themselves owned) and children (paths with owned
// descendants). In FieldsV1 a node that is both a member and has children carries `.`.
//
// Everything here is pure and deterministic; the same set always serializes the same way,
// in the order structured-merge-diff uses (fields, then keys, then values, then indexes).

export type PathElement =
  { field: string } | { key: Array<[string, unknown]> } | { value: unknown } | { index: number };

export type Path = PathElement[];

// ---------------------------------------------------------------------------------------------
// JSON as Go's encoding/json writes it: sorted object keys (when asked), and <, >, &, U+2028,
// U+2029 escaped, so key strings and the last-applied annotation match a real apiserver byte
// for byte.

export function goJSON(v: unknown, sortKeys = true): string {
  // Scalars (set-list values, most key fields) need no replacer; most text needs no escapes.
  const s =
    v === null || typeof v !== 'object' ? JSON.stringify(v) : JSON.stringify(v, sortKeys ? sortedReplacer : undefined);
  return HTML_CHARS.test(s) ? escapeHTML(s) : s;
}

const HTML_CHARS = /[<>&\u2028\u2029]/;

function sortedReplacer(_k: string, v: unknown): unknown {
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v as object).sort(compareStrings)) out[k] = (v as Record<string, unknown>)[k];
    return out;
  }
  return v;
}

function escapeHTML(s: string): string {
  return s.replace(/[<>&\u2028\u2029]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

/**
 * Byte-order string comparison (Go's strings.Compare on UTF-8). UTF-16 code units order like
 * UTF-8 bytes except that surrogates (code points above U+FFFF) must sort after U+E000-U+FFFF.
 */
export function compareStrings(a: string, b: string): number {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x === y) continue;
    if (x >= 0xd800 && x <= 0xdfff) x += 0x10000;
    if (y >= 0xd800 && y <= 0xdfff) y += 0x10000;
    return x < y ? -1 : 1;
  }
  return a.length < b.length ? -1 : a.length > b.length ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Path elements

/** The FieldsV1 key of a path element (`f:spec`, `k:{"type":"Ready"}`, `v:"a"`, `i:0`). */
export function peKey(pe: PathElement): string {
  if ('field' in pe) return 'f:' + pe.field;
  if ('key' in pe) {
    const o: Record<string, unknown> = {};
    for (const [k, v] of pe.key) o[k] = v;
    return 'k:' + goJSON(o);
  }
  if ('value' in pe) return 'v:' + goJSON(pe.value);
  return 'i:' + pe.index;
}

/** Parses a FieldsV1 key. Throws an Error on a malformed key. */
export function parsePeKey(s: string): PathElement {
  const kind = s.slice(0, 2);
  const rest = s.slice(2);
  switch (kind) {
    case 'f:':
      return { field: rest };
    case 'k:': {
      const o = JSON.parse(rest);
      if (o === null || typeof o !== 'object' || Array.isArray(o)) throw new Error(`invalid key path element ${s}`);
      return makeKey(Object.entries(o));
    }
    case 'v:':
      return { value: JSON.parse(rest) };
    case 'i:': {
      const n = Number(rest);
      if (!Number.isInteger(n) || n < 0) throw new Error(`invalid index path element ${s}`);
      return { index: n };
    }
    default:
      throw new Error(`unknown path element ${JSON.stringify(s)}`);
  }
}

/** A key path element with its fields sorted by name, as kube names map-list items. */
export function makeKey(pairs: Array<[string, unknown]>): PathElement {
  return { key: [...pairs].sort((a, b) => compareStrings(a[0], b[0])) };
}

/** The human form used in conflict messages: `.spec`, `[type="Ready"]`, `[="a"]`, `[0]`. */
export function peString(pe: PathElement): string {
  if ('field' in pe) return '.' + pe.field;
  if ('key' in pe) return '[' + pe.key.map(([k, v]) => `${k}=${valueString(v)}`).join(',') + ']';
  if ('value' in pe) return `[=${valueString(pe.value)}]`;
  return `[${pe.index}]`;
}

export function pathString(p: Path): string {
  return p.map(peString).join('');
}

function valueString(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'string') return JSON.stringify(v);
  if (Array.isArray(v)) return '[' + v.map(valueString).join(', ') + ']';
  if (typeof v === 'object') {
    const keys = Object.keys(v as object).sort(compareStrings);
    return '{' + keys.map((k) => `${k}=${valueString((v as Record<string, unknown>)[k])}`).join(', ') + '}';
  }
  return String(v);
}

/** Total order of path elements (structured-merge-diff's PathElement.Compare). */
export function comparePE(a: PathElement, b: PathElement): number {
  const rank = (pe: PathElement) => ('field' in pe ? 0 : 'key' in pe ? 1 : 'value' in pe ? 2 : 3);
  const ra = rank(a);
  const rb = rank(b);
  if (ra !== rb) return ra - rb;
  if ('field' in a && 'field' in b) return compareStrings(a.field, b.field);
  if ('key' in a && 'key' in b) {
    if (a.key.length !== b.key.length) return a.key.length - b.key.length;
    for (let i = 0; i < a.key.length; i++) {
      const c = compareStrings(a.key[i][0], b.key[i][0]) || compareValues(a.key[i][1], b.key[i][1]);
      if (c !== 0) return c;
    }
    return 0;
  }
  if ('value' in a && 'value' in b) return compareValues(a.value, b.value);
  if ('index' in a && 'index' in b) return a.index - b.index;
  return 0;
}

/** Total order of JSON values: numbers, strings, booleans, lists, maps, null. */
export function compareValues(a: unknown, b: unknown): number {
  const rank = (v: unknown) =>
    typeof v === 'number'
      ? 0
      : typeof v === 'string'
        ? 1
        : typeof v === 'boolean'
          ? 2
          : Array.isArray(v)
            ? 3
            : v !== null && typeof v === 'object'
              ? 4
              : 5;
  const ra = rank(a);
  const rb = rank(b);
  if (ra !== rb) return ra - rb;
  switch (ra) {
    case 0:
      return (a as number) < (b as number) ? -1 : (a as number) > (b as number) ? 1 : 0;
    case 1:
      return compareStrings(a as string, b as string);
    case 2:
      return Number(a) - Number(b);
    case 3: {
      const la = a as unknown[];
      const lb = b as unknown[];
      for (let i = 0; i < Math.min(la.length, lb.length); i++) {
        const c = compareValues(la[i], lb[i]);
        if (c !== 0) return c;
      }
      return la.length - lb.length;
    }
    case 4: {
      const ma = a as Record<string, unknown>;
      const mb = b as Record<string, unknown>;
      const ka = Object.keys(ma).sort(compareStrings);
      const kb = Object.keys(mb).sort(compareStrings);
      for (let i = 0; i < Math.min(ka.length, kb.length); i++) {
        const c = compareStrings(ka[i], kb[i]) || compareValues(ma[ka[i]], mb[kb[i]]);
        if (c !== 0) return c;
      }
      return ka.length - kb.length;
    }
    default:
      return 0;
  }
}

// ---------------------------------------------------------------------------------------------
// Sets

interface Child {
  pe: PathElement;
  set: FieldSet;
}

/**
 * An immutable-by-convention set of paths. Methods that combine sets return new sets and never
 * modify their operands; `insert` is the only mutator and is used while building a set.
 * Invariant: no stored child set is empty.
 */
export class FieldSet {
  private readonly members = new Map<string, PathElement>();
  private readonly children = new Map<string, Child>();

  static of(...paths: Path[]): FieldSet {
    const s = new FieldSet();
    for (const p of paths) s.insert(p);
    return s;
  }

  insert(path: Path): void {
    if (path.length === 0) return;
    let node: FieldSet = this;
    for (let i = 0; i < path.length - 1; i++) {
      const k = peKey(path[i]);
      let c = node.children.get(k);
      if (!c) {
        c = { pe: path[i], set: new FieldSet() };
        node.children.set(k, c);
      }
      node = c.set;
    }
    const last = path[path.length - 1];
    node.members.set(peKey(last), last);
  }

  has(path: Path): boolean {
    if (path.length === 0) return false;
    let node: FieldSet | undefined = this;
    for (let i = 0; i < path.length - 1 && node; i++) node = node.children.get(peKey(path[i]))?.set;
    return !!node && node.members.has(peKey(path[path.length - 1]));
  }

  hasMember(pe: PathElement): boolean {
    return this.members.has(peKey(pe));
  }

  /** The set of paths below `pe` (relative to it); empty when there are none. */
  withPrefix(pe: PathElement): FieldSet {
    return this.children.get(peKey(pe))?.set ?? new FieldSet();
  }

  isEmpty(): boolean {
    return this.members.size === 0 && this.children.size === 0;
  }

  /** Member path elements at this level, in kube order. */
  memberElements(): PathElement[] {
    return [...this.members.values()].sort(comparePE);
  }

  /** Child path elements at this level, in kube order. */
  childElements(): Array<{ pe: PathElement; set: FieldSet }> {
    return [...this.children.values()].sort((a, b) => comparePE(a.pe, b.pe));
  }

  union(o: FieldSet): FieldSet {
    const out = new FieldSet();
    for (const [k, pe] of this.members) out.members.set(k, pe);
    for (const [k, pe] of o.members) out.members.set(k, pe);
    for (const [k, c] of this.children) {
      const oc = o.children.get(k);
      out.children.set(k, { pe: c.pe, set: oc ? c.set.union(oc.set) : c.set });
    }
    for (const [k, c] of o.children) if (!this.children.has(k)) out.children.set(k, c);
    return out;
  }

  intersection(o: FieldSet): FieldSet {
    const out = new FieldSet();
    for (const [k, pe] of this.members) if (o.members.has(k)) out.members.set(k, pe);
    for (const [k, c] of this.children) {
      const oc = o.children.get(k);
      if (!oc) continue;
      const i = c.set.intersection(oc.set);
      if (!i.isEmpty()) out.children.set(k, { pe: c.pe, set: i });
    }
    return out;
  }

  /** Paths of this set not in `o`; a member of `o` does not remove this set's descendants. */
  difference(o: FieldSet): FieldSet {
    const out = new FieldSet();
    for (const [k, pe] of this.members) if (!o.members.has(k)) out.members.set(k, pe);
    for (const [k, c] of this.children) {
      const oc = o.children.get(k);
      if (!oc) {
        out.children.set(k, c);
        continue;
      }
      const d = c.set.difference(oc.set);
      if (!d.isEmpty()) out.children.set(k, { pe: c.pe, set: d });
    }
    return out;
  }

  /** Like difference, but a member of `o` also removes everything below it. */
  recursiveDifference(o: FieldSet): FieldSet {
    const out = new FieldSet();
    for (const [k, pe] of this.members) if (!o.members.has(k)) out.members.set(k, pe);
    for (const [k, c] of this.children) {
      if (o.members.has(k)) continue;
      const oc = o.children.get(k);
      if (!oc) {
        out.children.set(k, c);
        continue;
      }
      const d = c.set.recursiveDifference(oc.set);
      if (!d.isEmpty()) out.children.set(k, { pe: c.pe, set: d });
    }
    return out;
  }

  /** Only the paths under top-level elements accepted by `keep` (members and descendants). */
  filterTop(keep: (pe: PathElement) => boolean): FieldSet {
    const out = new FieldSet();
    for (const [k, pe] of this.members) if (keep(pe)) out.members.set(k, pe);
    for (const [k, c] of this.children) if (keep(c.pe)) out.children.set(k, c);
    return out;
  }

  /** Adds `pe` as a member at this level (used while building derived sets). */
  addMember(pe: PathElement): void {
    this.members.set(peKey(pe), pe);
  }

  /** Sets the child set of `pe` (ignored when empty). */
  setChild(pe: PathElement, set: FieldSet): void {
    if (!set.isEmpty()) this.children.set(peKey(pe), { pe, set });
  }

  /** Every member path, members before children at each level, each level in kube order. */
  paths(prefix: Path = []): Path[] {
    const out: Path[] = [];
    for (const pe of this.memberElements()) out.push([...prefix, pe]);
    for (const c of this.childElements()) out.push(...c.set.paths([...prefix, c.pe]));
    return out;
  }

  equals(o: FieldSet): boolean {
    return this.difference(o).isEmpty() && o.difference(this).isEmpty();
  }

  /** The FieldsV1 form: `{"f:spec":{".":{},"f:image":{}}}`. Keys are in kube order. */
  toFieldsV1(): Record<string, unknown> {
    return this.emit(false);
  }

  private emit(includeSelf: boolean): Record<string, unknown> {
    const out: Record<string, unknown> = {};
    if (includeSelf) out['.'] = {};
    const entries: Array<{ pe: PathElement; member: boolean; set?: FieldSet }> = [];
    for (const [k, pe] of this.members) {
      const c = this.children.get(k);
      entries.push({ pe, member: true, set: c?.set });
    }
    for (const [k, c] of this.children) if (!this.members.has(k)) entries.push({ pe: c.pe, member: false, set: c.set });
    entries.sort((a, b) => comparePE(a.pe, b.pe));
    for (const e of entries) out[peKey(e.pe)] = e.set ? e.set.emit(e.member) : {};
    return out;
  }

  /**
   * Parses FieldsV1. Throws an Error when the value is not a FieldsV1 object (a non-object
   * node, or an unknown path element prefix); the caller decides what that means.
   */
  static fromFieldsV1(v: unknown): FieldSet {
    const out = new FieldSet();
    if (v === undefined || v === null) return out;
    parseInto(out, v);
    return out;
  }

  toString(): string {
    return this.paths()
      .map((p) => pathString(p))
      .join('\n');
  }
}

function parseInto(set: FieldSet, v: unknown): void {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('FieldsV1 nodes must be objects');
  for (const [k, child] of Object.entries(v as Record<string, unknown>)) {
    if (k === '.') continue; // handled by the parent
    const pe = parsePeKey(k);
    if (typeof child !== 'object' || child === null || Array.isArray(child))
      throw new Error(`FieldsV1 node ${k} must be an object`);
    const keys = Object.keys(child);
    if (keys.length === 0 || keys.includes('.')) set.addMember(pe);
    if (keys.some((x) => x !== '.')) {
      const sub = new FieldSet();
      parseInto(sub, child);
      set.setChild(pe, sub);
    }
  }
}
