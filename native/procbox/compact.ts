// Layer compaction: several frozen layers become one, by applying them oldest first into a
// new directory. The work runs in the fileops helper (fileops.ts, op `merge`), fd-anchored like
// every other host-side operation on sandbox files: nothing is followed, names deeper than
// PATH_MAX work. Regular files are hard-linked, never copied (frozen layers are never written
// again and overlayfs copies a lower file up before changing it, so sharing the inode is
// safe); across btrfs subvolumes (each layer is one, quota.ts) links fail with EXDEV, so a
// reflink copy then (shares the extents: no data copied either), owner, mode and times kept.
// The result is the bottom of its stack, so whiteouts and opaque markers are applied and
// dropped.
import type { FileOps } from './fileops.js';

/**
 * Builds `outDir` (must not exist; its parent must) from the layer directories `layers`
 * (oldest first). Throws on any I/O error (the caller cleans up).
 */
export async function mergeLayers(ops: FileOps, layers: string[], outDir: string): Promise<void> {
  await ops.merge(layers, outDir);
}
