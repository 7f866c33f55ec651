// Sandbox path rules (spec: sandbox-changes.md "How it works and limits"), the lossless
// text encoding of file names and the byte order used for sorted lists. Pure: nothing here
// touches a file. Mapping a sandbox path onto the host is not done by name anywhere: procbox
// goes through native/procbox/fileops.ts (fd-anchored, in its C helper), a VM through its
// guest agent.
//
// Path encoding (used for every manifest key, diff entry and staged path):
//   - a name that is valid UTF-8 is kept as is, except that a literal backslash `\` is
//     written `\\`;
//   - every byte that is not part of a valid UTF-8 sequence (RFC 3629: no overlong forms,
//     no surrogates, nothing above U+10FFFF) is written `\xNN` (two lowercase hex digits).
//   Because the backslash itself is always escaped, the mapping from bytes to strings is
//   injective: two distinct byte names never share a string, and `decodePath(encodePath(b))`
//   gives back exactly `b`. Plain ASCII/UTF-8 paths without a backslash (nearly all of them)
//   are unchanged. The result is ordinary JSON-safe text.
import { isUtf8 } from 'node:buffer';
import { RuntimeError } from '../runtime.js';
import { DEFAULT_MANIFEST_LIMITS, type ManifestLimits } from './types.js';

const BACKSLASH = 0x5c;
const HEX = '0123456789abcdef';

/** Length of the valid UTF-8 sequence starting at `i`, or 0 when the byte there is invalid. */
function utf8SeqLen(b: Uint8Array, i: number): number {
  const c = b[i]!;
  if (c < 0x80) return 1;
  const cont = (k: number): boolean => i + k < b.length && (b[i + k]! & 0xc0) === 0x80;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (!cont(1) || !cont(2)) return 0;
    const c1 = b[i + 1]!;
    if (c === 0xe0 && c1 < 0xa0) return 0; // overlong
    if (c === 0xed && c1 >= 0xa0) return 0; // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const c1 = b[i + 1]!;
    if (c === 0xf0 && c1 < 0x90) return 0; // overlong
    if (c === 0xf4 && c1 >= 0x90) return 0; // above U+10FFFF
    return 4;
  }
  return 0;
}

/** Encodes raw path bytes as text (see the header). Pure; never throws. */
export function encodePath(buf: Uint8Array): string {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  if (b.indexOf(BACKSLASH) < 0 && isUtf8(b)) return b.toString('utf8');
  let out = '';
  let start = 0; // start of the pending run of valid bytes
  let i = 0;
  while (i < b.length) {
    const n = b[i] === BACKSLASH ? 0 : utf8SeqLen(b, i);
    if (n > 0) {
      i += n;
      continue;
    }
    out += b.toString('utf8', start, i);
    const c = b[i]!;
    out += c === BACKSLASH ? '\\\\' : '\\x' + HEX[c >> 4] + HEX[c & 15];
    i += 1;
    start = i;
  }
  return out + b.toString('utf8', start, b.length);
}

/**
 * Inverse of encodePath: the exact bytes of an encoded path. `\\` is a backslash and `\xNN`
 * a raw byte; any other backslash sequence is not an encoded path and throws
 * RuntimeError('InvalidPath'). Pure.
 */
export function decodePath(str: string): Buffer {
  if (str.indexOf('\\') < 0) return Buffer.from(str, 'utf8');
  const parts: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < str.length; i++) {
    if (str.charCodeAt(i) !== BACKSLASH) continue;
    parts.push(Buffer.from(str.slice(start, i), 'utf8'));
    const next = str[i + 1];
    if (next === '\\') {
      parts.push(Buffer.from([BACKSLASH]));
      i += 1;
    } else if (next === 'x' && /^[0-9a-fA-F]{2}$/.test(str.slice(i + 2, i + 4))) {
      parts.push(Buffer.from([parseInt(str.slice(i + 2, i + 4), 16)]));
      i += 3;
    } else {
      throw new RuntimeError('InvalidPath', `invalid escape in path ${JSON.stringify(str)}: use \\\\ or \\xNN`);
    }
    start = i + 1;
  }
  parts.push(Buffer.from(str.slice(start), 'utf8'));
  return Buffer.concat(parts);
}

/**
 * Compares two strings by the byte order of their UTF-8 encodings (= Unicode code point
 * order). JavaScript's default sort compares UTF-16 code units, which puts U+10000 and up
 * before U+E000..U+FFFF; this comparator does not. Every sorted list in this layer uses it.
 */
export function compareUtf8(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x === y) continue;
    // Surrogates (supplementary planes) must sort above U+E000..U+FFFF.
    if (x >= 0xd800 && y >= 0xd800) {
      x = x >= 0xe000 ? x - 0x800 : x + 0x2000;
      y = y >= 0xe000 ? y - 0x800 : y + 0x2000;
    }
    return x - y;
  }
  return a.length - b.length;
}

/** Sorts in place with compareUtf8 and returns the array. */
export function sortPaths(paths: string[]): string[] {
  return paths.sort(compareUtf8);
}

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * Checks caller-supplied sandbox paths against the spec rules: at least one and at most
 * `limits.maxPaths` paths, each absolute, at most `limits.maxPathBytes` UTF-8 bytes, no `..`
 * component, no control character (C0 incl. NUL and newline, and DEL). Throws
 * RuntimeError('LimitExceeded') for a count/length limit and RuntimeError('InvalidPath')
 * otherwise, naming the offending path. Pure; returns nothing.
 */
export function validateSandboxPaths(paths: readonly string[], limits: Partial<ManifestLimits> = {}): void {
  const maxPaths = limits.maxPaths ?? DEFAULT_MANIFEST_LIMITS.maxPaths;
  const maxPathBytes = limits.maxPathBytes ?? DEFAULT_MANIFEST_LIMITS.maxPathBytes;
  if (!Array.isArray(paths) || paths.length === 0) {
    throw new RuntimeError('InvalidPath', 'at least one path is required');
  }
  if (paths.length > maxPaths) {
    throw new RuntimeError('LimitExceeded', `too many paths: ${paths.length} > ${maxPaths}`);
  }
  for (const p of paths) validateSandboxPath(p, maxPathBytes);
}

/** One path of validateSandboxPaths; same errors. */
export function validateSandboxPath(p: string, maxPathBytes = DEFAULT_MANIFEST_LIMITS.maxPathBytes): void {
  if (typeof p !== 'string') throw new RuntimeError('InvalidPath', `path is not a string: ${String(p)}`);
  const shown = JSON.stringify(p.length > 200 ? p.slice(0, 200) + '...' : p);
  if (Buffer.byteLength(p, 'utf8') > maxPathBytes) {
    throw new RuntimeError('LimitExceeded', `path longer than ${maxPathBytes} bytes: ${shown}`);
  }
  if (!p.startsWith('/')) throw new RuntimeError('InvalidPath', `path is not absolute: ${shown}`);
  if (CONTROL.test(p)) throw new RuntimeError('InvalidPath', `path contains a control character: ${shown}`);
  if (p.split('/').includes('..')) throw new RuntimeError('InvalidPath', `path contains '..': ${shown}`);
}

/**
 * Normal form of a validated absolute sandbox path: no empty or `.` components, no trailing
 * slash ("/" stays "/"). Pure. Does not check the rules: call validateSandboxPath first.
 */
export function normalizeSandboxPath(p: string): string {
  const parts = p.split('/').filter((c) => c !== '' && c !== '.');
  return '/' + parts.join('/');
}

/** True when `p` is `dir` or below it (both normalized sandbox paths). */
export function isUnder(p: string, dir: string): boolean {
  return dir === '/' || p === dir || p.startsWith(dir + '/');
}

const SLASH = Buffer.from('/');
const DOT = Buffer.from('.');

/** Splits raw path bytes on '/', dropping empty and '.' components. */
export function splitComponents(b: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let start = 0;
  for (let i = 0; i <= b.length; i++) {
    if (i === b.length || b[i] === 0x2f) {
      const c = b.subarray(start, i);
      if (c.length > 0 && !c.equals(DOT)) out.push(c);
      start = i + 1;
    }
  }
  return out;
}

/** rootDir + '/' + components, as raw bytes. */
export function joinHost(rootDir: string | Buffer, comps: readonly Buffer[]): Buffer {
  let root = Buffer.isBuffer(rootDir) ? rootDir : Buffer.from(rootDir);
  while (root.length > 1 && root[root.length - 1] === 0x2f) root = root.subarray(0, -1);
  if (comps.length === 0) return root;
  const parts: Buffer[] = root.length === 1 && root[0] === 0x2f ? [] : [root];
  for (const c of comps) parts.push(SLASH, c);
  return Buffer.concat(parts);
}
