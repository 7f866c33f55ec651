// The workspace volume store: the filesystem that holds every sandbox's writable layer
// (`vols/<vol>/u`, overlay upper; `vols/<vol>/w-<gen>`, its work directories) and the frozen
// layers they become (`layers/<lid>/u`). A mark renames a volume into `layers/`, so both
// must be on one filesystem.
//
// Disk quota. The kernel of this host has no XFS quota and no ext4 quota format (no
// CONFIG_XFS_QUOTA, no QFMT_V2), and its root ext4 has no project quota anyway, so the quota is
// a btrfs qgroup: one loop-mounted btrfs per runtime (a sparse image `<root>/workspaces.img`,
// mounted on `<mountBase>/<scope>`, outside the state directory so that removing the state
// directory never meets a mount point) with quotas enabled, and one subvolume per writable
// layer with a referenced-bytes limit (set by the helper: `vol`/`vollimit` config lines).
// Per sandbox that is one subvolume-create and one qgroup-limit ioctl; per runtime a mkfs and
// a mount (measured in the README). Inodes are metadata bytes in the same qgroup, so creating
// files is bounded by the same limit.
//
// A full host disk (docs/decisions/0008-full-host-disk.md): the image is fully allocated on the
// host, never sparse, and sized by volsize.ts (grown on demand, shrunk after deletes), and btrfs is mounted
// `nodiscard` (discard would punch holes into the image again). A write that does not fit
// fails inside the sandbox with ENOSPC at write() time; btrfs never sees a failed write of
// its device. Mixed block groups (data and metadata share chunks): a file system kept this
// close to what it holds must not run out of metadata space while data chunks have room.
// An image of an older version (sparse, or with write errors recorded by btrfs) is made safe
// where it can be and reported (VolumeStore.damaged), never used silently.
//
// A runtime whose state directory was removed leaves its mount behind (the image is unlinked
// but still open): openVolumeStore sweeps such mounts (lazy unmount; the loop device goes
// with the last user, autoclear) whenever a runtime starts, and a runtime closed with no
// sandbox left unmounts its own (unmountVolumeStore).
import { execFile } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statfsSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { truncate } from 'node:fs/promises';
import { join, resolve as resolvePath } from 'node:path';
import { promisify } from 'node:util';
import { btrfsSysfs, headroom, hostFree, hostReserve, MIN_IMAGE_BYTES, usedBytes } from './volsize.js';

const run = promisify(execFile);

export interface VolumeStore {
  /** Directory holding `vols/` and `layers/`. */
  dir: string;
  /** True when every volume is a btrfs subvolume with a qgroup limit (disk quota enforced). */
  quota: boolean;
  /** Why there is no quota, when there is none. */
  reason?: string;
  /** The btrfs store's image and its loop device. */
  image?: string;
  dev?: string;
  /**
   * What is wrong with an image an older version left (btrfs recorded write errors: files
   * may be lost; or it could not be fully allocated): logged at each start until repaired.
   */
  damaged?: string;
}

export interface VolumeOptions {
  /** The runtime's root (`<stateDir>/procbox`): the image lives here. */
  root: string;
  /** Short name of the runtime (the mount point's name). */
  scope: string;
  /** Directory of the mount points. */
  mountBase: string;
  /** false: plain directories below root, no quota. */
  enabled: boolean;
  /** Size of a new image (fully allocated; volsize.ts grows it on demand). Default and minimum 256 MiB. */
  imageBytes?: number;
  /** Host bytes the volume never takes (default hostReserve: 1/32 of the file system, 32 MiB..1 GiB). */
  reserveBytes?: number;
}

interface MountLine {
  source: string;
  target: string;
  fstype: string;
  /** Super block options (`rw,ssd,discard=async,...`). */
  opts: string;
}

function mounts(): MountLine[] {
  let text = '';
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return [];
  }
  const out: MountLine[] = [];
  for (const line of text.split('\n')) {
    const [pre, post] = line.split(' - ');
    if (!pre || !post) continue;
    const target = unescape(pre.split(' ')[4] ?? '');
    const [fstype = '', source = '', opts = ''] = post.split(' ');
    out.push({ source: unescape(source), target, fstype, opts });
  }
  return out;
}

function unescape(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/** The file behind a loop device (`/dev/loopN`), with " (deleted)" when it was unlinked. */
function backingFile(dev: string): string | undefined {
  const m = /^\/dev\/(loop\d+)$/.exec(dev);
  if (!m) return undefined;
  try {
    return readFileSync(`/sys/block/${m[1]}/loop/backing_file`, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** Lazily unmounts the volume stores below mountBase whose image was deleted. Never throws. */
export async function sweepStaleVolumes(mountBase: string): Promise<number> {
  let n = 0;
  for (const m of mounts()) {
    if (!m.target.startsWith(mountBase + '/')) continue;
    const b = backingFile(m.source);
    if (b !== undefined && !b.endsWith(' (deleted)') && existsSync(b)) continue;
    try {
      await run('umount', ['-l', m.target]);
      rmdirSync(m.target);
      n++;
    } catch {
      // in use by a mount we cannot see, or already gone
    }
  }
  return n;
}

/** Whether the directory can be listed (false on EIO from a failed file system; true when missing: created later). */
function readable(dir: string): boolean {
  try {
    readdirSync(dir);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'ENOENT';
  }
}

/** The volume store directories mounted from `image` (a workspaces.img): for tests and diagnostics. */
export function mountsOf(image: string): string[] {
  return mounts()
    .filter((m) => backingFile(m.source) === image)
    .map((m) => m.target);
}

/**
 * Opens (creating and mounting when needed) the volume store of a runtime. Falls back to plain
 * directories below root (quota false, with the reason) when the host cannot: not root, no
 * loop devices, no btrfs tools or kernel support. Safe to call again (an existing mount of
 * the same image is reused).
 */
export async function openVolumeStore(o: VolumeOptions): Promise<VolumeStore> {
  const plain = (reason: string): VolumeStore => {
    const dir = join(o.root, 'ws');
    for (const d of ['vols', 'layers']) mkdirSync(join(dir, d), { recursive: true, mode: 0o700 });
    return { dir, quota: false, reason };
  };
  if (!o.enabled) return plain('disk quota disabled by the runtime options');
  if (process.getuid?.() !== 0) return plain('disk quota needs root (loop device, mount)');
  if (!existsSync('/dev/loop-control')) return plain('no loop devices on this host');
  await sweepStaleVolumes(o.mountBase);
  const image = resolvePath(o.root, 'workspaces.img');
  const target = join(o.mountBase, o.scope);
  let made = false;
  try {
    let mounted = mounts().find((m) => m.target === target);
    // A mount of this image that fails (btrfs answers EIO for good once a write to its image
    // failed: a sparse image of an older version whose disk filled up) is mounted again: the
    // file system comes back at its last committed state, and what a failed delete left is swept.
    if (mounted && backingFile(mounted.source) === image && !readable(join(target, 'vols'))) {
      await run('umount', ['-l', target]);
      mounted = undefined;
    }
    if (!mounted || backingFile(mounted.source) !== image) {
      if (mounted) await run('umount', ['-l', target]); // another image's leftover (an old state directory of this path)
      if (!existsSync(image)) {
        const reserve = o.reserveBytes ?? hostReserve(o.root);
        const room = Math.floor((hostFree(o.root) - reserve) / MiB) * MiB;
        if (room < MIN_IMAGE_BYTES) {
          return plain(
            `the file system of the state directory has ${mib(hostFree(o.root))} MiB free: a btrfs volume needs ${mib(MIN_IMAGE_BYTES)} MiB besides a reserve of ${mib(reserve)} MiB`,
          );
        }
        const size = Math.min(room, Math.max(MIN_IMAGE_BYTES, o.imageBytes ?? MIN_IMAGE_BYTES));
        writeFileSync(image, '', { mode: 0o600 });
        made = true;
        // On a btrfs host: no copy-on-write for the image, or an overwrite would need new space.
        if (statfsSync(o.root).type === BTRFS_MAGIC) await run('chattr', ['+C', image]).catch(() => undefined);
        await run('fallocate', ['-l', String(size), image]);
        // single profile (no duplicated metadata on a file that already lives on a disk), no discard.
        await run('mkfs.btrfs', ['-q', '-f', '-K', '--mixed', '-m', 'single', '-d', 'single', image]);
      }
      mkdirSync(target, { recursive: true, mode: 0o700 });
      await run('mount', ['-o', 'loop,noatime,nodiscard', image, target]);
      mounted = mounts().find((m) => m.target === target);
    } else if (/(^|,)discard/.test(mounted.opts)) {
      // Mounted by an older version, which let btrfs discard (punch holes into the image).
      await run('mount', ['-o', 'remount,nodiscard', target]);
    }
    const dev = mounted?.source ?? '';
    await run('btrfs', ['quota', 'enable', target]);
    for (const d of ['vols', 'layers']) mkdirSync(join(target, d), { recursive: true, mode: 0o700 });
    // An image made here is fully allocated, sized and without errors: nothing to check.
    const damaged = made ? undefined : await secureImage(image, target, dev);
    return { dir: target, quota: true, image, dev, ...(damaged ? { damaged } : {}) };
  } catch (err) {
    // An image made here that never worked would only take space (a full disk, no btrfs).
    if (made) {
      await run('umount', ['-l', target]).catch(() => undefined);
      rmSync(image, { force: true });
    }
    const e = err as { stderr?: string; message: string };
    return plain(`btrfs volume store unavailable: ${(e.stderr || e.message).trim().split('\n')[0]}`);
  }
}

const MiB = 1024 * 1024;
/** statfs f_type of btrfs. */
const BTRFS_MAGIC = 0x9123683e;
const mib = (n: number) => Math.floor(n / MiB);

/**
 * Checks an opened image and makes it safe where it can: write errors btrfs recorded (an
 * older version's sparse image whose disk filled up: files may be lost) are reported; an image
 * not fully allocated on the host (sparse, older versions) is shrunk to what it holds plus the
 * headroom and allocated; btrfs is grown to the image (a crash between a resize's steps).
 * Returns what is wrong, for the caller to report; undefined when nothing is.
 */
async function secureImage(image: string, target: string, dev: string): Promise<string | undefined> {
  const problems: string[] = [];
  const stats = await run('btrfs', ['device', 'stats', target]).then(
    (r) => r.stdout,
    () => '',
  );
  const errors = [...stats.matchAll(/\.(write_io_errs|flush_io_errs|corruption_errs|generation_errs)\s+(\d+)/g)].reduce(
    (n, m) => n + Number(m[2]),
    0,
  );
  if (errors > 0) {
    problems.push(
      `btrfs recorded ${errors} failed writes or corrupt blocks on the workspace volume ${image} (an older FluxVM kept it sparse and its disk filled up): files written before that may be lost or unreadable; ` +
        `check with \`btrfs scrub start -B ${target}\`, then clear the report with \`btrfs device stats -z ${target}\``,
    );
  }
  const st = statSync(image);
  if (st.blocks * 512 < st.size) {
    try {
      await run('btrfs', ['filesystem', 'sync', target]);
      const sysfs = btrfsSysfs(dev);
      const used = sysfs ? usedBytes(sysfs) : st.size;
      const to = Math.min(
        st.size,
        Math.max(MIN_IMAGE_BYTES, Math.ceil((used + 2 * headroom(used)) / (16 * MiB)) * 16 * MiB),
      );
      if (to < st.size) {
        await run('btrfs', ['filesystem', 'resize', String(to), target]);
        await truncate(image, to);
        await run('losetup', ['-c', dev]);
      }
      await run('fallocate', ['-l', String(to), image]);
    } catch (err) {
      const e = err as { stderr?: string; message: string };
      problems.push(
        `the workspace volume ${image} is not fully allocated on the host (an older FluxVM made it sparse) and could not be made so (${(e.stderr || e.message).trim().split('\n')[0]}): if the disk fills up, btrfs can fail with EIO; free space on the disk of the state directory and restart`,
      );
    }
  }
  await run('btrfs', ['filesystem', 'resize', 'max', target]).catch(() => undefined);
  return problems.length ? problems.join('; ') : undefined;
}

/**
 * Unmounts a runtime's volume store (a close with no sandbox left): the loop device goes with
 * it (autoclear). Lazy when something still holds it. Never throws; true when unmounted.
 */
export async function unmountVolumeStore(dir: string): Promise<boolean> {
  if (!mounts().some((m) => m.target === dir)) return false;
  try {
    await run('umount', [dir]);
  } catch {
    try {
      await run('umount', ['-l', dir]);
    } catch {
      return false;
    }
  }
  try {
    rmdirSync(dir);
  } catch {
    // kept by something else
  }
  return true;
}
