// The store's disk helpers: the full-disk test, free space, the reserve files released when the
// disk is full (see "Disk full" in README.md), and the database files' mode and durability.
import fs from 'node:fs';
import path from 'node:path';

/** The watch log's limits in read-and-delete-only mode (watchers further behind relist on 410). */
export const FULL_MAX_EVENTS = 1000;
export const FULL_LOG_BYTES = 1024 * 1024;

/** The reserve is kept in this many files, released one per commit that finds the disk full. */
export const RESERVE_CHUNKS = 4;

export const NOSPACE_MESSAGE =
  'database space exceeded: the disk of the state directory is full; the server answers reads and deletes only until space is freed';

/** Whether a SQLite or fs error says the disk is full. */
export function isDiskFull(e: unknown): boolean {
  const code = (e as { code?: string })?.code;
  return (
    code === 'SQLITE_FULL' ||
    code === 'ENOSPC' ||
    (code === 'SQLITE_IOERR_WRITE' && /disk|space/i.test(String((e as Error).message)))
  );
}

/** Free bytes for unprivileged use on the file system holding dir (Infinity when unknown). */
export function freeBytes(dir: string): number {
  try {
    const st = fs.statfsSync(dir);
    return Number(st.bavail) * Number(st.bsize);
  } catch {
    return Infinity;
  }
}

/**
 * Writes `bytes` of zeros to `file` (through a temp file, fsync, rename), so the space is
 * really allocated (no sparse file). False, with nothing left behind, when the disk is full.
 */
function writeReserve(file: string, bytes: number): boolean {
  const tmp = `${file}.tmp`;
  let fd: number | undefined;
  try {
    fd = fs.openSync(tmp, 'w', 0o600);
    const chunk = Buffer.alloc(Math.min(bytes, 1024 * 1024));
    for (let done = 0; done < bytes;) {
      const n = fs.writeSync(fd, chunk, 0, Math.min(chunk.length, bytes - done));
      done += n;
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = undefined;
    fs.renameSync(tmp, file);
    return true;
  } catch (e) {
    if (fd !== undefined) fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    if ((e as NodeJS.ErrnoException).code === 'ENOSPC' || (e as NodeJS.ErrnoException).code === 'EDQUOT') return false;
    throw e;
  }
}

/**
 * The database holds Secrets, so its file is created 0600 (SQLite would create it 0644) and
 * an existing one, with its -wal and -shm, is narrowed to 0600. SQLite creates the -wal and
 * -shm files with the database file's mode, so they follow. Throws when a file cannot be
 * created or chmod-ed; safe to call any number of times.
 */
export function restrictDatabaseFiles(file: string): void {
  fs.closeSync(fs.openSync(file, 'a', 0o600));
  for (const f of [file, `${file}-wal`, `${file}-shm`]) {
    try {
      if ((fs.statSync(f).mode & 0o077) !== 0) fs.chmodSync(f, 0o600);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
}

/** fsyncs a directory, so the entries created in it (the -wal file) survive a power loss. */
export function syncDir(dir: string): void {
  const fd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** The reserve: `bytes` preallocated beside the database in RESERVE_CHUNKS files `<file>.N`. */
export class Reserve {
  constructor(
    /** `<database file>.reserve`; chunk N is `<file>.N`. */
    private readonly file: string,
    readonly bytes: number,
  ) {}

  /** The directory holding the reserve (and the database). */
  get dir(): string {
    return path.dirname(this.file);
  }

  private chunkFiles(): string[] {
    return Array.from({ length: RESERVE_CHUNKS }, (_, i) => `${this.file}.${i}`);
  }

  /**
   * Writes the missing chunks of the reserve; false when the disk cannot hold them (the
   * chunks written stay), or when less than the headroom is left besides.
   */
  ensure(dir: string): boolean {
    const size = Math.ceil(this.bytes / RESERVE_CHUNKS);
    for (const f of this.chunkFiles()) {
      let have = 0;
      try {
        have = fs.statSync(f).size;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      }
      if (have < size && !writeReserve(f, size)) return false;
    }
    return freeBytes(dir) >= this.headroom();
  }

  /** Free space, besides the reserve, below which the store stays read-and-delete-only. */
  headroom(): number {
    return Math.max(this.bytes, 1024 * 1024);
  }

  /** Removes one chunk of the reserve; false when none is left. */
  releaseChunk(): boolean {
    for (const f of this.chunkFiles()) {
      if (!fs.existsSync(f)) continue;
      fs.rmSync(f, { force: true });
      return true;
    }
    return false;
  }
}
