// A small JSONPath evaluator for printer columns (the subset CRD additionalPrinterColumns
// use): `.a.b`, `.a[0]`, `.a[*].b`, `['key.with.dots']`, and filters
// `[?(@.type=="Ready")]` with == / != on strings, numbers and booleans. Paths are compiled
// once per column; evaluating never throws, a path that does not match yields [].

type Step =
  | { t: 'field'; name: string }
  | { t: 'index'; i: number }
  | { t: 'all' }
  | { t: 'filter'; path: string[]; op: '==' | '!=' | 'exists'; value?: unknown };

export interface CompiledPath {
  source: string;
  /** Every match, in document order. */
  eval(obj: unknown): unknown[];
  /** The first match, or undefined; allocation-free for plain dotted paths (the hot case in Tables). */
  first(obj: unknown): unknown;
}

/** How many paths were compiled and evaluated in this process (tests hold the Table's costs with these). */
export const jsonPathCounts = { compiles: 0, evaluations: 0 };

/** Compiles a JSONPath; throws Error on syntax it does not understand. */
export function compileJSONPath(src: string): CompiledPath {
  jsonPathCounts.compiles++;
  let s = src.trim();
  if (s.startsWith('{') && s.endsWith('}')) s = s.slice(1, -1);
  if (s.startsWith('$')) s = s.slice(1);
  const steps: Step[] = [];
  let i = 0;
  const ident = /^[A-Za-z0-9_\-$]+/;
  while (i < s.length) {
    const c = s[i];
    if (c === '.') {
      i++;
      const m = ident.exec(s.slice(i));
      if (!m) {
        if (s[i] === '[' || i === s.length) continue;
        throw new Error(`invalid JSONPath ${src}: unexpected ${s[i]} at ${i}`);
      }
      steps.push({ t: 'field', name: m[0] });
      i += m[0].length;
    } else if (c === '[') {
      const end = findClose(s, i);
      const inner = s.slice(i + 1, end).trim();
      i = end + 1;
      if (inner === '*') steps.push({ t: 'all' });
      else if (/^-?\d+$/.test(inner)) steps.push({ t: 'index', i: Number(inner) });
      else if (/^'.*'$|^".*"$/.test(inner)) steps.push({ t: 'field', name: inner.slice(1, -1) });
      else if (inner.startsWith('?(') && inner.endsWith(')')) steps.push(parseFilter(inner.slice(2, -1), src));
      else throw new Error(`invalid JSONPath ${src}: unsupported [${inner}]`);
    } else {
      const m = ident.exec(s.slice(i));
      if (!m || steps.length > 0) throw new Error(`invalid JSONPath ${src}: unexpected ${c} at ${i}`);
      steps.push({ t: 'field', name: m[0] });
      i += m[0].length;
    }
  }
  if (steps.every((st) => st.t === 'field')) {
    const names = steps.map((st) => (st as { name: string }).name);
    const first = (obj: unknown): unknown => {
      jsonPathCounts.evaluations++;
      let v = obj;
      for (const n of names) {
        if (v === null || typeof v !== 'object' || Array.isArray(v) || !Object.prototype.hasOwnProperty.call(v, n))
          return undefined;
        v = (v as Record<string, unknown>)[n];
      }
      return v;
    };
    return { source: src, eval: (obj) => evaluate(steps, obj), first };
  }
  return { source: src, eval: (obj) => evaluate(steps, obj), first: (obj) => evaluate(steps, obj)[0] };
}

function findClose(s: string, open: number): number {
  let depth = 0;
  let quote: string | undefined;
  for (let j = open; j < s.length; j++) {
    const ch = s[j];
    if (quote) {
      if (ch === quote) quote = undefined;
    } else if (ch === '"' || ch === "'") quote = ch;
    else if (ch === '[' || ch === '(') depth++;
    else if (ch === ']' || ch === ')') {
      depth--;
      if (depth === 0 && ch === ']') return j;
    }
  }
  throw new Error(`invalid JSONPath ${s}: unclosed [`);
}

function parseFilter(expr: string, src: string): Step {
  const m = /^@((?:\.[A-Za-z0-9_\-$]+)+)\s*(?:(==|!=)\s*(.+))?$/.exec(expr.trim());
  if (!m) throw new Error(`invalid JSONPath ${src}: unsupported filter ${expr}`);
  const path = m[1].slice(1).split('.');
  if (!m[2]) return { t: 'filter', path, op: 'exists' };
  const raw = m[3].trim();
  let value: unknown;
  if (/^'.*'$|^".*"$/.test(raw)) value = raw.slice(1, -1);
  else if (raw === 'true' || raw === 'false') value = raw === 'true';
  else if (!Number.isNaN(Number(raw))) value = Number(raw);
  else throw new Error(`invalid JSONPath ${src}: unsupported literal ${raw}`);
  return { t: 'filter', path, op: m[2] as '==' | '!=', value };
}

function evaluate(steps: Step[], root: unknown): unknown[] {
  jsonPathCounts.evaluations++;
  let cur: unknown[] = [root];
  for (const st of steps) {
    const next: unknown[] = [];
    for (const v of cur) {
      if (v === null || v === undefined) continue;
      switch (st.t) {
        case 'field':
          if (typeof v === 'object' && !Array.isArray(v) && Object.prototype.hasOwnProperty.call(v, st.name)) {
            next.push((v as Record<string, unknown>)[st.name]);
          }
          break;
        case 'index':
          if (Array.isArray(v)) {
            const i = st.i < 0 ? v.length + st.i : st.i;
            if (i >= 0 && i < v.length) next.push(v[i]);
          }
          break;
        case 'all':
          if (Array.isArray(v)) next.push(...v);
          else if (typeof v === 'object') next.push(...Object.values(v as object));
          break;
        case 'filter':
          if (Array.isArray(v)) {
            for (const el of v) {
              let x: unknown = el;
              for (const p of st.path) x = x && typeof x === 'object' ? (x as Record<string, unknown>)[p] : undefined;
              if (st.op === 'exists' ? x !== undefined : st.op === '==' ? x === st.value : x !== st.value)
                next.push(el);
            }
          }
          break;
      }
    }
    cur = next;
  }
  return cur;
}
