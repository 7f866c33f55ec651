// The size of the workspace volume (quota.ts): a btrfs on a loop device whose image file is
// FULLY allocated on the host, grown on demand and shrunk after deletes.
//
// Why (docs/decisions/0008-full-host-disk.md): with a sparse image, a write inside a sandbox succeeds into the
// page cache, the loop device's writeback into the image then fails when the host disk is
// full, btrfs sees a failed write from its device, aborts its transaction and answers EIO to
// every sandbox from then on (and what it had not committed is gone). btrfs must never see a
// failed write: every block it may write is allocated on the host before it is part of the
// file system. A write that does not fit then fails inside the sandbox with ENOSPC at write()
// time (btrfs reserves data and metadata space when a write or a create starts), and the host
// disk never fills under btrfs.
//
// So the file system is kept a little larger than what it holds: this sizer reads btrfs's
// space use from sysfs (no process) every POLL_MS and, when the free space falls under the
// headroom, allocates more of the image (`fallocate`), tells the loop device (`losetup -c`) and
// btrfs (`btrfs filesystem resize max`), as long as the host file system keeps its reserve
// (SQLite, records, checkpoints of the state directory). After deletes (a sandbox, layers) it
// shrinks btrfs (`btrfs filesystem resize SIZE`: the chunks past SIZE are relocated, cheap when
// they are empty) and truncates the image, so the host gets the space back. One change at a
// time; a failure is logged and tried again at the next poll. A crash between the steps leaves
// an image larger than the file system, fully allocated: openVolumeStore grows btrfs to it.
import { execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statfsSync } from 'node:fs';
import { truncate } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

const MiB = 1024 * 1024;
/** btrfs refuses to resize below 256 MiB (BTRFS_IOC_RESIZE: EINVAL): the smallest image. */
export const MIN_IMAGE_BYTES = 256 * MiB;
const POLL_MS = 250;
/** After a release (a delete), the shrink waits this long for more deletes. */
const SHRINK_DEBOUNCE_MS = 1000;
/** Without a release, a shrink is tried at most this often (space freed inside sandboxes). */
const IDLE_SHRINK_MS = 60_000;

/** The space btrfs has (device size) and uses, in bytes. */
export interface VolumeUsage {
  size: number;
  used: number;
}

/**
 * The host reserve the volume never grows into: 1/32 of the host file system, at least 32 MiB,
 * at most 1 GiB.
 */
export function hostReserve(dir: string): number {
  const st = statfsSync(dir);
  return Math.min(1024 * MiB, Math.max(32 * MiB, Math.floor((Number(st.blocks) * Number(st.bsize)) / 32)));
}

/** Bytes the host file system holding dir has free. */
export function hostFree(dir: string): number {
  const st = statfsSync(dir);
  return Number(st.bavail) * Number(st.bsize);
}

/**
 * The free space the volume keeps ahead of what it holds: a quarter of it, at least 128 MiB
 * (a writer at 500 MB/s between two polls), at most 2 GiB; `burst` times that while a writer
 * keeps the volume growing poll after poll. Pure.
 */
export function headroom(used: number, burst = 1): number {
  return Math.min(2048 * MiB * burst, Math.max(128 * MiB * burst, Math.floor(used / 4)));
}

const roundUp = (n: number, to: number) => Math.ceil(n / to) * to;

/**
 * The size the volume should have for `used` bytes: grow when less than the headroom is
 * free, to `used` plus two headrooms (`burst` times that while a writer keeps it growing);
 * shrink when more than three headrooms are free, to `used` plus two headrooms; never below
 * MIN_IMAGE_BYTES. undefined: keep the size. Pure.
 */
export function wantedSize(u: VolumeUsage, burst = 1): number | undefined {
  const h = headroom(u.used);
  const target = (b: number) => Math.max(MIN_IMAGE_BYTES, roundUp(u.used + 2 * headroom(u.used, b), 16 * MiB));
  if (u.size - u.used < h && target(burst) > u.size) return target(burst);
  if (u.size - u.used > 3 * h && target(1) < u.size) return target(1);
  return undefined;
}

/** `/sys/fs/btrfs/<fsid>` of the file system on a block device (`/dev/loopN`), or undefined. */
export function btrfsSysfs(dev: string): string | undefined {
  const name = dev.replace(/^\/dev\//, '');
  try {
    for (const fsid of readdirSync('/sys/fs/btrfs')) {
      if (existsSync(join('/sys/fs/btrfs', fsid, 'devices', name))) return join('/sys/fs/btrfs', fsid);
    }
  } catch {
    // no btrfs
  }
  return undefined;
}

/**
 * btrfs's used bytes (every space: mixed or data + metadata, system) from sysfs: what is written (disk_used) and what
 * is promised (bytes_may_use: space reserved for writes still in the page cache; bytes_reserved and bytes_pinned:
 * allocated for or freed by the running transaction). btrfs refuses a write (ENOSPC) once the promised part does not
 * fit, and on a busy host gigabytes of a writer's data can wait in the page cache: counting only disk_used, the
 * sizer saw free space that was already spoken for.
 */
export function usedBytes(sysfs: string): number {
  let used = 0;
  for (const k of ['mixed', 'data', 'metadata', 'system']) {
    for (const f of ['disk_used', 'bytes_may_use', 'bytes_reserved', 'bytes_pinned']) {
      try {
        const n = Number(readFileSync(join(sysfs, 'allocation', k, f), 'utf8'));
        if (Number.isSafeInteger(n) && n > 0) used += n;
      } catch {
        // this space does not exist (mixed: no data/metadata; otherwise no mixed), or an older kernel
      }
    }
  }
  return used;
}

export interface SizerOptions {
  image: string;
  /** The mount point. */
  mount: string;
  /** The loop device (`/dev/loopN`). */
  dev: string;
  /** The device size now (bytes). */
  size: number;
  log: (msg: string, fields?: Record<string, unknown>) => void;
  /** Host bytes never given to the volume; default hostReserve(dir of the image). */
  reserveBytes?: number;
  /** Tests: poll interval. */
  pollMs?: number;
}

export class VolumeSizer {
  size: number;
  private readonly sysfs: string | undefined;
  private timer: NodeJS.Timeout | undefined;
  private shrinkTimer: NodeJS.Timeout | undefined;
  private busy: Promise<void> = Promise.resolve();
  private lastChange = Date.now();
  private warnedFull = false;
  /** Doubles (up to 8) with each poll that has to grow the volume again; back to 1 when one need not. */
  private burst = 1;
  private stopped = false;

  constructor(private readonly o: SizerOptions) {
    this.size = o.size;
    this.sysfs = btrfsSysfs(o.dev);
  }

  private get dir(): string {
    return dirname(this.o.image);
  }

  private reserve(): number {
    return this.o.reserveBytes ?? hostReserve(this.dir);
  }

  /** Starts the poll (unref'd). Safe to call twice. */
  start(): this {
    if (this.timer || !this.sysfs) return this;
    this.timer = setInterval(() => void this.check(), this.o.pollMs ?? POLL_MS);
    this.timer.unref();
    return this;
  }

  /** Stops polling and waits for a change in progress. Safe to call twice. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    clearTimeout(this.shrinkTimer);
    this.timer = this.shrinkTimer = undefined;
    await this.busy;
  }

  usage(): VolumeUsage {
    return { size: this.size, used: this.sysfs ? usedBytes(this.sysfs) : 0 };
  }

  /**
   * Space was freed (a sandbox, layers or a checkpoint deleted): shrink soon. btrfs frees the
   * extents of a deleted subvolume in the background, so the shrink is tried again a few times
   * (1, 3, 7, 15 s after the last release) until one cuts the image.
   */
  released(): void {
    if (this.stopped || !this.sysfs) return;
    clearTimeout(this.shrinkTimer);
    const attempt = (n: number) => {
      this.shrinkTimer = setTimeout(
        () => {
          const before = this.size;
          void this.check(true).then(() => {
            if (!this.stopped && this.size === before && this.size > MIN_IMAGE_BYTES && n < 3) attempt(n + 1);
          });
        },
        SHRINK_DEBOUNCE_MS * 2 ** n,
      );
      this.shrinkTimer.unref();
    };
    attempt(0);
  }

  /** One look: grows or shrinks when needed (serialized; never throws). */
  check(release = false): Promise<void> {
    this.busy = this.busy
      .then(() => this.step(release))
      .catch((e) =>
        this.o.log('procbox: resizing the workspace volume failed; tried again later', {
          image: this.o.image,
          error: errText(e),
        }),
      );
    return this.busy;
  }

  private async step(release: boolean): Promise<void> {
    if (this.stopped) return;
    // After deletes, commit first (the extents of deleted files are free once their
    // transaction is), unless the volume is as small as it gets: then nothing spawns a process
    // (a spawn forks the server: several ms of its CPU, after every destroy of a fork's children).
    if (release && this.size <= MIN_IMAGE_BYTES) return;
    if (release) await run('btrfs', ['filesystem', 'sync', this.o.mount]);
    let want = wantedSize(this.usage(), this.burst);
    if (want === undefined || want < this.size) this.burst = 1;
    else if (want > this.size) {
      this.burst = Math.min(8, this.burst * 2);
      return this.grow(want);
    }
    if (want === undefined) return;
    if (!release) {
      if (Date.now() - this.lastChange < IDLE_SHRINK_MS) return;
      await run('btrfs', ['filesystem', 'sync', this.o.mount]);
      want = wantedSize(this.usage());
    }
    if (want !== undefined && want < this.size) await this.shrink(want);
  }

  private async grow(want: number): Promise<void> {
    const room = hostFree(this.dir) - this.reserve();
    const to = Math.min(want, this.size + Math.floor(Math.max(0, room) / MiB) * MiB);
    if (to - this.size < 16 * MiB) {
      if (!this.warnedFull)
        this.o.log(
          'procbox: the host file system of the state directory is full (its reserve kept): the workspace volume cannot grow, writes in sandboxes fail with ENOSPC',
          { image: this.o.image, free: hostFree(this.dir), reserve: this.reserve() },
        );
      this.warnedFull = true;
      return;
    }
    this.warnedFull = false;
    // Allocated on the host before btrfs may use it: an ENOSPC here is the host's, nothing else changed.
    await run('fallocate', ['-o', String(this.size), '-l', String(to - this.size), this.o.image]);
    await run('losetup', ['-c', this.o.dev]);
    await run('btrfs', ['filesystem', 'resize', 'max', this.o.mount]);
    this.size = to;
    this.lastChange = Date.now();
  }

  private async shrink(to: number): Promise<void> {
    // btrfs moves what lies past `to` below it (for the empty chunks of a deleted volume that
    // is only their removal); only then is the tail of the image cut off.
    await run('btrfs', ['filesystem', 'resize', String(to), this.o.mount]);
    this.size = to;
    await truncate(this.o.image, to);
    await run('losetup', ['-c', this.o.dev]);
    this.lastChange = Date.now();
  }
}

function errText(e: unknown): string {
  const x = e as { stderr?: string; message?: string };
  return (
    String(x.stderr || x.message || e)
      .trim()
      .split('\n')[0] ?? ''
  );
}
