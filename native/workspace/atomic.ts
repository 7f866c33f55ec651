// Crash-safe file writes: a reader (or a restart after a crash) sees either the old file or
// the complete new one, never a partial file. Temporary files are named `.<name>.tmp-<hex>`
// in the destination's directory, so a crash can leave one behind but never at the
// destination path; removeTempFiles cleans them.
import { randomBytes } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { chmod, mkdir, open, readdir, rename, rm, unlink } from 'node:fs/promises';

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

/** fsyncs a directory so a rename or create in it survives a crash. */
export async function fsyncDir(dir: string | Buffer): Promise<void> {
  const fh = await open(dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

export interface AtomicWriteOptions {
  /** chown the file before it becomes visible. */
  owner?: { uid: number; gid: number };
}

/**
 * Replaces `path` with `data` atomically and durably: temp file in the same directory
 * (created exclusively with `mode`, chmod'ed to exactly `mode` regardless of umask), write,
 * fsync, rename over `path` (which replaces a symlink there rather than following it),
 * fsync the directory. The parent directory must exist. On error the temp file is removed
 * and `path` is untouched. Safe to call twice (the second write wins).
 */
export async function writeFileAtomic(
  path: string | Buffer,
  data: Uint8Array | string,
  mode = 0o600,
  opts: AtomicWriteOptions = {},
): Promise<void> {
  const { dir, base } = splitDir(path);
  const tmp = tempPath(dir, base);
  const fh = await open(
    tmp,
    fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_NOFOLLOW,
    mode,
  );
  try {
    try {
      await fh.chmod(mode);
      if (opts.owner) await fh.chown(opts.owner.uid, opts.owner.gid);
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path);
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
  await fsyncDir(dir);
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
