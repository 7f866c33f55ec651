// Crash-safe file writes: a reader (or a restart after a crash) sees either the old file or
// the complete new one, never a partial file. Temporary files are named `.<name>.tmp-<hex>`
// in the destination's directory, so a crash can leave one behind but never at the
// destination path; removeTempFiles cleans them.
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  fchmodSync,
  fchownSync,
  constants as fsConstants,
  fsync,
  openSync,
  renameSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { chmod, mkdir, open, readdir, rename, rm, unlink } from 'node:fs/promises';

/** fsync(2) of an fd in the thread pool (the only slow call of a small durable write). */
export function fsyncFd(fd: number): Promise<void> {
  return new Promise((resolve, reject) => fsync(fd, (e) => (e ? reject(e) : resolve())));
}

/**
 * fsyncs what is at `path` (a file, or a directory's entries) as it is now: open and close are
 * synchronous, only the fsync goes to the thread pool.
 */
export async function fsyncFile(path: string | Buffer): Promise<void> {
  const fd = openSync(path, fsConstants.O_RDONLY);
  try {
    await fsyncFd(fd);
  } finally {
    closeSync(fd);
  }
}

/** Raw bytes of a path given as string or Buffer. */
function bytesOf(p: string | Buffer): Buffer {
  return Buffer.isBuffer(p) ? p : Buffer.from(p);
}

/** Splits a path into (directory, last component) as bytes; the directory of 'x' is '.'. */
export function splitDir(p: string | Buffer): { dir: Buffer; base: Buffer } {
  const b = bytesOf(p);
  let end = b.length;
  while (end > 1 && b[end - 1] === 0x2f) end--;
  const i = b.lastIndexOf(0x2f, end - 1);
  if (i < 0) return { dir: Buffer.from('.'), base: b.subarray(0, end) };
  return { dir: i === 0 ? Buffer.from('/') : b.subarray(0, i), base: b.subarray(i + 1, end) };
}

function tempPath(dir: Buffer, base: Buffer): Buffer {
  return Buffer.concat([dir, Buffer.from('/.'), base, Buffer.from(`.tmp-${randomBytes(6).toString('hex')}`)]);
}

/**
 * fsyncs a directory so a rename or create in it survives a crash. The open and close are
 * synchronous (a directory's open is a lookup); the fsync goes to the thread pool.
 */
export async function fsyncDir(dir: string | Buffer): Promise<void> {
  const fd = openSync(dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  try {
    await fsyncFd(fd);
  } finally {
    closeSync(fd);
  }
}

export interface AtomicWriteOptions {
  /** chown the file before it becomes visible. */
  owner?: { uid: number; gid: number };
  /**
   * false: no fsync of the file or its directory. A crash of the process still leaves the old or
   * the new content (the rename is atomic); a power cut may lose the write. For files whose
   * content something durable also proves (a ledger, a recount on load). Default true.
   */
  durable?: boolean;
  /**
   * false: the file is fsynced but not its directory (the caller fsyncs the directory once for
   * several new entries). Default: as `durable`.
   */
  syncDir?: boolean;
}

/**
 * Data up to this size is written with synchronous open, write, close and rename on the event
 * loop; only the fsyncs go to libuv's thread pool. Each thread-pool call is a round trip through
 * the event loop (0.3-0.5 ms on a busy 2-core host) and waits behind any other file I/O of the
 * process in that pool (a big read, a slow disk): a durable write through the pool was eight
 * such calls. Writing a few KiB into the page cache takes microseconds. Larger data goes through
 * the pool so that a big write never stalls the loop.
 */
export const SYNC_WRITE_MAX = 256 * 1024;

/**
 * Replaces `path` with `data` atomically and (unless `durable` is false) durably: temp file in
 * the same directory (created exclusively with `mode`, chmod'ed to exactly `mode` regardless of
 * umask), write, fsync, rename over `path` (which replaces a symlink there rather than
 * following it), fsync the directory. The parent directory must exist. On error the temp file
 * is removed and `path` is untouched. Safe to call twice (the second write wins).
 */
export async function writeFileAtomic(
  path: string | Buffer,
  data: Uint8Array | string,
  mode = 0o600,
  opts: AtomicWriteOptions = {},
): Promise<void> {
  const durable = opts.durable !== false;
  const { dir, base } = splitDir(path);
  const tmp = tempPath(dir, base);
  const flags = fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_NOFOLLOW;
  const size = typeof data === 'string' ? Buffer.byteLength(data) : data.byteLength;
  if (size <= SYNC_WRITE_MAX) {
    const fd = openSync(tmp, flags, mode);
    try {
      try {
        fchmodSync(fd, mode);
        if (opts.owner) fchownSync(fd, opts.owner.uid, opts.owner.gid);
        writeFileSync(fd, data); // the whole buffer: it loops on a short write
        if (durable) await fsyncFd(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, path);
    } catch (err) {
      try {
        unlinkSync(tmp);
      } catch {
        // already gone (renamed, or never made)
      }
      throw err;
    }
  } else {
    const fh = await open(tmp, flags, mode);
    try {
      try {
        await fh.chmod(mode);
        if (opts.owner) await fh.chown(opts.owner.uid, opts.owner.gid);
        await fh.writeFile(data);
        if (durable) await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(tmp, path);
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw err;
    }
  }
  if (opts.syncDir ?? durable) await fsyncDir(dir);
}

/**
 * Creates `path` and any missing parents with mode 0700 and makes sure `path` itself is
 * 0700 (chmod if it already existed). The new directory entry is fsynced into its parent.
 * Safe to call twice. Throws the fs error (e.g. ENOTDIR) otherwise.
 */
export async function mkdirPrivate(path: string | Buffer): Promise<void> {
  const first = await mkdir(path, { recursive: true, mode: 0o700 });
  await chmod(path, 0o700);
  if (first !== undefined) {
    await fsyncDir(splitDir(first).dir);
    if (bytesOf(first).compare(bytesOf(path)) !== 0) await fsyncDir(splitDir(path).dir);
  }
}

/** Removes `.*.tmp-<hex>` leftovers of interrupted writeFileAtomic calls in `dir`. Idempotent. */
export async function removeTempFiles(dir: string | Buffer): Promise<number> {
  const names = await readdir(dir, { encoding: 'buffer' });
  let n = 0;
  for (const name of names) {
    if (name[0] === 0x2e && /\.tmp-[0-9a-f]{12}$/.test(name.toString('latin1'))) {
      await rm(Buffer.concat([bytesOf(dir), Buffer.from('/'), name]), { force: true });
      n++;
    }
  }
  return n;
}
