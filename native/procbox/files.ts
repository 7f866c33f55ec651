// The Files API of a procbox sandbox, on the host side of its workspace: the init's view
// through /proc/<init>/root. Confined to the workspace path (other sandbox paths: /tmp is
// private to the sandbox's mount namespace, the rest are read-only host system directories,
// so they are refused with InvalidPath). Paths follow native/workspace rules and are resolved
// component by component: a symlink is followed only while it stays inside the workspace.
// Written files and directories belong to the sandbox's root. Methods throw RuntimeErrors
// (NotFound, NotADirectory, IsADirectory, InvalidPath, LimitExceeded, Conflict, Internal).
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  closeSync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmdirSync,
  rmSync,
  unlinkSync,
  writeSync,
  type Stats,
} from 'node:fs';
import { RuntimeError, type FileEntry, type WriteFileOptions } from '../runtime.js';
import { encodePath, isUnder, normalizeSandboxPath, resolveInsideRaw, validateSandboxPath } from '../workspace/paths.js';

export class WorkspaceFiles {
  /**
   * @param rootDir host path of the sandbox's root (/proc/<init>/root)
   * @param ws the workspace path inside the sandbox
   * @param uid host uid (and gid) of root inside the sandbox
   */
  constructor(
    private readonly rootDir: string,
    private readonly ws: string,
    private readonly uid: number,
  ) {}

  private resolve(path: string, followFinal: boolean): Buffer {
    validateSandboxPath(path);
    const p = normalizeSandboxPath(path);
    if (!isUnder(p, this.ws)) throw new RuntimeError('InvalidPath', `path ${p} is outside the workspace ${this.ws}`);
    return resolveInsideRaw(`${this.rootDir}${this.ws}`, p, { rootView: this.ws, followFinal });
  }

  private entry(path: string, name: string, host: Buffer, st: Stats): FileEntry {
    const type = st.isFile() ? 'file' : st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : 'other';
    const e: FileEntry = { path, name, type, size: st.size, mode: st.mode & 0o7777, mtime: st.mtime.toISOString() };
    if (type === 'symlink') e.linkTarget = encodePath(readlinkSync(host, { encoding: 'buffer' }));
    return e;
  }

  private fsErr(err: unknown, path: string): never {
    if (err instanceof RuntimeError) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new RuntimeError('NotFound', `no such file: ${path}`);
    if (code === 'ENOTDIR') throw new RuntimeError('NotADirectory', `not a directory: ${path}`);
    if (code === 'EISDIR') throw new RuntimeError('IsADirectory', `is a directory: ${path}`);
    if (code === 'ENOTEMPTY') throw new RuntimeError('Conflict', `directory not empty: ${path}`);
    throw new RuntimeError('Internal', `${path}: ${(err as Error).message}`);
  }

  list(path: string): FileEntry[] {
    const host = this.resolve(path, true);
    const base = normalizeSandboxPath(path);
    try {
      const names = readdirSync(host, { encoding: 'buffer' });
      const out: FileEntry[] = [];
      for (const n of names) {
        const h = Buffer.concat([host, Buffer.from('/'), n]);
        let st: Stats;
        try {
          st = lstatSync(h);
        } catch {
          continue; // removed while listing
        }
        const name = encodePath(n);
        out.push(this.entry(base === '/' ? `/${name}` : `${base}/${name}`, name, h, st));
      }
      return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    } catch (err) {
      this.fsErr(err, path);
    }
  }

  stat(path: string): FileEntry {
    const host = this.resolve(path, false);
    const p = normalizeSandboxPath(path);
    try {
      return this.entry(p, p.slice(p.lastIndexOf('/') + 1), host, lstatSync(host));
    } catch (err) {
      this.fsErr(err, path);
    }
  }

  read(path: string, opts?: { maxBytes?: number }): Buffer {
    const host = this.resolve(path, true);
    try {
      const st = lstatSync(host);
      if (st.isDirectory()) throw new RuntimeError('IsADirectory', `is a directory: ${path}`);
      if (!st.isFile()) throw new RuntimeError('InvalidArgument', `not a regular file: ${path}`);
      if (opts?.maxBytes !== undefined && st.size > opts.maxBytes) {
        throw new RuntimeError('LimitExceeded', `${path} is ${st.size} bytes, more than ${opts.maxBytes}`);
      }
      return readFileSync(host);
    } catch (err) {
      this.fsErr(err, path);
    }
  }

  write(path: string, data: Buffer, opts?: WriteFileOptions): void {
    const p = normalizeSandboxPath(path);
    if (p === this.ws) throw new RuntimeError('IsADirectory', `is a directory: ${path}`);
    const host = this.resolve(path, true);
    const parent = host.subarray(0, host.lastIndexOf(0x2f));
    try {
      if (opts?.mkdirs) this.mkdirsOwned(p.slice(0, p.lastIndexOf('/')));
      const st = (() => {
        try {
          return lstatSync(host);
        } catch {
          return undefined;
        }
      })();
      if (st?.isDirectory()) throw new RuntimeError('IsADirectory', `is a directory: ${path}`);
      const tmp = Buffer.concat([parent, Buffer.from(`/.fluxvm-tmp-${randomBytes(6).toString('hex')}`)]);
      const fd = openSync(tmp, 'wx', opts?.mode ?? 0o644);
      try {
        writeSync(fd, data);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      chownSync(tmp, this.uid, this.uid);
      if (opts?.mode !== undefined) chmodSync(tmp, opts.mode & 0o7777); // not masked by umask
      renameSync(tmp, host);
    } catch (err) {
      this.fsErr(err, path);
    }
  }

  /** mkdir -p below the workspace, each new directory 0755 and owned by sandbox root. */
  private mkdirsOwned(dirPath: string): void {
    const comps = dirPath.slice(this.ws.length).split('/').filter(Boolean);
    let cur = this.ws;
    for (const c of comps) {
      cur = `${cur}/${c}`;
      const h = this.resolve(cur, true);
      try {
        mkdirSync(h, { mode: 0o755 });
        chownSync(h, this.uid, this.uid);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        if (!lstatSync(h).isDirectory()) throw new RuntimeError('NotADirectory', `not a directory: ${cur}`);
      }
    }
  }

  delete(path: string, opts?: { recursive?: boolean }): void {
    validateSandboxPath(path);
    const p = normalizeSandboxPath(path);
    if (p.split('/').filter(Boolean).length < 2) throw new RuntimeError('InvalidPath', `refusing to delete ${p}`);
    if (p === this.ws) throw new RuntimeError('InvalidPath', `refusing to delete the workspace root ${p}`);
    const host = this.resolve(path, false);
    try {
      const st = lstatSync(host);
      if (st.isDirectory()) {
        if (opts?.recursive) rmSync(host, { recursive: true });
        else rmdirSync(host);
      } else unlinkSync(host);
    } catch (err) {
      this.fsErr(err, path);
    }
  }
}
