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
import { initConfig } from './config.js';
import { nowIso, run, type ProcboxCore } from './core.js';
import { changesBetween, opaqueSet, scanLayer, type StackLayer } from './layers.js';
import { readJson, writeJsonAtomic, type LayerMeta, type SandboxRecord } from './state.js';

/**
 * Freezes the sandbox's upper into a new layer and remounts the workspace on top of it.
 * Must run under the sandbox's lock. Throws Busy when a process holds a workspace file open
 * for writing (nothing changes then).
 */
export async function markLocked(pb: ProcboxCore, rec: SandboxRecord): Promise<{ token: string; layers: string[] }> {
  const lid = `l${Date.now().toString(36)}${randomBytes(5).toString('hex')}`;
  const alive = pb.alive(rec);
  const cg = pb.cgroups(rec.id);
  const frozenBefore = rec.paused || !!rec.frozen;
  if (alive && !frozenBefore) await cg.setFrozen(true);
  try {
    // The whole volume (upper and work, one btrfs subvolume with its quota) becomes the layer
    // (a record of before volumes: its upper directory, into the old layers directory).
    const oldVol = rec.vol;
    const oldDir = rec.vol ? pb.volDir(rec) : pb.upperDir(rec);
    const layerAt = rec.vol ? join(pb.vs.dir, 'layers', lid) : pb.legacyLayer(lid);
    renameSync(oldDir, layerAt);
    rec.vol = pb.newVol(rec.id); // created by the helper (remount, or the next init)
    const prev = rec.layers;
    rec.layers = [...prev, lid];
    const gen = rec.gen;
    pb.bumpWork(rec);
    if (alive) {
      const r = await run(pb.helper, ['remount', String(rec.pid), initConfig(pb, rec)]);
      if (r.code !== 0) {
        // Put everything back as it was.
        rmSync(pb.volDir(rec), { recursive: true, force: true });
        rec.vol = oldVol;
        renameSync(layerAt, oldDir);
        rec.layers = prev;
        rec.gen = gen;
        initConfig(pb, rec);
        const msg = r.stdout.trim().replace(/^(busy|err) /, '');
        if (r.code === 3) throw new RuntimeError('Busy', `sandbox ${rec.id}: a process holds a workspace file open for writing (${msg})`);
        throw new RuntimeError('Internal', `remount workspace: ${msg || r.stderr.trim()}`);
      }
    }
    pb.save(rec);
  } finally {
    if (alive && !frozenBefore) await cg.setFrozen(false);
  }
  // Scanned once frozen: the old mount is read-only now, so the listing is final.
  const entries = await scanLayer(pb.fileops, pb.layerDir(lid));
  const size = entries.filter((e) => e.type === 'f').reduce((a, e) => a + e.size, 0);
  const meta: LayerMeta = { id: lid, sizeBytes: size, opaque: [...opaqueSet(entries)], createdAt: nowIso() };
  // No fsync: the layer's files are not synced either, except by checkpoint, whose
  // `sync -f` of the filesystem covers this file too.
  writeJsonAtomic(`${pb.layerVol(lid)}.json`, meta, false);
  if (rec.layers.length > pb.maxLayers) await compact(pb, rec);
  return { token: lid, layers: [...rec.layers] };
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
  await mergeLayers(pb.fileops, merge.map((l) => pb.layerDir(l)), pb.layerDir(lid));
  const entries = await scanLayer(pb.fileops, pb.layerDir(lid));
  const size = entries.filter((e) => e.type === 'f').reduce((a, e) => a + e.size, 0);
  writeJsonAtomic(`${pb.layerVol(lid)}.json`, { id: lid, sizeBytes: size, opaque: [], createdAt: nowIso() } satisfies LayerMeta);
  rec.aliases = { ...(rec.aliases ?? {}), [merge[merge.length - 1]!]: lid };
  rec.layers = [lid, ...rec.layers.slice(merge.length)];
  pb.bumpWork(rec);
  if (pb.alive(rec)) {
    const r = await run(pb.helper, ['remount', String(rec.pid), initConfig(pb, rec)]);
    if (r.code !== 0) throw new RuntimeError('Internal', `remount after compaction: ${r.stdout.trim()}`);
  }
  pb.save(rec);
  await pb.gc();
}

function stackLayer(pb: ProcboxCore, l: string): StackLayer {
  const meta = readJson<LayerMeta>(`${pb.layerVol(l)}.json`);
  return { dir: pb.layerDir(l), opaque: new Set(meta?.opaque ?? []) };
}

/** What changed in the sandbox's workspace since `mark` (a layer of its stack): only the layers above it are read. */
export async function changesSince(pb: ProcboxCore, id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff> {
  pb.ensureStarted();
  if (paths) validateSandboxPaths(paths);
  const rec = pb.rec(id);
  const token = rec.aliases?.[mark.token] ?? mark.token;
  const idx = rec.layers.indexOf(token);
  if (idx < 0) throw new RuntimeError('Conflict', `mark ${mark.token} is not in the history of sandbox ${id} (restored or compacted)`);
  const base = rec.layers.slice(0, idx + 1).reverse().map((l) => stackLayer(pb, l));
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
