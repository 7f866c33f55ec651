// Diff of two manifests (spec: sandbox-changes.md "changes") and drift detection for
// changeset apply (spec: speculative-execution.md "Conflict detection").
//
// Order: every list is sorted by the byte order of the UTF-8 encoding of the (encoded, see
// paths.ts) path strings, i.e. Unicode code point order (compareUtf8), not JavaScript's
// default UTF-16 order. Only fingerprints are compared: a mode change alone is not a change.
// A rename is one deletion plus one addition. `unreadable` <-> `sha256:...` is modified;
// unreadable -> unreadable is unchanged (the content cannot be known).
import { RuntimeError } from '../runtime.js';
import { compareUtf8, isUnder, normalizeSandboxPath, validateSandboxPaths } from './paths.js';
import type { Diff, Manifest } from './types.js';

/**
 * Compares `current` against `base`. With `paths`, only files below those directories are
 * compared; each must be one of base.paths or below one (else InvalidArgument). Different
 * fingerprint modes are RuntimeError('Conflict') (spec: 409, take a new baseline). Pure.
 */
export function diffManifests(base: Manifest, current: Manifest, paths?: readonly string[]): Diff {
  if (base.mode !== current.mode) {
    throw new RuntimeError(
      'Conflict',
      `baseline mode ${base.mode} differs from current mode ${current.mode}; take a new baseline`,
    );
  }
  const within = narrowing(base, paths);
  const added: string[] = [];
  const modified: string[] = [];
  const deleted: string[] = [];
  let unchanged = 0;
  for (const [p, fp] of Object.entries(current.files)) {
    if (!within(p)) continue;
    const old = base.files[p];
    if (old === undefined) added.push(p);
    else if (old !== fp) modified.push(p);
    else unchanged++;
  }
  for (const p of Object.keys(base.files)) {
    if (within(p) && current.files[p] === undefined) deleted.push(p);
  }
  return {
    added: added.sort(compareUtf8),
    modified: modified.sort(compareUtf8),
    deleted: deleted.sort(compareUtf8),
    unchanged,
  };
}

function narrowing(base: Manifest, paths?: readonly string[]): (p: string) => boolean {
  if (!paths || paths.length === 0) return () => true;
  validateSandboxPaths(paths);
  const dirs = paths.map(normalizeSandboxPath);
  for (const d of dirs) {
    if (!base.paths.some((b) => isUnder(d, normalizeSandboxPath(b)))) {
      throw new RuntimeError(
        'InvalidArgument',
        `path ${d} is not below the baseline's paths (${base.paths.join(', ')})`,
      );
    }
  }
  return (p) => dirs.some((d) => isUnder(p, d));
}

export interface Drift {
  /** First ten differing paths (added, modified or deleted since base), sorted. */
  paths: string[];
  /** How many paths differ in total. */
  count: number;
}

/**
 * Which files differ between the base a speculation started from and a fresh manifest of
 * the real sandbox over the same paths: any added, modified or deleted file is a conflict.
 * Empty (count 0) means apply may proceed. Pure; same errors as diffManifests.
 */
export function checkDrift(base: Manifest, current: Manifest, paths?: readonly string[], max = 10): Drift {
  const d = diffManifests(base, current, paths);
  const all = [...d.added, ...d.modified, ...d.deleted].sort(compareUtf8);
  return { paths: all.slice(0, max), count: all.length };
}
