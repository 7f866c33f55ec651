// Disk checkpoints of a sandbox's workspace (a btrfs snapshot of the writable volume as a new
// layer, or off btrfs a mark, plus a record of the layer stack), restore (the checkpoint's stack
// under a fresh writable layer) and their deletion.
import { randomBytes } from 'node:crypto';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { existsSync, promises as fsp, renameSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { RuntimeError, type CheckpointInfo } from '../runtime.js';
import { remountWorkspace } from './config.js';
import { ID_RE, nowIso, type ProcboxCore } from './core.js';
import { markLocked, writeLayerMeta, writeUnwrittenMeta } from './marks.js';
import { readJson, writeJsonAtomic, type CheckpointRecord, type LayerMeta, type SandboxRecord } from './state.js';

/**
 * A disk checkpoint: a mark whose stack is recorded (durably) under `checkpointId`. Idempotent per id; Conflict when
 * the id is another sandbox's.
 */
export async function checkpoint(
  pb: ProcboxCore,
  id: string,
  checkpointId: string,
  opts?: { memory?: boolean },
): Promise<CheckpointInfo> {
  const { info, sync } = await take(pb, id, checkpointId, opts, false);
  await sync();
  return info;
}

/**
 * A checkpoint whose flush to disk is the caller's to start (`sync`, idempotent): the layer
 * freeze and every record are written (so a kill -9 of this process after it returns keeps
 * the checkpoint, as the kernel keeps the page cache), but nothing is fsynced until `sync`
 * runs; it is on disk (host crash safe) once `sync` resolves. Rewind points take one before
 * a step and flush it while the step runs (controllers/agentsession/rewind-point.ts).
 */
export async function checkpointDeferred(
  pb: ProcboxCore,
  id: string,
  checkpointId: string,
): Promise<CheckpointInfo & { sync: () => Promise<void> }> {
  const { info, sync } = await take(pb, id, checkpointId, {}, true);
  return { ...info, sync };
}

async function take(
  pb: ProcboxCore,
  id: string,
  checkpointId: string,
  opts: { memory?: boolean } | undefined,
  deferSync: boolean,
): Promise<{ info: CheckpointInfo; sync: () => Promise<void> }> {
  pb.ensureStarted();
  if (opts?.memory)
    throw new RuntimeError('Unsupported', 'procbox has no memory checkpoints (CRIU does not work on this kernel)');
  if (!ID_RE.test(checkpointId))
    throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
  let token = ''; // the new layer (an existing checkpoint was flushed when it was taken)
  let snapped = false; // whether that layer is a snapshot (freezeBySnapshot) or a mark
  const info = await pb.locked(id, async () => {
    // (existsSync first: a new id's missing file costs no exception, 0.08 ms on a point's path)
    let existing = existsSync(pb.ckptFile(checkpointId))
      ? readJson<CheckpointRecord>(pb.ckptFile(checkpointId))
      : undefined;
    if (existing && deferSync && existing.sandboxId === id) {
      // Its caller never reuses an id, so a record there is stale: left by a host crash
      // before its flush, when the caller's own record of the id was lost too. Replaced.
      rmSync(pb.ckptFile(checkpointId), { force: true });
      pb.ckLayers.delete(`${checkpointId}.json`);
      existing = undefined;
    }
    if (existing) {
      if (existing.sandboxId !== id)
        throw new RuntimeError('Conflict', `checkpoint ${checkpointId} belongs to sandbox ${existing.sandboxId}`);
      return ckInfo(existing);
    }
    const rec = pb.rec(id);
    // On btrfs volumes the freeze is a snapshot of the writable volume (freezeBySnapshot); else
    // a mark, whose own intent stays fsynced (marks.ts): after a host crash no sandbox record
    // names a volume that is gone.
    const snap =
      rec.vol &&
      pb.vs.quota &&
      pb.checkpointFreeze === 'snapshot' &&
      (pb.upperEntries.get(id) ?? 0) <= SNAPSHOT_MAX_ENTRIES;
    const m = snap ? await freezeBySnapshot(pb, rec, deferSync) : await markLocked(pb, rec);
    snapped = !!snap;
    if (!snap) pb.upperEntries.delete(id); // a fresh upper
    token = m.token;
    const size = m.layers.reduce((a, l) => a + pb.layerSize(l), 0);
    const ck: CheckpointRecord = {
      id: checkpointId,
      sandboxId: id,
      layers: m.layers,
      takenAt: nowIso(),
      sizeBytes: size,
    };
    try {
      // Taken now: the layer reaches the disk before the record naming it (as before deferral).
      if (!deferSync) await layerToDisk(pb, m.token, !!snap);
      // Deferred: the record is renamed into place now and fsynced by sync(), after the layer.
      writeJsonAtomic(pb.ckptFile(checkpointId), ck, !deferSync);
    } finally {
      pb.pendingLayers.delete(token); // named by the record now (or garbage after a failure)
    }
    return ckInfo(ck);
  });
  let flushed: Promise<void> | undefined;
  // A checkpoint is a promise about the disk: the deferred one puts its layer on disk
  // (layerToDisk), then its record (written without fsync), in that order. Both start on the
  // next turn of the event loop, when the caller's step has started: on the microtasks of
  // sync() they came ahead of it (a snapshot's LayerMeta write, see freezeBySnapshot, 0.3-0.4
  // ms; the opens of the record's fsyncs 0.15 ms).
  const sync = () =>
    (flushed ??=
      deferSync && token
        ? layerToDisk(pb, token, snapped)
            .then(() => nextTurn())
            .then(() => (snapped ? writeUnwrittenMeta(pb, token) : undefined))
            .then(() => fsyncPaths([pb.ckptFile(checkpointId)]))
        : Promise.resolve());
  return { info, sync };
}

/**
 * A snapshot holds the whole upper, and its LayerMeta (size, opaque directories) is a scan of
 * it: O(entries in the upper), where a mark's is O(entries since the last mark) since it starts
 * a fresh upper. So a sandbox whose upper had more entries than this at its last snapshot gets
 * a mark instead (its remount, about 5-20 ms here, costs what a scan of ~1000 entries does);
 * the upper is then empty and the next points are snapshots again. Measured: 20,000 files in
 * the upper, a snapshot point 330-500 ms (the scan), a mark 34-71 ms (load 8).
 */
const SNAPSHOT_MAX_ENTRIES = 1000;

/**
 * The layer freeze of a checkpoint on a btrfs volume: a snapshot of the sandbox's writable
 * volume (upper and work) becomes the checkpoint's top layer, and the running sandbox keeps its
 * upper, its mount and its record as they are: no remount, no record write, no copy (O(1) in
 * the workspace's size). Before (markLocked, still used off btrfs): the upper was renamed into
 * a layer, the intent fsynced into the sandbox record and the workspace remounted on a fresh
 * upper: a mount in the sandbox's namespace and two record writes per point, and one more
 * layer in the live stack (compacted every few points).
 *
 * Why it is safe: the sandbox's cgroup is frozen around the snapshot (cgroup v2 freezes a task
 * on its way back to user space, so no syscall of the sandbox, overlay copy-ups included, is
 * half done) unless it runs nothing that writes (idle below), and overlayfs's upper is only
 * read here, never changed under the live mount. The snapshot holds what a host crash at that
 * instant would leave: every write the sandbox made, as the page cache had it (btrfs flushes
 * the source's delalloc before the snapshot). A restore mounts the checkpoint's stack under a
 * fresh upper (restore below), as for a mark.
 *
 * Durability: the snapshot ioctl commits a btrfs transaction (superblock after a cache flush,
 * on the loop device an fsync of the image), so the layer is on disk when it returns; the
 * record naming it is written after it and fsynced by the caller's sync() (deferred) or here.
 * A crash before the record leaves a layer nobody names, which gc removes (pendingLayers
 * keeps it from a concurrent gc of this process until the record is written). The LayerMeta
 * (size, opaque directories) is written without fsync (layerToDisk says why that is enough);
 * a deferred checkpoint's (a rewind point's) by its sync(), while the step runs, and served
 * from memory until then (pb.unwrittenMetas; a process dying first leaves the file missing,
 * which start() rewrites). Its creation on the volume store right after the snapshot's commit
 * took 0.2-0.3 ms of the point.
 */
async function freezeBySnapshot(
  pb: ProcboxCore,
  rec: SandboxRecord,
  metaLater: boolean,
): Promise<{ token: string; layers: string[] }> {
  const lid = `l${Date.now().toString(36)}${randomBytes(5).toString('hex')}`;
  const alive = pb.alive(rec);
  const cg = pb.cgroups(rec.id);
  const held = rec.paused || !!rec.frozen;
  const freeze = alive && !held && !idle(pb, rec);
  pb.pendingLayers.add(lid);
  try {
    let scanned: Promise<number> | undefined;
    if (freeze) {
      await cg.setFrozen(true);
      freezeCounts.snapshot++;
    }
    try {
      await pb.fileops.snapshot(pb.volDir(rec), join(pb.vs.dir, 'layers'), lid, rec.qgroup);
      pb.fault('checkpoint:snapshot');
      // Scanned while the sandbox thaws (the helper reads the snapshot, which never changes,
      // as this thread writes cgroup.freeze). A deferred checkpoint's LayerMeta is kept in
      // memory and written by its sync(), after the step has started (pb.unwrittenMetas).
      scanned = writeLayerMeta(pb, lid, metaLater);
      scanned.catch(() => undefined); // awaited below; a failed thaw must not leave it unhandled
    } finally {
      if (freeze) await cg.setFrozen(false);
    }
    pb.upperEntries.set(rec.id, await scanned);
  } catch (e) {
    pb.pendingLayers.delete(lid);
    throw e;
  }
  return { token: lid, layers: [...rec.layers, lid] };
}

/** Snapshots and restores done with the sandbox frozen, in this process (tests hold the idle case with it). */
export const freezeCounts = { snapshot: 0, restore: 0 };

/**
 * Whether the sandbox runs nothing but its init and its idle standby exec helper (standby.ts),
 * neither of which writes to the workspace or holds it open: then there is nothing for a freeze
 * to stop, and its freeze and thaw (0.45 ms of a point or a restore here, much of it the
 * server's thread waiting for the cgroup's state) are left out. Exact, not a count: the pids
 * cgroup must list these processes and hold no other task (threads and child cgroups, such as
 * a job's, included).
 * A command that starts after this check runs beside the snapshot like one started before a
 * freeze would, up to the instant of the snapshot, which holds what a host crash would leave
 * then (btrfs snapshots are crash-consistent); only a syscall of it in flight at that instant
 * can be half in, where a freeze would have finished it first.
 */
function idle(pb: ProcboxCore, rec: SandboxRecord): boolean {
  if (!rec.pid) return false;
  const standby = pb.standbys.get(rec.id)?.child.pid;
  return pb.cgroups(rec.id).holdsOnly(standby ? [rec.pid, standby] : [rec.pid]);
}

/**
 * Puts a new layer on disk. A snapshot is there when its ioctl returns (it commits a btrfs
 * transaction after flushing the volume's data), and nothing more is synced: its LayerMeta, a
 * scan of a layer that never changes, is written without fsync and rewritten at start when a
 * host crash left it absent or empty (recover.ts repairLayerMetas). Before: a syncfs of the
 * volume store, which committed its transaction again with every sandbox's dirty data in it:
 * 2.0-2.3 ms per point, and an exec running beside it took 1.2-1.4 ms longer (the commit's
 * writes and its wait for writers); an fsync of the LayerMeta file and its directory instead
 * took 11 ms on that btrfs (bench/rewind-parts.ts, "sync: checkpoint"). A mark's layer is the
 * renamed upper, whose files the kernel may not have written yet: syncfs in the running
 * fileops helper.
 */
async function layerToDisk(pb: ProcboxCore, lid: string, snapshot: boolean): Promise<void> {
  if (!snapshot) await pb.fileops.syncfs(pb.layerDir(lid));
}

/** fsync of each file and of its directory (one fsync per distinct directory). */
async function fsyncPaths(paths: string[]): Promise<void> {
  const one = async (p: string) => {
    const fh = await fsp.open(p, 'r');
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
  };
  await Promise.all([...paths, ...new Set(paths.map((p) => dirname(p)))].map(one));
}

/**
 * Puts the workspace back to the checkpoint: its layers plus a fresh empty upper. Running
 * processes survive (see the header for what they see); the discarded upper is deleted.
 */
export async function restore(pb: ProcboxCore, id: string, checkpointId: string): Promise<void> {
  pb.ensureStarted();
  await pb.locked(id, async () => {
    const rec = pb.rec(id);
    const ck = readJson<CheckpointRecord>(pb.ckptFile(checkpointId));
    if (!ck) throw new RuntimeError('NotFound', `checkpoint ${checkpointId} not found`);
    const trash = rec.vol
      ? join(pb.vs.dir, 'vols', `${id}~discard-${Date.now()}`)
      : join(pb.sbxDir(id), `discard-${Date.now()}`);
    const cur = rec.vol ? pb.volDir(rec) : pb.upperDir(rec);
    rec.vol = pb.newVol(id); // created by the helper (remount, or the next init)
    pb.upperEntries.delete(id); // a fresh upper
    rec.layers = [...ck.layers];
    pb.bumpWork(rec);
    // The record names the checkpoint's stack before anything moves (fsync: the restore is
    // acknowledged after this); from here on a crash is finished by start() (recover.ts).
    rec.remount = 'restore';
    pb.save(rec, true);
    pb.fault('restore:recorded');
    if (existsSync(cur)) renameSync(cur, trash);
    pb.fault('restore:renamed');
    if (pb.alive(rec)) {
      const cg = pb.cgroups(id);
      const freeze = !(rec.paused || !!rec.frozen) && !idle(pb, rec);
      if (freeze) {
        await cg.setFrozen(true);
        freezeCounts.restore++;
      }
      try {
        await remountWorkspace(pb, rec, 'discard');
      } finally {
        if (freeze) await cg.setFrozen(false);
      }
      pb.fault('restore:remounted');
    }
    await pb.fileops.rmtree(trash);
    pb.sizer?.released();
    delete rec.remount;
    pb.save(rec);
    await pb.gc();
  });
}

export async function deleteCheckpoint(pb: ProcboxCore, checkpointId: string): Promise<void> {
  pb.ensureStarted();
  if (!ID_RE.test(checkpointId))
    throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
  rmSync(pb.ckptFile(checkpointId), { force: true });
  pb.ckLayers.delete(`${checkpointId}.json`);
  await pb.gc();
}

function ckInfo(ck: CheckpointRecord): CheckpointInfo {
  return { id: ck.id, sandboxId: ck.sandboxId, kind: 'disk', sizeBytes: ck.sizeBytes, takenAt: ck.takenAt };
}
