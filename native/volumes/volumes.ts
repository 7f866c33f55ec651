// Named volumes on a node: one ext4 file system per volume, in a fully allocated image file
// (`<stateDir>/volumes/<id>.img`) loop-mounted on `<mountBase>/<scope>/<id>` (outside the state
// directory, as the procbox workspace store, so removing the state directory never meets a
// mount point). Sandboxes bind the mounted root (procbox binds.c); the volume outlives them.
//
// The quota is the file system's size, enforced by the kernel for every writer: ext4 counts
// blocks exactly, and the image is sized so that what an unprivileged writer can use (statfs
// f_bavail: free blocks less the reserved blocks and ext4's own metadata reserve) is exactly the
// volume's size: the image is made larger than the size (journal, inode tables, the reserve),
// measured once mounted, and the difference is set as reserved blocks (`tune2fs -r`), which
// only a process with CAP_SYS_RESOURCE in the host's user namespace may use; a sandbox has
// none. So a sandbox can write `size` bytes of file data and the next block fails with ENOSPC.
// The image is fully allocated on the host (fallocate, never sparse: a sparse image's writeback
// could fail on a full host disk after the write succeeded inside;
// docs/decisions/0008-full-host-disk.md).
//
// Trust: the contents of a volume are written by sandboxes (hostile). The host never walks
// them: usage is statfs of the mount point (the file system's own counters), delete unmounts
// the file system and unlinks the image, and nothing between creates and deletes opens a path
// below the volume's root. The root directory itself is made by mkfs (`root_owner`: the
// sandboxes' root user) and is the root of its file system, so no sandbox can swap it.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, statfsSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve as resolvePath } from 'node:path';
import { promisify } from 'node:util';
import { sweepStaleVolumes } from '../procbox/quota.js';

const run = promisify(execFile);

const BLOCK = 4096;
const MiB = 1024 * 1024;
/** The smallest volume: ext4 with its journal needs a few MiB of its own (tune2fs reserves at most half). */
export const MIN_VOLUME_BYTES = 16 * MiB;
/** The largest volume: 16 TiB, ext4's limit with 4 KiB blocks and no 64bit tricks. */
export const MAX_VOLUME_BYTES = 16 * 1024 ** 4;
const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export interface NodeVolumesOptions {
  /** The process's state root; images live in `<stateDir>/volumes`. */
  stateDir: string;
  /** Where volumes are mounted (default /run/fluxvm/volumes). */
  mountBase?: string;
  /** Host uid (and gid) owning a volume's root directory: root inside procbox sandboxes (default 100000). */
  ownerUid?: number;
}

export interface VolumeUsage {
  /** Bytes sandboxes can write in all (the volume's size, rounded up to 4 KiB). */
  capacityBytes: number;
  /** Bytes in use (file data and the metadata that holds it). */
  usedBytes: number;
}

/** Why the node cannot make volumes, or undefined when it can (root, loop devices, mkfs.ext4). */
export function volumesUnsupported(): string | undefined {
  if (process.getuid?.() !== 0) return 'volumes need root (loop-mounted ext4 images)';
  if (!existsSync('/dev/loop-control')) return 'the node has no loop devices (/dev/loop-control)';
  for (const b of ['/usr/sbin/mkfs.ext4', '/sbin/mkfs.ext4']) if (existsSync(b)) return undefined;
  return 'mkfs.ext4 is not installed (e2fsprogs)';
}

/** The image size to try first for a volume of `size` bytes: ext4's overhead at its largest. */
export function firstImageBytes(size: number): number {
  // journal (4 MiB below 128 MiB .. 128 MiB), inode tables (256 B per 16 KiB: 1.6 %), the
  // metadata reserve (2 %, at most 16 MiB), group descriptors and bitmaps.
  const journal =
    size < 128 * MiB ? 4 * MiB : size < 1024 * MiB ? 16 * MiB : size < 16 * 1024 * MiB ? 64 * MiB : 256 * MiB;
  return roundUp(Math.ceil(size * 1.045) + journal + 8 * MiB, MiB);
}

function roundUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}

export class NodeVolumes {
  readonly dir: string;
  readonly mountBase: string;
  readonly scope: string;
  readonly ownerUid: number;
  /** One change per volume at a time (create, delete). */
  private readonly busy = new Map<string, Promise<unknown>>();

  constructor(opts: NodeVolumesOptions) {
    const root = resolvePath(opts.stateDir);
    this.dir = join(root, 'volumes');
    this.mountBase = opts.mountBase ?? '/run/fluxvm/volumes';
    this.scope = createHash('sha256').update(root).digest('hex').slice(0, 8);
    this.ownerUid = opts.ownerUid ?? 100000;
  }

  image(id: string): string {
    return join(this.dir, `${check(id)}.img`);
  }

  /** Where the volume's file system is mounted on the host: the `source` a sandbox binds. */
  mountPoint(id: string): string {
    return join(this.mountBase, this.scope, check(id));
  }

  /** Whether the volume's file system is mounted on its mount point. */
  mounted(id: string): boolean {
    const mp = this.mountPoint(id);
    let text = '';
    try {
      text = readFileSync('/proc/self/mountinfo', 'utf8');
    } catch {
      return false;
    }
    return text.split('\n').some((l) => l.split(' ')[4] === mp);
  }

  /**
   * Makes the volume (once: an existing image is kept whatever its size) and mounts it.
   * Idempotent; a crash midway is finished by the next call (an image without its `.ok`
   * marker is made again). Returns the usage.
   */
  ensure(id: string, sizeBytes: number): Promise<VolumeUsage> {
    return this.serial(id, async () => {
      if (!Number.isSafeInteger(sizeBytes) || sizeBytes < MIN_VOLUME_BYTES || sizeBytes > MAX_VOLUME_BYTES)
        throw new Error(`volume size ${sizeBytes}: between ${MIN_VOLUME_BYTES} and ${MAX_VOLUME_BYTES} bytes`);
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      const img = this.image(id);
      if (!existsSync(img + '.ok')) await this.make(id, roundUp(sizeBytes, BLOCK));
      else if (!this.mounted(id)) await this.mount(id);
      return this.usage(id);
    });
  }

  /** Size and use, from the file system's own counters (statfs of the mount point: no walk). */
  usage(id: string): VolumeUsage {
    const st = statfsSync(this.mountPoint(id));
    const cap = Number(readFileSync(this.image(id) + '.ok', 'utf8').trim());
    const avail = Number(st.bavail) * Number(st.bsize);
    return { capacityBytes: cap, usedBytes: Math.max(0, cap - avail) };
  }

  /**
   * Lazily unmounts the volumes below mountBase whose image was deleted (a state directory
   * removed without deleting its Volumes). Never throws.
   */
  sweep(): Promise<number> {
    return sweepStaleVolumes(this.mountBase);
  }

  /** Unmounts the file system and removes the image. Idempotent. */
  remove(id: string): Promise<void> {
    return this.serial(id, async () => {
      const mp = this.mountPoint(id);
      if (this.mounted(id)) await run('umount', [mp]).catch(() => run('umount', ['-l', mp]));
      for (const d of [mp, dirname(mp)]) {
        try {
          rmdirSync(d); // the scope's directory too once it is empty
        } catch {
          // not there, or not empty
        }
      }
      rmSync(this.image(id) + '.ok', { force: true });
      rmSync(this.image(id), { force: true });
    });
  }

  private async make(id: string, size: number): Promise<void> {
    const img = this.image(id);
    const mp = this.mountPoint(id);
    if (this.mounted(id)) await run('umount', [mp]);
    rmSync(img, { force: true });
    let bytes = firstImageBytes(size);
    await run('fallocate', ['-l', String(bytes), img]);
    await run('mkfs.ext4', [
      '-q',
      '-F',
      '-b',
      String(BLOCK),
      '-m',
      '0',
      '-E',
      `root_owner=${this.ownerUid}:${this.ownerUid},lazy_itable_init=0,lazy_journal_init=0,nodiscard`,
      img,
    ]);
    // Grow until an unprivileged writer has at least `size`, then reserve the rest.
    for (let i = 0; ; i++) {
      await this.mount(id);
      // lost+found is root's (unmapped in a sandbox) and holds blocks: gone before measuring
      // (fsck makes it again when it needs one).
      if (existsSync(join(mp, 'lost+found'))) rmdirSync(join(mp, 'lost+found'));
      const avail = this.available(id);
      await run('umount', [mp]);
      if (avail >= size) {
        const { stdout } = await run('dumpe2fs', ['-h', img]);
        const reserved = Number(/Reserved block count:\s+(\d+)/.exec(stdout)?.[1] ?? 0);
        await run('tune2fs', ['-r', String(reserved + (avail - size) / BLOCK), img]);
        break;
      }
      if (i === 4) throw new Error(`volume ${id}: could not size its file system (${avail} of ${size} bytes)`);
      bytes = roundUp(bytes + (size - avail) + (size - avail) / 8 + MiB, MiB);
      await run('fallocate', ['-l', String(bytes), img]);
      await run('resize2fs', ['-f', img]);
    }
    await this.mount(id);
    const got = this.available(id);
    if (got !== size) throw new Error(`volume ${id}: ${got} bytes usable, not ${size}`);
    await run('sync', ['-f', mp]);
    writeFileSync(img + '.ok', `${size}\n`, { mode: 0o600 });
  }

  private async mount(id: string): Promise<void> {
    const mp = this.mountPoint(id);
    mkdirSync(mp, { recursive: true, mode: 0o700 });
    if (!statSync(mp).isDirectory()) throw new Error(`${mp} is not a directory`);
    await run('mount', ['-t', 'ext4', '-o', 'loop,nosuid,nodev,noatime', this.image(id), mp]);
  }

  private available(id: string): number {
    const st = statfsSync(this.mountPoint(id));
    return Number(st.bavail) * Number(st.bsize);
  }

  private serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.busy.get(id) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.busy.set(id, tail);
    void tail.then(() => {
      if (this.busy.get(id) === tail) this.busy.delete(id);
    });
    return next;
  }
}

function check(id: string): string {
  if (!ID_RE.test(id)) throw new Error(`invalid volume id ${JSON.stringify(id)}`);
  return id;
}
