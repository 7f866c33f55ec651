// Server-side apply and managedFields upkeep, as pure functions the registry calls on every write.
// The semantics follow kube's field manager (apimachinery managedfields + structured-merge-diff):
//
//   recordUpdate  create / update / patch: the writer's Update entry gains every field whose
//                 value it added or changed; those fields leave every other entry (no conflicts).
//   apply         server-side apply: merge the configuration into the live object, remove what
//                 this applier applied before and stopped applying (unless someone else owns it),
//                 and refuse (409) to change a value another manager owns, unless forced.
//
// Scope: on the main resource of a kind with a status subresource, `status` is neither tracked
// nor applied; on the `status` subresource only `status` is. Server-owned metadata (name,
// namespace, uid, resourceVersion, generation, creationTimestamp, managedFields) and
// apiVersion/kind are never recorded, as kube's stripMeta does.
import type { Schema } from '../../../apis/types.js';
import { errors } from '../../meta/errors.js';
import type { KubeObject, ManagedFieldsEntry } from '../../meta/types.js';
import { conflictError } from './conflicts.js';
import { FieldSet, type Path } from './fieldset.js';
import { updateLastApplied } from './lastapplied.js';
import { type ManagerSet, capUpdateManagers, decodeManagedFields, encodeManagedFields, managerId } from './managed.js';
import { type MapType, isObject, rootType } from './schema.js';
import {
  compare,
  createdFieldsV1,
  deepEqual,
  ensureNamedFieldsAreMembers,
  filterComparison,
  merge,
  removeItems,
  toFieldSet,
} from './value.js';

/** The manager that takes ownership of pre-existing fields on the first apply to an object without managedFields. */
export const BEFORE_FIRST_APPLY = 'before-first-apply';

export interface FieldManagerScope {
  /** KindDefinition.schema of the kind (the whole object). */
  schema: Schema;
  /** apiVersion of the request, e.g. `fluxvm.dev/v1alpha1`; recorded in entries. */
  apiVersion: string;
  /** `status` for writes to the status subresource; undefined for the main resource. */
  subresource?: string;
  /**
   * Whether the kind has a status subresource (then main-resource writes do not own `status`).
   * Defaults to whether the schema declares a `status` property.
   */
  statusSubresource?: boolean;
}

const STRIPPED_META_FIELDS = [
  'name',
  'namespace',
  'creationTimestamp',
  'selfLink',
  'uid',
  'clusterName',
  'generation',
  'managedFields',
  'resourceVersion',
];
const STRIPPED_META = STRIPPED_META_FIELDS.map((f) => `f:${f}`);
const STRIP = FieldSet.of(
  [{ field: 'apiVersion' }],
  [{ field: 'kind' }],
  [{ field: 'metadata' }],
  ...STRIPPED_META_FIELDS.map((f): Path => [{ field: 'metadata' }, { field: f }]),
);

/** The set filter for the scope: what a write through this endpoint may own. */
function scopeFilter(scope: FieldManagerScope): (s: FieldSet) => FieldSet {
  if (scope.subresource === 'status') return (s) => s.filterTop((pe) => 'field' in pe && pe.field === 'status');
  const statusSub = scope.statusSubresource ?? scope.schema.properties?.status !== undefined;
  if (!scope.subresource && statusSub) {
    const ignored = FieldSet.of([{ field: 'status' }]);
    return (s) => s.recursiveDifference(ignored);
  }
  return (s) => s;
}

/** The part of an applied configuration the scope lets through (identity fields always). */
function scopeConfig(config: Record<string, unknown>, scope: FieldManagerScope): Record<string, unknown> {
  if (scope.subresource === 'status') {
    const out: Record<string, unknown> = {};
    for (const k of ['apiVersion', 'kind']) if (config[k] !== undefined) out[k] = config[k];
    const md = isObject(config.metadata) ? config.metadata : {};
    const meta: Record<string, unknown> = {};
    for (const k of ['name', 'namespace']) if (md[k] !== undefined) meta[k] = md[k];
    out.metadata = meta;
    if (config.status !== undefined) out.status = config.status;
    return out;
  }
  const statusSub = scope.statusSubresource ?? scope.schema.properties?.status !== undefined;
  if (!scope.subresource && statusSub && 'status' in config) {
    const { status: _ignored, ...rest } = config;
    return rest;
  }
  return config;
}

/**
 * A shallow view of the object without metadata.managedFields (which field management never
 * walks). Shares structure with `obj`: callers only read it.
 */
function withoutManagedFields(obj: KubeObject | undefined): Record<string, unknown> {
  if (!obj) return {};
  if (!isObject(obj.metadata) || !('managedFields' in obj.metadata)) return { ...obj };
  const { managedFields: _mf, ...metadata } = obj.metadata;
  return { ...obj, metadata };
}

/**
 * The object with `metadata.managedFields` set to `entries` (removed when empty). Returns a
 * shallow copy (new top level and metadata, everything else shared); the input is not modified.
 */
export function withManagedFields<T extends KubeObject>(obj: T, entries: ManagedFieldsEntry[]): T {
  const metadata = { ...(obj.metadata ?? {}) };
  if (entries.length > 0) metadata.managedFields = entries;
  else delete metadata.managedFields;
  return { ...obj, metadata };
}

// ---------------------------------------------------------------------------------------------
// fieldsOf

/**
 * The set of fields `obj` sets, as an applier of `obj` would own them: scoped like a write
 * through `scope` (no `status` on the main resource of a kind with a status subresource, only
 * `status` on the status subresource) and without server-owned metadata. Pure.
 */
export function fieldsOf(
  obj: KubeObject | Record<string, unknown>,
  schema: Schema,
  scope: Partial<FieldManagerScope> = {},
): FieldSet {
  const full: FieldManagerScope = { apiVersion: '', ...scope, schema };
  const set = toFieldSet(withoutManagedFields(obj as KubeObject), rootType(schema));
  return scopeFilter(full)(set).difference(STRIP);
}

// ---------------------------------------------------------------------------------------------
// recordUpdate

export interface RecordUpdateInput extends FieldManagerScope {
  /** The object before the write; undefined for a create. */
  oldObj: KubeObject | undefined;
  /** The object about to be persisted (after patching, defaulting and the status split). */
  newObj: KubeObject;
  /**
   * The entries to start from. When omitted, kube's rule applies (see managedFieldsBase): a
   * non-empty `newObj.metadata.managedFields` supplied by the client replaces the stored one
   * (main resource only; `[{}]` resets it), otherwise the old object's entries are used.
   */
  managedFields?: ManagedFieldsEntry[];
  manager: string;
  /** RFC 3339 time recorded on the writer's entry when it took fields. */
  now: string;
}

/**
 * kube's choice of the entries a non-apply write starts from. Client-supplied entries that do
 * not decode are ignored (the stored ones are kept), so a client can never store malformed
 * managedFields; `[{}]` (every entry empty) means "reset to nothing".
 */
export function managedFieldsBase(
  oldObj: KubeObject | undefined,
  newObj: KubeObject,
  subresource?: string,
): ManagedFieldsEntry[] {
  const live = oldObj?.metadata?.managedFields ?? [];
  if (subresource) return live;
  const given = newObj.metadata?.managedFields;
  if (!Array.isArray(given) || given.length === 0) return live;
  if (given.every((e) => isObject(e) && Object.keys(e).length === 0)) return [];
  try {
    if (decodeManagedFields(given).size === 0) return live;
  } catch {
    return live;
  }
  return given;
}

/**
 * The managedFields after a create, update or non-apply patch by `manager`.
 *
 * The writer's Update entry (one per manager, apiVersion and subresource) gains every field
 * whose value was added or changed, and `time` becomes `now`; a write that changes nothing
 * tracked leaves the entries as they were. Changed fields leave every other entry, removed
 * fields leave every entry; entries left empty are dropped; more than ten Update entries are
 * folded into `ancient-changes`. Entries come back in kube's order.
 *
 * Never throws: base entries that cannot be decoded are treated as empty (kube's
 * UpdateNoErrors does the same). Pure and deterministic; safe to call again with the same input.
 */
export function recordUpdate(input: RecordUpdateInput): ManagedFieldsEntry[] {
  const base = input.managedFields ?? managedFieldsBase(input.oldObj, input.newObj, input.subresource);
  let managers: Map<string, ManagerSet>;
  try {
    managers = decodeManagedFields(base);
  } catch {
    managers = new Map();
  }
  // A create with nothing to start from (the common case): the writer owns everything it set,
  // written straight to FieldsV1 without building and diffing field sets (same result).
  if (!input.oldObj && managers.size === 0) return createdEntries(input);
  managers = updateManagers(
    managers,
    input.oldObj ? withoutManagedFields(input.oldObj) : {},
    withoutManagedFields(input.newObj),
    input,
  );
  return encodeManagedFields(capUpdateManagers(managers).values());
}

function createdEntries(input: RecordUpdateInput): ManagedFieldsEntry[] {
  const root = rootType(input.schema);
  const fields = createdFieldsV1(withoutManagedFields(input.newObj), root);
  // Scope (scopeFilter) and server-owned metadata (STRIP), applied to the FieldsV1 form.
  const statusSub = input.statusSubresource ?? input.schema.properties?.status !== undefined;
  if (input.subresource === 'status') {
    for (const k of Object.keys(fields)) if (k !== 'f:status') delete fields[k];
  } else if (!input.subresource && statusSub) delete fields['f:status'];
  delete fields['f:apiVersion'];
  delete fields['f:kind'];
  const md = fields['f:metadata'] as Record<string, unknown> | undefined;
  if (md) {
    delete md['.'];
    for (const f of STRIPPED_META) {
      const n = md[f] as Record<string, unknown> | undefined;
      if (!n) continue;
      // difference() removes the member, not what is below it (malformed metadata only).
      if (Object.keys(n).some((k) => k !== '.')) delete n['.'];
      else delete md[f];
    }
    if (Object.keys(md).length === 0) delete fields['f:metadata'];
  }
  if (Object.keys(fields).length === 0) return [];
  const e: ManagedFieldsEntry = {
    manager: input.manager,
    operation: 'Update',
    apiVersion: input.apiVersion,
    ...(input.now ? { time: input.now } : {}),
    fieldsType: 'FieldsV1',
    fieldsV1: fields,
  };
  if (input.subresource) e.subresource = input.subresource;
  return [e];
}

function updateManagers(
  managers: Map<string, ManagerSet>,
  oldV: Record<string, unknown>,
  newV: Record<string, unknown>,
  input: FieldManagerScope & { manager: string; now: string },
): Map<string, ManagerSet> {
  const root = rootType(input.schema);
  const cmp = filterComparison(compare(oldV, newV, root), scopeFilter(input));
  const taken = cmp.added.union(cmp.modified);
  const out = new Map<string, ManagerSet>();
  for (const [id, m] of managers) {
    const set = m.set.difference(taken).difference(cmp.removed);
    if (!set.isEmpty()) out.set(id, set === m.set ? m : { ...m, set });
  }
  const opSet = taken.difference(cmp.removed).difference(STRIP);
  if (opSet.isEmpty()) return out;
  const writer: ManagerSet = {
    manager: input.manager,
    operation: 'Update',
    apiVersion: input.apiVersion,
    time: input.now,
    ...(input.subresource ? { subresource: input.subresource } : {}),
    set: opSet,
  };
  const id = managerId(writer);
  const prev = out.get(id);
  out.set(id, { ...writer, set: prev ? prev.set.union(opSet) : opSet });
  return out;
}

// ---------------------------------------------------------------------------------------------
// apply

export interface ApplyInput extends FieldManagerScope {
  /** The stored object; undefined when the apply creates it. */
  live: KubeObject | undefined;
  /** The applied configuration (the request body, decoded). Not modified. */
  config: KubeObject;
  /** Entries to start from; defaults to `live.metadata.managedFields`. */
  managedFields?: ManagedFieldsEntry[];
  manager: string;
  force: boolean;
  now: string;
  /** When given, the configuration's kind must be this kind (else 400, as kube). */
  kind?: string;
}

export interface ApplyResult {
  /** The object to persist, with `metadata.managedFields` set. */
  object: KubeObject;
  managedFields: ManagedFieldsEntry[];
  /** False when the apply changes nothing but (possibly) ownership: the object content is the live one. */
  changed: boolean;
}

/**
 * Server-side apply of `config` by `manager`.
 *
 * The result is the live object with the configuration merged in (objects field by field,
 * map-lists by key, set-lists by value, atomic values replaced) minus the fields this manager
 * applied last time and omits now, unless another manager (Apply or Update) still owns them.
 * The manager's Apply entry becomes exactly the configuration's fields. An absent object is
 * created from the configuration (the caller persists it and fills server-owned metadata).
 *
 * Throws StatusError: 400 BadRequest when the configuration has the wrong apiVersion or kind,
 * or carries metadata.managedFields; 409 Conflict (causes FieldManagerConflict, kube's
 * message) when it would change a value another manager owns and `force` is false, in which
 * case nothing is returned; with `force` the conflicting fields change owner. A value equal
 * to the live one is shared ownership, never a conflict. Pure and deterministic.
 */
export function apply(input: ApplyInput): ApplyResult {
  const { config } = input;
  checkConfig(input);
  const root = rootType(input.schema);
  const filter = scopeFilter(input);
  const liveV = withoutManagedFields(input.live);
  const configV = scopeConfig({ ...config }, input);

  let managers: Map<string, ManagerSet>;
  try {
    managers = decodeManagedFields(input.managedFields ?? input.live?.metadata?.managedFields);
  } catch (err) {
    throw errors.internal(`failed to decode managed fields: ${(err as Error).message}`);
  }
  if (input.live && managers.size === 0) {
    // kube's skipNonAppliedManager: fields that exist before the first apply belong to someone.
    managers = updateManagers(managers, {}, liveV, { ...input, manager: BEFORE_FIRST_APPLY });
  }

  const applier: ManagerSet = {
    manager: input.manager,
    operation: 'Apply',
    apiVersion: input.apiVersion,
    ...(input.subresource ? { subresource: input.subresource } : {}),
    set: new FieldSet(),
  };
  const id = managerId(applier);
  const last = managers.get(id);

  const merged = merge(liveV, configV, root) as Record<string, unknown>;
  const newSet = filter(toFieldSet(configV, root));
  const withApplier = new Map(managers);
  withApplier.set(id, { ...applier, set: newSet });
  const newObj = last && !last.set.isEmpty() ? prune(merged, withApplier, last.set, root) : merged;

  // Ownership: others lose what changed (or conflict) and what was removed.
  const cmp = filterComparison(compare(liveV, newObj, root), filter);
  const changedSet = cmp.modified.union(cmp.added);
  const conflicts: Array<{ m: ManagerSet; paths: Path[] }> = [];
  const out = new Map<string, ManagerSet>();
  for (const [mid, m] of withApplier) {
    if (mid === id) continue;
    const c = m.set.intersection(changedSet);
    if (!c.isEmpty()) conflicts.push({ m, paths: c.paths() });
    const set = m.set.difference(c).difference(cmp.removed);
    if (!set.isEmpty()) out.set(mid, set === m.set ? m : { ...m, set });
  }
  if (conflicts.length > 0 && !input.force) throw conflictError(conflicts);

  const changed = !deepEqual(liveV, newObj);
  const time = changed || !last?.time ? input.now : last.time;
  out.set(id, { ...applier, time, set: newSet.difference(STRIP) });
  const managedFields = encodeManagedFields(out.values());

  let object = newObj as unknown as KubeObject;
  if (input.manager === 'kubectl') object = updateLastApplied(object, config);
  return {
    object: withManagedFields(object, managedFields),
    managedFields,
    changed: changed || !deepEqual(newObj, object),
  };
}

function checkConfig(input: ApplyInput): void {
  const { config } = input;
  if (!isObject(config)) throw errors.badRequest('the applied configuration must be an object');
  const wrongKind = input.kind !== undefined && config.kind !== input.kind;
  if (config.apiVersion !== input.apiVersion || wrongKind) {
    const av = typeof config.apiVersion === 'string' ? config.apiVersion : '';
    const slash = av.indexOf('/');
    const group = slash >= 0 ? av.slice(0, slash) : '';
    const version = slash >= 0 ? av.slice(slash + 1) : av;
    throw errors.badRequest(
      `invalid object type: ${group}/${version}, Kind=${typeof config.kind === 'string' ? config.kind : ''}`,
    );
  }
  const md = config.metadata as unknown;
  if (md !== undefined && md !== null && !isObject(md)) throw errors.badRequest('metadata must be an object');
  if (isObject(md) && md.managedFields !== undefined && md.managedFields !== null) {
    throw errors.badRequest('metadata.managedFields must be nil');
  }
}

/**
 * Removes from `merged` what the applier owned last time (`lastSet`) and no longer applies,
 * keeping whatever any manager (including the applier's new configuration) owns.
 * structured-merge-diff's prune / addBackOwnedItems / addBackDanglingItems.
 */
function prune(
  merged: Record<string, unknown>,
  managers: Map<string, ManagerSet>,
  lastSet: FieldSet,
  root: MapType,
): Record<string, unknown> {
  const ens = (s: FieldSet) => ensureNamedFieldsAreMembers(s, root);
  const lastE = ens(lastSet);
  const pruned0 = removeItems(merged, lastE, root);
  // Server-owned metadata and apiVersion/kind are never pruned, whoever "owns" them.
  let owned = STRIP;
  for (const m of managers.values()) owned = owned.union(m.set);
  const mergedE = ens(toFieldSet(merged, root));
  const pruned1 = removeItems(merged, mergedE.difference(ens(toFieldSet(pruned0, root)).union(ens(owned))), root);
  const toRemove = mergedE.difference(ens(toFieldSet(pruned1, root))).intersection(lastE);
  return removeItems(merged, toRemove, root) as Record<string, unknown>;
}
