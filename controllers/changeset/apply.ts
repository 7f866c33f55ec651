// Apply of an approved changeset to the real sandbox through the Runtime files API, with the
// conflict check before the first write and an on-disk marker around the writes.
//
// Marker (<changeset dir>/apply.json, 0600, fsynced, renamed): `started` is durable before
// the first file is written; `done` after the last one. A reconcile that finds `started`
// knows an apply began and did not finish (the process died): the changeset becomes Failed
// and nothing is written again. `done` means every write happened and only the status was
// lost: the changeset becomes Applied.
import { readFile, rm } from 'node:fs/promises';
import { RuntimeError, type Runtime } from '../../native/runtime.js';
import {
  checkDrift,
  compareUtf8,
  createStaging,
  sha256Fingerprint,
  writeFileAtomic,
  type Drift,
} from '../../native/workspace/index.js';
import { applyMarkerPath } from './helpers.js';
import type { ChangesetMeta } from './meta.js';

export interface ApplyMarker {
  state: 'started' | 'done';
  startedAt: string;
  files: number;
  deleted: number;
}

/** The marker, or undefined when no apply is in progress. A corrupt marker counts as started. */
export async function readApplyMarker(dir: string): Promise<ApplyMarker | undefined> {
  try {
    const m = JSON.parse(await readFile(applyMarkerPath(dir), 'utf8')) as ApplyMarker;
    return m.state === 'done' ? m : { ...m, state: 'started' };
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    return { state: 'started', startedAt: '', files: 0, deleted: 0 };
  }
}

/** Removes the marker once the outcome is recorded in status. Idempotent. */
export async function clearApplyMarker(dir: string): Promise<void> {
  await rm(applyMarkerPath(dir), { force: true });
}

/**
 * Which files of the real sandbox differ from the base over the changeset's paths (added,
 * modified or deleted since the speculation started): changesSince the fork's mark on a
 * layered workspace, a fresh manifest against base.json otherwise. Read-only. A mark the
 * sandbox no longer has (restored to a checkpoint, compacted) throws RuntimeError Conflict.
 */
export async function realDrift(rt: Runtime, meta: ChangesetMeta, dir: string): Promise<Drift> {
  let all: string[];
  if (meta.layered) {
    const d = await rt.changesSince(meta.sandbox.uid, meta.parentMark, meta.paths);
    all = [...d.added, ...d.modified, ...d.deleted];
  } else {
    const store = await createStaging(dir);
    all = checkDrift(
      await store.readBase(),
      await rt.manifest(meta.sandbox.uid, meta.paths),
      meta.paths,
      Infinity,
    ).paths;
  }
  all = [...new Set([...all, ...(await blockedParents(rt, meta))])].sort(compareUtf8);
  return { paths: all.slice(0, 10), count: all.length };
}

/**
 * Manifests list regular files only, so a directory replaced by a symlink or a file since
 * the speculation is not in them; it is a conflict all the same (apply would fail or be
 * redirected): every existing parent of a path to write or delete must be a directory.
 */
async function blockedParents(rt: Runtime, meta: ChangesetMeta): Promise<string[]> {
  const dirs = new Set<string>();
  for (const p of [...meta.staged.map((e) => e.path), ...meta.changes.deleted]) {
    for (let i = p.indexOf('/', 1); i > 0; i = p.indexOf('/', i + 1)) dirs.add(p.slice(0, i));
  }
  const blocked: string[] = [];
  for (const d of [...dirs].sort(compareUtf8)) {
    if (!meta.paths.some((root) => d.length > root.length && d.startsWith(root + '/'))) continue;
    try {
      const st = await rt.stat(meta.sandbox.uid, d);
      if (st.type !== 'dir') blocked.push(d);
    } catch (e) {
      if (!(e instanceof RuntimeError && (e.code === 'NotFound' || e.code === 'NotADirectory'))) throw e;
    }
  }
  return blocked;
}

/**
 * Runs `fn` with every process of sandbox `id` frozen (Runtime.freeze), and thaws in any case
 * (an error of `fn` wins over one of the thaw). A backend without freeze, or a sandbox that is
 * gone (NotFound: `fn` reports it), runs `fn` unfrozen. A crash while frozen is thawed by the
 * runtime's next start. Nests: each call holds its own freeze.
 */
export async function withFrozen<T>(rt: Runtime, id: string, fn: () => Promise<T>): Promise<T> {
  if (!rt.freeze || !rt.thaw) return fn();
  try {
    await rt.freeze(id);
  } catch (e) {
    if (e instanceof RuntimeError && (e.code === 'NotFound' || e.code === 'Unsupported')) return fn();
    throw e;
  }
  let out: T;
  try {
    out = await fn();
  } catch (e) {
    await rt.thaw(id).catch(() => undefined);
    throw e;
  }
  await rt.thaw(id);
  return out;
}

export interface ApplyOptions {
  /** Test-only failpoint: pause this long after each file written (SIGKILL-mid-apply tests). */
  delayMsPerFile?: number;
  /** Test-only gate: awaited after each file written (with the marker at `started`). */
  afterFile?: (path: string) => Promise<void>;
}

/**
 * Writes every staged file (recorded mode, setuid/setgid dropped, parents created) and
 * removes the deleted paths in the real sandbox. Every blob is read and checked against its
 * sha256 first: a missing or corrupt blob throws RuntimeError Internal with nothing written
 * and no marker. Then marker `started`, the writes, marker `done`. An error after the marker
 * leaves it at `started` and rethrows (the caller records Failed). Not to be run twice: the
 * caller checks the marker first.
 */
export async function applyToSandbox(
  rt: Runtime,
  meta: ChangesetMeta,
  dir: string,
  opts: ApplyOptions = {},
): Promise<{ written: number; deleted: number }> {
  const writes: { path: string; data: Buffer; mode: number }[] = [];
  for (const e of meta.staged) {
    if (!/^[0-9]{6}$/.test(e.blob)) throw new RuntimeError('Internal', `bad blob name for ${e.path}`);
    const data = await readFile(`${dir}/blobs/${e.blob}`).catch(() => {
      throw new RuntimeError('Internal', `staged blob ${e.blob} of ${e.path} is missing`);
    });
    if (sha256Fingerprint(data) !== e.sha256) {
      throw new RuntimeError('Internal', `staged blob ${e.blob} of ${e.path} is corrupt (sha256 mismatch)`);
    }
    writes.push({ path: e.path, data, mode: e.mode & 0o1777 });
  }
  const marker: ApplyMarker = {
    state: 'started',
    startedAt: new Date().toISOString(),
    files: writes.length,
    deleted: meta.changes.deleted.length,
  };
  await writeFileAtomic(applyMarkerPath(dir), JSON.stringify(marker), 0o600);
  for (const w of writes) {
    await rt.writeFile(meta.sandbox.uid, w.path, w.data, { mode: w.mode, mkdirs: true });
    if (opts.delayMsPerFile) await new Promise((r) => setTimeout(r, opts.delayMsPerFile));
    await opts.afterFile?.(w.path);
  }
  let deleted = 0;
  for (const p of meta.changes.deleted) {
    try {
      await rt.deleteFile(meta.sandbox.uid, p);
      deleted++;
    } catch (e) {
      if (!(e instanceof RuntimeError && e.code === 'NotFound')) throw e;
    }
  }
  await writeFileAtomic(applyMarkerPath(dir), JSON.stringify({ ...marker, state: 'done' }), 0o600);
  return { written: writes.length, deleted };
}

/**
 * Destroys a speculation's copy; one no node holds any more is gone already (split mode's router
 * answers NotFound for it: after finish() destroyed it, or on another replica).
 */
export async function destroyCopy(rt: Runtime, id: string): Promise<void> {
  await rt.destroy(id).catch((e) => {
    if (!(e instanceof RuntimeError && e.code === 'NotFound')) throw e;
  });
}
