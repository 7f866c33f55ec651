// The sha256 manifest rules (spec: sandbox-changes.md) and buildManifest, which every backend
// uses on what it listed: procbox's walk runs fd-anchored in its C helper
// (native/procbox/fileops.ts), a VM's inside the guest. manifest() below walks a host-owned
// tree by name (tests, benchmarks and reference listings of host directories); it is never
// used on a sandbox's files, which only the backends' own walkers read. Rules, as
// `find -xdev -type f`:
//   - only regular files are listed; symlinks, directories, FIFOs, sockets and devices are
//     not, and symlinks are never followed;
//   - no descent into a directory on another filesystem than its starting directory
//     (st_dev differs: a mount point). As with find -xdev, files themselves are not
//     dev-checked (overlayfs may report a lower layer's device for files).
//   - fingerprint `sha256:<hex>` of the content, `unreadable` when opening the file for
//     reading is refused;
//   - any walk failure (unreadable directory, something removed or replaced while listing,
//     a starting path that is missing or not a directory) fails the whole call with
//     RuntimeError('InvalidArgument'), never a partial listing (which would show false
//     deletions); unexpected I/O errors are RuntimeError('Internal');
//   - limits: maxFiles files, and maxListingBytes of listing, where the listing size is
//     defined as the sum over listed files of the UTF-8 byte length of the key (sandbox
//     path, encoded) plus the byte length of its fingerprint (71 for sha256, 10 for
//     unreadable): exceeding either is RuntimeError('LimitExceeded');
//   - keys are absolute sandbox-view paths: the normalized starting path + '/' + names
//     encoded with encodePath (non-UTF-8 bytes as \xNN, backslash as \\).
// Hashing runs on worker threads (2 by default) reading files sequentially; small trees,
// or a pool that cannot start, are hashed on the calling thread.
import { lstatSync, readdirSync, type Dirent, type Stats } from 'node:fs';
import { Worker } from 'node:worker_threads';
import { RuntimeError } from '../runtime.js';
import { hashFile, type HashResult } from './hash.js';
import { compareUtf8, decodePath, encodePath, normalizeSandboxPath, validateSandboxPaths } from './paths.js';
import { DEFAULT_MANIFEST_LIMITS, type Manifest, type ManifestLimits } from './types.js';

export interface ManifestOptions {
  limits?: Partial<ManifestLimits>;
  /**
   * Maps a normalized starting path (sandbox view) to its host path. Both sides are in the
   * encoded form of paths.ts (a returned string is decoded with decodePath, so a plain
   * prefix replacement keeps \xNN names exact); a returned Buffer is used as raw bytes.
   * Default: identity.
   */
  mapPath?: (sandboxPath: string) => string | Buffer;
  /** Hash worker threads; 0 hashes on the calling thread. Default 2. */
  workers?: number;
  /** Use workers only from this many files or bytes up (startup costs tens of ms). */
  workerThreshold?: { files: number; bytes: number };
  now?: () => Date;
  /**
   * Called after listing, before hashing. Only for tests, which use it to change the tree
   * between the two steps (a file removed while listing must fail the whole call).
   */
  afterWalk?: () => void | Promise<void>;
  /**
   * When the worker pool cannot start: true (default) hashes on the calling thread, false
   * fails with RuntimeError('Internal') (tests use it to prove the workers really ran).
   */
  workerFallback?: boolean;
  /** A long-lived pool to hash with (then no workers are started or stopped by this call). */
  pool?: HashPool;
}

interface FileItem {
  key: string;
  host: Buffer;
}

const BATCH = 32;
// Starting two workers costs ~30-80 ms; in-thread hashing does ~700 MB/s and ~20 us per
// file here, so workers only pay off for trees larger than this.
const DEFAULT_THRESHOLD = { files: 2000, bytes: 64 * 1024 * 1024 };

/**
 * Takes the manifest of regular files below `paths` (sandbox view). Validates the paths
 * first (InvalidPath / LimitExceeded naming the path). Read-only on the walked tree; safe
 * to call any number of times and concurrently. Errors as in the header; on error no
 * worker is left running.
 */
export async function manifest(rootPaths: readonly string[], opts: ManifestOptions = {}): Promise<Manifest> {
  const limits: ManifestLimits = { ...DEFAULT_MANIFEST_LIMITS, ...opts.limits };
  validateSandboxPaths(rootPaths, limits);
  const takenAt = (opts.now ?? (() => new Date()))().toISOString();
  const roots = [...new Set(rootPaths.map(normalizeSandboxPath))].sort(compareUtf8);
  const mapPath = opts.mapPath ?? ((p: string) => decodePath(p));

  const items: FileItem[] = [];
  const seen = new Set<string>();
  let keyBytes = 0;
  for (const root of roots) {
    const m = mapPath(root);
    walk(root, Buffer.isBuffer(m) ? m : decodePath(m), (key, host) => {
      if (seen.has(key)) return; // overlapping starting paths
      seen.add(key);
      items.push({ key, host });
      keyBytes += Buffer.byteLength(key, 'utf8');
      if (items.length > limits.maxFiles) {
        throw new RuntimeError(
          'LimitExceeded',
          `more than ${limits.maxFiles} files below ${roots.join(', ')}; narrow paths`,
        );
      }
      // Lower bound (every fingerprint is at least 10 bytes): fail before hashing.
      if (keyBytes + 10 * items.length > limits.maxListingBytes) throw listingTooLarge(limits);
    });
  }

  await opts.afterWalk?.();
  const results = await hashAll(items, opts);
  items.sort((a, b) => compareUtf8(a.key, b.key));
  const files: Record<string, string> = {};
  const modes: Record<string, number> = {};
  let listing = keyBytes;
  for (const it of items) {
    const r = results.get(it)!;
    if ('error' in r) {
      const code = r.code === 'EIO' || !KNOWN_WALK_CODES.has(r.code) ? 'Internal' : 'InvalidArgument';
      throw new RuntimeError(code, `walk failed at ${it.key}: ${r.error}`);
    }
    files[it.key] = r.fp;
    modes[it.key] = r.mode;
    listing += r.fp.length;
  }
  if (listing > limits.maxListingBytes) throw listingTooLarge(limits);
  return { mode: 'sha256', paths: roots, files, modes, takenAt };
}

const KNOWN_WALK_CODES = new Set(['ENOENT', 'ENOTDIR', 'ELOOP', 'ECHANGED', 'EACCES', 'EPERM']);

function listingTooLarge(limits: ManifestLimits): RuntimeError {
  return new RuntimeError('LimitExceeded', `listing larger than ${limits.maxListingBytes} bytes; narrow paths`);
}

/** Depth-first walk of one starting directory; calls `onFile` for each regular file. */
function walk(root: string, hostRoot: Buffer, onFile: (key: string, host: Buffer) => void): void {
  let st: Stats;
  try {
    st = lstatSync(hostRoot);
  } catch (err) {
    throw walkError(root, err);
  }
  if (!st.isDirectory()) throw new RuntimeError('InvalidArgument', `not a directory: ${root}`);
  const dev = st.dev;
  const stack: { key: string; host: Buffer }[] = [{ key: root === '/' ? '' : root, host: hostRoot }];
  while (stack.length > 0) {
    const dir = stack.pop()!;
    let entries: Dirent<Buffer>[];
    try {
      entries = readdirSync(dir.host, { withFileTypes: true, encoding: 'buffer' }) as Dirent<Buffer>[];
    } catch (err) {
      throw walkError(dir.key || '/', err);
    }
    for (const e of entries) {
      const name = e.name as unknown as Buffer;
      const key = dir.key + '/' + encodePath(name);
      const host = Buffer.concat([dir.host, SLASH, name]);
      let isFile = e.isFile();
      let isDir = e.isDirectory();
      if (
        !isFile &&
        !isDir &&
        !e.isSymbolicLink() &&
        !e.isFIFO() &&
        !e.isSocket() &&
        !e.isBlockDevice() &&
        !e.isCharacterDevice()
      ) {
        // DT_UNKNOWN (some filesystems): ask lstat.
        try {
          const s = lstatSync(host);
          isFile = s.isFile();
          isDir = s.isDirectory();
        } catch (err) {
          throw walkError(key, err);
        }
      }
      if (isFile) {
        onFile(key, host);
      } else if (isDir) {
        let s: Stats;
        try {
          s = lstatSync(host);
        } catch (err) {
          throw walkError(key, err);
        }
        if (!s.isDirectory())
          throw new RuntimeError('InvalidArgument', `walk failed at ${key}: changed type while listing`);
        if (s.dev === dev) stack.push({ key, host });
      }
    }
  }
}

const SLASH = Buffer.from('/');

function walkError(where: string, err: unknown): RuntimeError {
  if (err instanceof RuntimeError) return err;
  const e = err as NodeJS.ErrnoException;
  const code = e.code ?? '';
  if (code === 'ENOENT')
    return new RuntimeError('InvalidArgument', `walk failed at ${where}: removed while listing or does not exist`);
  if (KNOWN_WALK_CODES.has(code)) return new RuntimeError('InvalidArgument', `walk failed at ${where}: ${code}`);
  return new RuntimeError('Internal', `walk failed at ${where}: ${e.message ?? String(err)}`);
}

/** Hashes every item, on workers when worthwhile and possible, else on this thread. */
async function hashAll(items: FileItem[], opts: ManifestOptions): Promise<Map<FileItem, HashResult>> {
  const out = new Map<FileItem, HashResult>();
  const nWorkers = opts.workers ?? 2;
  if (
    items.length > 0 &&
    (opts.pool || (nWorkers > 0 && worthWorkers(items, opts.workerThreshold ?? DEFAULT_THRESHOLD)))
  ) {
    const pool = opts.pool ?? (await HashPool.start(nWorkers));
    if (pool) {
      try {
        const batches: FileItem[][] = [];
        for (let i = 0; i < items.length; i += BATCH) batches.push(items.slice(i, i + BATCH));
        await Promise.all(
          batches.map(async (batch) => {
            const results = await pool.hash(batch.map((it) => it.host));
            batch.forEach((it, i) => out.set(it, results[i]!));
          }),
        );
        return out;
      } finally {
        if (pool !== opts.pool) await pool.close();
      }
    }
    if (opts.workerFallback === false) throw new RuntimeError('Internal', 'hash workers could not start');
  }
  const buf = Buffer.allocUnsafe(1 << 20);
  for (const it of items) out.set(it, hashFile(it.host, buf));
  return out;
}

function worthWorkers(items: FileItem[], t: { files: number; bytes: number }): boolean {
  if (items.length >= t.files) return true;
  let bytes = 0;
  for (const it of items) {
    try {
      bytes += lstatSync(it.host).size;
    } catch {
      // The hash step reports it.
    }
    if (bytes >= t.bytes) return true;
  }
  return false;
}

/**
 * Starts one hash worker. Compiled (dist/), the worker is hash-worker.js next to this file.
 * Under tsx (tests) this file is .ts: Node 20 does not apply `--import tsx` hooks to a
 * worker's entry module, so a tiny eval'd bootstrap registers tsx in the worker first and
 * then imports hash-worker.ts. Throws if the worker cannot be constructed; a worker that
 * fails later emits 'error'/'exit' (the pool then falls back to hashing in-thread).
 */
export function startHashWorker(): Worker {
  const here = import.meta.url;
  if (!here.endsWith('.ts')) return new Worker(new URL('./hash-worker.js', here));
  const entry = new URL('./hash-worker.ts', here).href;
  const tsx = import.meta.resolve('tsx/esm/api');
  const boot = `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(entry)}); });`;
  return new Worker(boot, { eval: true });
}

/**
 * A few hash worker threads fed batches of host paths, one batch in flight per worker.
 * A long-lived owner (the procbox runtime) can start one with HashPool.start and pass it as
 * `pool` to every manifest call, so worker start-up (tens of ms) is paid once; concurrent
 * manifest calls share it. Without `pool`, manifest starts and closes one per call.
 */
export class HashPool {
  private readonly idle: Worker[] = [];
  private readonly queue: { paths: Buffer[]; resolve: (r: HashResult[]) => void; reject: (e: Error) => void }[] = [];
  private readonly inflight = new Map<Worker, (typeof this.queue)[number]>();
  private closed = false;

  private constructor(private readonly workers: Worker[]) {
    for (const w of workers) {
      w.on('message', (m: { results?: HashResult[] }) => {
        const job = this.inflight.get(w);
        this.inflight.delete(w);
        if (job && m.results) job.resolve(m.results);
        this.idle.push(w);
        this.pump();
      });
      const die = (err?: unknown): void => this.lose(w, err);
      w.on('error', die);
      w.on('exit', () => die());
    }
    this.idle.push(...workers);
  }

  /** Starts `n` workers; resolves null (and leaves none running) if any cannot start. */
  static async start(n = 2): Promise<HashPool | null> {
    const workers: Worker[] = [];
    const ready: Promise<boolean>[] = [];
    for (let i = 0; i < n; i++) {
      let w: Worker;
      try {
        w = startHashWorker();
      } catch {
        break;
      }
      workers.push(w);
      ready.push(
        new Promise<boolean>((resolve) => {
          // Only our own listeners are removed afterwards: Worker keeps internal ones.
          const onMessage = (m: { ready?: boolean }) => done(m.ready === true);
          const onFail = () => done(false);
          const done = (ok: boolean) => {
            w.off('message', onMessage).off('error', onFail).off('exit', onFail);
            resolve(ok);
          };
          w.on('message', onMessage).on('error', onFail).on('exit', onFail);
        }),
      );
    }
    const ok = n > 0 && workers.length === n && (await Promise.all(ready)).every(Boolean);
    if (!ok) {
      await Promise.all(workers.map((w) => w.terminate()));
      return null;
    }
    return new HashPool(workers);
  }

  /**
   * Hashes one batch (results in order). Rejects with RuntimeError('Internal') if the pool is closed or its workers
   * die.
   */
  hash(paths: Buffer[]): Promise<HashResult[]> {
    if (this.closed || this.workers.length === 0)
      return Promise.reject(new RuntimeError('Internal', 'hash pool is closed'));
    return new Promise((resolve, reject) => {
      this.queue.push({ paths, resolve, reject });
      this.pump();
    });
  }

  private pump(): void {
    while (this.idle.length > 0 && this.queue.length > 0) {
      const w = this.idle.pop()!;
      const job = this.queue.shift()!;
      this.inflight.set(w, job);
      w.postMessage({ paths: job.paths });
    }
  }

  private lose(w: Worker, err?: unknown): void {
    const i = this.workers.indexOf(w);
    if (i < 0) return;
    this.workers.splice(i, 1);
    const idle = this.idle.indexOf(w);
    if (idle >= 0) this.idle.splice(idle, 1);
    const msg = this.closed
      ? 'hash pool is closed'
      : `hash worker failed: ${err instanceof Error ? err.message : 'exited'}`;
    this.inflight.get(w)?.reject(new RuntimeError('Internal', msg));
    this.inflight.delete(w);
    if (this.workers.length === 0)
      for (const job of this.queue.splice(0)) job.reject(new RuntimeError('Internal', msg));
  }

  /** Terminates the workers; pending and later hash calls reject. Safe to call twice. */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.workers].map((w) => w.terminate()));
  }
}

/** One file as listed by a walk that ran elsewhere (e.g. the VM guest agent). */
export interface ListedFile {
  /** Absolute sandbox path, raw bytes (or an already encoded string). */
  path: Buffer | string;
  /** `sha256:<hex>` or `unreadable`. */
  fingerprint: string;
  mode?: number;
}

const FINGERPRINT = /^(sha256:[0-9a-f]{64}|unreadable)$/;

/**
 * Builds a Manifest from a listing produced outside this process (the VM backend's guest
 * walk), applying the same rules as manifest(): paths validated, keys encoded with
 * encodePath and sorted, every file below one of `paths`, file-count and listing-size
 * limits (LimitExceeded). A malformed record (bad fingerprint, path outside `paths`, a
 * duplicate) is RuntimeError('Internal'): the walker is broken, the listing is not used.
 * Pure.
 */
export function buildManifest(
  rootPaths: readonly string[],
  listed: Iterable<ListedFile>,
  opts: { limits?: Partial<ManifestLimits>; now?: () => Date } = {},
): Manifest {
  const limits: ManifestLimits = { ...DEFAULT_MANIFEST_LIMITS, ...opts.limits };
  validateSandboxPaths(rootPaths, limits);
  const roots = [...new Set(rootPaths.map(normalizeSandboxPath))].sort(compareUtf8);
  const entries: [string, string, number | undefined][] = [];
  const seen = new Set<string>();
  let listing = 0;
  for (const f of listed) {
    const key = typeof f.path === 'string' ? f.path : encodePath(f.path);
    if (!FINGERPRINT.test(f.fingerprint)) throw new RuntimeError('Internal', `bad fingerprint for ${key}`);
    if (!roots.some((r) => key !== r && (r === '/' || key.startsWith(r + '/')))) {
      throw new RuntimeError('Internal', `listed file ${key} is not below ${roots.join(', ')}`);
    }
    if (seen.has(key)) throw new RuntimeError('Internal', `file listed twice: ${key}`);
    seen.add(key);
    entries.push([key, f.fingerprint, f.mode]);
    listing += Buffer.byteLength(key, 'utf8') + f.fingerprint.length;
    if (entries.length > limits.maxFiles) {
      throw new RuntimeError(
        'LimitExceeded',
        `more than ${limits.maxFiles} files below ${roots.join(', ')}; narrow paths`,
      );
    }
    if (listing > limits.maxListingBytes) throw listingTooLarge(limits);
  }
  entries.sort((a, b) => compareUtf8(a[0], b[0]));
  const files: Record<string, string> = {};
  const modes: Record<string, number> = {};
  for (const [k, fp, mode] of entries) {
    files[k] = fp;
    if (mode !== undefined) modes[k] = mode;
  }
  const takenAt = (opts.now ?? (() => new Date()))().toISOString();
  return { mode: 'sha256', paths: roots, files, modes, takenAt };
}
