// Resumable uploads (spec/agent-sessions.md "Large files"): the host-side staging
// that the uploads subresources of sandboxes and agentsessions share. An upload is opened with
// {path, size, sha256?, mode?, parents?}, receives chunks in order (`offset` must be what was
// received), and is completed: size and checksum verified on the host, then streamed into the
// sandbox by the runtime's atomic streaming write (Runtime.writeFileStream), so nothing
// half-written and nothing unverified is ever at the path.
//
// On disk, below `<root>/<owner>/uploads/<id>/` (owner = the session's or sandbox's uid, so the
// owner's cleanup removes its uploads with it), all host-controlled, 0700/0600:
//   upload.json   the record (written atomically at open, completion and failure)
//   data          the staged bytes, written at their offsets
//   offsets, chunks  the progress logs (upload-log.ts): durable checkpoints, and one record
//                 with the crc32 of each chunk since the last one.
// What a chunk's answer promises (spec "Large files": `received` is the byte to continue from,
// and a client re-asks where the upload is after any error): that its bytes are held and the
// next chunk starts at `received`, never that they were fsync'ed. The bytes and the chunk's
// record are written (not synced) before the answer, so a restart of the server (kill -9
// included) continues where it answered; every `syncEveryBytes` (64 MiB by default) the bytes
// are fdatasync'ed and a checkpoint written and fdatasync'ed in the background, while the next
// chunks arrive (0: every chunk, before its answer), so a host crash goes back about that far
// (one sync still running), and never past bytes that are on disk (a chunk after the
// checkpoint counts only when its bytes still have its crc32). A failed background checkpoint
// refuses the next chunk (507 on a full disk) and is retried after it. The sha256 is computed as the
// chunks arrive; complete reads the staged file again only after a restart.
// Bounds: at most MAX_OPEN open uploads per owner; the declared sizes of every open upload
// below `root` together at most `maxStagedBytes`, and what is still to arrive must fit in the
// file system's free space minus `reserveBytes` (507 otherwise), so clients cannot fill the
// host's disk. Uploads idle for `ttlMs` (24 h by default) expire: `sweep()` (run at start and
// hourly by `start(signal)`, and for an owner on each open) removes them with their staging.
import { createHash, randomBytes, type Hash } from 'node:crypto';
import { constants as fsConstants, promises as fsp, statfsSync } from 'node:fs';
import { join } from 'node:path';
import { EventEmitter } from 'node:events';
import { crc32 } from 'node:zlib';
import { chunkRecord, offsetRecord, recoverProgress } from './upload-log.js';
import { ChunkWriter, hashFile, stagingError, statfsFree, young } from './upload-staging.js';
import { UPLOAD_LIMITS, type UploadRecord, type UploadSpec, type UploadStoreOptions } from './upload-types.js';
import { fsyncDir, mkdirPrivate, writeFileAtomic } from '../../native/workspace/atomic.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';

export {
  UPLOAD_LIMITS,
  type UploadRecord,
  type UploadSpec,
  type UploadState,
  type UploadStoreOptions,
} from './upload-types.js';

/** An open upload's progress (UploadStore.live). */
interface Progress {
  received: number;
  /** The last chunk's time (ms), undefined before the first. */
  at: number | undefined;
  /** Received as of the last durable checkpoint. */
  durable: number;
  /** Chunk records in the chunks log (since it was last emptied; after a restart, those past the checkpoint). */
  records: number;
  h?: Hash;
  /** A checkpoint running in the background, while later chunks arrive. */
  syncing?: Promise<void>;
  /** Its failure, told to the next request on the upload. */
  syncError?: unknown;
}

/** Chunk records in the log at most before a checkpoint that empties it (a client sending tiny chunks). */
const MAX_RECORDS = 1024;

export { lastOffset } from './upload-log.js';

const ID_RE = /^u-[0-9a-f]{16}$/;
const OWNER_RE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
/** A Status 409 naming where the upload continues (details.causes field `offset`). */
export function continueAt(received: number, message: string): StatusError {
  return new StatusError(409, 'Conflict', `${message}: continue at offset ${received}`, {
    causes: [{ reason: 'FieldValueInvalid', field: 'offset', message: String(received) }],
  });
}

export class UploadStore {
  /** The last request queued on each upload (hold). */
  private readonly busy = new Map<string, Promise<void>>();
  /** Emits an upload's key when its received offset moved (chunks waiting ahead of it). */
  private readonly advanced = new EventEmitter().setMaxListeners(0);
  /**
   * Each open upload's progress once known (from its logs after a restart): received, the time
   * of its last chunk, what is durable, the chunks since, and the running sha256 of [0,
   * received) (none after a restart: complete then reads the staged file).
   */
  private readonly live = new Map<string, Progress>();
  private readonly syncEvery: number;
  private readonly ttl: number;
  private readonly now: () => number;

  constructor(
    readonly root: string,
    private readonly o: UploadStoreOptions = {},
  ) {
    this.ttl = o.ttlMs ?? UPLOAD_LIMITS.ttlMs;
    this.now = o.now ?? Date.now;
    this.syncEvery = o.syncEveryBytes ?? 64 * 1024 * 1024;
  }

  private dirOf(owner: string, id?: string): string {
    if (!OWNER_RE.test(owner)) throw new Error(`invalid upload owner ${JSON.stringify(owner)}`);
    if (id !== undefined && !ID_RE.test(id)) throw errors.notFound('uploads', 'fluxvm.dev', id);
    return id === undefined ? join(this.root, owner, 'uploads') : join(this.root, owner, 'uploads', id);
  }

  /** The progress of an open upload: the live one, or the one its logs give (kept from then on). */
  private async progress(key: string, dir: string): Promise<Progress> {
    const have = this.live.get(key);
    if (have) return have;
    const read = (n: string) => fsp.readFile(join(dir, n)).catch(() => Buffer.alloc(0));
    const r = await recoverProgress(await read('offsets'), await read('chunks'), join(dir, 'data'));
    const again = this.live.get(key); // another request got there first
    if (again) return again;
    const p: Progress = {
      received: r.received,
      at: r.at,
      durable: r.durable,
      records: r.records,
      ...(r.received === 0 ? { h: createHash('sha256') } : {}),
    };
    this.live.set(key, p);
    return p;
  }

  private async readRecord(dir: string, key: string): Promise<UploadRecord | undefined> {
    let rec: UploadRecord;
    try {
      rec = JSON.parse(await fsp.readFile(join(dir, 'upload.json'), 'utf8')) as UploadRecord;
    } catch {
      return undefined; // missing or torn at open: not an upload (the sweep removes it)
    }
    if (rec.state === 'Open') {
      const p = await this.progress(key, dir);
      rec.received = p.received;
      if (p.at !== undefined) rec.updatedAt = new Date(p.at).toISOString();
    } else this.live.delete(key);
    rec.expiresAt = new Date(Date.parse(rec.updatedAt) + this.ttl).toISOString();
    return rec;
  }

  /** The upload `id` of `owner`; 404 when there is none. */
  async get(owner: string, id: string): Promise<UploadRecord> {
    const rec = await this.readRecord(this.dirOf(owner, id), `${owner}/${id}`);
    if (!rec) throw errors.notFound('uploads', 'fluxvm.dev', id);
    return rec;
  }

  /** Every upload of `owner` (open, complete, failed), oldest first. */
  async list(owner: string): Promise<UploadRecord[]> {
    const dir = this.dirOf(owner);
    const names = await fsp.readdir(dir).catch(() => [] as string[]);
    const out: UploadRecord[] = [];
    for (const n of names) {
      if (!ID_RE.test(n)) continue;
      const rec = await this.readRecord(join(dir, n), `${owner}/${n}`);
      if (rec) out.push(rec);
    }
    return out.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id));
  }

  /** Open uploads below the root (every owner): their declared bytes and the bytes still to arrive. */
  private async staged(): Promise<{ declared: number; pending: number }> {
    let declared = 0;
    let pending = 0;
    for (const owner of await fsp.readdir(this.root).catch(() => [] as string[])) {
      if (!OWNER_RE.test(owner)) continue;
      for (const u of await this.list(owner)) {
        if (u.state !== 'Open') continue;
        declared += u.size;
        pending += u.size - u.received;
      }
    }
    return { declared, pending };
  }

  /**
   * Opens an upload (the spec already validated by the caller). 409 past MAX_OPEN open
   * uploads of the owner; 507 when the staging bound or the free space would be exceeded.
   */
  async open(owner: string, spec: UploadSpec): Promise<UploadRecord> {
    await this.sweep();
    const open = (await this.list(owner)).filter((u) => u.state === 'Open');
    if (open.length >= UPLOAD_LIMITS.maxOpen) {
      throw new StatusError(
        409,
        'Conflict',
        `${open.length} uploads are open, the limit is ${UPLOAD_LIMITS.maxOpen} (maxOpenUploads): complete or delete one first`,
        {
          causes: [{ reason: 'TooMany', field: 'maxOpenUploads', message: String(UPLOAD_LIMITS.maxOpen) }],
        },
      );
    }
    const st = await this.staged();
    const bound = this.o.maxStagedBytes ?? 16 * 1024 * 1024 * 1024;
    if (st.declared + spec.size > bound) {
      throw errors.insufficientStorage(
        `upload staging is full: open uploads hold ${st.declared} of the server's ${bound} bytes (maxStagedBytes), ${spec.size} more do not fit; complete or delete uploads, or retry later`,
      );
    }
    await mkdirPrivate(this.dirOf(owner));
    const free = (this.o.freeBytes ?? statfsFree)(this.root);
    const reserve = this.o.reserveBytes ?? 1024 * 1024 * 1024;
    if (st.pending + spec.size + reserve > free) {
      throw errors.insufficientStorage(
        `the server's upload staging disk has ${free} bytes free; ${spec.size} more (plus ${st.pending} still expected by open uploads and a reserve of ${reserve}) do not fit`,
      );
    }
    const id = `u-${randomBytes(8).toString('hex')}`;
    const dir = this.dirOf(owner, id);
    const at = new Date(this.now()).toISOString();
    const rec: UploadRecord = {
      kind: 'Upload',
      id,
      path: spec.path,
      size: spec.size,
      ...(spec.sha256 ? { sha256: spec.sha256 } : {}),
      ...(spec.mode !== undefined ? { mode: spec.mode } : {}),
      parents: spec.parents ?? true,
      state: 'Open',
      received: 0,
      createdAt: at,
      updatedAt: at,
      expiresAt: new Date(this.now() + this.ttl).toISOString(),
    };
    try {
      await mkdirPrivate(dir);
      await (await fsp.open(join(dir, 'data'), 'w', 0o600)).close();
      await (await fsp.open(join(dir, 'offsets'), 'w', 0o600)).close();
      await (await fsp.open(join(dir, 'chunks'), 'w', 0o600)).close();
      await writeFileAtomic(join(dir, 'upload.json'), JSON.stringify(rec), 0o600);
      await fsyncDir(this.dirOf(owner));
    } catch (e) {
      await fsp.rm(dir, { recursive: true, force: true }).catch(() => undefined);
      throw stagingError(e, 'opening the upload');
    }
    this.live.set(`${owner}/${id}`, { received: 0, at: undefined, durable: 0, records: 0, h: createHash('sha256') });
    return rec;
  }

  /**
   * Runs `fn` holding the upload: requests on one upload run one at a time, in order. One that
   * waited `waitMs` (10 s) for the one before it (a client that went away mid-chunk is noticed
   * when its connection closes) is refused with 409.
   */
  private async hold<T>(owner: string, id: string, fn: () => Promise<T>, waitMs = 10_000): Promise<T> {
    const key = `${owner}/${id}`;
    const before = this.busy.get(key);
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = (before ?? Promise.resolve()).then(() => mine);
    this.busy.set(key, tail);
    try {
      if (before) {
        let timer: NodeJS.Timeout | undefined;
        const waited = await Promise.race([
          before.then(() => true),
          new Promise<boolean>((r) => (timer = setTimeout(() => r(false), waitMs))),
        ]);
        clearTimeout(timer);
        if (!waited)
          throw errors.conflict(
            'uploads',
            'fluxvm.dev',
            id,
            'another request on this upload is still in progress; retry later (GET the upload for its received offset)',
          );
      }
      return await fn();
    } finally {
      release();
      if (this.busy.get(key) === tail) this.busy.delete(key);
    }
  }

  /**
   * Writes one chunk at `offset` (must equal received: 409 naming it otherwise), read from
   * `body` (at most UPLOAD_LIMITS.maxChunk bytes and not past the declared size: 413). The
   * answer is sent once the bytes and their chunk record are written (durable at the next
   * checkpoint: see the file comment). A failure leaves received where it was (a full disk:
   * 507), except a failed checkpoint: the chunk is held, the client re-asks where to continue.
   */
  async writeChunk(
    owner: string,
    id: string,
    offset: number,
    body: AsyncIterable<Buffer> | Buffer,
  ): Promise<UploadRecord> {
    // A chunk ahead of `received` (a client with the next chunk already in flight, its request
    // overtaking the one before) waits, body unread, until the upload gets there or 2 s pass.
    const key = `${owner}/${id}`;
    const deadline = Date.now() + 2_000;
    for (;;) {
      const ahead = await this.hold(owner, id, async () => {
        const rec = await this.get(owner, id);
        return rec.state === 'Open' && offset > rec.received && Date.now() < deadline ? rec.received : undefined;
      });
      if (ahead === undefined) break;
      const ev = this.advanced;
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(t);
          ev.off(key, done);
          resolve();
        };
        const t = setTimeout(done, Math.max(0, deadline - Date.now()));
        ev.on(key, done);
      });
    }
    return this.hold(owner, id, async () => {
      const dir = this.dirOf(owner, id);
      const rec = await this.get(owner, id);
      if (rec.state !== 'Open')
        throw errors.conflict(
          'uploads',
          'fluxvm.dev',
          id,
          `the upload is ${rec.state.toLowerCase()}${rec.message ? ` (${rec.message})` : ''}; it takes no more chunks`,
        );
      if (offset !== rec.received)
        throw continueAt(
          rec.received,
          `offset ${offset} is not where upload ${id} continues (received ${rec.received} of ${rec.size} bytes)`,
        );
      const room = Math.min(UPLOAD_LIMITS.maxChunk, rec.size - rec.received);
      const p = await this.progress(key, dir);
      if (p.syncError !== undefined) {
        // The background checkpoint failed: this chunk is refused, the next one retries it.
        const e = p.syncError;
        p.syncError = undefined;
        throw e;
      }
      // The chunk is hashed as it arrives (into a copy kept only if the chunk is) and written
      // while the rest of it still arrives (upload-staging.ts): batches of 1 MiB, two in flight.
      const h = p.h?.copy();
      let n = 0;
      let crc = 0;
      const out = new ChunkWriter(join(dir, 'data'), rec.received);
      try {
        for await (const c of Buffer.isBuffer(body) ? [body] : body) {
          if (n + c.length > room) {
            const past = rec.received + n + c.length > rec.size;
            throw errors.tooLarge(
              past && room < UPLOAD_LIMITS.maxChunk
                ? `the chunk runs past the upload's size ${rec.size} (received ${rec.received}): at most ${room} more bytes`
                : `a chunk is at most ${UPLOAD_LIMITS.maxChunk} bytes (4 MiB)`,
            );
          }
          h?.update(c);
          crc = crc32(c, crc);
          n += c.length;
          await out.add(c).catch((e: unknown) => {
            throw stagingError(e, 'writing the chunk');
          });
        }
        if (n === 0) return rec;
        await out.finish().catch((e: unknown) => {
          throw stagingError(e, 'writing the chunk');
        });
      } finally {
        await out.close();
      }
      const at = this.now();
      const log = await fsp.open(join(dir, 'chunks'), 'a');
      try {
        await log.write(chunkRecord({ end: rec.received + n, at, length: n, crc }));
      } catch (e) {
        throw stagingError(e, 'recording the chunk');
      } finally {
        await log.close();
      }
      p.received = rec.received + n;
      p.at = at;
      p.records++;
      if (h) p.h = h;
      if (p.records >= MAX_RECORDS || this.syncEvery === 0) {
        // Durable before the answer, and the log emptied: the checkpoint covers every record.
        await p.syncing;
        await this.checkpoint(dir, p, true);
      } else if (p.received - p.durable >= this.syncEvery && !p.syncing) {
        // In the background: the fdatasync of 64 MiB overlaps the next chunks instead of holding
        // them (a chunk's answer never promised more than bytes written; see the file comment).
        p.syncing = this.checkpoint(dir, p, false).then(
          () => void (p.syncing = undefined),
          (e: unknown) => void ((p.syncing = undefined), (p.syncError = e)),
        );
      }
      setImmediate(() => this.advanced.emit(key));
      return {
        ...rec,
        received: p.received,
        updatedAt: new Date(at).toISOString(),
        expiresAt: new Date(at + this.ttl).toISOString(),
      };
    });
  }

  /**
   * Makes the progress durable: the staged bytes fdatasync'ed, then a checkpoint record
   * appended and fdatasync'ed. With `empty` (run holding the upload, so no chunk record is
   * written meanwhile) the chunks log is emptied after it; a background checkpoint leaves the
   * log alone (records at or below a checkpoint are ignored by recoverProgress). A failure
   * leaves the chunk records (a restart verifies them).
   */
  private async checkpoint(dir: string, p: Progress, empty: boolean): Promise<void> {
    const received = p.received;
    const at = p.at ?? this.now();
    try {
      const fh = await fsp.open(join(dir, 'data'), 'r+');
      try {
        await fh.datasync();
      } finally {
        await fh.close();
      }
      const log = await fsp.open(join(dir, 'offsets'), 'a');
      try {
        await log.write(offsetRecord(received, at));
        await log.datasync();
      } finally {
        await log.close();
      }
      if (empty) await fsp.truncate(join(dir, 'chunks'), 0);
    } catch (e) {
      throw stagingError(e, 'syncing the staged bytes');
    }
    p.durable = Math.max(p.durable, received);
    if (empty) p.records = 0;
  }

  /** Waits for the upload's background checkpoint, if one runs (before its files go away). */
  private async quiesce(key: string): Promise<void> {
    await this.live.get(key)?.syncing;
  }

  /** Resolves once no background checkpoint of the upload runs (tests; a clean shutdown). */
  async settled(owner: string, id: string): Promise<void> {
    await this.quiesce(`${owner}/${id}`);
  }

  /**
   * Completes the upload: all bytes received (409 naming the offset otherwise), the sha256
   * checked (the one given here, `sha256`, else the one the upload was opened with; a client
   * that hashes while it sends names it here): a mismatch fails the upload, frees its staging
   * and writes nothing (409). Two different checksums (here and at open) are 422 naming
   * `sha256`, and change nothing. Then `write` gets the staged file, open, and puts it into place. Completing
   * a completed upload returns its record again and writes nothing. A failed `write` leaves the
   * upload open to retry.
   */
  async complete(
    owner: string,
    id: string,
    write: (data: { readonly fd: number }, rec: UploadRecord) => Promise<void>,
    sha256?: string,
  ): Promise<UploadRecord> {
    return this.hold(owner, id, async () => {
      const dir = this.dirOf(owner, id);
      await this.quiesce(`${owner}/${id}`);
      const rec = await this.get(owner, id);
      const declared = rec.sha256 ?? (rec.state === 'Complete' ? rec.writtenSha256 : undefined);
      if (sha256 !== undefined && declared !== undefined && sha256 !== declared && rec.state !== 'Failed')
        throw errors.invalid('Upload', 'fluxvm.dev', id, [
          {
            reason: 'FieldValueInvalid',
            field: 'sha256',
            message: `Invalid value: ${JSON.stringify(sha256)}: the upload ${rec.state === 'Complete' ? 'was completed' : 'was opened'} with sha256 ${declared}`,
          },
        ]);
      if (rec.state === 'Complete') return rec;
      if (rec.state === 'Failed')
        throw errors.conflict('uploads', 'fluxvm.dev', id, `the upload failed: ${rec.message}; open a new one`);
      if (rec.received !== rec.size)
        throw continueAt(rec.received, `upload ${id} has ${rec.received} of ${rec.size} bytes`);
      const running = this.live.get(`${owner}/${id}`);
      const digest =
        running?.h && running.received === rec.size
          ? running.h.copy().digest('hex')
          : await hashFile(join(dir, 'data'), rec.size);
      const want = sha256 ?? rec.sha256;
      if (want && digest !== want) {
        const message = `checksum mismatch: the ${rec.size} bytes received have sha256 ${digest}, the upload ${sha256 ? 'was completed' : 'was opened'} with ${want}; nothing was written to ${rec.path}`;
        await this.finish(owner, id, { ...rec, ...(want ? { sha256: want } : {}), state: 'Failed', message });
        throw errors.conflict('uploads', 'fluxvm.dev', id, message);
      }
      // The staged file itself, open: the runtime hands it to its writer (procbox's file-in
      // helper), so a GiB never passes through the event loop. Bytes past the size (a write
      // cut by a crash) are dropped first.
      const staged = await fsp.open(join(dir, 'data'), fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
      try {
        if ((await staged.stat()).size > rec.size) await fsp.truncate(join(dir, 'data'), rec.size);
        await write({ fd: staged.fd }, rec);
      } finally {
        await staged.close();
      }
      const at = new Date(this.now()).toISOString();
      const done: UploadRecord = {
        ...rec,
        ...(want ? { sha256: want } : {}),
        state: 'Complete',
        completedAt: at,
        updatedAt: at,
        writtenSha256: digest,
        expiresAt: new Date(this.now() + this.ttl).toISOString(),
      };
      await this.finish(owner, id, done);
      return done;
    });
  }

  /** Writes the final record and frees the staged bytes. */
  private async finish(owner: string, id: string, rec: UploadRecord): Promise<void> {
    const dir = this.dirOf(owner, id);
    await writeFileAtomic(join(dir, 'upload.json'), JSON.stringify(rec), 0o600);
    await fsp.rm(join(dir, 'data'), { force: true });
    await fsp.rm(join(dir, 'offsets'), { force: true });
    await fsp.rm(join(dir, 'chunks'), { force: true });
    this.live.delete(`${owner}/${id}`);
  }

  /** Drops the upload and its staging; 404 when there is none. */
  async abort(owner: string, id: string): Promise<UploadRecord> {
    return this.hold(owner, id, async () => {
      await this.quiesce(`${owner}/${id}`);
      const rec = await this.get(owner, id);
      await fsp.rm(this.dirOf(owner, id), { recursive: true, force: true });
      this.live.delete(`${owner}/${id}`);
      return rec;
    });
  }

  /**
   * Removes what is past its time: open uploads idle for the TTL (with their staging), finished
   * records a TTL after they finished, and directories without a readable record. Of one owner,
   * or of every owner below the root. Returns the ids removed. Safe to run at any time.
   */
  async sweep(owner?: string): Promise<string[]> {
    const owners =
      owner !== undefined
        ? [owner]
        : (await fsp.readdir(this.root).catch(() => [] as string[])).filter((o) => OWNER_RE.test(o));
    const removed: string[] = [];
    for (const o of owners) {
      const dir = this.dirOf(o);
      for (const n of await fsp.readdir(dir).catch(() => [] as string[])) {
        const key = `${o}/${n}`;
        if (this.busy.has(key) || this.live.get(key)?.syncing) continue;
        const rec = ID_RE.test(n) ? await this.readRecord(join(dir, n), key) : undefined;
        const idle = rec ? this.now() - Date.parse(rec.updatedAt) : Infinity;
        // A directory without a record may be an open in progress: give it a minute.
        if (rec ? idle < this.ttl : await young(join(dir, n), this.now())) continue;
        await fsp.rm(join(dir, n), { recursive: true, force: true });
        this.live.delete(key);
        removed.push(n);
      }
    }
    return removed;
  }

  /** Sweeps at once and then every `everyMs` (default an hour) until `signal` aborts. */
  async start(signal: AbortSignal, everyMs = 3600 * 1000): Promise<void> {
    while (!signal.aborted) {
      await this.sweep().catch(() => undefined);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, everyMs);
        t.unref?.();
        signal.addEventListener('abort', () => (clearTimeout(t), resolve()), { once: true });
      });
    }
  }
}
