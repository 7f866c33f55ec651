// The one module through which the host touches sandbox files (README.md "File operations").
// It drives the helper's `procbox fileops` mode (fileops.c): long-lived processes, started
// lazily and restarted when one dies, each serving one framed request at a time. Every
// operation is anchored at a directory fd of a host-controlled root (the workspace of a
// running sandbox as /proc/<init>/root<ws>, or an overlay layer or upper directory in the
// state directory) and resolved by the helper with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) one component at a time; no
// code on the host opens, stats, lists, writes, chowns, renames or deletes a path a sandbox
// controls by name. Do not add fs calls on sandbox paths elsewhere: add an op here.
//
// Wire format (little-endian): request u32 len | u32 id | u8 op | args (u32 len + bytes each);
// response u32 len | u32 id | i32 errno (0 = ok) | payload (the message on error). Up to 8
// requests are written to a helper ahead of its answers, which come back in order.
import { spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { closeSync, constants as fsConstants, fstatSync, openSync, readSync } from 'node:fs';
import { RuntimeError, type FileEntry, type TarSummary } from '../runtime.js';
import { encodePath } from '../workspace/paths.js';
import {
  OP,
  ERRNO,
  FileOpError,
  oneShotError,
  PIPELINE,
  Server,
  type Anchor,
  type Op,
  type Pending,
  type RawEntry,
  type WalkedFile,
} from './fileops-wire.js';

export { FileOpError, type Anchor, type RawEntry, type WalkedFile } from './fileops-wire.js';

/**
 * A small pool of `procbox fileops` helpers (started on first use, replaced when one dies; a
 * request in flight on a dying helper fails with RuntimeError Internal). Safe to share
 * between sandboxes and concurrent callers; close() ends the helpers (later calls start new
 * ones).
 */
export class FileOps {
  private readonly servers: Server[] = [];
  private readonly queue: Pending[] = [];
  private nextId = 1;

  constructor(
    private readonly helper: string,
    private readonly size = 2,
  ) {}

  private pump(): void {
    while (this.queue.length > 0) {
      // The least loaded live helper; a new one while every helper has work and there is room.
      let s: Server | undefined;
      for (const x of this.servers) if (!x.dead && x.load < PIPELINE && (!s || x.load < s.load)) s = x;
      if ((!s || s.load > 0) && this.servers.length < this.size) {
        s = new Server(this.helper, (dead) => {
          const i = this.servers.indexOf(dead);
          if (i >= 0) this.servers.splice(i, 1);
          this.pump();
        });
        s.pump = () => this.pump();
        this.servers.push(s);
      }
      if (!s) return;
      s.send(this.queue.shift()!);
    }
  }

  /** Sends one request; resolves the payload, rejects FileOpError (errno + message). */
  private call(
    op: Op,
    args: (Buffer | string | number | bigint)[],
    post?: (payload: Buffer, from: Server) => Buffer,
  ): Promise<Buffer> {
    const parts: Buffer[] = [];
    for (const a of args) {
      let b: Buffer;
      if (typeof a === 'number' || typeof a === 'bigint') {
        b = Buffer.alloc(8);
        b.writeBigUInt64LE(BigInt(a));
      } else b = Buffer.isBuffer(a) ? a : Buffer.from(a);
      const h = Buffer.alloc(4);
      h.writeUInt32LE(b.length);
      parts.push(h, b);
    }
    const id = this.nextId++ >>> 0;
    const body = Buffer.concat(parts);
    const head = Buffer.alloc(9);
    head.writeUInt32LE(5 + body.length, 0);
    head.writeUInt32LE(id, 4);
    head.writeUInt8(OP[op], 8);
    const frame = Buffer.concat([head, body]);
    const readOnly = op !== 'write' && op !== 'delete' && op !== 'rmtree' && op !== 'run';
    let retried = false;
    return new Promise<Buffer>((resolve, reject) => {
      this.queue.push({
        frame,
        reject,
        retry: (p) => {
          if (!readOnly || retried) return false;
          retried = true;
          this.queue.unshift(p);
          return true;
        },
        resolve: (r, from) => {
          if (r.readUInt32LE(0) !== id)
            return reject(new RuntimeError('Internal', 'procbox fileops: answer out of order'));
          const errno = r.readInt32LE(4);
          if (errno !== 0) return reject(new FileOpError(ERRNO[errno] ?? `E${errno}`, r.subarray(8).toString()));
          try {
            resolve(post ? post(r.subarray(8), from) : r.subarray(8));
          } catch (e) {
            reject(e as Error);
          }
        },
      });
      this.pump();
    });
  }

  /** lstat of the entry at `rel` (intermediate symlinks followed inside the anchor, the last not). */
  async stat(a: Anchor, rel: Buffer): Promise<RawEntry> {
    return parseEntries(await this.call('stat', [a.root, a.view, rel]))[0]!;
  }

  /**
   * lstat of many (root, rel) pairs in one round trip, nothing followed at all (for overlay
   * layers): null where the entry does not exist or a component is not a directory.
   */
  async statMany(pairs: { root: string; rel: Buffer }[]): Promise<(RawEntry | null)[]> {
    const parts: Buffer[] = [];
    for (const p of pairs) {
      const r = Buffer.from(p.root);
      const h = Buffer.alloc(4);
      h.writeUInt32LE(r.length);
      const h2 = Buffer.alloc(4);
      h2.writeUInt32LE(p.rel.length);
      parts.push(h, r, h2, p.rel);
    }
    const b = await this.call('statv', [Buffer.concat(parts)]);
    const out: (RawEntry | null)[] = [];
    let o = 0;
    while (o < b.length) {
      const errno = b.readUInt32LE(o);
      o += 4;
      if (errno !== 0) {
        const name = ERRNO[errno] ?? `E${errno}`;
        if (name !== 'ENOENT' && name !== 'ENOTDIR' && name !== 'ELOOP')
          throw new FileOpError(name, 'lstat of a layer entry failed');
        out.push(null);
        continue;
      }
      const [e, next] = parseEntry(b, o);
      out.push(e);
      o = next;
    }
    return out;
  }

  /** The entries of the directory at `rel` (symlinks followed inside the anchor), unsorted. */
  async list(a: Anchor, rel: Buffer): Promise<RawEntry[]> {
    return parseEntries(await this.call('list', [a.root, a.view, rel]));
  }

  /**
   * The bytes of the regular file at `rel` (symlinks followed inside the anchor); EFBIG past
   * maxBytes (checked on the bytes read). Files from 256 KiB up are not copied through the
   * pipe: the helper hands over the fd it verified and this process reads that very file
   * through /proc/<helper>/fd/<n> (dev and ino checked), then lets the helper close it.
   */
  read(a: Anchor, rel: Buffer, maxBytes: number): Promise<Buffer> {
    const max = Math.max(0, Math.min(maxBytes, Number.MAX_SAFE_INTEGER));
    return this.call('read', [a.root, a.view, rel, max, 1], (p, from) => {
      if (p[0] === 0) return p.subarray(1);
      try {
        return readHandedOver(p, from.pid, max);
      } finally {
        from.release(p.readUInt32LE(1));
      }
    });
  }

  /**
   * Opens the regular file at `rel` (resolved as `read` does) for ranged reads: a file under
   * 256 KiB comes back whole (`inline`); a larger one as an fd of this process on the very file
   * the helper verified (opened through /proc/<helper>/fd/<n>, dev and ino checked, the
   * helper's copy released at once). The caller closes `fd`.
   */
  async open(a: Anchor, rel: Buffer): Promise<{ inline: Buffer } | { fd: number }> {
    let fd = -1;
    const p = await this.call('read', [a.root, a.view, rel, Number.MAX_SAFE_INTEGER, 1], (p, from) => {
      if (p[0] === 0) return p;
      try {
        fd = openHandedOver(p, from.pid);
      } finally {
        from.release(p.readUInt32LE(1));
      }
      return p;
    });
    return fd >= 0 ? { fd } : { inline: p.subarray(1) };
  }

  /**
   * Replaces the file at `rel` atomically (temp file, fchown to `owner`, fchmod to `mode` or
   * 0644, fsync, rename, fsync of the directory); with `mkdirs`, missing parents are made 0755
   * and owned by `owner`.
   */
  async write(
    a: Anchor,
    rel: Buffer,
    data: Buffer,
    opts: { mode?: number; owner: number; mkdirs?: boolean },
  ): Promise<void> {
    await this.call('write', [
      a.root,
      a.view,
      rel,
      data,
      opts.mode === undefined ? 0xffffffffffffffffn : opts.mode & 0o7777,
      opts.owner,
      opts.mkdirs ? 1 : 0,
    ]);
  }

  /** Removes the entry at `rel` (the last component not followed); a directory only when empty unless recursive. */
  async delete(a: Anchor, rel: Buffer, recursive: boolean): Promise<void> {
    await this.call('delete', [a.root, a.view, rel, recursive ? 1 : 0]);
  }

  /**
   * sha256 of every regular file below the directory `rel` (found as the files API would,
   * then nothing followed, no other filesystem entered); E2BIG past maxFiles.
   */
  async walk(a: Anchor, rel: Buffer, maxFiles: number): Promise<WalkedFile[]> {
    const b = await this.call('walk', [a.root, a.view, rel, maxFiles]);
    const out: WalkedFile[] = [];
    let o = 0;
    while (o < b.length) {
      const n = b.readUInt32LE(o);
      const relp = b.subarray(o + 4, o + 4 + n);
      o += 4 + n;
      const kind = b[o]!;
      const dig = b.subarray(o + 1, o + 33);
      const mode = b.readUInt32LE(o + 33);
      o += 37;
      out.push({
        rel: Buffer.from(relp),
        fingerprint: kind === 0 ? `sha256:${dig.toString('hex')}` : 'unreadable',
        mode,
      });
    }
    return out;
  }

  /** The raw listing of a layer directory (see layers.ts for the record format). */
  scan(dir: string): Promise<Buffer> {
    return this.call('scan', [dir]);
  }

  /** True when both are regular files with the same bytes (nothing followed). */
  async same(rootA: string, relA: Buffer, rootB: string, relB: Buffer): Promise<boolean> {
    return (await this.call('cmp', [rootA, relA, rootB, relB]))[0] === 1;
  }

  /**
   * Removes the host directory `path` (in the state directory) and everything below it, through
   * fds (trees deeper than PATH_MAX too, symlinks never followed). A missing path is fine.
   */
  async rmtree(path: string): Promise<void> {
    await this.call('rmtree', [path]);
  }

  /**
   * Runs the helper subcommand `args` (`remount`, `attach` or `init ...`; anything else is
   * EPERM) in a child the running helper starts, with `input` on its stdin, and gives its exit
   * status and output, as spawning `procbox args...` would: without a spawn from this process,
   * whose fork blocks the event loop for milliseconds. Never retried (not idempotent).
   */
  async run(args: string[], input?: string): Promise<{ code: number; stdout: string; stderr: string }> {
    if (args.length === 0 || args.some((a) => a.includes('\0')))
      throw new RuntimeError('InvalidArgument', 'helper arguments: none, or one contains a NUL byte');
    const b = await this.call(
      'run',
      input === undefined ? [Buffer.from(args.join('\0'))] : [Buffer.from(args.join('\0')), Buffer.from(input)],
    );
    const n = b.readUInt32LE(4);
    return { code: b.readUInt32LE(0), stdout: b.subarray(8, 8 + n).toString(), stderr: b.subarray(8 + n).toString() };
  }

  /** syncfs(2) of the filesystem holding the host directory `path` (what `sync -f` does, in the running helper). */
  async syncfs(path: string): Promise<void> {
    await this.call('syncfs', [path]);
  }

  /**
   * A btrfs snapshot of the volume `vol` (a subvolume root) as `dir`/`name`, in qgroup 1/`group`
   * when given; on disk when it resolves (the ioctl commits a transaction). ENOTTY off btrfs.
   */
  async snapshot(vol: string, dir: string, name: string, group?: number): Promise<void> {
    await this.call('snapshot', [vol, dir, name, String(group ?? 0)]);
  }

  /**
   * Builds the new host directory `outDir` from the layer directories `layers` (oldest first):
   * whiteouts remove, opaque directories replace, directories merge, regular files are
   * hard-linked (reflinked or copied across filesystems), symlinks and special files
   * recreated; owners, modes and times kept; nothing followed. Fails if `outDir` exists.
   */
  async merge(layers: string[], outDir: string): Promise<void> {
    const parts: Buffer[] = [];
    for (const l of layers) {
      const b = Buffer.from(l);
      const h = Buffer.alloc(4);
      h.writeUInt32LE(b.length);
      parts.push(h, b);
    }
    await this.call('merge', [outDir, Buffer.concat(parts)]);
  }

  /**
   * A tar archive (ustar + pax) of the entry at `rel` (resolved as `read` does), named `name`
   * (and `name/...` below a directory), streamed by a helper process of its own (fileops.c
   * tar-out) through a pipe: reading slowly slows the helper down, nothing is buffered here.
   * Rejects with a FileOpError before any byte when the entry cannot be archived (missing,
   * leads out of the workspace, not a file or directory). A failure later destroys the stream
   * with the FileOpError; destroying the stream ends the helper.
   */
  tarOut(a: Anchor, rel: Buffer, name: Buffer): Promise<Readable> {
    const child = spawn(
      this.helper,
      ['fileops', 'tar-out', a.root, a.view, rel.toString('hex'), name.toString('hex')],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let err = '';
    child.stderr.on('data', (b: Buffer) => (err = (err + b.toString()).slice(-2000)));
    const out = child.stdout;
    out.on('close', () => child.exitCode === null && child.kill('SIGKILL'));
    return new Promise<Readable>((resolve, reject) => {
      let started = false;
      const failure = (code: number | null, sig: string | null) =>
        oneShotError(err) ??
        new RuntimeError('Internal', `procbox fileops tar-out exited (${sig ?? code})${err ? `: ${err.trim()}` : ''}`);
      child.on('error', (e) => (started ? out.destroy(e) : reject(e)));
      const onReadable = () => {
        if (started || out.readableLength === 0) return; // 0: the end, the exit says how it went
        started = true;
        out.off('readable', onReadable);
        resolve(out);
      };
      child.on('exit', (code, sig) => {
        if (code === 0) {
          if (!started) ((started = true), resolve(out));
          return;
        }
        if (!started) ((started = true), reject(failure(code, sig)));
        else if (!out.destroyed) out.destroy(failure(code, sig));
      });
      out.on('readable', onReadable);
    });
  }

  /**
   * Extracts the tar archive `input` into the directory at `rel` (created when missing) through
   * a helper process of its own (fileops.c tar-in): entries below fds only, symlinks never
   * followed, `..`/absolute names, hard links, devices, FIFOs and more than `maxEntries`
   * entries refused; staged inside the target and moved in only once the whole archive was
   * good, so a refused archive writes nothing (FileOpError EINVAL naming the entry). Modes are
   * kept without setuid/setgid, mtimes kept, everything owned by `owner`; the file system is
   * synced before this resolves. `input` is piped with backpressure; it is left to the caller
   * to drain or destroy on failure.
   */
  tarIn(a: Anchor, rel: Buffer, input: Readable, opts: { owner: number; maxEntries: number }): Promise<TarSummary> {
    const child = spawn(
      this.helper,
      ['fileops', 'tar-in', a.root, a.view, rel.toString('hex'), String(opts.owner), String(opts.maxEntries)],
      { stdio: ['pipe', 'pipe', 'pipe'] },
    );
    let err = '';
    let out = '';
    child.stderr.on('data', (b: Buffer) => (err = (err + b.toString()).slice(-2000)));
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stdin.on('error', () => undefined); // the helper refused and exited: shows as its exit
    // A client that goes away (an error, or a close before the end) ends the helper's input:
    // it then sees a cut archive and removes what it staged (a kill would leave it there).
    const onInputError = () => child.stdin.end();
    input.on('error', onInputError);
    input.on('close', onInputError);
    input.pipe(child.stdin);
    return new Promise<TarSummary>((resolve, reject) => {
      child.on('error', reject);
      child.on('close', (code, sig) => {
        input.unpipe(child.stdin);
        input.off('error', onInputError);
        input.off('close', onInputError);
        const r = writerResult('tar-in', code, sig, out, err);
        if (r instanceof Error) reject(r);
        else resolve(r);
      });
    });
  }

  /**
   * Writes exactly `opts.size` bytes read from the open file `fd` (from its offset; the caller
   * closes it) as the file `name` of the directory at `rel` (created when missing), through a
   * helper process of its own (fileops-filein.c file-in) that is handed `fd` as its stdin: the
   * bytes never pass through this process, and the kernel copies them where the two file systems
   * allow. Staged under a temporary name in the directory and renamed over `name` only once every
   * byte arrived (a symlink there is replaced, a directory refused: FileOpError EISDIR); fewer or
   * more bytes than `size`: FileOpError EINVAL, nothing at `name` changes. Synced before this resolves.
   */
  fileIn(
    a: Anchor,
    rel: Buffer,
    name: Buffer,
    fd: number,
    opts: { owner: number; size: number; mode: number; mtime: Date },
  ): Promise<TarSummary> {
    const args = [
      'fileops',
      'file-in',
      a.root,
      a.view,
      rel.toString('hex'),
      name.toString('hex'),
      String(opts.owner),
      String(opts.size),
      String(opts.mode & 0o7777),
      String(Math.floor(opts.mtime.getTime() / 1000)),
    ];
    const child = spawn(this.helper, args, { stdio: [fd, 'pipe', 'pipe'] });
    let err = '';
    let out = '';
    child.stderr!.on('data', (b: Buffer) => (err = (err + b.toString()).slice(-2000)));
    child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    return new Promise<TarSummary>((resolve, reject) => {
      child.on('error', reject);
      child.on('close', (code, sig) => {
        const r = writerResult('file-in', code, sig, out, err);
        if (r instanceof Error) reject(r);
        else resolve(r);
      });
    });
  }

  /** Ends the helpers; a call afterwards starts new ones. Safe to call twice. */
  close(): void {
    for (const s of this.servers.splice(0)) s.close();
    for (const p of this.queue.splice(0)) p.reject(new RuntimeError('Internal', 'procbox fileops closed'));
  }
}

/** A one-shot writer's (tar-in, file-in) summary line as a TarSummary, or the error its exit means. */
function writerResult(
  mode: string,
  code: number | null,
  sig: NodeJS.Signals | null,
  out: string,
  err: string,
): TarSummary | Error {
  const m = /^entries (\d+) files (\d+) dirs (\d+) symlinks (\d+) bytes (\d+)/.exec(out);
  if (code === 0 && m) return { entries: +m[1]!, files: +m[2]!, dirs: +m[3]!, symlinks: +m[4]!, bytes: +m[5]! };
  return (
    oneShotError(err) ??
    new RuntimeError('Internal', `procbox fileops ${mode} exited (${sig ?? code})${err ? `: ${err.trim()}` : ''}`)
  );
}

/**
 * Opens the file the helper `pid` handed over (answer: u8 1, u32 fd, u64 dev, u64 ino) and checks it is the one
 * resolved.
 */
function openHandedOver(p: Buffer, pid: number): number {
  const fd = openSync(
    `/proc/${pid}/fd/${p.readUInt32LE(1)}`,
    fsConstants.O_RDONLY | fsConstants.O_NOCTTY | fsConstants.O_NONBLOCK,
  );
  const st = fstatSync(fd, { bigint: true });
  if (!st.isFile() || st.dev !== p.readBigUInt64LE(5) || st.ino !== p.readBigUInt64LE(13)) {
    closeSync(fd);
    throw new FileOpError('ESTALE', 'the file handed over is not the one the helper resolved');
  }
  return fd;
}

/** Reads the file the helper `pid` handed over (answer: u8 1, u32 fd, u64 dev, u64 ino), capped at `max`. */
function readHandedOver(p: Buffer, pid: number, max: number): Buffer {
  const n = p.readUInt32LE(1);
  const fd = openSync(`/proc/${pid}/fd/${n}`, fsConstants.O_RDONLY | fsConstants.O_NOCTTY | fsConstants.O_NONBLOCK);
  try {
    const st = fstatSync(fd, { bigint: true });
    if (!st.isFile() || st.dev !== p.readBigUInt64LE(5) || st.ino !== p.readBigUInt64LE(13)) {
      throw new FileOpError('ESTALE', 'the file handed over is not the one the helper resolved');
    }
    let buf = Buffer.allocUnsafe(Math.min(Number(st.size), max) + 1);
    let got = 0;
    for (;;) {
      if (got === buf.length) {
        if (got > max) break;
        const bigger = Buffer.allocUnsafe(Math.min(buf.length * 2, max + 1));
        buf.copy(bigger, 0, 0, got);
        buf = bigger;
      }
      const r = readSync(fd, buf, got, buf.length - got, got);
      if (r === 0) break;
      got += r;
    }
    if (got > max) throw new FileOpError('EFBIG', `file grew past ${max} bytes while reading`);
    return buf.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

function parseEntry(b: Buffer, o: number): [RawEntry, number] {
  const type = String.fromCharCode(b[o]!) as RawEntry['type'];
  const size = Number(b.readBigUInt64LE(o + 1));
  const mode = b.readUInt32LE(o + 9);
  const sec = Number(b.readBigInt64LE(o + 13));
  const nsec = b.readUInt32LE(o + 21);
  const uid = b.readUInt32LE(o + 25);
  const gid = b.readUInt32LE(o + 29);
  o += 33;
  const nl = b.readUInt32LE(o);
  const name = Buffer.from(b.subarray(o + 4, o + 4 + nl));
  o += 4 + nl;
  const ll = b.readUInt32LE(o);
  const link = Buffer.from(b.subarray(o + 4, o + 4 + ll));
  o += 4 + ll;
  return [{ type, size, mode, mtimeMs: sec * 1000 + Math.floor(nsec / 1e6), uid, gid, name, link }, o];
}

function parseEntries(b: Buffer): RawEntry[] {
  const out: RawEntry[] = [];
  for (let o = 0; o < b.length;) {
    const [e, next] = parseEntry(b, o);
    out.push(e);
    o = next;
  }
  return out;
}

/** A FileEntry of the Runtime files API from a helper entry. */
export function toFileEntry(path: string, e: RawEntry): FileEntry {
  const type = e.type === 'f' ? 'file' : e.type === 'd' ? 'dir' : e.type === 'l' ? 'symlink' : 'other';
  const f: FileEntry = {
    path,
    name: encodePath(e.name),
    type,
    size: e.size,
    mode: e.mode & 0o7777,
    mtime: new Date(e.mtimeMs).toISOString(),
  };
  if (type === 'symlink') f.linkTarget = encodePath(e.link);
  return f;
}

/**
 * The RuntimeError for a failed file operation on `path`: ENOENT NotFound, ENOTDIR
 * NotADirectory, EISDIR IsADirectory, ELOOP/EXDEV (a symlink or `..` leading out, a symlink
 * where none may be) InvalidPath, ENOTEMPTY Conflict, EFBIG/E2BIG LimitExceeded, EINVAL (not a
 * regular file) InvalidArgument, anything else Internal.
 */
export function fileOpError(err: unknown, path: string): RuntimeError {
  if (err instanceof RuntimeError) return err;
  if (!(err instanceof FileOpError)) return new RuntimeError('Internal', `${path}: ${(err as Error).message}`);
  const m = `${path}: ${err.message}`;
  switch (err.errno) {
    case 'ENOENT':
      return new RuntimeError('NotFound', `no such file: ${m}`);
    case 'ENOTDIR':
      return new RuntimeError('NotADirectory', `not a directory: ${m}`);
    case 'EISDIR':
      return new RuntimeError('IsADirectory', `is a directory: ${m}`);
    case 'ELOOP':
    case 'EXDEV':
    case 'ENAMETOOLONG':
      return new RuntimeError('InvalidPath', m);
    case 'ENOTEMPTY':
      return new RuntimeError('Conflict', `directory not empty: ${m}`);
    case 'EFBIG':
    case 'E2BIG':
      return new RuntimeError('LimitExceeded', m);
    case 'EINVAL':
      return new RuntimeError('InvalidArgument', m);
    default:
      return new RuntimeError('Internal', m);
  }
}
