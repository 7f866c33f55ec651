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
// A runtime whose state directory was removed leaves its mount behind (the image is unlinked
// but still open): openVolumeStore sweeps such mounts (lazy unmount; the loop device goes
// with the last user, autoclear) whenever a runtime starts.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, statfsSync, truncateSync, writeFileSync } from 'node:fs';
import { join, resolve as resolvePath } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface VolumeStore {
  /** Directory holding `vols/` and `layers/`. */
  dir: string;
  /** True when every volume is a btrfs subvolume with a qgroup limit (disk quota enforced). */
  quota: boolean;
  /** Why there is no quota, when there is none. */
  reason?: string;
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
  /** Size of a new image (sparse). Default 90% of the free space of root's filesystem. */
  imageBytes?: number;
}

interface MountLine {
  source: string;
  target: string;
  fstype: string;
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
    const [fstype = '', source = ''] = post.split(' ');
    out.push({ source: unescape(source), target, fstype });
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
  return mounts().filter((m) => backingFile(m.source) === image).map((m) => m.target);
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
    // failed, e.g. the state directory's disk filled up) is mounted again: the file system
    // comes back at its last committed state, and what a failed delete left is swept.
    if (mounted && backingFile(mounted.source) === image && !readable(join(target, 'vols'))) {
      await run('umount', ['-l', target]);
      mounted = undefined;
    }
    if (!mounted || backingFile(mounted.source) !== image) {
      if (mounted) await run('umount', ['-l', target]); // another image's leftover (an old state directory of this path)
      if (!existsSync(image)) {
        const st = statfsSync(o.root);
        const size = o.imageBytes ?? Math.max(1 << 30, Math.floor(st.bavail * st.bsize * 0.9));
        writeFileSync(image, '', { mode: 0o600 });
        made = true;
        truncateSync(image, size);
        // single profiles: no duplicated metadata on a file that already lives on a disk.
        await run('mkfs.btrfs', ['-q', '-f', '-m', 'single', '-d', 'single', image]);
      }
      mkdirSync(target, { recursive: true, mode: 0o700 });
      await run('mount', ['-o', 'loop,noatime', image, target]);
    }
    await run('btrfs', ['quota', 'enable', target]);
    for (const d of ['vols', 'layers']) mkdirSync(join(target, d), { recursive: true, mode: 0o700 });
    return { dir: target, quota: true };
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
