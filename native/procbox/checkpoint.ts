// Disk checkpoints of a sandbox's workspace (a mark plus a record of its layer stack), restore
// (the checkpoint's stack under a fresh writable layer) and their deletion.
import { existsSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { RuntimeError, type CheckpointInfo } from '../runtime.js';
import { remountWorkspace } from './config.js';
import { ID_RE, nowIso, type ProcboxCore } from './core.js';
import { markLocked } from './marks.js';
import { readJson, writeJsonAtomic, type CheckpointRecord, type LayerMeta } from './state.js';

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
  pb.ensureStarted();
  if (opts?.memory)
    throw new RuntimeError('Unsupported', 'procbox has no memory checkpoints (CRIU does not work on this kernel)');
  if (!ID_RE.test(checkpointId))
    throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
  return pb.locked(id, async () => {
    const existing = readJson<CheckpointRecord>(pb.ckptFile(checkpointId));
    if (existing) {
      if (existing.sandboxId !== id)
        throw new RuntimeError('Conflict', `checkpoint ${checkpointId} belongs to sandbox ${existing.sandboxId}`);
      return ckInfo(existing);
    }
    const { token, layers } = await markLocked(pb, pb.rec(id));
    // A checkpoint is a promise about the disk: flush the filesystem holding the layers
    // (mark alone leaves the writeback to the kernel): syncfs in the running fileops helper.
    await pb.fileops.syncfs(pb.layerDir(token));
    const size = layers.reduce((a, l) => a + (readJson<LayerMeta>(`${pb.layerVol(l)}.json`)?.sizeBytes ?? 0), 0);
    const ck: CheckpointRecord = { id: checkpointId, sandboxId: id, layers, takenAt: nowIso(), sizeBytes: size };
    writeJsonAtomic(pb.ckptFile(checkpointId), ck);
    return ckInfo(ck);
  });
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
      const held = rec.paused || !!rec.frozen;
      if (!held) await cg.setFrozen(true);
      try {
        await remountWorkspace(pb, rec, 'discard');
      } finally {
        if (!held) await cg.setFrozen(false);
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
  await pb.gc();
}

function ckInfo(ck: CheckpointRecord): CheckpointInfo {
  return { id: ck.id, sandboxId: ck.sandboxId, kind: 'disk', sizeBytes: ck.sizeBytes, takenAt: ck.takenAt };
}
