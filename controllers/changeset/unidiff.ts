// A unified diff of two texts (diff -u format, 3 lines of context), from a Myers shortest
// edit script over lines. Pure. Binary content is not diffed: see isBinary.

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

type Op = { t: ' ' | '-' | '+'; line: string };

/** Lines of a text, each with its newline (a last line without one differs from the same text with it). */
function lines(s: string): string[] {
  return s.match(/[^\n]*\n|[^\n]+$/g) ?? [];
}

/** Myers O((N+M)D) edit script from a to b. */
function editScript(a: string[], b: string[]): Op[] {
  const n = a.length;
  const m = b.length;
  const max = n + m;
  const off = max + 1;
  const v = new Int32Array(2 * max + 3);
  const trace: Int32Array[] = [];
  let found = false;
  for (let d = 0; d <= max && !found; d++) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[off + k - 1]! < v[off + k + 1]!) ? v[off + k + 1]! : v[off + k - 1]! + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x++;
        y++;
      }
      v[off + k] = x;
      if (x >= n && y >= m) {
        found = true;
        break;
      }
    }
  }
  trace.push(v.slice());
  // Walk back through the saved frontiers.
  const ops: Op[] = [];
  let x = n;
  let y = m;
  for (let d = trace.length - 2; d >= 0 && (x > 0 || y > 0); d--) {
    const vd = trace[d]!;
    const k = x - y;
    const prevK = k === -d || (k !== d && vd[off + k - 1]! < vd[off + k + 1]!) ? k + 1 : k - 1;
    const prevX = d === 0 ? 0 : vd[off + prevK]!;
    const prevY = d === 0 ? 0 : prevX - prevK;
    while (x > prevX && y > prevY) ops.push({ t: ' ', line: a[--x]! }), y--;
    if (d === 0) break;
    if (x === prevX) ops.push({ t: '+', line: b[--y]! });
    else ops.push({ t: '-', line: a[--x]! });
  }
  while (x > 0 && y > 0) ops.push({ t: ' ', line: a[--x]! }), y--;
  return ops.reverse();
}

/**
 * The hunks of a unified diff from `a` to `b` (no file header), or '' when equal. A missing
 * final newline is shown as `\ No newline at end of file`, as GNU diff does.
 */
export function unifiedHunks(a: string, b: string, context = 3): string {
  if (a === b) return '';
  const al = lines(a);
  const bl = lines(b);
  const ops = editScript(al, bl);
  const out: string[] = [];
  let i = 0;
  while (i < ops.length) {
    if (ops[i]!.t === ' ') {
      i++;
      continue;
    }
    const start = Math.max(0, i - context);
    let end = i;
    // Extend while changes are within 2*context of each other.
    for (let j = i; j < ops.length; j++) {
      if (ops[j]!.t !== ' ') end = j;
      else if (j - end > 2 * context) break;
    }
    const stop = Math.min(ops.length, end + context + 1);
    let aStart = 0;
    let bStart = 0;
    for (let j = 0; j < start; j++) {
      if (ops[j]!.t !== '+') aStart++;
      if (ops[j]!.t !== '-') bStart++;
    }
    const hunk = ops.slice(start, stop);
    const aLen = hunk.filter((o) => o.t !== '+').length;
    const bLen = hunk.filter((o) => o.t !== '-').length;
    const range = (s: number, l: number) => (l === 1 ? `${s + 1}` : `${l === 0 ? s : s + 1},${l}`);
    out.push(`@@ -${range(aStart, aLen)} +${range(bStart, bLen)} @@`);
    for (const o of hunk) {
      if (o.line.endsWith('\n')) out.push(o.t + o.line.slice(0, -1));
      else out.push(o.t + o.line, '\\ No newline at end of file');
    }
    i = stop;
  }
  return out.length ? out.join('\n') + '\n' : '';
}

/** A whole file section: `--- a/path` / `+++ b/path` headers and hunks (/dev/null for absent sides). */
export function fileDiff(path: string, before: Uint8Array | undefined, after: Uint8Array | undefined): string {
  const rel = path.replace(/^\/+/, '');
  const aName = before ? `a/${rel}` : '/dev/null';
  const bName = after ? `b/${rel}` : '/dev/null';
  const header = `diff --fluxvm a/${rel} b/${rel}\n`;
  if ((before && isBinary(before)) || (after && isBinary(after))) return `${header}Binary files ${aName} and ${bName} differ\n`;
  const a = before ? Buffer.from(before).toString('utf8') : '';
  const b = after ? Buffer.from(after).toString('utf8') : '';
  const hunks = unifiedHunks(a, b);
  return hunks ? `${header}--- ${aName}\n+++ ${bName}\n${hunks}` : '';
}
