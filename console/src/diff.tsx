// The changeset diff (changesets/NAME/diff, a unified diff of the staged change) as unified and
// side-by-side views with syntax highlighting (highlight.js core, a few languages, in its own
// chunk loaded after the first paint: highlight.ts). Each line is
// escaped (escapeTerminal) before highlighting, and highlight.js escapes HTML, so neither
// markup nor control characters from the sandbox reach the DOM raw. Binary files and files past
// LARGE_LINES are summarized (a button shows a large one).
import { parsePatch, type StructuredPatch } from 'diff';
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { escapeLine, escapeTerminal } from './escape';
import type * as Highlight from './highlight';

const EXT: Record<string, string> = {
  sh: 'bash',
  bash: 'bash',
  css: 'css',
  go: 'go',
  js: 'javascript',
  mjs: 'javascript',
  cjs: 'javascript',
  jsx: 'javascript',
  json: 'json',
  md: 'markdown',
  py: 'python',
  rs: 'rust',
  ts: 'typescript',
  tsx: 'typescript',
  html: 'xml',
  xml: 'xml',
  svg: 'xml',
  yaml: 'yaml',
  yml: 'yaml',
  c: 'c',
  h: 'c',
  mk: 'makefile',
};

export const LARGE_LINES = 3000;

function langOf(file: string): string | undefined {
  const base = file.split('/').pop() ?? '';
  if (base === 'Makefile') return 'makefile';
  return EXT[base.split('.').pop()?.toLowerCase() ?? ''];
}

export interface FileDiff {
  name: string;
  patch: StructuredPatch;
  /** The server's one-line summary instead of hunks: a binary file, or too many changes to show. */
  summary?: string;
  lines: number;
}

const HEADER = 'diff --fluxvm ';

/** The sections of changesets/NAME/diff, one per file (`diff --fluxvm a/P b/P` starts each). Pure. */
export function parseDiff(text: string): FileDiff[] {
  const out: FileDiff[] = [];
  const first = text.startsWith(HEADER) ? 0 : text.indexOf('\n' + HEADER);
  const preamble = (first < 0 ? text : text.slice(0, first)).trim();
  // Lines before the first file (e.g. "Not staged: PATH: why"): shown as a note of their own.
  if (preamble) out.push({ name: '', patch: { hunks: [] } as unknown as StructuredPatch, summary: preamble, lines: 0 });
  const starts: number[] = [];
  if (text.startsWith(HEADER)) starts.push(0);
  for (let i = text.indexOf('\n' + HEADER); i >= 0; i = text.indexOf('\n' + HEADER, i + 1)) starts.push(i + 1);
  for (let k = 0; k < starts.length; k++) {
    const sec = text.slice(starts[k], k + 1 < starts.length ? starts[k + 1] : text.length);
    const nl = sec.indexOf('\n');
    const head = sec.slice(HEADER.length, nl < 0 ? sec.length : nl);
    const name = head.slice(2, 2 + (head.length - 5) / 2);
    const body = nl < 0 ? '' : sec.slice(nl + 1);
    if (body.startsWith('--- ')) {
      const patch = parsePatch(body)[0]!;
      out.push({ name, patch, lines: patch.hunks.reduce((n, h) => n + h.lines.length, 0) });
    } else {
      out.push({ name, patch: { hunks: [] } as unknown as StructuredPatch, summary: body.trim(), lines: 0 });
    }
  }
  return out;
}

type Row = { kind: ' ' | '+' | '-' | '@'; text: string; oldNo?: number; newNo?: number };

function rowsOf(p: StructuredPatch): Row[] {
  const rows: Row[] = [];
  for (const h of p.hunks) {
    rows.push({ kind: '@', text: `@@ -${h.oldStart},${h.oldLines} +${h.newStart},${h.newLines} @@` });
    let o = h.oldStart;
    let n = h.newStart;
    for (const l of h.lines) {
      const k = l[0];
      if (k === '\\') continue;
      if (k === '+') rows.push({ kind: '+', text: l.slice(1), newNo: n++ });
      else if (k === '-') rows.push({ kind: '-', text: l.slice(1), oldNo: o++ });
      else rows.push({ kind: ' ', text: l.slice(1), oldNo: o++, newNo: n++ });
    }
  }
  return rows;
}

/** One line as plain escaped HTML (what is shown first; highlighting replaces it after). */
function plain(text: string): string {
  return escapeHtml(escapeTerminal(text).replace(/\n/g, '\\n'));
}

/** A table body's rows, made into HTML a range at a time (the first screenful first, the rest after it). */
interface Rows {
  count: number;
  html: (from: number, to: number) => string;
}

/** Rows in the first paint; the rest are appended in chunks after it (a 2,000-line diff shows at once). */
const FIRST_ROWS = 100;
const CHUNK_ROWS = 400;

let highlighter: Promise<typeof Highlight> | undefined;

/**
 * After the first paint: appends the rows past FIRST_ROWS a chunk at a time, then highlights the
 * code cells (data-i indexes `texts`) a chunk at a time, so a large diff shows at once and gets its
 * colours in the following frames. The first paint sets the performance mark
 * fluxvm:diff-rendered (bench/console.ts reads it: the first-render target).
 */
function useProgressive(
  ref: { current: HTMLTableSectionElement | null },
  rows: Rows,
  texts: string[],
  lang: string | undefined,
) {
  useEffect(() => {
    const body = ref.current;
    if (!body) return;
    if (!performance.getEntriesByName('fluxvm:diff-rendered').length) performance.mark('fluxvm:diff-rendered');
    let hl: ((text: string, lang: string | undefined) => string) | undefined;
    let stopped = false;
    let timer = 0;
    let r = FIRST_ROWS;
    let i = 0;
    let cells: NodeListOf<HTMLElement> | undefined;
    const highlight = () => {
      cells ??= body.querySelectorAll<HTMLElement>('td.code[data-i]');
      const end = Math.min(cells.length, i + 200);
      for (; i < end; i++) cells[i]!.innerHTML = hl!(texts[Number(cells[i]!.dataset.i)]!, lang);
      if (i < cells.length) timer = window.setTimeout(highlight, 0);
    };
    const append = () => {
      if (r < rows.count) {
        body.insertAdjacentHTML('beforeend', rows.html(r, r + CHUNK_ROWS));
        r += CHUNK_ROWS;
        timer = window.setTimeout(append, 0);
      } else
        void (highlighter ??= import('./highlight')).then((m) => {
          hl = m.hl;
          if (!stopped) timer = window.setTimeout(highlight, 0);
        });
    };
    timer = window.setTimeout(append, 0);
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [rows, texts, lang]);
}

function Unified({ f, lang }: { f: FileDiff; lang?: string }) {
  const ref = useRef<HTMLTableSectionElement>(null);
  const { rows, texts } = useMemo(() => {
    const all = rowsOf(f.patch);
    const texts: string[] = [];
    const idx = all.map((r) => (r.kind === '@' ? -1 : texts.push(r.text) - 1));
    const one = (k: number) => {
      const r = all[k]!;
      const cls = r.kind === '+' ? 'add' : r.kind === '-' ? 'del' : r.kind === '@' ? 'hunk' : 'ctx';
      const code =
        r.kind === '@'
          ? `<td class="code">${escapeHtml(r.text)}</td>`
          : `<td class="code" data-i="${idx[k]}">${plain(r.text)}</td>`;
      return `<tr class="${cls}"><td class="ln">${r.oldNo ?? ''}</td><td class="ln">${r.newNo ?? ''}</td><td class="mk">${r.kind === '@' ? '' : r.kind}</td>${code}</tr>`;
    };
    const rows: Rows = { count: all.length, html: (a, b) => range(a, Math.min(b, all.length), one) };
    return { rows, texts };
  }, [f]);
  const html = useMemo(() => rows.html(0, FIRST_ROWS), [rows]);
  useProgressive(ref, rows, texts, lang);
  return (
    <table class="diff unified">
      <colgroup>
        <col class="c-ln" />
        <col class="c-ln" />
        <col class="c-mk" />
        <col />
      </colgroup>
      <tbody ref={ref} dangerouslySetInnerHTML={{ __html: html }} />
    </table>
  );
}

function SideBySide({ f, lang }: { f: FileDiff; lang?: string }) {
  const ref = useRef<HTMLTableSectionElement>(null);
  const { rows: out, texts } = useMemo(() => {
    const rows = rowsOf(f.patch);
    const texts: string[] = [];
    // Pairs of (old, new) rows, or a hunk header; their HTML is made when shown.
    const pairs: Array<[Row | undefined, Row | undefined] | string> = [];
    const idx = new Map<Row, number>();
    let i = 0;
    const cell = (r: Row | undefined, side: 'old' | 'new') =>
      r
        ? `<td class="ln">${(side === 'old' ? r.oldNo : r.newNo) ?? ''}</td><td class="code ${r.kind === '+' ? 'add' : r.kind === '-' ? 'del' : 'ctx'}" data-i="${idx.get(r)}">${plain(r.text)}</td>`
        : '<td class="ln"></td><td class="code empty"></td>';
    const pair = (a: Row | undefined, b: Row | undefined) => {
      for (const r of [a, b]) if (r) idx.set(r, texts.push(r.text) - 1);
      pairs.push([a, b]);
    };
    while (i < rows.length) {
      const r = rows[i]!;
      if (r.kind === '@') {
        pairs.push(r.text);
        i++;
      } else if (r.kind === ' ') {
        pair(r, r);
        i++;
      } else {
        const dels: Row[] = [];
        const adds: Row[] = [];
        while (i < rows.length && rows[i]!.kind === '-') dels.push(rows[i++]!);
        while (i < rows.length && rows[i]!.kind === '+') adds.push(rows[i++]!);
        for (let k = 0; k < Math.max(dels.length, adds.length); k++) pair(dels[k], adds[k]);
      }
    }
    const one = (k: number) => {
      const p = pairs[k]!;
      return typeof p === 'string'
        ? `<tr class="hunk"><td colspan="4">${escapeHtml(p)}</td></tr>`
        : `<tr>${cell(p[0], 'old')}${cell(p[1], 'new')}</tr>`;
    };
    const out: Rows = { count: pairs.length, html: (a, b) => range(a, Math.min(b, pairs.length), one) };
    return { rows: out, texts };
  }, [f]);
  const html = useMemo(() => out.html(0, FIRST_ROWS), [out]);
  useProgressive(ref, out, texts, lang);
  return (
    <table class="diff split">
      <colgroup>
        <col class="c-ln" />
        <col />
        <col class="c-ln" />
        <col />
      </colgroup>
      <tbody ref={ref} dangerouslySetInnerHTML={{ __html: html }} />
    </table>
  );
}

function range(a: number, b: number, one: (k: number) => string): string {
  let s = '';
  for (let k = a; k < b; k++) s += one(k);
  return s;
}

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

export function FileDiffView({ f, mode, size }: { f: FileDiff; mode: 'unified' | 'split'; size?: number }) {
  const [showLarge, setShowLarge] = useState(false);
  const lang = langOf(f.name);
  const label = escapeLine(f.name);
  return (
    <section class="file" aria-label={`diff of ${label}`}>
      <h3 class="filename">
        <span class="path">{label || '(notes)'}</span>
        {size !== undefined && <span class="muted"> {fmtBytes(size)}</span>}
      </h3>
      {f.summary !== undefined ? (
        <pre class="summary">{escapeTerminal(f.summary)}</pre>
      ) : f.lines > LARGE_LINES && !showLarge ? (
        <p class="summary">
          Large diff: {f.lines} lines.{' '}
          <button type="button" onClick={() => setShowLarge(true)}>
            Show it
          </button>
        </p>
      ) : mode === 'split' ? (
        <SideBySide f={f} lang={lang} />
      ) : (
        <Unified f={f} lang={lang} />
      )}
    </section>
  );
}

export function fmtBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}
