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
import type { Readable } from 'node:stream';
import { RuntimeError, type FileEntry, type TarSummary, type WriteFileOptions } from '../runtime.js';
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
    await this.ops.write(anchor, rel, data, { mode: opts?.mode, owner: this.uid, mkdirs: opts?.mkdirs }).catch((e: unknown) => {
      throw fileOpError(e, path);
    });
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
      if (err.code === 'InvalidArgument') throw new RuntimeError('InvalidArgument', `not a regular file or directory: ${path}`);
      throw err;
    });
  }

  /** Extracts the tar `input` into the directory at `path` (fileops tar-in): all or nothing. */
  async tarIn(path: string, input: Readable, opts?: { maxEntries?: number }): Promise<TarSummary> {
    const { rel, anchor } = this.rel(path);
    return this.ops.tarIn(anchor, rel, input, { owner: this.uid, maxEntries: opts?.maxEntries ?? DEFAULT_MAX_TAR_ENTRIES }).catch((e: unknown) => {
      throw fileOpError(e, path);
    });
  }
}
