// A unified diff of two files (diff -u format, 3 lines of context), bounded in time and
// memory whatever they hold: both sides can be written by a sandbox (a staged file may be
// 16 MiB). Pure and synchronous; the server runs it in a worker (diffpool.ts), never on its
// event loop. How the cost stays bounded (DIFF_LIMITS):
// - the common leading and trailing lines are cut off first (linear), so a small edit of a
//   big file diffs only its middle;
// - a pure insertion or deletion (a new or deleted file, lines appended) is written out
//   directly, in linear time;
// - otherwise the line diff is jsdiff's Myers (structuredPatch) with maxEditLength and a
//   timeout. Before it, a linear lower bound of the edit distance (the lines the two
//   middles cannot share, counted as multisets) skips it when it could only give up, e.g. a
//   file rewritten line by line;
// - when the middle has more than maxLines lines or jsdiff gives up, the file's section is
//   one summary line: `Files a/P and b/P differ (too many changes to show: ...)` with both
//   sizes and sha256 digests (the shape of the binary and large-file lines).
import { createHash } from 'node:crypto';
import { diffLines } from 'diff';

export interface DiffLimits {
  /** Lines of context around each change. */
  context: number;
  /** Largest edit distance (lines removed + lines added) diffed; past it: the summary. */
  maxEditLength: number;
  /** Wall-clock bound of one jsdiff run (checked between edit-distance rounds). */
  timeoutMs: number;
  /** Largest number of lines (both sides' middles together) given to jsdiff. */
  maxLines: number;
}

/**
 * 2,000 edits cost jsdiff about 1 s of one core (about 0.1 us per step of its O(D^2)
 * search, ~20 MiB); the timeout is a second guard on a loaded machine.
 */
export const DIFF_LIMITS: Readonly<DiffLimits> = Object.freeze({
  context: 3,
  maxEditLength: 2000,
  timeoutMs: 5000,
  maxLines: 200_000,
});

/** True when the bytes look binary: a NUL in the first 8 KiB, or not valid UTF-8. */
export function isBinary(b: Uint8Array): boolean {
  if (b.subarray(0, 8192).includes(0)) return true;
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(b);
    return false;
  } catch {
    return true;
  }
}

/** Lines of s in [from, to), counting an unterminated last one. */
function countLines(s: string, from = 0, to = s.length): number {
  let n = 0;
  for (let i = s.indexOf('\n', from); i !== -1 && i < to; i = s.indexOf('\n', i + 1)) n++;
  return to > from && s.charCodeAt(to - 1) !== 10 ? n + 1 : n;
}

/** The start of the line `n` lines before the line that starts at `pos` (0 at most). */
function linesBack(s: string, pos: number, n: number): number {
  let p = pos;
  for (let i = 0; i < n && p > 0; i++) p = p < 2 ? 0 : s.lastIndexOf('\n', p - 2) + 1;
  return p;
}

/** The end of the `n`th line starting at `pos` (the string's end at most). */
function linesForward(s: string, pos: number, n: number): number {
  let p = pos;
  for (let i = 0; i < n && p < s.length; i++) {
    const nl = s.indexOf('\n', p);
    p = nl === -1 ? s.length : nl + 1;
  }
  return p;
}

/** `start,len` of a hunk header as GNU diff writes it (1-based start; `start` alone for one line). */
function range(start1: number, len: number): string {
  return len === 1 ? `${start1}` : `${len === 0 ? start1 - 1 : start1},${len}`;
}

/** `t` before every line of s, with the missing-newline marker after an unterminated last one. */
function prefixed(t: string, s: string): string {
  if (!s) return '';
  const body = t + s.replace(/\n(?!$)/g, `\n${t}`);
  return s.endsWith('\n') ? body : `${body}\n\\ No newline at end of file\n`;
}

const splitLines = (s: string): string[] => s.match(/[^\n]*\n|[^\n]+$/g) ?? [];

/** One diff line: the marker, the text, and the missing-newline marker after an unterminated last line. */
const line = (t: string, l: string) => (l.endsWith('\n') ? t + l : `${t}${l}\n\\ No newline at end of file\n`);

/** Lines that are the same (' '), removed ('-') or added ('+'), in order. */
interface Run {
  t: ' ' | '-' | '+';
  lines: string[];
}

/**
 * The hunks of an edit script as GNU diff writes them: `c` lines of context, changes closer
 * than 2c+1 unchanged lines in one hunk, removals before additions within a change. The
 * first line of `runs` is line `base` + 1 of both files.
 */
function hunks(runs: Run[], c: number, base: number): string {
  let out = '';
  let body = '';
  let open = false;
  let oldAt = base;
  let newAt = base;
  let hOld = 0;
  let hNew = 0;
  let oldLen = 0;
  let newLen = 0;
  const close = () => {
    out += `@@ -${range(hOld + 1, oldLen)} +${range(hNew + 1, newLen)} @@\n${body}`;
    body = '';
    open = false;
  };
  for (let i = 0; i < runs.length; i++) {
    const r = runs[i]!;
    if (r.t === ' ') {
      const n = r.lines.length;
      if (open) {
        const k = i < runs.length - 1 && n <= 2 * c ? n : Math.min(n, c);
        for (let j = 0; j < k; j++) body += line(' ', r.lines[j]!);
        oldLen += k;
        newLen += k;
        if (k < n || i === runs.length - 1) close();
      }
      oldAt += n;
      newAt += n;
      continue;
    }
    if (!open) {
      const prev = runs[i - 1];
      const k = prev ? Math.min(c, prev.lines.length) : 0;
      open = true;
      hOld = oldAt - k;
      hNew = newAt - k;
      oldLen = newLen = k;
      for (let j = prev ? prev.lines.length - k : 0; prev && j < prev.lines.length; j++)
        body += line(' ', prev.lines[j]!);
    }
    // A change: every removal of this block, then every addition.
    let j = i;
    const removed: string[] = [];
    const added: string[] = [];
    for (; j < runs.length && runs[j]!.t !== ' '; j++) (runs[j]!.t === '-' ? removed : added).push(...runs[j]!.lines);
    for (const l of removed) body += line('-', l);
    for (const l of added) body += line('+', l);
    oldLen += removed.length;
    newLen += added.length;
    oldAt += removed.length;
    newAt += added.length;
    i = j - 1;
    if (j === runs.length) close();
  }
  return out;
}

/** A lower bound of the line edit distance of a and b: the lines they cannot share. */
function editDistanceAtLeast(a: string, b: string): number {
  const al = splitLines(a);
  const bl = splitLines(b);
  const count = new Map<string, number>();
  for (const l of al) count.set(l, (count.get(l) ?? 0) + 1);
  let shared = 0;
  for (const l of bl) {
    const c = count.get(l);
    if (c) {
      shared++;
      count.set(l, c - 1);
    }
  }
  return al.length + bl.length - 2 * shared;
}

/**
 * The hunks of a unified diff from `a` to `b` (no file header): '' when equal, undefined
 * when the limits are exceeded (too many changes to show). A missing final newline is shown
 * as `\ No newline at end of file`, as GNU diff does. Never throws on any input.
 */
export function unifiedHunks(a: string, b: string, limits: Readonly<DiffLimits> = DIFF_LIMITS): string | undefined {
  if (a === b) return '';
  const c = limits.context;
  // Common leading lines: [0, head) is whole lines equal in both.
  let p = 0;
  const short = Math.min(a.length, b.length);
  while (p < short && a.charCodeAt(p) === b.charCodeAt(p)) p++;
  const head = p === 0 ? 0 : a.lastIndexOf('\n', p - 1) + 1;
  // Common trailing lines: the last `tail` chars of both, starting at a line start in both.
  let s = 0;
  while (s < short - head && a.charCodeAt(a.length - 1 - s) === b.charCodeAt(b.length - 1 - s)) s++;
  const lineStart = (t: string, i: number) => i === head || t.charCodeAt(i - 1) === 10;
  let tail = s;
  while (tail > 0 && !(lineStart(a, a.length - tail) && lineStart(b, b.length - tail))) tail--;
  // The middles with up to `c` lines of context either side.
  const from = linesBack(a, head, c);
  const aEnd = a.length - tail;
  const bEnd = b.length - tail;
  const aTo = linesForward(a, aEnd, c);
  const aMid = a.slice(head, aEnd);
  const bMid = b.slice(head, bEnd);
  const before = a.slice(from, head);
  const after = a.slice(aEnd, aTo);
  const base = countLines(a, 0, from);
  if (!aMid || !bMid) {
    // A pure insertion or deletion: one hunk, written out directly (no search, no line array).
    const ctx = countLines(before) + countLines(after);
    const oldLen = ctx + countLines(aMid);
    const newLen = ctx + countLines(bMid);
    return `@@ -${range(base + 1, oldLen)} +${range(base + 1, newLen)} @@\n${prefixed(' ', before)}${prefixed('-', aMid)}${prefixed('+', bMid)}${prefixed(' ', after)}`;
  }
  if (countLines(aMid) + countLines(bMid) > limits.maxLines) return undefined;
  if (editDistanceAtLeast(aMid, bMid) > limits.maxEditLength) return undefined;
  const parts = diffLines(aMid, bMid, { maxEditLength: limits.maxEditLength, timeout: limits.timeoutMs });
  if (!parts) return undefined;
  const runs: Run[] = [{ t: ' ', lines: splitLines(before) }];
  for (const x of parts) runs.push({ t: x.added ? '+' : x.removed ? '-' : ' ', lines: splitLines(x.value) });
  runs.push({ t: ' ', lines: splitLines(after) });
  return hunks(runs, c, base);
}

/** Size and sha256 (hex) of one side of a file. */
export interface FileSum {
  size: number;
  sha256: string;
}

export const fileSum = (b: Uint8Array): FileSum => ({
  size: b.length,
  sha256: createHash('sha256').update(b).digest('hex'),
});

/**
 * The section of a file whose diff is not shown, in the shape of the binary-file line:
 * `Files a/P and b/P differ (too many changes to show: N bytes sha256:H -> M bytes sha256:K)`.
 */
export function tooManyChanges(path: string, before: FileSum | undefined, after: FileSum | undefined): string {
  const rel = path.replace(/^\/+/, '');
  const side = (f: FileSum | undefined) => (f ? `${f.size} bytes sha256:${f.sha256}` : 'absent');
  return `diff --fluxvm a/${rel} b/${rel}\nFiles ${before ? `a/${rel}` : '/dev/null'} and ${after ? `b/${rel}` : '/dev/null'} differ (too many changes to show: ${side(before)} -> ${side(after)})\n`;
}

/**
 * A whole file section: `--- a/path` / `+++ b/path` headers and hunks (/dev/null for absent
 * sides); binary files named; past the limits, the tooManyChanges summary. '' when equal.
 */
export function fileDiff(
  path: string,
  before: Uint8Array | undefined,
  after: Uint8Array | undefined,
  limits: Readonly<DiffLimits> = DIFF_LIMITS,
): string {
  const rel = path.replace(/^\/+/, '');
  const aName = before ? `a/${rel}` : '/dev/null';
  const bName = after ? `b/${rel}` : '/dev/null';
  const header = `diff --fluxvm a/${rel} b/${rel}\n`;
  if ((before && isBinary(before)) || (after && isBinary(after)))
    return `${header}Binary files ${aName} and ${bName} differ\n`;
  const a = before ? Buffer.from(before.buffer, before.byteOffset, before.byteLength).toString('utf8') : '';
  const b = after ? Buffer.from(after.buffer, after.byteOffset, after.byteLength).toString('utf8') : '';
  const hunks = unifiedHunks(a, b, limits);
  if (hunks === undefined) return tooManyChanges(path, before && fileSum(before), after && fileSum(after));
  return hunks ? `${header}--- ${aName}\n+++ ${bName}\n${hunks}` : '';
}
