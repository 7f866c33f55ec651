// Hashing of one file for the manifest walk, shared by the worker threads (hash-worker.ts)
// and the in-thread fallback. Sequential synchronous reads into one reused buffer: the
// runtime notes measured this faster than many concurrent async reads on these machines.
import { closeSync, constants as fsConstants, fstatSync, lstatSync, openSync, readSync } from 'node:fs';
import { createHash, type Hash } from 'node:crypto';

/** Outcome for one path: a fingerprint and mode bits, or a walk failure. */
export type HashResult = { fp: string; mode: number } | { error: string; code: string };

export const UNREADABLE = 'unreadable';
const CHUNK = 1 << 20;

/**
 * Fingerprints the regular file at `path` (never following a symlink, never blocking on a
 * FIFO): `sha256:<hex>`, or `unreadable` when opening it for reading is refused
 * (EACCES/EPERM). A file that vanished or stopped being a regular file since it was listed,
 * or any other I/O error, is returned as `{error, code}` so the caller fails the whole walk.
 * `buf` is scratch space reused between calls. Never throws.
 */
export function hashFile(rawPath: Uint8Array, buf: Buffer = Buffer.allocUnsafe(CHUNK)): HashResult {
  // Structured clone turns Buffers into plain Uint8Arrays; fs wants a Buffer.
  const path = Buffer.isBuffer(rawPath) ? rawPath : Buffer.from(rawPath.buffer, rawPath.byteOffset, rawPath.byteLength);
  let fd: number;
  try {
    fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'EIO';
    if (code === 'EACCES' || code === 'EPERM') {
      try {
        const st = lstatSync(path);
        if (!st.isFile()) return { error: 'changed type while listing', code: 'ECHANGED' };
        return { fp: UNREADABLE, mode: st.mode & 0o7777 };
      } catch (e) {
        return failure(e);
      }
    }
    if (code === 'ELOOP') return { error: 'replaced by a symlink while listing', code };
    if (code === 'ENOENT') return { error: 'removed while listing', code };
    return failure(err);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) return { error: 'changed type while listing', code: 'ECHANGED' };
    const h = createHash('sha256');
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      h.update(buf.subarray(0, n));
    }
    return { fp: fingerprintOf(h), mode: st.mode & 0o7777 };
  } catch (err) {
    return failure(err);
  } finally {
    closeSync(fd);
  }
}

/** The fingerprint form of manifests, staging and apply for bytes in memory: `sha256:<hex>`. Pure. */
export function sha256Fingerprint(data: Uint8Array): string {
  return fingerprintOf(createHash('sha256').update(data));
}

/** The fingerprint (`sha256:<hex>`) of a sha256 fed in pieces; finalizes `h` (digest once). */
export function fingerprintOf(h: Hash): string {
  return 'sha256:' + h.digest('hex');
}

function failure(err: unknown): HashResult {
  const e = err as NodeJS.ErrnoException;
  return { error: e.message ?? String(err), code: e.code ?? 'EIO' };
}
