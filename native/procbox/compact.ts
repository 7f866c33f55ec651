// Layer compaction: several frozen layers become one, by applying them oldest first into a
// new directory. Regular files are hard-linked, never copied (frozen layers are never
// written again and overlayfs copies a lower file up before changing it, so sharing the
// inode is safe). The result is the bottom of its stack, so whiteouts and opaque markers
// are applied and dropped.
import { execFileSync } from 'node:child_process';
import { chmodSync, constants as fsConstants, copyFileSync, linkSync, lchownSync, lstatSync, mkdirSync, readlinkSync, rmSync, symlinkSync, utimesSync } from 'node:fs';
import type { Stats } from 'node:fs';
import { joinHost } from '../workspace/paths.js';
import type { ScanEntry } from './layers.js';

function exists(p: Buffer): ReturnType<typeof lstatSync> | undefined {
  try {
    return lstatSync(p);
  } catch {
    return undefined;
  }
}

/**
 * Hard link; across btrfs subvolumes (each layer is one, quota.ts) links fail with EXDEV, so
 * a reflink copy then (shares the extents: no data copied either), owner, mode and times kept.
 */
function linkOrClone(src: Buffer, dst: Buffer, st: Stats): void {
  try {
    linkSync(src, dst);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
    copyFileSync(src, dst, fsConstants.COPYFILE_FICLONE);
    lchownSync(dst, st.uid, st.gid);
    chmodSync(dst, st.mode & 0o7777);
    utimesSync(dst, st.atime, st.mtime);
  }
}

/** Builds `outDir` from `layers` (oldest first). Throws on any I/O error (caller cleans up). */
export function mergeLayers(layers: { dir: string; entries: ScanEntry[] }[], outDir: string): void {
  mkdirSync(outDir);
  const first = lstatSync(layers[0]!.dir);
  lchownSync(outDir, first.uid, first.gid);
  chmodSync(outDir, first.mode & 0o7777);
  for (const { dir, entries } of layers) {
    for (const e of entries) {
      const src = joinHost(dir, [e.rel]);
      const dst = joinHost(outDir, [e.rel]);
      const cur = exists(dst);
      if (e.type === 'w') {
        if (cur) rmSync(dst, { recursive: true, force: true });
        continue;
      }
      const st = lstatSync(src);
      if (e.type === 'd' || e.type === 'D') {
        if (cur && (e.type === 'D' || !cur.isDirectory())) rmSync(dst, { recursive: true, force: true });
        if (!cur || e.type === 'D' || !cur.isDirectory()) mkdirSync(dst);
        lchownSync(dst, st.uid, st.gid);
        chmodSync(dst, st.mode & 0o7777);
        utimesSync(dst, st.atime, st.mtime);
        continue;
      }
      if (cur) rmSync(dst, { recursive: true, force: true });
      if (e.type === 'f') linkOrClone(src, dst, st);
      else if (e.type === 'l') {
        symlinkSync(readlinkSync(src, { encoding: 'buffer' }), dst);
        lchownSync(dst, st.uid, st.gid);
      } else execFileSync('cp', ['-a', '--', src.toString('latin1'), dst.toString('latin1')]);
    }
  }
}
