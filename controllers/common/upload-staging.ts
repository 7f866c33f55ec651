// The staging file of an upload (uploads.ts): how a chunk's bytes reach it, how it is hashed
// again after a restart, and the Status of a failure on its disk.
//
// A chunk's bytes (ChunkWriter) are written at consecutive offsets while the rest of the chunk
// is still arriving, so the thread pool's writes overlap the event loop's TLS decryption and
// hashing of what follows. The body arrives as TLS records of at most 16 KiB; they are gathered
// into batches of `batch` bytes (one pwritev each), and at most `depth` batches are in flight
// (the body is not read further until one finishes). Pieces are written where they belong in
// the file, never past the chunk; a failed write fails the chunk (the caller leaves `received`
// where it was, so whatever was written past it is overwritten by the retry).
import { createHash } from 'node:crypto';
import { createReadStream, promises as fsp, statfsSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { errors } from '../../runtime/meta/errors.js';

function isNoSpace(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException)?.code;
  return code === 'ENOSPC' || code === 'EDQUOT';
}

/** The Status of a failure on the staging disk: 507 for a full one, the error itself otherwise. */
export function stagingError(e: unknown, what: string): unknown {
  return isNoSpace(e)
    ? errors.insufficientStorage(
        `the server's upload staging disk is full (${what}): nothing past the last acknowledged offset was kept; free space or retry later`,
      )
    : e;
}

/**
 * A batch's bytes written at `at`, every one: a short write (a filling disk) is written on from
 * where it stopped, so the next call fails with ENOSPC instead of leaving a hole.
 */
async function writeAll(fh: FileHandle, parts: Buffer[], n: number, at: number): Promise<void> {
  let done = (await fh.writev(parts, at)).bytesWritten;
  if (done < n) {
    const buf = Buffer.concat(parts, n);
    while (done < n) done += (await fh.write(buf, done, n - done, at + done)).bytesWritten;
  }
}

/** Writes one chunk's pieces into the staging file from `start` on, while they arrive. */
export class ChunkWriter {
  private gathered: Buffer[] = [];
  private gatheredBytes = 0;
  private readonly inflight = new Set<Promise<void>>();
  private failed: unknown;
  private fh: FileHandle | undefined;
  private pos: number;

  constructor(
    private readonly file: string,
    start: number,
    private readonly batch = 1 << 20,
    private readonly depth = 2,
  ) {
    this.pos = start;
  }

  /** Takes the next piece; resolves once there is room for more (a write may still be running). */
  async add(piece: Buffer): Promise<void> {
    if (this.failed !== undefined) throw this.failed;
    this.gathered.push(piece);
    this.gatheredBytes += piece.length;
    if (this.gatheredBytes >= this.batch) await this.issue();
  }

  private async issue(): Promise<void> {
    const parts = this.gathered;
    const n = this.gatheredBytes;
    const at = this.pos;
    this.gathered = [];
    this.gatheredBytes = 0;
    this.pos += n;
    this.fh ??= await fsp.open(this.file, 'r+');
    const w: Promise<void> = writeAll(this.fh, parts, n, at).then(
      () => void this.inflight.delete(w),
      (e: unknown) => {
        this.inflight.delete(w);
        this.failed ??= e;
      },
    );
    this.inflight.add(w);
    while (this.inflight.size >= this.depth) await Promise.race(this.inflight);
    if (this.failed !== undefined) throw this.failed;
  }

  /** Writes what is still gathered and waits for every write: resolves once all bytes are in the file. */
  async finish(): Promise<void> {
    if (this.gatheredBytes > 0) await this.issue();
    await Promise.all(this.inflight);
    if (this.failed !== undefined) throw this.failed;
  }

  /** Waits for the writes still running (their errors are finish()'s) and closes the file. Safe after any failure. */
  async close(): Promise<void> {
    await Promise.all(this.inflight);
    await this.fh?.close();
    this.fh = undefined;
  }
}

/** Whether the directory was modified in the last minute (an open in progress). */
export async function young(dir: string, now: number): Promise<boolean> {
  const st = await fsp.stat(dir).catch(() => undefined);
  return st !== undefined && now - st.mtimeMs < 60_000;
}

/** Free bytes of the file system holding `dir`, for an unprivileged writer. */
export function statfsFree(dir: string): number {
  const st = statfsSync(dir);
  return Number(st.bavail) * Number(st.bsize);
}

/** The sha256 of the first `size` bytes of `file` (hex). */
export async function hashFile(file: string, size: number): Promise<string> {
  const h = createHash('sha256');
  if (size > 0)
    for await (const c of createReadStream(file, { start: 0, end: size - 1, highWaterMark: 1 << 20 }))
      h.update(c as Buffer);
  return h.digest('hex');
}
