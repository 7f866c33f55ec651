// Workspace layers: a mark freezes the writable layer into a shared read-only layer and
// remounts the workspace on a fresh one (fork and checkpoint are marks); long stacks are
// compacted; changesSince reads only the layers above a mark (layers.ts has the semantics).
import { randomBytes } from 'node:crypto';
import { mkdirSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { RuntimeError, type WorkspaceMark } from '../runtime.js';
import { isUnder, normalizeSandboxPath, validateSandboxPaths } from '../workspace/paths.js';
import type { Diff } from '../workspace/types.js';
import { mergeLayers } from './compact.js';
import { initConfig, remountWorkspace } from './config.js';
import { nowIso, type ProcboxCore } from './core.js';
import { changesBetween, opaqueSet, scanLayer, type StackLayer } from './layers.js';
import { readJson, writeJsonAtomic, type LayerMeta, type SandboxRecord } from './state.js';

/**
 * Freezes the sandbox's upper into a new layer and remounts the workspace on top of it.
 * Must run under the sandbox's lock. Throws Busy when a process holds a workspace file open
 * for writing (nothing changes then).
 *
 * Crash safety (README "Crash safety"): the intent (`marking`) is on disk, fsynced, before the
 * upper is renamed; the record lists the layer only after the remount; `marking` goes once the
 * layer's LayerMeta is written. A crash at any step leaves a record start() can finish or undo
 * from what is on disk and mounted (recover.ts).
 */
export async function markLocked(pb: ProcboxCore, rec: SandboxRecord): Promise<{ token: string; layers: string[] }> {
  const lid = `l${Date.now().toString(36)}${randomBytes(5).toString('hex')}`;
  const alive = pb.alive(rec);
  const cg = pb.cgroups(rec.id);
  const frozenBefore = rec.paused || !!rec.frozen;
  // The whole volume (upper and work, one btrfs subvolume with its quota) becomes the layer
  // (a record of before volumes: its upper directory, into the old layers directory).
  const oldVol = rec.vol;
  const oldDir = rec.vol ? pb.volDir(rec) : pb.upperDir(rec);
  const layerAt = rec.vol ? join(pb.vs.dir, 'layers', lid) : pb.legacyLayer(lid);
  const gen = rec.gen;
  const vol = pb.newVol(rec.id); // created by the helper (remount, or the next init)
  // The intent's fsync happens before the freeze: the sandbox stops only for the switch.
  rec.marking = { layer: lid, vol, ...(oldVol ? { from: oldVol } : {}), gen };
  pb.save(rec, true);
  pb.fault('mark:intent');
  const dropIntent = () => {
    delete rec.marking;
    pb.save(rec);
  };
  try {
    if (alive && !frozenBefore) await cg.setFrozen(true);
  } catch (e) {
    dropIntent();
    throw e;
  }
  try {
    try {
      renameSync(oldDir, layerAt);
    } catch (e) {
      dropIntent();
      throw e;
    }
    pb.fault('mark:renamed');
    rec.vol = vol;
    const prev = rec.layers;
    rec.layers = [...prev, lid];
    pb.bumpWork(rec);
    if (alive) {
      try {
        await remountWorkspace(pb, rec, 'keep');
      } catch (e) {
        undoMark(pb, rec);
        throw e;
      }
      pb.fault('mark:remounted');
    }
    pb.save(rec);
  } finally {
    if (alive && !frozenBefore) await cg.setFrozen(false);
  }
  pb.fault('mark:recorded');
  // Scanned once frozen: the old mount is read-only now, so the listing is final.
  await writeLayerMeta(pb, lid);
  delete rec.marking;
  pb.save(rec);
  if (rec.layers.length > pb.maxLayers) await compact(pb, rec);
  return { token: lid, layers: [...rec.layers] };
}

/**
 * Puts a mark whose upper was renamed back as it was (the remount failed, or found Busy when
 * start() finished it): the new volume goes, the layer is the upper again, the record names
 * the old volume and stack, and `marking` is dropped.
 */
export function undoMark(pb: ProcboxCore, rec: SandboxRecord): void {
  const m = rec.marking!;
  rmSync(pb.volDir({ ...rec, vol: m.vol }), { recursive: true, force: true });
  const layerAt = m.from ? join(pb.vs.dir, 'layers', m.layer) : pb.legacyLayer(m.layer);
  if (m.from) rec.vol = m.from;
  else delete rec.vol;
  renameSync(layerAt, m.from ? pb.volDir(rec) : pb.upperDir(rec));
  rec.layers = rec.layers.filter((l) => l !== m.layer);
  rec.gen = m.gen;
  delete rec.marking;
  initConfig(pb, rec);
  pb.save(rec);
}

/**
 * The LayerMeta of a frozen layer (its size and opaque directories). No fsync: the layer's
 * files are not synced either, except by checkpoint, whose `sync -f` of the filesystem
 * covers this file too. Returns how many entries the layer has (its scan's cost). `later`:
 * the file is not written here but kept in pb.unwrittenMetas for writeUnwrittenMeta (0.2-0.3 ms
 * of file creation on the volume store, right after a snapshot's commit, off a point's path).
 */
export async function writeLayerMeta(pb: ProcboxCore, lid: string, later = false): Promise<number> {
  const entries = await scanLayer(pb.fileops, pb.layerDir(lid));
  const size = entries.filter((e) => e.type === 'f').reduce((a, e) => a + e.size, 0);
  const meta: LayerMeta = { id: lid, sizeBytes: size, opaque: [...opaqueSet(entries)], createdAt: nowIso() };
  if (later) pb.unwrittenMetas.set(lid, meta);
  else writeJsonAtomic(`${pb.layerVol(lid)}.json`, meta, false);
  return entries.length;
}

/** Writes the LayerMeta writeLayerMeta kept for later (none, or gc removed the layer: nothing). */
export function writeUnwrittenMeta(pb: ProcboxCore, lid: string): void {
  const meta = pb.unwrittenMetas.get(lid);
  if (!meta) return;
  writeJsonAtomic(`${pb.layerVol(lid)}.json`, meta, false);
  pb.unwrittenMetas.delete(lid);
}

/**
 * Merges every layer but the newest 8 into one (hard links: no file data is copied; frozen
 * layers are never written, so sharing inodes is safe). Marks naming the newest merged layer
 * stay valid through an alias; older marks in the merged range then fail with Conflict.
 */
async function compact(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  const keep = 8;
  const merge = rec.layers.slice(0, rec.layers.length - keep);
  const lid = `l${Date.now().toString(36)}${randomBytes(5).toString('hex')}c`;
  mkdirSync(pb.layerVol(lid));
  await mergeLayers(
    pb.fileops,
    merge.map((l) => pb.layerDir(l)),
    pb.layerDir(lid),
  );
  const entries = await scanLayer(pb.fileops, pb.layerDir(lid));
  const size = entries.filter((e) => e.type === 'f').reduce((a, e) => a + e.size, 0);
  writeJsonAtomic(`${pb.layerVol(lid)}.json`, {
    id: lid,
    sizeBytes: size,
    opaque: [],
    createdAt: nowIso(),
  } satisfies LayerMeta);
  pb.fault('compact:merged');
  const before = { layers: rec.layers, aliases: rec.aliases, gen: rec.gen };
  rec.aliases = { ...(rec.aliases ?? {}), [merge[merge.length - 1]!]: lid };
  rec.layers = [lid, ...rec.layers.slice(merge.length)];
  pb.bumpWork(rec);
  // Recorded before the remount: the layers it replaces stay until the gc below, and a crash
  // in between is remounted by start() (recover.ts) before any gc can run.
  rec.remount = 'compact';
  pb.save(rec);
  pb.fault('compact:recorded');
  if (pb.alive(rec)) {
    const r = await pb.fileops.run(['remount', String(rec.pid), initConfig(pb, rec)]);
    if (r.code !== 0) {
      Object.assign(rec, before);
      if (!before.aliases) delete rec.aliases;
      delete rec.remount;
      pb.save(rec);
      throw new RuntimeError('Internal', `remount after compaction: ${r.stdout.trim()}`);
    }
  }
  delete rec.remount;
  pb.save(rec);
  await pb.gc();
}

function stackLayer(pb: ProcboxCore, l: string): StackLayer {
  const meta = pb.layerMeta(l);
  return { dir: pb.layerDir(l), opaque: new Set(meta?.opaque ?? []) };
}

/** What changed in the sandbox's workspace since `mark` (a layer of its stack): only the layers above it are read. */
export async function changesSince(pb: ProcboxCore, id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff> {
  pb.ensureStarted();
  if (paths) validateSandboxPaths(paths);
  const rec = pb.rec(id);
  const token = rec.aliases?.[mark.token] ?? mark.token;
  const idx = rec.layers.indexOf(token);
  if (idx < 0)
    throw new RuntimeError(
      'Conflict',
      `mark ${mark.token} is not in the history of sandbox ${id} (restored or compacted)`,
    );
  const base = rec.layers
    .slice(0, idx + 1)
    .reverse()
    .map((l) => stackLayer(pb, l));
  const newer = [];
  const upper = pb.upperDir(rec);
  const upEntries = await scanLayer(pb.fileops, upper);
  newer.push({ layer: { dir: upper, opaque: opaqueSet(upEntries) }, entries: upEntries });
  for (const l of rec.layers.slice(idx + 1).reverse()) {
    const sl = stackLayer(pb, l);
    newer.push({ layer: sl, entries: await scanLayer(pb.fileops, sl.dir) });
  }
  const filters = paths?.map(normalizeSandboxPath);
  const filter = (p: string) => !filters || filters.some((f) => isUnder(p, f));
  return changesBetween(pb.fileops, base, newer, rec.workspacePath, filter);
}
