// kubectl's output formats: the human-readable Table (tabwriter with kubectl's settings),
// -o yaml|json (keys sorted, as Go marshals maps), -o name, and -o jsonpath templates.
import yaml from 'js-yaml';
import { compileJSONPath } from '../../runtime/apiserver/http/jsonpath.js';
import { escapeLine } from './escape.js';
import { CliError } from './util.js';

/**
 * Go's text/tabwriter as kubectl configures it (minwidth 6, padding 3, pad ' '): every cell
 * but the last of a line is padded to its column's width; the last cell is not.
 */
export function tabwrite(rows: string[][], minWidth = 6, padding = 3): string {
  const widths: number[] = [];
  for (const r of rows)
    for (let i = 0; i < r.length - 1; i++)
      widths[i] = Math.max(widths[i] ?? 0, Math.max(minWidth, width(r[i]) + padding));
  return rows
    .map((r) => r.map((c, i) => (i < r.length - 1 ? c + ' '.repeat(widths[i] - width(c)) : c)).join('') + '\n')
    .join('');
}

/**
 * tabwrite for `get -w`: column widths persist across calls and only grow, so rows printed
 * as events arrive line up under the header, as kubectl's watch output does.
 */
export class LiveTabwriter {
  private widths: number[] = [];
  constructor(
    private readonly minWidth = 6,
    private readonly padding = 3,
  ) {}
  format(rows: string[][]): string {
    for (const r of rows)
      for (let i = 0; i < r.length - 1; i++)
        this.widths[i] = Math.max(this.widths[i] ?? 0, this.minWidth, width(r[i]) + this.padding);
    return rows
      .map((r) => r.map((c, i) => (i < r.length - 1 ? c + ' '.repeat(this.widths[i] - width(c)) : c)).join('') + '\n')
      .join('');
  }
}

function width(s: string): number {
  return [...s].length;
}

export interface TableColumn {
  name: string;
  type: string;
  format?: string;
  priority?: number;
}

export interface TableRowIn {
  cells: unknown[];
  object?: {
    metadata?: { name?: string; namespace?: string; labels?: Record<string, string>; resourceVersion?: string };
  };
}

export interface TableOptions {
  wide?: boolean;
  withNamespace?: boolean;
  noHeaders?: boolean;
  showLabels?: boolean;
  /** Replaces the Name cell (kubectl prefixes `kind.group/` when several kinds are printed). */
  namePrefix?: string;
}

/** Renders one Table (rows of cells from the server) the way kubectl prints it. */
export function tableRows(columns: TableColumn[], rows: TableRowIn[], o: TableOptions): string[][] {
  const shown = columns.map((c, i) => ({ c, i })).filter(({ c }) => o.wide || !c.priority);
  const out: string[][] = [];
  if (!o.noHeaders) {
    const h = shown.map(({ c }) => c.name.toUpperCase());
    if (o.withNamespace) h.unshift('NAMESPACE');
    if (o.showLabels) h.push('LABELS');
    out.push(h);
  }
  for (const r of rows) {
    const cells = shown.map(({ c, i }) => {
      // Cells can hold sandbox-controlled text (paths, messages): escaped, one line each.
      const v = escapeLine(cellString(r.cells[i]));
      return c.format === 'name' && o.namePrefix ? `${o.namePrefix}${v}` : v;
    });
    if (o.withNamespace) cells.unshift(r.object?.metadata?.namespace ?? '');
    if (o.showLabels) cells.push(labelsString(r.object?.metadata?.labels));
    out.push(cells);
  }
  return out;
}

/** kubectl prints nil cells as <none> and everything else with Go's %v. */
export function cellString(v: unknown): string {
  if (v === null || v === undefined) return '';
  if (typeof v === 'string') return v;
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `[${v.map(cellString).join(' ')}]`;
  return `map[${Object.entries(v as object)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, x]) => `${k}:${cellString(x)}`)
    .join(' ')}]`;
}

export function labelsString(labels: Record<string, string> | undefined): string {
  const e = Object.entries(labels ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return e.length ? e.map(([k, v]) => `${k}=${v}`).join(',') : '<none>';
}

/** Deep copy with object keys sorted (Go marshals maps that way). */
export function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object') {
    const o: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) o[k] = sortKeys((v as Record<string, unknown>)[k]);
    return o;
  }
  return v;
}

export function toYaml(v: unknown): string {
  return yaml.dump(sortKeys(v), { noArrayIndent: true, lineWidth: -1, noRefs: true, quotingType: '"' });
}

export function toJson(v: unknown): string {
  return JSON.stringify(sortKeys(v), null, 4) + '\n';
}

/** kubectl's wrapper for several objects in -o yaml/json. */
/** kubectl hides metadata.managedFields unless --show-managed-fields. Returns a copy. */
export function withoutManagedFields<T>(o: T): T {
  const x = o as { items?: unknown; metadata?: { managedFields?: unknown } } | null | undefined;
  if (Array.isArray(x?.items)) return { ...x, items: x.items.map(withoutManagedFields) } as T;
  if (!x?.metadata?.managedFields) return o;
  const { managedFields: _mf, ...metadata } = x.metadata;
  return { ...x, metadata } as T;
}

export function listOf(items: unknown[]): Record<string, unknown> {
  return { apiVersion: 'v1', items, kind: 'List', metadata: { resourceVersion: '' } };
}

type Node = { t: 'text'; s: string } | { t: 'expr'; src: string } | { t: 'range'; src: string; body: Node[] };

/**
 * A kubectl jsonpath template: literal text, `{.path}` expressions (several results are
 * joined by a space), `{"literal"}`, and `{range .path}...{end}`. Throws CliError on syntax
 * errors; a path that matches nothing prints nothing (kubectl --allow-missing-template-keys).
 */
export function jsonpathTemplate(template: string): (obj: unknown) => string {
  const nodes = parseTemplate(template);
  return (obj) => render(nodes, obj);
}

function parseTemplate(t: string): Node[] {
  const root: Node[] = [];
  const stack: Node[][] = [root];
  const ranges: { t: 'range'; src: string; body: Node[] }[] = [];
  let i = 0;
  while (i < t.length) {
    const open = t.indexOf('{', i);
    if (open < 0) {
      stack[stack.length - 1].push({ t: 'text', s: t.slice(i) });
      break;
    }
    if (open > i) stack[stack.length - 1].push({ t: 'text', s: t.slice(i, open) });
    let close = open + 1;
    let quote: string | undefined;
    for (; close < t.length; close++) {
      const ch = t[close];
      if (quote) {
        if (ch === '\\') close++;
        else if (ch === quote) quote = undefined;
      } else if (ch === '"' || ch === "'") quote = ch;
      else if (ch === '}') break;
    }
    if (close >= t.length) throw new CliError(`error: error parsing jsonpath ${t}, unclosed action`);
    const inner = t.slice(open + 1, close).trim();
    i = close + 1;
    const cur = stack[stack.length - 1];
    if (inner.startsWith('range ')) {
      const r = { t: 'range' as const, src: inner.slice(6).trim(), body: [] as Node[] };
      cur.push(r);
      ranges.push(r);
      stack.push(r.body);
    } else if (inner === 'end') {
      if (stack.length === 1) throw new CliError(`error: error parsing jsonpath ${t}, not in range, nothing to end`);
      stack.pop();
      ranges.pop();
    } else if (/^".*"$/s.test(inner) || /^'.*'$/s.test(inner)) {
      cur.push({ t: 'text', s: unescape(inner.slice(1, -1)) });
    } else {
      try {
        compileJSONPath(inner);
      } catch (e) {
        throw new CliError(`error: error parsing jsonpath ${t}, ${(e as Error).message}`);
      }
      cur.push({ t: 'expr', src: inner });
    }
  }
  if (stack.length !== 1) throw new CliError(`error: error parsing jsonpath ${t}, unclosed range`);
  return root;
}

function unescape(s: string): string {
  return s.replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c === 't' ? '\t' : c === 'r' ? '\r' : c));
}

function render(nodes: Node[], obj: unknown): string {
  let out = '';
  for (const n of nodes) {
    if (n.t === 'text') out += n.s;
    else if (n.t === 'expr') out += evalPath(n.src, obj).map(valueString).join(' ');
    else for (const item of evalPath(n.src, obj)) out += render(n.body, item);
  }
  return out;
}

function evalPath(src: string, obj: unknown): unknown[] {
  const s = src.trim();
  if (s === '@' || s === '$' || s === '.') return [obj];
  return compileJSONPath(s.startsWith('@') ? s.slice(1) : s).eval(obj);
}

function valueString(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === null || v === undefined) return '';
  if (typeof v === 'object') return JSON.stringify(sortKeys(v));
  return String(v);
}

/**
 * Go's text/tabwriter (flags 0, pad ' '): cells are tab-terminated; a column block is a run
 * of consecutive lines that have a cell in that column, and its width is the widest cell
 * plus padding (at least minWidth). Text after a line's last tab is not aligned.
 */
export function goTabwriter(text: string, minWidth: number, padding: number): string {
  const lines = text.split('\n');
  const trailingNewline = text.endsWith('\n');
  if (trailingNewline) lines.pop();
  const cells = lines.map((l) => l.split('\t'));
  const widths: number[][] = cells.map(() => []);
  const format = (line0: number, line1: number, col: number) => {
    let i = line0;
    while (i < line1) {
      if (cells[i].length - 1 <= col) {
        i++;
        continue;
      }
      let j = i;
      let w = minWidth;
      while (j < line1 && cells[j].length - 1 > col) {
        w = Math.max(w, width(cells[j][col]) + padding);
        j++;
      }
      for (let k = i; k < j; k++) widths[k][col] = w;
      format(i, j, col + 1);
      i = j;
    }
  };
  format(0, cells.length, 0);
  const out = cells.map((cs, li) =>
    cs.map((c, ci) => (ci < cs.length - 1 ? c + ' '.repeat(Math.max(0, widths[li][ci] - width(c))) : c)).join(''),
  );
  return out.join('\n') + (trailingNewline ? '\n' : '');
}

/**
 * Prints the result of an imperative verb in the -o format the person asked for: json,
 * yaml, name (the `names`, one per line), jsonpath=...; no format (or wide): `human()`.
 * Any other format is kubectl's "unable to match a printer" error.
 */
export function printResult(
  out: (s: string) => void,
  fmt: string | undefined,
  value: unknown,
  human: () => void,
  names?: string[],
): void {
  if (!fmt || fmt === 'wide') return human();
  if (fmt === 'json') return out(toJson(value));
  if (fmt === 'yaml') return out(toYaml(value));
  if (fmt === 'name' && names) {
    for (const n of names) out(`${n}\n`);
    return;
  }
  if (fmt.startsWith('jsonpath=') || fmt.startsWith('jsonpath-as-json='))
    return out(jsonpathTemplate(fmt.slice(fmt.indexOf('=') + 1))(value));
  const allowed = names ? 'json,jsonpath,name,wide,yaml' : 'json,jsonpath,wide,yaml';
  throw new CliError(
    `error: unable to match a printer suitable for the output format "${fmt}", allowed formats are: ${allowed}`,
  );
}
