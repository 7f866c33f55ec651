// The Files API of a procbox sandbox. Every operation goes through fileops.ts (the helper's
// fd-anchored mode): anchored at the workspace of the running init (/proc/<init>/root<ws>),
// resolved below it with openat2 one component at a time. Confined to the workspace path
// (other sandbox paths: /tmp is private to the sandbox's mount namespace, the rest are
// read-only host system directories, so they are refused with InvalidPath). Symlinks inside
// the workspace are followed the way the sandbox sees them, by the helper, never by the
// kernel on our behalf: an absolute target must name the workspace, `..` never climbs above
// it, else InvalidPath. Written files and directories belong to the sandbox's root. Methods
// throw RuntimeErrors (NotFound, NotADirectory, IsADirectory, InvalidPath, InvalidArgument,
// LimitExceeded, Conflict, Internal).
import { createHash } from 'node:crypto';
import { closeSync, fstatSync, promises as fsp } from 'node:fs';
import { Readable, Transform } from 'node:stream';
import { Header, Pax } from 'tar';
import {
  RuntimeError,
  type FileEntry,
  type FileRange,
  type FileData,
  type TarSummary,
  type WriteFileOptions,
} from '../runtime.js';
import { compareUtf8, decodePath, isUnder, normalizeSandboxPath, validateSandboxPath } from '../workspace/paths.js';
import { fileOpError, toFileEntry, type Anchor, type FileOps } from './fileops.js';

/** Reads are capped here when the caller gives no cap (the files API passes its own). */
const DEFAULT_MAX_READ = 1 << 30;
/** Entries of one extracted archive, unless the caller says otherwise (the manifest's file limit). */
export const DEFAULT_MAX_TAR_ENTRIES = 200_000;

export class WorkspaceFiles {
  private readonly anchor: Anchor;
  /** The writable binds below a read-only workspace (procbox.c attach_overlay), deepest first. */
  private readonly subs: Array<{ path: string; anchor: Anchor }>;

  /**
   * @param ops the runtime's fileops helpers
   * @param rootDir host path of the sandbox's root (/proc/<init>/root)
   * @param ws the workspace path inside the sandbox
   * @param uid host uid (and gid) of root inside the sandbox
   * @param binds paths below the workspace that are mounts of their own (the writePaths of a
   *   read-only workspace): the resolver never crosses a mount, so a path below one is anchored
   *   there (a symlink in it may then not leave it: InvalidPath)
   */
  constructor(
    private readonly ops: FileOps,
    rootDir: string,
    private readonly ws: string,
    private readonly uid: number,
    binds: string[] = [],
  ) {
    this.anchor = { root: `${rootDir}${ws}`, view: ws };
    this.subs = binds
      .map((b) => normalizeSandboxPath(b))
      .filter((b) => b !== ws && isUnder(b, ws))
      .sort((a, b) => b.length - a.length)
      .map((b) => ({ path: b, anchor: { root: `${rootDir}${b}`, view: b } }));
  }

  /** The anchor of a path and the path below it as raw bytes (empty = the anchor itself). */
  private rel(path: string): { p: string; rel: Buffer; anchor: Anchor } {
    validateSandboxPath(path);
    const p = normalizeSandboxPath(path);
    if (!isUnder(p, this.ws)) throw new RuntimeError('InvalidPath', `path ${p} is outside the workspace ${this.ws}`);
    const sub = this.subs.find((s) => isUnder(p, s.path));
    const base = sub?.path ?? this.ws;
    return { p, rel: decodePath(p.slice(base.length).replace(/^\//, '')), anchor: sub?.anchor ?? this.anchor };
  }

  async list(path: string): Promise<FileEntry[]> {
    const { p, rel, anchor } = this.rel(path);
    const entries = await this.ops.list(anchor, rel).catch((e: unknown) => {
      throw fileOpError(e, path);
    });
    return entries
      .map((e) => {
        const f = toFileEntry('', e);
        f.path = p === '/' ? `/${f.name}` : `${p}/${f.name}`;
        return f;
      })
      .sort((a, b) => compareUtf8(a.name, b.name));
  }

  async stat(path: string): Promise<FileEntry> {
    const { p, rel, anchor } = this.rel(path);
    const e = await this.ops.stat(anchor, rel).catch((err: unknown) => {
      throw fileOpError(err, path);
    });
    const f = toFileEntry(p, e);
    f.name = p.slice(p.lastIndexOf('/') + 1);
    return f;
  }

  async read(path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    const { rel, anchor } = this.rel(path);
    return this.ops.read(anchor, rel, opts?.maxBytes ?? DEFAULT_MAX_READ).catch((e: unknown) => {
      const err = fileOpError(e, path);
      if (err.code === 'InvalidArgument') throw new RuntimeError('InvalidArgument', `not a regular file: ${path}`);
      throw err;
    });
  }

  async write(path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    const { p, rel, anchor } = this.rel(path);
    if (p === this.ws) throw new RuntimeError('IsADirectory', `is a directory: ${path}`);
    await this.ops
      .write(anchor, rel, data, { mode: opts?.mode, owner: this.uid, mkdirs: opts?.mkdirs })
      .catch((e: unknown) => {
        throw fileOpError(e, path);
      });
  }

  /**
   * Replaces the file at `path` with exactly `opts.size` bytes of `data`, streamed: a one-entry
   * archive (header made here, the bytes counted as they pass) extracted by the helper's tar-in
   * into the parent directory, which stages the file inside it and renames it into place only
   * once every byte arrived, so nothing half-written is ever at `path`. The parent is resolved
   * as every file operation is (fd-anchored, never out of the workspace); a symlink at `path`
   * is replaced, not followed. Fewer or more bytes than `size`: InvalidArgument, nothing written.
   * An open file (`{fd}`) is handed to the helper's file-in as its stdin instead: the same
   * staging and rename, and its bytes never pass through this process.
   */
  async writeStream(path: string, data: FileData, opts: WriteFileOptions & { size: number }): Promise<void> {
    const { p } = this.rel(path);
    if (p === this.ws) throw new RuntimeError('IsADirectory', `is a directory: ${path}`);
    const parent = p.slice(0, p.lastIndexOf('/')) || '/';
    const name = p.slice(p.lastIndexOf('/') + 1);
    if (!opts.mkdirs) {
      const st = await this.stat(parent);
      if (st.type !== 'dir' && st.type !== 'symlink')
        throw new RuntimeError('NotADirectory', `not a directory: ${parent}`);
    }
    const mode =
      opts.mode ??
      (await this.stat(p)
        .then((st) => (st.type === 'file' ? st.mode : 0o644))
        .catch(() => 0o644));
    if (!(data instanceof Readable)) {
      const at = this.rel(parent);
      await this.ops
        .fileIn(at.anchor, at.rel, decodePath(name), data.fd, {
          owner: this.uid,
          size: opts.size,
          mode,
          mtime: new Date(),
        })
        .catch((e: unknown) => {
          throw fileOpError(e, path);
        });
      return;
    }
    const head = new Header({
      path: name,
      type: 'File',
      mode: mode & 0o777,
      size: opts.size,
      mtime: new Date(),
      uid: 0,
      gid: 0,
      uname: '',
      gname: '',
    });
    head.encode();
    const header = head.needPax
      ? Buffer.concat([new Pax({ path: name, size: opts.size, mtime: new Date() }).encode(), head.block!])
      : head.block!;
    let seen = 0;
    const size = opts.size;
    const body = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        seen += chunk.length;
        if (seen > size)
          return cb(new RuntimeError('InvalidArgument', `${path}: more than the ${size} bytes announced`));
        cb(null, chunk);
      },
      flush(cb) {
        if (seen !== size)
          return cb(new RuntimeError('InvalidArgument', `${path}: ${seen} bytes arrived, ${size} were announced`));
        // The end of the entry (padding) and of the archive (two zero blocks).
        cb(null, Buffer.alloc(((512 - (size % 512)) % 512) + 1024));
      },
    });
    const archive = Readable.from(
      (async function* () {
        yield header;
        yield* body;
      })(),
      { objectMode: false },
    );
    let failed: Error | undefined;
    data.on('error', (e) => (failed ??= e));
    body.on('error', (e) => (failed ??= e));
    data.pipe(body);
    try {
      await this.tarIn(parent, archive);
    } catch (e) {
      throw failed ?? e;
    } finally {
      data.unpipe(body);
    }
    if (failed) throw failed;
  }

  /**
   * Up to `length` bytes of the regular file at `path` from `offset`, read from one open file
   * (the size, mtime, validator and checksum all describe that file). A file under 256 KiB
   * comes whole from the helper and its validator is a digest of the bytes.
   */
  async readRange(path: string, offset: number, length: number, opts?: { checksum?: boolean }): Promise<FileRange> {
    const { rel, anchor } = this.rel(path);
    const opened = await this.ops.open(anchor, rel).catch((e: unknown) => {
      const err = fileOpError(e, path);
      if (err.code === 'InvalidArgument') throw new RuntimeError('InvalidArgument', `not a regular file: ${path}`);
      throw err;
    });
    if ('inline' in opened) {
      const all = opened.inline;
      const st = await this.stat(path);
      const digest = createHash('sha256').update(all).digest('hex');
      const data = Buffer.from(all.subarray(Math.min(offset, all.length), Math.min(offset + length, all.length)));
      return {
        data,
        size: all.length,
        mtime: st.mtime,
        etag: `"c-${all.length}-${digest.slice(0, 32)}"`,
        ...(opts?.checksum ? { sha256: digest } : {}),
      };
    }
    const fd = opened.fd;
    try {
      const st = fstatSync(fd, { bigint: true });
      const size = Number(st.size);
      const fh = await fsp.open(`/proc/self/fd/${fd}`, 'r');
      try {
        const want = Math.max(0, Math.min(length, size - offset));
        const data = Buffer.alloc(want);
        let got = 0;
        while (got < want) {
          const { bytesRead } = await fh.read(data, got, want - got, offset + got);
          if (bytesRead === 0) break;
          got += bytesRead;
        }
        let sha256: string | undefined;
        if (opts?.checksum) {
          const h = createHash('sha256');
          const buf = Buffer.allocUnsafe(1 << 20);
          for (let pos = 0; ;) {
            const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
            if (bytesRead === 0) break;
            h.update(buf.subarray(0, bytesRead));
            pos += bytesRead;
          }
          sha256 = h.digest('hex');
        }
        const after = await fh.stat({ bigint: true });
        // A file that changed while it was read has a validator no later read matches.
        const etag =
          after.size === st.size && after.mtimeNs === st.mtimeNs
            ? `"f-${size}-${st.mtimeNs}-${st.ino}"`
            : `"changing-${Date.now()}"`;
        return {
          data: data.subarray(0, got),
          size,
          mtime: new Date(Number(st.mtimeNs / 1000000n)).toISOString(),
          etag,
          ...(sha256 ? { sha256 } : {}),
        };
      } finally {
        await fh.close();
      }
    } finally {
      closeSync(fd);
    }
  }

  async delete(path: string, opts?: { recursive?: boolean }): Promise<void> {
    const { p, rel, anchor } = this.rel(path);
    if (p.split('/').filter(Boolean).length < 2) throw new RuntimeError('InvalidPath', `refusing to delete ${p}`);
    if (p === this.ws) throw new RuntimeError('InvalidPath', `refusing to delete the workspace root ${p}`);
    await this.ops.delete(anchor, rel, opts?.recursive ?? false).catch((e: unknown) => {
      throw fileOpError(e, path);
    });
  }

  /** A tar stream of the file or directory at `path` (fileops tar-out), named by its last component. */
  async tarOut(path: string): Promise<Readable> {
    const { p, rel, anchor } = this.rel(path);
    const name = p === '/' ? 'root' : p.slice(p.lastIndexOf('/') + 1);
    return this.ops.tarOut(anchor, rel, decodePath(name)).catch((e: unknown) => {
      const err = fileOpError(e, path);
      if (err.code === 'InvalidArgument')
        throw new RuntimeError('InvalidArgument', `not a regular file or directory: ${path}`);
      throw err;
    });
  }

  /** Extracts the tar `input` into the directory at `path` (fileops tar-in): all or nothing. */
  async tarIn(path: string, input: Readable, opts?: { maxEntries?: number }): Promise<TarSummary> {
    const { rel, anchor } = this.rel(path);
    return this.ops
      .tarIn(anchor, rel, input, { owner: this.uid, maxEntries: opts?.maxEntries ?? DEFAULT_MAX_TAR_ENTRIES })
      .catch((e: unknown) => {
        throw fileOpError(e, path);
      });
  }
}
