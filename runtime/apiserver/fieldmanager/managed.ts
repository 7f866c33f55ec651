// managedFields entries <-> manager sets, keyed the way kube keys them, plus the encoding order.
import type { ManagedFieldsEntry } from '../../meta/types.js';
import { FieldSet, compareStrings, goJSON } from './fieldset.js';

export interface ManagerSet {
  manager: string;
  operation: 'Apply' | 'Update';
  apiVersion: string;
  time?: string;
  subresource?: string;
  set: FieldSet;
}

/**
 * The identity of an entry, as kube's BuildManagerIdentifier: manager, operation and
 * subresource, plus apiVersion for Update entries (an applier keeps one entry across versions).
 */
export function managerId(m: Pick<ManagerSet, 'manager' | 'operation' | 'apiVersion' | 'subresource'>): string {
  const o: Record<string, unknown> = { manager: m.manager, operation: m.operation };
  if (m.operation === 'Update' && m.apiVersion) o.apiVersion = m.apiVersion;
  if (m.subresource) o.subresource = m.subresource;
  return goJSON(o, false);
}

/** How conflict messages name a manager: `"kubectl"`, `"x" with subresource "status" using v1`. */
export function printManager(m: Pick<ManagerSet, 'manager' | 'operation' | 'apiVersion' | 'subresource'>): string {
  let s = JSON.stringify(m.manager);
  if (m.subresource) s += ` with subresource ${JSON.stringify(m.subresource)}`;
  if (m.operation === 'Update') s += ` using ${m.apiVersion}`;
  return s;
}

/**
 * Decodes entries into a map by identity (a later duplicate replaces an earlier one, as in
 * kube). Throws an Error naming the bad entry when an entry is malformed (operation not
 * Apply/Update, empty apiVersion, fieldsType not FieldsV1, fieldsV1 not a field set).
 */
export function decodeManagedFields(
  entries: readonly ManagedFieldsEntry[] | undefined | null,
): Map<string, ManagerSet> {
  const out = new Map<string, ManagerSet>();
  (entries ?? []).forEach((e, i) => {
    if (!e || typeof e !== 'object') throw new Error(`managed fields entry ${i} is not an object`);
    if (e.operation !== 'Apply' && e.operation !== 'Update')
      throw new Error(`managed fields entry ${i}: operation must be \`Apply\` or \`Update\``);
    if (!e.apiVersion) throw new Error(`managed fields entry ${i}: apiVersion must not be empty`);
    if (e.fieldsType !== 'FieldsV1') {
      throw new Error(
        e.fieldsType
          ? `invalid fieldsType ${JSON.stringify(e.fieldsType)} in managed fields entry ${i}`
          : `missing fieldsType in managed fields entry ${i}`,
      );
    }
    let set: FieldSet;
    try {
      set = FieldSet.fromFieldsV1(e.fieldsV1 ?? {});
    } catch (err) {
      throw new Error(`managed fields entry ${i}: ${(err as Error).message}`);
    }
    const m: ManagerSet = {
      manager: e.manager ?? '',
      operation: e.operation,
      apiVersion: e.apiVersion,
      ...(e.time ? { time: e.time } : {}),
      ...(e.subresource ? { subresource: e.subresource } : {}),
      set,
    };
    out.set(managerId(m), m);
  });
  return out;
}

function seconds(t: string | undefined): number {
  if (!t) return 0;
  const ms = Date.parse(t);
  return Number.isNaN(ms) ? 0 : Math.floor(ms / 1000);
}

/**
 * Entries in kube's order: Apply before Update, then by time (seconds), manager, apiVersion,
 * subresource. Deterministic: the same sets always encode to the same entries.
 */
export function encodeManagedFields(managers: Iterable<ManagerSet>): ManagedFieldsEntry[] {
  const list = [...managers];
  list.sort(
    (p, q) =>
      compareStrings(p.operation, q.operation) ||
      seconds(p.time) - seconds(q.time) ||
      compareStrings(p.manager, q.manager) ||
      compareStrings(p.apiVersion, q.apiVersion) ||
      compareStrings(p.subresource ?? '', q.subresource ?? ''),
  );
  return list.map((m) => {
    const e: ManagedFieldsEntry = {
      manager: m.manager,
      operation: m.operation,
      apiVersion: m.apiVersion,
      ...(m.time ? { time: m.time } : {}),
      fieldsType: 'FieldsV1',
      fieldsV1: m.set.toFieldsV1(),
    };
    if (m.subresource) e.subresource = m.subresource;
    return e;
  });
}

/** Update entries beyond this many are folded, oldest first, into "ancient-changes". */
export const MAX_UPDATE_MANAGERS = 10;
export const ANCIENT_CHANGES = 'ancient-changes';

/**
 * kube's capManagersManager: when there are more than `max` Update entries, the oldest are
 * merged into one `ancient-changes` entry per apiVersion (taking the newest merged time).
 */
export function capUpdateManagers(
  managers: Map<string, ManagerSet>,
  max = MAX_UPDATE_MANAGERS,
): Map<string, ManagerSet> {
  const updaters = [...managers.entries()].filter(([, m]) => m.operation === 'Update');
  if (updaters.length <= max) return managers;
  updaters.sort(([ia, a], [ib, b]) => seconds(a.time) - seconds(b.time) || compareStrings(ia, ib));
  const out = new Map(managers);
  const firstByVersion = new Map<string, string>();
  let length = updaters.length;
  for (let i = 0; i < updaters.length && length > max; i++) {
    const [id, m] = updaters[i];
    const bucket = managerId({ manager: ANCIENT_CHANGES, operation: 'Update', apiVersion: m.apiVersion });
    const first = firstByVersion.get(m.apiVersion);
    if (first === undefined) {
      firstByVersion.set(m.apiVersion, id);
      continue;
    }
    let b = out.get(bucket);
    if (!b) {
      const f = out.get(first)!;
      out.delete(first);
      b = { ...f, manager: ANCIENT_CHANGES, subresource: undefined };
    }
    out.set(bucket, { ...b, set: m.set.union(b.set), time: m.time });
    out.delete(id);
    length--;
  }
  return out;
}
