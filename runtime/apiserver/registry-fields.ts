// The one seam between the registry and field management (metadata.managedFields).
// The registry calls only `FieldManagerHooks`; the default implementation here is a compact
// server-side-apply (granular objects, atomic lists unless the schema makes them map/set
// lists is left to the full field manager in runtime/apiserver/fieldmanager/, which plugs in
// through the same interface).
import type { KindDefinition } from '../../apis/types.js';
import { StatusError } from '../meta/errors.js';
import type { KubeObject, ManagedFieldsEntry } from '../meta/types.js';
import { deepClone, deepEqual, isPlainObject } from './patch.js';

export interface FieldManagerHooks {
  /**
   * A non-apply write (create, update, merge/json patch) by `manager`: returns the new
   * managedFields for `next` (prev undefined on create). Never throws for valid objects.
   */
  update(
    def: KindDefinition,
    prev: KubeObject | undefined,
    next: KubeObject,
    manager: string,
    subresource: string | undefined,
    now: string,
  ): ManagedFieldsEntry[] | undefined;
  /**
   * Server-side apply of `applied` (the user's partial configuration) onto `live` (undefined
   * when the object does not exist yet). Returns the merged object with its managedFields.
   * Throws 409 Conflict (details.causes reason FieldManagerConflict) unless `force`.
   */
  apply(
    def: KindDefinition,
    live: KubeObject | undefined,
    applied: KubeObject,
    manager: string,
    force: boolean,
    subresource: string | undefined,
    now: string,
  ): KubeObject;
}

type FieldSet = Record<string, unknown>;

// Server-owned metadata never belongs to a manager.
const SKIP_META = new Set(['uid', 'resourceVersion', 'generation', 'creationTimestamp', 'managedFields', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'selfLink', 'namespace', 'name']);

/** Leaf paths (as field-set key arrays) set in an object; lists and scalars are leaves. */
function leaves(obj: unknown, prefix: string[], out: string[][], top = true): void {
  if (!isPlainObject(obj)) {
    out.push(prefix);
    return;
  }
  const keys = Object.keys(obj);
  if (!top && keys.length === 0) {
    out.push(prefix);
    return;
  }
  for (const k of keys) {
    if (top && (k === 'apiVersion' || k === 'kind')) continue;
    if (top && k === 'metadata') {
      for (const mk of Object.keys(obj.metadata as object)) {
        if (SKIP_META.has(mk)) continue;
        leaves((obj.metadata as Record<string, unknown>)[mk], ['metadata', mk], out, false);
      }
      continue;
    }
    if (obj[k] === undefined) continue;
    leaves(obj[k], [...prefix, k], out, false);
  }
}

function getPath(obj: unknown, p: string[]): unknown {
  let cur = obj;
  for (const k of p) {
    if (!isPlainObject(cur)) return undefined;
    cur = cur[k];
  }
  return cur;
}

function toFieldsV1(paths: string[][]): FieldSet {
  const root: FieldSet = {};
  for (const p of paths) {
    let cur = root;
    for (const k of p) {
      const fk = `f:${k}`;
      cur[fk] = (cur[fk] as FieldSet) ?? {};
      cur = cur[fk] as FieldSet;
    }
  }
  return root;
}

function fromFieldsV1(fs: unknown, prefix: string[] = [], out: string[][] = []): string[][] {
  if (!isPlainObject(fs)) return out;
  const keys = Object.keys(fs).filter((k) => k.startsWith('f:'));
  if (keys.length === 0 && prefix.length > 0) out.push(prefix);
  for (const k of keys) fromFieldsV1(fs[k], [...prefix, k.slice(2)], out);
  return out;
}

const pkey = (p: string[]) => JSON.stringify(p);
const isUnder = (p: string[], q: string[]) => q.length <= p.length && q.every((k, i) => p[i] === k);

function setEntry(
  entries: ManagedFieldsEntry[],
  match: (e: ManagedFieldsEntry) => boolean,
  make: () => ManagedFieldsEntry,
  paths: string[][],
): ManagedFieldsEntry[] {
  const out = entries.filter((e) => !match(e));
  if (paths.length) out.push({ ...make(), fieldsV1: toFieldsV1(paths) });
  return out;
}

/** Removes `paths` (and anything under them) from every entry except `keep`. */
function disown(entries: ManagedFieldsEntry[], paths: string[][], keep: (e: ManagedFieldsEntry) => boolean): ManagedFieldsEntry[] {
  return entries
    .map((e) => {
      if (keep(e)) return e;
      const owned = fromFieldsV1(e.fieldsV1).filter((p) => !paths.some((q) => isUnder(p, q) || isUnder(q, p)));
      return { ...e, fieldsV1: toFieldsV1(owned) };
    })
    .filter((e) => Object.keys(e.fieldsV1).length > 0);
}

/** Merges an applied configuration into live: objects merge, everything else replaces. */
function mergeApplied(live: unknown, applied: unknown): unknown {
  if (!isPlainObject(applied) || !isPlainObject(live)) return deepClone(applied);
  const out: Record<string, unknown> = { ...live };
  for (const [k, v] of Object.entries(applied)) out[k] = mergeApplied(live[k], v);
  return out;
}

function deletePath(obj: unknown, p: string[]): void {
  let cur = obj;
  for (const k of p.slice(0, -1)) {
    if (!isPlainObject(cur)) return;
    cur = cur[k];
  }
  if (isPlainObject(cur)) delete cur[p[p.length - 1]];
  // Drop parents left empty by the removal, as apply does for fields nobody owns.
  for (let i = p.length - 1; i > 0; i--) {
    const parent = getPath(obj, p.slice(0, i));
    if (isPlainObject(parent) && Object.keys(parent).length === 0) {
      const gp = getPath(obj, p.slice(0, i - 1));
      if (isPlainObject(gp)) delete gp[p[i - 1]];
    } else break;
  }
}

const dotted = (p: string[]) => '.' + p.join('.');

export const defaultFieldManager: FieldManagerHooks = {
  update(def, prev, next, manager, subresource, now) {
    const entries = (prev?.metadata.managedFields ?? []).map((e) => ({ ...e }));
    const nextLeaves: string[][] = [];
    leaves(next, [], nextLeaves);
    const changed = nextLeaves.filter((p) => !prev || !deepEqual(getPath(prev, p), getPath(next, p)));
    const apiVersion = def.group ? `${def.group}/${def.version}` : def.version;
    const mine = (e: ManagedFieldsEntry) => e.manager === manager && e.operation === 'Update' && (e.subresource ?? '') === (subresource ?? '');
    // Fields that disappeared are owned by nobody any more.
    const present = new Set(nextLeaves.map(pkey));
    let out = entries
      .map((e) => ({ ...e, fieldsV1: toFieldsV1(fromFieldsV1(e.fieldsV1).filter((p) => present.has(pkey(p)) || nextLeaves.some((q) => isUnder(q, p)))) }))
      .filter((e) => Object.keys(e.fieldsV1).length > 0 || mine(e));
    if (changed.length === 0) return out.filter((e) => Object.keys(e.fieldsV1).length > 0);
    out = disown(out, changed, mine);
    const existing = out.find(mine);
    const owned = existing ? fromFieldsV1(existing.fieldsV1) : [];
    const all = [...owned.filter((p) => !changed.some((q) => pkey(q) === pkey(p))), ...changed];
    return setEntry(
      out,
      mine,
      () => ({ manager, operation: 'Update', apiVersion, time: now, fieldsType: 'FieldsV1', fieldsV1: {}, ...(subresource ? { subresource } : {}) }),
      all,
    );
  },

  apply(def, live, applied, manager, force, subresource, now) {
    const apiVersion = def.group ? `${def.group}/${def.version}` : def.version;
    const entries = live?.metadata.managedFields ?? [];
    const mine = (e: ManagedFieldsEntry) => e.manager === manager && e.operation === 'Apply' && (e.subresource ?? '') === (subresource ?? '');
    const appliedLeaves: string[][] = [];
    leaves(applied, [], appliedLeaves);
    // Conflicts: a field another manager owns, whose value the applier changes.
    const conflicts: { manager: string; path: string[] }[] = [];
    if (live && !force) {
      for (const e of entries) {
        if (mine(e)) continue;
        for (const p of fromFieldsV1(e.fieldsV1)) {
          const hit = appliedLeaves.find((q) => isUnder(q, p) || isUnder(p, q));
          if (hit && !deepEqual(getPath(live, p), getPath(mergeApplied(live, applied), p))) conflicts.push({ manager: e.manager, path: p });
        }
      }
    }
    if (conflicts.length) {
      const causes = conflicts.map((c) => ({
        reason: 'FieldManagerConflict',
        message: `conflict with "${c.manager}" using ${apiVersion}`,
        field: dotted(c.path),
      }));
      const lines = causes.map((c) => `${c.message}: ${c.field}`);
      const msg =
        conflicts.length === 1
          ? `Apply failed with 1 conflict: ${lines[0]}`
          : `Apply failed with ${conflicts.length} conflicts: ${lines.join('\n')}`;
      throw new StatusError(409, 'Conflict', msg, { causes });
    }
    const merged = mergeApplied(live ?? {}, applied) as KubeObject;
    // Fields this manager applied before and omits now: removed unless someone else owns them.
    const prevMine = entries.find(mine);
    if (live && prevMine) {
      const others = entries.filter((e) => !mine(e)).flatMap((e) => fromFieldsV1(e.fieldsV1));
      for (const p of fromFieldsV1(prevMine.fieldsV1)) {
        if (appliedLeaves.some((q) => isUnder(q, p) || isUnder(p, q))) continue;
        if (others.some((q) => isUnder(q, p) || isUnder(p, q))) continue;
        deletePath(merged, p);
      }
    }
    let out = disown(entries, appliedLeaves, mine);
    out = setEntry(
      out,
      mine,
      () => ({ manager, operation: 'Apply', apiVersion, time: now, fieldsType: 'FieldsV1', fieldsV1: {}, ...(subresource ? { subresource } : {}) }),
      appliedLeaves,
    );
    merged.metadata = { ...(merged.metadata ?? {}), managedFields: out };
    return merged;
  },
};
