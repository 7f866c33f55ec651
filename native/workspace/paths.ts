// Sandbox path rules (spec: sandbox-changes.md "How it works and limits"), the lossless
// text encoding of file names, the byte order used for sorted lists, and safe mapping of a
// sandbox path onto a host directory.
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
import { closeSync, constants as fsConstants, fchmodSync, fchownSync, fsyncSync, lstatSync, mkdirSync, openSync, readlinkSync } from 'node:fs';
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

export interface ResolveOptions {
  /**
   * Sandbox path at which `rootDir` appears (default '/'). `sandboxPath` must be below it,
   * and absolute symlink targets are read in the sandbox view and must stay below it.
   */
  rootView?: string;
  /**
   * 'follow' (default): symlinks in intermediate components are followed as the sandbox
   * would follow them, but only while they stay inside the root; 'refuse': any symlink in an
   * intermediate component is an InvalidPath error.
   */
  symlinks?: 'follow' | 'refuse';
  /** Follow a symlink in the last component too (same rules). Default false. */
  followFinal?: boolean;
}

const MAX_SYMLINK_HOPS = 40;
const SLASH = Buffer.from('/');
const DOT = Buffer.from('.');
const DOTDOT = Buffer.from('..');

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

/**
 * Maps an (encoded, see encodePath) sandbox path onto the host, below `rootDir` (a host
 * directory that the sandbox sees at `opts.rootView`), resolving component by component
 * with lstat so that no symlink ever leads out of the root: a symlink whose target
 * (absolute in the sandbox view, or relative) would leave the root, a `..` above the root,
 * or more than 40 symlink hops is RuntimeError('InvalidPath'); a path not below rootView is
 * InvalidPath. Missing components are fine (the result may not exist yet: writes create
 * it); a non-directory in the middle is RuntimeError('NotADirectory'). The returned path
 * has no symlink in its intermediate components at the time of the call; the last component
 * is not followed unless `followFinal`.
 *
 * Returns a string when the host path is valid UTF-8, else throws InvalidPath: use
 * resolveInsideRaw (Buffer result, which every fs call accepts) for arbitrary names.
 *
 * Race: this checks, then the caller uses the path. A process inside the sandbox that swaps
 * a directory for a symlink in between could redirect the use; when the sandbox may be
 * running and writes matter, use openDirInside (fd-anchored, race-free) for the parent.
 * Read-only; safe to call any number of times.
 */
export function resolveInside(rootDir: string, sandboxPath: string, opts: ResolveOptions = {}): string {
  const raw = resolveInsideRaw(rootDir, sandboxPath, opts);
  if (!isUtf8(raw)) throw new RuntimeError('InvalidPath', `host path is not UTF-8, use resolveInsideRaw: ${sandboxPath}`);
  return raw.toString('utf8');
}

/** resolveInside with the exact host bytes as a Buffer. Same rules and errors. */
export function resolveInsideRaw(rootDir: string, sandboxPath: string, opts: ResolveOptions = {}): Buffer {
  const rootView = opts.rootView ?? '/';
  const pending = belowView(decodePath(sandboxPath), rootView, sandboxPath).reverse(); // next at the end
  const resolved: Buffer[] = []; // real (symlink-free) components below rootDir
  let hops = 0;
  while (pending.length > 0) {
    const c = pending.pop()!;
    if (c.equals(DOTDOT)) {
      if (resolved.length === 0) throw new RuntimeError('InvalidPath', `path escapes the sandbox root: ${sandboxPath}`);
      resolved.pop();
      continue;
    }
    const isLast = pending.length === 0;
    const host = joinHost(rootDir, [...resolved, c]);
    let st;
    try {
      st = lstatSync(host);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') {
        // Nothing exists below a missing component, so no symlink can be met there; '..'
        // is still clamped lexically.
        resolved.push(c);
        while (pending.length > 0) {
          const r = pending.pop()!;
          if (!r.equals(DOTDOT)) resolved.push(r);
          else if (resolved.length === 0) throw new RuntimeError('InvalidPath', `path escapes the sandbox root: ${sandboxPath}`);
          else resolved.pop();
        }
        return joinHost(rootDir, resolved);
      }
      if (code === 'ENOTDIR') throw new RuntimeError('NotADirectory', `not a directory in path ${sandboxPath}`);
      throw err;
    }
    if (st.isSymbolicLink() && (!isLast || opts.followFinal)) {
      if ((opts.symlinks ?? 'follow') === 'refuse') {
        throw new RuntimeError('InvalidPath', `symlink in path ${sandboxPath}: ${encodePath(c)}`);
      }
      if (++hops > MAX_SYMLINK_HOPS) throw new RuntimeError('InvalidPath', `too many symlinks in ${sandboxPath}`);
      const target = readlinkSync(host, { encoding: 'buffer' });
      let targetComps: Buffer[];
      if (target[0] === 0x2f) {
        targetComps = belowView(target, rootView, sandboxPath);
        resolved.length = 0;
      } else {
        targetComps = splitComponents(target);
      }
      for (let i = targetComps.length - 1; i >= 0; i--) pending.push(targetComps[i]!);
      continue;
    }
    if (!isLast && !st.isDirectory()) {
      throw new RuntimeError('NotADirectory', `not a directory in path ${sandboxPath}: ${encodePath(c)}`);
    }
    resolved.push(c);
  }
  return joinHost(rootDir, resolved);
}

/** Components of absolute path `p` below `rootView`; InvalidPath when not below it. */
function belowView(p: Buffer, rootView: string, forPath: string): Buffer[] {
  if (p[0] !== 0x2f) throw new RuntimeError('InvalidPath', `path is not absolute: ${forPath}`);
  const parts = splitComponents(p);
  const viewParts = splitComponents(Buffer.from(rootView));
  // '..' is only resolved later, so '/work/../etc' never matches a '/work' prefix check
  // wrongly: it is walked and clamped at the root.
  for (let i = 0; i < viewParts.length; i++) {
    if (!parts[i] || !parts[i]!.equals(viewParts[i]!)) {
      throw new RuntimeError('InvalidPath', `path ${forPath} is outside ${normalizeSandboxPath(rootView)}`);
    }
  }
  return parts.slice(viewParts.length);
}

/**
 * Opens the directory `rootDir/comps...` anchored on file descriptors, as openat(2) with
 * O_NOFOLLOW would: each component is opened relative to the already-open parent through
 * /proc/self/fd/N, so no symlink is ever followed and swapping a directory for a symlink
 * concurrently cannot redirect the walk out of the root. With `create`, missing directories
 * are made with exactly `dirMode` (default 0o755), owned by `owner` if given. Returns an open directory fd the caller must
 * close; use fdPath(fd, name) to address entries in it. Errors: a symlink component is
 * RuntimeError('InvalidPath'), a non-directory is RuntimeError('NotADirectory'), a missing
 * one without `create` is RuntimeError('NotFound'); nothing is left open on error. Needs
 * /proc (always there on the host). Idempotent with `create`.
 */
export function openDirInside(
  rootDir: string | Buffer,
  comps: readonly Buffer[],
  opts: { create?: boolean; dirMode?: number; owner?: { uid: number; gid: number } } = {},
): number {
  let fd = openSync(rootDir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  try {
    for (const c of comps) {
      if (c.equals(DOTDOT) || c.equals(DOT) || c.length === 0 || c.includes(0x2f)) {
        throw new RuntimeError('InvalidPath', `invalid path component ${JSON.stringify(encodePath(c))}`);
      }
      const p = fdPath(fd, c);
      let next: number;
      try {
        next = openNoFollowDir(p);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || !opts.create) throw mapOpenError(err, c, p);
        let made = false;
        try {
          mkdirSync(p, opts.dirMode ?? 0o755);
          made = true;
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
        }
        try {
          next = openNoFollowDir(p);
        } catch (e) {
          throw mapOpenError(e, c, p);
        }
        if (made) {
          try {
            fchmodSync(next, opts.dirMode ?? 0o755); // exact mode regardless of umask
            if (opts.owner) fchownSync(next, opts.owner.uid, opts.owner.gid);
            fsyncSync(fd); // the new entry in its parent
          } catch (e) {
            closeSync(next);
            throw e;
          }
        }
      }
      closeSync(fd);
      fd = next;
    }
    return fd;
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/** `/proc/self/fd/<fd>/<name>` as bytes: an entry of an open directory, not followed through symlinks in between. */
export function fdPath(fd: number, name?: Buffer | string): Buffer {
  const base = Buffer.from(`/proc/self/fd/${fd}`);
  if (name === undefined) return base;
  return Buffer.concat([base, SLASH, Buffer.isBuffer(name) ? name : Buffer.from(name)]);
}

function openNoFollowDir(p: Buffer): number {
  return openSync(p, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY | fsConstants.O_NOFOLLOW);
}

function mapOpenError(err: unknown, c: Buffer, p: Buffer): unknown {
  let code = (err as NodeJS.ErrnoException).code;
  const name = encodePath(c);
  // O_DIRECTORY|O_NOFOLLOW on a symlink reports ENOTDIR: tell the two apart.
  if (code === 'ENOTDIR') {
    try {
      if (lstatSync(p).isSymbolicLink()) code = 'ELOOP';
    } catch {
      // keep ENOTDIR
    }
  }
  if (code === 'ELOOP') return new RuntimeError('InvalidPath', `symlink in path: ${name}`);
  if (code === 'ENOTDIR') return new RuntimeError('NotADirectory', `not a directory: ${name}`);
  if (code === 'ENOENT') return new RuntimeError('NotFound', `no such directory: ${name}`);
  return err;
}
