// Changeset staging store, the on-disk layout of speculative-execution.md:
//
//   <dir>/            0700
//     meta.json       0600  the changeset record (written by the caller through writeMeta)
//     base.json       0600  manifest the command started from (writeBase)
//     blobs/          0700
//       000000        0600  staged contents of one added or modified file, fsynced, renamed
//       000001              into place (six decimal digits, in staging order)
//
// Caps: a file larger than maxFileBytes (16 MiB) or one that would take the changeset past
// maxTotalBytes (64 MiB) is not staged; the call returns {unstaged: reason} and the caller
// lists it in `unstaged` (a changeset with unstaged files cannot be applied). A file of
// exactly the cap is staged. Contents always come from the caller (read through the
// Runtime), never from a host path into a sandbox.
import {
  closeSync,
  constants as fsConstants,
  fstatSync,
  openSync,
  readFile as readFileCb,
  readFileSync,
} from 'node:fs';
import { open, readdir, rename, rm, stat } from 'node:fs/promises';
import { promisify } from 'node:util';
import { RuntimeError } from '../runtime.js';
import { fsyncDir, mkdirPrivate, SYNC_WRITE_MAX, writeFileAtomic } from './atomic.js';
import { sha256Fingerprint } from './hash.js';
import type { Manifest } from './types.js';

/** fs.readFile of an open fd (fs.promises.readFile takes a FileHandle, not an fd). */
const readFd = promisify(readFileCb) as (fd: number, enc: 'utf8') => Promise<string>;

export interface StagingCaps {
  maxFileBytes: number;
  maxTotalBytes: number;
}

export const DEFAULT_STAGING_CAPS: StagingCaps = { maxFileBytes: 16 * 1024 * 1024, maxTotalBytes: 64 * 1024 * 1024 };

export interface StagedBlob {
  /** Blob name below blobs/, e.g. "000003". */
  blob: string;
  size: number;
  /** `sha256:<hex>` of the staged bytes (same form as a manifest fingerprint). */
  sha256: string;
}

/** One staged file, as the caller records it in meta.json (and apply writes back through the Runtime). */
export interface StagedEntry extends StagedBlob {
  /** Sandbox path (encoded, see paths.ts). */
  path: string;
  /** Permission bits to write the file with. */
  mode: number;
}

export type StageResult = StagedBlob | { unstaged: string };

const BLOB_NAME = /^[0-9]{6}$/;

/**
 * `<dir>/blobs/<blob>` of the changeset directory `dir`. Throws InvalidArgument for a name that is not six digits.
 * Pure.
 */
export function blobPathIn(dir: string, blob: string): string {
  if (!BLOB_NAME.test(blob)) throw new RuntimeError('InvalidArgument', `bad blob name ${JSON.stringify(blob)}`);
  return `${dir}/blobs/${blob}`;
}
const MAX_BLOBS = 1_000_000;

export class StagingStore {
  private nextBlob: number;
  private total: number;
  private queue: Promise<unknown> = Promise.resolve();

  private constructor(
    readonly dir: string,
    readonly caps: StagingCaps,
    nextBlob: number,
    total: number,
  ) {
    this.nextBlob = nextBlob;
    this.total = total;
  }

  get blobsDir(): string {
    return `${this.dir}/blobs`;
  }

  /** Bytes staged so far (all blobs present). */
  get totalBytes(): number {
    return this.total;
  }

  /** Path of a blob file. Throws InvalidArgument for a name that is not six digits. */
  blobPath(blob: string): string {
    return blobPathIn(this.dir, blob);
  }

  /**
   * Creates (or reopens) the store at `dir`: the directory and blobs/ are made 0700.
   * Reopening after a restart continues numbering after the highest blob present and counts
   * the bytes already staged toward the total. Safe to call twice.
   */
  static async create(dir: string, caps: Partial<StagingCaps> = {}): Promise<StagingStore> {
    await mkdirPrivate(dir);
    await mkdirPrivate(`${dir}/blobs`);
    let next = 0;
    let total = 0;
    for (const name of await readdir(`${dir}/blobs`)) {
      if (!BLOB_NAME.test(name)) continue; // temp leftovers of a crash
      next = Math.max(next, Number(name) + 1);
      total += (await stat(`${dir}/blobs/${name}`)).size;
    }
    return new StagingStore(dir, { ...DEFAULT_STAGING_CAPS, ...caps }, next, total);
  }

  /**
   * Stages bytes the caller read through its Runtime (readFile: on procbox the fd-anchored
   * fileops helper, on a VM the guest agent; the host never opens a sandbox path itself) as
   * the next blob: 0600, fsync, rename, fsync blobs/. Returns {unstaged: reason} over a cap
   * (nothing is written then). Serialized with the other staging calls; I/O errors throw.
   */
  stageData(data: Uint8Array, opts: { sandboxPath?: string } = {}): Promise<StageResult> {
    const run = this.queue.then(async (): Promise<StageResult> => {
      const over = this.overCap(data.length, opts.sandboxPath ?? 'data');
      if (over) return over;
      if (this.nextBlob >= MAX_BLOBS) throw new RuntimeError('LimitExceeded', `more than ${MAX_BLOBS} staged files`);
      const blob = String(this.nextBlob).padStart(6, '0');
      await writeFileAtomic(this.blobPath(blob), data, 0o600);
      this.nextBlob++;
      this.total += data.length;
      return { blob, size: data.length, sha256: sha256Fingerprint(data) };
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * stageData for several files at once, as the next blobs in order: the same caps (each file
   * checked in turn, so one over a cap is {unstaged} and the rest go on), layout and
   * durability (each blob written to a temp file and fsynced, all fsyncs in flight together,
   * then renamed into place and blobs/ fsynced once). Results are in the order of `items`.
   * On an I/O error nothing of this call is left behind and the call throws; the store stays
   * usable. Serialized with the other staging calls.
   */
  stageDataMany(items: readonly { data: Uint8Array; sandboxPath?: string }[]): Promise<StageResult[]> {
    const run = this.queue.then(async (): Promise<StageResult[]> => {
      const results: StageResult[] = [];
      const writes: { tmp: string; final: string; data: Uint8Array }[] = [];
      const next0 = this.nextBlob;
      const total0 = this.total;
      for (const it of items) {
        const over = this.overCap(it.data.length, it.sandboxPath ?? 'data');
        if (over) {
          results.push(over);
          continue;
        }
        if (this.nextBlob >= MAX_BLOBS) throw new RuntimeError('LimitExceeded', `more than ${MAX_BLOBS} staged files`);
        const blob = String(this.nextBlob++).padStart(6, '0');
        this.total += it.data.length;
        writes.push({ tmp: `${this.blobsDir}/.${blob}.tmp`, final: this.blobPath(blob), data: it.data });
        results.push({ blob, size: it.data.length, sha256: sha256Fingerprint(it.data) });
      }
      try {
        await Promise.all(
          writes.map(async (w) => {
            const fh = await open(
              w.tmp,
              fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_TRUNC | fsConstants.O_NOFOLLOW,
              0o600,
            );
            try {
              await fh.chmod(0o600);
              await fh.writeFile(w.data);
              await fh.sync();
            } finally {
              await fh.close();
            }
          }),
        );
        for (const w of writes) await rename(w.tmp, w.final);
        if (writes.length) await fsyncDir(this.blobsDir);
      } catch (err) {
        await Promise.all(writes.flatMap((w) => [rm(w.tmp, { force: true }), rm(w.final, { force: true })]));
        this.nextBlob = next0;
        this.total = total0;
        throw err;
      }
      return results;
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  private overCap(size: number, shown: string): { unstaged: string } | null {
    if (size > this.caps.maxFileBytes)
      return { unstaged: `${shown}: larger than the ${this.caps.maxFileBytes}-byte per-file cap` };
    if (this.total + size > this.caps.maxTotalBytes) {
      return { unstaged: `${shown}: would exceed the ${this.caps.maxTotalBytes}-byte per-changeset cap` };
    }
    return null;
  }

  /** Writes meta.json atomically (0600, fsync, rename). Safe to call repeatedly. */
  async writeMeta(meta: unknown): Promise<void> {
    await writeFileAtomic(`${this.dir}/meta.json`, JSON.stringify(meta), 0o600);
  }

  /** Reads meta.json: NotFound if absent, Internal if it is not valid JSON. */
  async readMeta<T = unknown>(): Promise<T> {
    return readJson<T>(`${this.dir}/meta.json`);
  }

  /** Writes base.json (the manifest the command started from) atomically. */
  async writeBase(base: Manifest): Promise<void> {
    await writeFileAtomic(`${this.dir}/base.json`, JSON.stringify(base), 0o600);
  }

  /** Reads base.json: NotFound if absent, Internal if corrupt. */
  async readBase(): Promise<Manifest> {
    return readStagedBase(this.dir);
  }

  /** Deletes all blobs (applied, rejected, expired); meta.json and base.json stay. Idempotent. */
  async dropBlobs(): Promise<void> {
    await this.queue;
    await rm(this.blobsDir, { recursive: true, force: true });
    await mkdirPrivate(this.blobsDir);
    this.total = 0;
  }

  /** Deletes the whole changeset directory (retention sweep). Idempotent. */
  async remove(): Promise<void> {
    await this.queue;
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** Creates or reopens a staging store (see StagingStore.create). */
export function createStaging(dir: string, caps: Partial<StagingCaps> = {}): Promise<StagingStore> {
  return StagingStore.create(dir, caps);
}

/**
 * Reads `<dir>/base.json` as StagingStore.readBase does, without opening the store (which lists
 * and stats every blob): NotFound if absent, Internal if corrupt.
 */
export function readStagedBase(dir: string): Promise<Manifest> {
  return readJson<Manifest>(`${dir}/base.json`);
}

/**
 * A file's text: read on the event loop when it is at most SYNC_WRITE_MAX, as writeFileAtomic
 * writes (each thread-pool call is a round trip: four of them took 0.3 ms for a 100 KB
 * base.json that a synchronous read takes in 0.05), else through the pool.
 */
async function readText(path: string): Promise<string> {
  const fd = openSync(path, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
  try {
    if (fstatSync(fd).size <= SYNC_WRITE_MAX) return readFileSync(fd, 'utf8');
    return await readFd(fd, 'utf8');
  } finally {
    closeSync(fd);
  }
}

async function readJson<T>(path: string): Promise<T> {
  let text: string;
  try {
    text = await readText(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new RuntimeError('NotFound', `${path} does not exist`);
    throw err;
  }
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new RuntimeError('Internal', `${path} is corrupt (not JSON)`);
  }
}
