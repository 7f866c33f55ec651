// Finishing what a crash interrupted (start(), README "Crash safety"). A mark, a restore and a
// compaction each change several things that cannot change at once: the record, directories
// in the volume store, and the live init's workspace mount. Each writes what it is about to do
// into the record first (`marking`, `remount`); for such a record, start() decides from what
// is on disk, and for a live init from what its workspace really has mounted (mountinfo.ts),
// whether to finish the change or undo it, before the sandbox is thawed or restarted.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { RuntimeError } from '../runtime.js';
import { configLowers, remountWorkspace } from './config.js';
import type { ProcboxCore } from './core.js';
import { undoMark, writeLayerMeta } from './marks.js';
import { overlayAt } from './mountinfo.js';
import { readJson, type LayerMeta, type SandboxRecord } from './state.js';

/** Whether the record says a change was in progress when its runtime stopped. */
export function interrupted(rec: SandboxRecord): boolean {
  return !!rec.marking || !!rec.remount;
}

/**
 * Finishes or undoes the interrupted change of `rec` (see the header): afterwards the record
 * names directories that exist (or that the helper creates: a new volume), a live init has
 * the record's stack mounted, every layer the record lists has its LayerMeta, and volumes of
 * the sandbox that the record no longer names are gone. Under the sandbox's lock. Throws when
 * the helper cannot remount (the record keeps its marker: the next start tries again).
 */
export async function settle(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  if (rec.marking) decideMark(pb, rec);
  if (pb.alive(rec)) await converge(pb, rec);
  const m = rec.marking;
  if (m) {
    if (!existsSync(`${pb.layerVol(m.layer)}.json`)) await writeLayerMeta(pb, m.layer);
    delete rec.marking;
  }
  delete rec.remount;
  pb.save(rec);
  await dropStaleVolumes(pb, rec);
}

/**
 * An interrupted mark, decided by whether the upper was renamed into the layer: not yet, so
 * the record is as before the mark (the intent goes); or it was, so the layer holds everything
 * the sandbox wrote and the record takes it (rolled forward; a live init is remounted next).
 */
function decideMark(pb: ProcboxCore, rec: SandboxRecord): void {
  const m = rec.marking!;
  if (rec.layers.includes(m.layer)) return; // recorded after the remount: only the LayerMeta may be missing
  const layerAt = m.from ? join(pb.vs.dir, 'layers', m.layer) : pb.legacyLayer(m.layer);
  if (!existsSync(layerAt)) {
    delete rec.marking;
    return;
  }
  rec.vol = m.vol;
  rec.layers = [...rec.layers, m.layer];
  rec.gen = m.gen;
  pb.bumpWork(rec);
}

/**
 * Mounts the record's stack on a live init whose workspace has another one (or none): `attach`
 * onto an empty mount point, `keep` for a mark (found Busy: a process writes through the old
 * upper, so the mark is undone), `discard` for a restore (the old upper is thrown away) and
 * for a compaction (the upper stays the same, only the lowers change).
 */
async function converge(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  let mountinfo: string;
  try {
    mountinfo = readFileSync(`/proc/${rec.pid}/mountinfo`, 'utf8');
  } catch {
    return; // the init ended meanwhile: its restart mounts the record's stack
  }
  const got = overlayAt(mountinfo, rec.workspacePath);
  const upper = pb.upperDir(rec);
  const lowers = configLowers(pb, rec);
  if (got && got.upper === upper && got.lowers.length === lowers.length && got.lowers.every((l, i) => l === lowers[i]))
    return;
  const how = !got ? 'attach' : got.upper !== upper && rec.marking ? 'keep' : 'discard';
  pb.log('procbox: remounting a workspace whose change a crash interrupted', {
    id: rec.id,
    how,
    mounted: got?.upper,
    recorded: upper,
  });
  const cg = pb.cgroups(rec.id);
  const wasFrozen = cg.frozen();
  if (!wasFrozen) await cg.setFrozen(true);
  try {
    await remountWorkspace(pb, rec, how);
  } catch (e) {
    if (!(how === 'keep' && e instanceof RuntimeError && e.code === 'Busy')) throw e;
    undoMark(pb, rec);
  } finally {
    if (!wasFrozen) await cg.setFrozen(false);
  }
}

/**
 * Removes the sandbox's volumes that the record does not name (and of a record of before volumes, its discarded or left
 * upper).
 */
async function dropStaleVolumes(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  const vols = join(pb.vs.dir, 'vols');
  for (const n of existsSync(vols) ? readdirSync(vols) : []) {
    if (n.startsWith(`${rec.id}~`) && n !== rec.vol) await pb.fileops.rmtree(join(vols, n));
  }
  for (const n of readdirSync(pb.sbxDir(rec.id))) {
    if (n.startsWith('discard-') || (n === 'upper' && rec.vol)) await pb.fileops.rmtree(join(pb.sbxDir(rec.id), n));
  }
}

/**
 * Rewrites the LayerMeta of every layer whose file is missing or not a LayerMeta (a scan of the
 * layer: frozen layers never change, so the scan gives what was written). A checkpoint's
 * snapshot is on disk when its ioctl returns, but its LayerMeta is written without an fsync of
 * its own (checkpoint.ts layerToDisk): a host crash can leave it absent or empty, and start()
 * repairs it before anything reads it. A kill of the server alone loses nothing (page cache).
 */
export async function repairLayerMetas(pb: ProcboxCore): Promise<number> {
  let repaired = 0;
  for (const ldir of pb.layerRoots()) {
    const names = existsSync(ldir) ? readdirSync(ldir) : [];
    const have = new Set(names);
    for (const lid of names) {
      if (lid.endsWith('.json') || lid.includes('.') || !/^l[0-9a-z]+$/.test(lid)) continue;
      if (have.has(`${lid}.json`) && validMeta(readJson<LayerMeta>(join(ldir, `${lid}.json`)), lid)) continue;
      try {
        await writeLayerMeta(pb, lid);
        repaired++;
      } catch (e) {
        pb.logFailure('procbox: rewriting the record of a layer failed', undefined, e);
      }
    }
  }
  if (repaired) pb.log('procbox: rewrote layer records a crash left incomplete', { layers: repaired });
  return repaired;
}

function validMeta(m: LayerMeta | undefined, lid: string): boolean {
  return (
    !!m &&
    m.id === lid &&
    Number.isSafeInteger(m.sizeBytes) &&
    m.sizeBytes >= 0 &&
    Array.isArray(m.opaque) &&
    m.opaque.every((o) => typeof o === 'string')
  );
}
