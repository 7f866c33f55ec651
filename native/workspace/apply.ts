// Apply of a staged changeset onto the real workspace (spec: speculative-execution.md
// "Apply"), with an on-disk marker so that a crash mid-apply is detectable: the marker is
// durable before the first file is touched and removed only after the last one, so if it
// exists, an apply started and did not finish (the caller marks the changeset Failed and
// never retries blindly).
//
// Every target path is reached through file descriptors opened component by component with
// O_NOFOLLOW (openDirInside): no symlink is ever followed, so a sandbox that plants or swaps
// a symlink cannot make apply write or delete outside targetRoot.
import { closeSync, existsSync, fsyncSync, lstatSync } from 'node:fs';
import { readFile, rm, unlink } from 'node:fs/promises';
import { RuntimeError } from '../runtime.js';
import { fsyncDir, splitDir, writeFileAtomic } from './atomic.js';
import { sha256Fingerprint } from './hash.js';
import { decodePath, encodePath, fdPath, joinHost, openDirInside, splitComponents } from './paths.js';
import { blobPathIn, type StagedEntry } from './staging.js';

export interface ApplyRequest {
  /** The changeset directory (its blobs/ holds the staged files). */
  stagingDir: string;
  /** Host directory that holds the sandbox files being written; nothing outside it is touched. */
  targetRoot: string;
  /**
   * Sandbox path -> host path below targetRoot, both in the encoded form of paths.ts (a
   * returned string is decoded with decodePath, so a prefix replacement keeps \xNN names
   * exact; a returned Buffer is raw bytes). Default: targetRoot + the sandbox path.
   */
  mapPath?: (sandboxPath: string) => string | Buffer;
  /** Files to write: each blob goes to `path` with `mode` (setuid/setgid bits are dropped). */
  entries: readonly Pick<StagedEntry, 'path' | 'blob' | 'mode' | 'sha256'>[];
  /** Sandbox paths to remove (a missing one is fine). */
  deleted: readonly string[];
  /** Where the in-progress marker lives (outside targetRoot, e.g. in the changeset dir). */
  markerPath: string;
  /** Owner of written files and created directories (the sandbox's host uid/gid). */
  owner?: { uid: number; gid: number };
}

export interface ApplyResult {
  written: number;
  deleted: number;
}

/**
 * Writes the staged files and removes the deleted paths. Order: every blob is read and its
 * sha256 checked against the entry (a corrupt or missing blob is RuntimeError('Internal')
 * and nothing is written, no marker); then the marker is written durably; then each file
 * is replaced atomically (parents created 0755); then deletions; then the marker is
 * removed. If a marker already exists the call refuses with RuntimeError('Conflict') and
 * writes nothing. A failure after the marker leaves the marker in place (applyInProgress
 * is then true) and rethrows. A path whose host mapping leaves targetRoot or has a `..`,
 * or whose existing parents include a symlink, is RuntimeError('InvalidPath'), a file as a
 * parent is RuntimeError('NotADirectory'): both are checked before the marker, so such a
 * request writes nothing. Blobs are held in memory while applying (at most the 64 MiB
 * staging cap). Not safe to run twice concurrently on the same target.
 */
export async function applyStaged(req: ApplyRequest): Promise<ApplyResult> {
  if (applyInProgress(req.markerPath)) {
    throw new RuntimeError('Conflict', `an earlier apply did not finish (marker ${req.markerPath} exists)`);
  }
  const toHostComps = hostComponents(req);
  // Validate everything before the marker: a bad request changes nothing.
  const writes = [];
  for (const e of req.entries) {
    const comps = toHostComps(e.path);
    const data = await readFile(blobPathIn(req.stagingDir, e.blob)).catch((err: NodeJS.ErrnoException) => {
      throw new RuntimeError('Internal', `staged blob ${e.blob} for ${e.path} is missing: ${err.code ?? err.message}`);
    });
    if (e.sha256 && sha256Fingerprint(data) !== e.sha256) throw new RuntimeError('Internal', `staged blob ${e.blob} for ${e.path} is corrupt`);
    writes.push({ comps, data, mode: e.mode & 0o1777 });
  }
  const deletes = req.deleted.map((p) => ({ path: p, comps: toHostComps(p) }));
  // Refuse symlinked or non-directory parents before anything is written; the fd-anchored
  // writes below still refuse them if they appear meanwhile.
  for (const c of [...writes.map((w) => w.comps), ...deletes.map((d) => d.comps)]) precheckParents(req.targetRoot, c);

  await writeFileAtomic(
    req.markerPath,
    JSON.stringify({ startedAt: new Date().toISOString(), entries: writes.length, deleted: deletes.length }),
    0o600,
  );
  for (const w of writes) {
    const fd = openDirInside(req.targetRoot, w.comps.slice(0, -1), { create: true, dirMode: 0o755, owner: req.owner });
    try {
      await writeFileAtomic(fdPath(fd, w.comps[w.comps.length - 1]!), w.data, w.mode, { owner: req.owner });
    } finally {
      closeSync(fd);
    }
  }
  let removed = 0;
  for (const d of deletes) {
    let fd: number;
    try {
      fd = openDirInside(req.targetRoot, d.comps.slice(0, -1));
    } catch (err) {
      if (err instanceof RuntimeError && err.code === 'NotFound') continue; // already gone
      throw err;
    }
    try {
      await unlink(fdPath(fd, d.comps[d.comps.length - 1]!));
      fsyncSync(fd);
      removed++;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    } finally {
      closeSync(fd);
    }
  }
  await rm(req.markerPath, { force: true });
  await fsyncDir(splitDir(req.markerPath).dir);
  return { written: writes.length, deleted: removed };
}

/** True when an apply started and did not finish (its marker exists). Read-only. */
export function applyInProgress(markerPath: string): boolean {
  return existsSync(markerPath);
}

/**
 * Removes a marker after the caller has recorded the failure (changeset Failed), so the
 * sandbox can take later applies. Idempotent.
 */
export async function clearApplyMarker(markerPath: string): Promise<void> {
  await rm(markerPath, { force: true });
}

/** Maps a sandbox path to its components below targetRoot, or throws InvalidPath. */
function hostComponents(req: ApplyRequest): (sandboxPath: string) => Buffer[] {
  const root = splitComponents(Buffer.from(req.targetRoot));
  return (sandboxPath) => {
    if (!sandboxPath.startsWith('/')) throw new RuntimeError('InvalidPath', `path is not absolute: ${sandboxPath}`);
    const raw = req.mapPath ? req.mapPath(sandboxPath) : null;
    if (raw !== null && (Buffer.isBuffer(raw) ? raw[0] !== 0x2f : !raw.startsWith('/'))) {
      throw new RuntimeError('InvalidPath', `mapPath gave a relative host path for ${sandboxPath}`);
    }
    const all = raw === null ? [...root, ...splitComponents(decodePath(sandboxPath))] : splitComponents(Buffer.isBuffer(raw) ? raw : decodePath(raw));
    const inside = root.every((c, i) => all[i] !== undefined && all[i]!.equals(c));
    const comps = all.slice(root.length);
    if (!inside || comps.length === 0 || comps.some((c) => c.equals(DOTDOT))) {
      throw new RuntimeError('InvalidPath', `path ${sandboxPath} does not map to a file below the target root`);
    }
    return comps;
  };
}

const DOTDOT = Buffer.from('..');

/** InvalidPath / NotADirectory if an existing parent component is a symlink or not a directory. */
function precheckParents(root: string, comps: Buffer[]): void {
  for (let i = 1; i < comps.length; i++) {
    let st;
    try {
      st = lstatSync(joinHost(root, comps.slice(0, i)));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return; // created later
      throw err;
    }
    const shown = comps.slice(0, i).map((c) => encodePath(c)).join('/');
    if (st.isSymbolicLink()) throw new RuntimeError('InvalidPath', `symlink in path below the target root: ${shown}`);
    if (!st.isDirectory()) throw new RuntimeError('NotADirectory', `not a directory below the target root: ${shown}`);
  }
}
