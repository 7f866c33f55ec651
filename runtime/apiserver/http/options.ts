// Decoding of query parameters (and DeleteOptions bodies) into the registry's option types.
// Every bad value is a 400/422 Status naming the parameter; nothing here touches storage.
import type { DeleteOptions, ListOptions, WatchOptions, WriteOptions } from '../../client/client.js';
import { errors, type StatusError } from '../../meta/errors.js';

export type Query = Record<string, string | string[] | undefined>;

/** The first value of a query parameter (repeated parameters: the first wins, as in Go's url.Values.Get). */
export function q1(q: Query, name: string): string | undefined {
  const v = q[name];
  return Array.isArray(v) ? v[0] : v;
}

function qAll(q: Query, name: string): string[] {
  const v = q[name];
  return v === undefined ? [] : Array.isArray(v) ? v : [v];
}

function optionsInvalid(kind: string, field: string, message: string, reason = 'FieldValueInvalid'): StatusError {
  return errors.invalid(kind, 'meta.k8s.io', '', [{ reason, field, message }]);
}

/**
 * A boolean query parameter as kube converts it (runtime.Convert_Slice_string_To_bool): only
 * `false` in any case and `0` are false; anything else, `True`, `1` and the empty string
 * included, is true. Undefined when absent. Never throws.
 */
export function parseBool(q: Query, name: string): boolean | undefined {
  const v = q1(q, name);
  if (v === undefined) return undefined;
  const l = v.toLowerCase();
  return !(l === 'false' || l === '0');
}

export function parseInt0(q: Query, name: string): number | undefined {
  const v = q1(q, name);
  if (v === undefined || v === '') return undefined;
  if (!/^-?\d+$/.test(v)) throw errors.badRequest(`invalid integer value for ${name}: ${JSON.stringify(v)}`);
  return Number(v);
}

function dryRunOf(values: string[], optionsKind: string): boolean {
  for (const v of values) {
    if (v !== 'All') {
      throw optionsInvalid(
        optionsKind,
        'dryRun',
        `Unsupported value: ${JSON.stringify(values)}: supported values: "All"`,
        'FieldValueNotSupported',
      );
    }
  }
  return values.length > 0;
}

/** Write options for POST/PUT/PATCH. kube-apiserver's default fieldValidation (absent parameter) is Warn. */
export function writeOptions(q: Query, optionsKind: 'CreateOptions' | 'UpdateOptions' | 'PatchOptions'): WriteOptions {
  const fv = q1(q, 'fieldValidation');
  let fieldValidation: WriteOptions['fieldValidation'];
  if (fv === undefined || fv === '') fieldValidation = 'Warn';
  else if (/^(strict|warn|ignore)$/i.test(fv)) {
    fieldValidation = (fv[0].toUpperCase() + fv.slice(1).toLowerCase()) as WriteOptions['fieldValidation'];
  } else {
    throw errors.badRequest(`invalid fieldValidation directive: ${fv}; valid values are Strict, Warn, Ignore`);
  }
  const fieldManager = q1(q, 'fieldManager');
  if (fieldManager !== undefined && fieldManager.length > 128) {
    throw optionsInvalid(optionsKind, 'fieldManager', `Too long: may not be longer than 128`, 'FieldValueTooLong');
  }
  const out: WriteOptions = { fieldValidation };
  if (dryRunOf(qAll(q, 'dryRun'), optionsKind)) out.dryRun = true;
  if (fieldManager) out.fieldManager = fieldManager;
  return out;
}

export function listOptions(q: Query): ListOptions {
  const out: ListOptions = {};
  const ls = q1(q, 'labelSelector');
  const fs = q1(q, 'fieldSelector');
  if (ls) out.labelSelector = ls;
  if (fs) out.fieldSelector = fs;
  const limit = parseInt0(q, 'limit');
  if (limit !== undefined && limit < 0) throw errors.badRequest(`limit must be non-negative, got ${limit}`);
  if (limit) out.limit = limit;
  const cont = q1(q, 'continue');
  if (cont) out.continue = cont;
  const rv = q1(q, 'resourceVersion');
  if (rv !== undefined) out.resourceVersion = rv;
  const rvm = q1(q, 'resourceVersionMatch');
  if (rvm) {
    if (rvm !== 'NotOlderThan' && rvm !== 'Exact') {
      throw optionsInvalid(
        'ListOptions',
        'resourceVersionMatch',
        `Unsupported value: "${rvm}": supported values: "Exact", "NotOlderThan"`,
        'FieldValueNotSupported',
      );
    }
    if (rv === undefined) {
      throw optionsInvalid(
        'ListOptions',
        'resourceVersionMatch',
        'Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided',
        'FieldValueForbidden',
      );
    }
    out.resourceVersionMatch = rvm;
  }
  return out;
}

export function watchOptions(q: Query): WatchOptions {
  const out: WatchOptions = {};
  const ls = q1(q, 'labelSelector');
  const fs = q1(q, 'fieldSelector');
  if (ls) out.labelSelector = ls;
  if (fs) out.fieldSelector = fs;
  const rv = q1(q, 'resourceVersion');
  if (rv !== undefined) out.resourceVersion = rv;
  const bm = parseBool(q, 'allowWatchBookmarks');
  if (bm) out.allowWatchBookmarks = true;
  const sie = parseBool(q, 'sendInitialEvents');
  if (sie !== undefined) out.sendInitialEvents = sie;
  const ts = parseInt0(q, 'timeoutSeconds');
  if (ts !== undefined && ts > 0) out.timeoutSeconds = ts;
  return out;
}

const POLICIES = new Set(['Background', 'Foreground', 'Orphan']);

/**
 * DeleteOptions from the JSON body (kubectl) merged over query parameters (client-node).
 * The deprecated orphanDependents becomes a propagationPolicy (true: Orphan, false:
 * Background) and is also returned as sent: kube answers 202 instead of 200 when it is false
 * and the object is not gone yet.
 */
export function deleteOptions(q: Query, body: unknown): DeleteOptions & { orphanDependents?: boolean } {
  const out: DeleteOptions & { orphanDependents?: boolean } = {};
  if (body !== undefined && (body === null || typeof body !== 'object' || Array.isArray(body))) {
    throw errors.badRequest('DeleteOptions: the request body must be a JSON object');
  }
  const b = (body ?? {}) as Record<string, unknown>;
  const typed: Array<[string, string]> = [
    ['propagationPolicy', 'string'],
    ['gracePeriodSeconds', 'number'],
    ['orphanDependents', 'boolean'],
    ['preconditions', 'object'],
  ];
  for (const [k, t] of typed) {
    if (b[k] !== undefined && b[k] !== null && typeof b[k] !== t) {
      throw errors.badRequest(`DeleteOptions: ${k} must be a ${t === 'object' ? 'JSON object' : t}`);
    }
  }
  if (b.dryRun !== undefined && b.dryRun !== null && !Array.isArray(b.dryRun))
    throw errors.badRequest('DeleteOptions: dryRun must be a list');
  const dry = [...qAll(q, 'dryRun'), ...(Array.isArray(b.dryRun) ? (b.dryRun as string[]) : [])];
  if (dryRunOf(dry, 'DeleteOptions')) out.dryRun = true;
  const policy = (b.propagationPolicy as string | undefined) ?? q1(q, 'propagationPolicy');
  const orphan = typeof b.orphanDependents === 'boolean' ? b.orphanDependents : parseBool(q, 'orphanDependents');
  if (policy !== undefined && policy !== null) {
    if (!POLICIES.has(policy)) {
      throw optionsInvalid(
        'DeleteOptions',
        'propagationPolicy',
        `Unsupported value: "${policy}": supported values: "Foreground", "Background", "Orphan"`,
        'FieldValueNotSupported',
      );
    }
    if (orphan !== undefined) {
      throw optionsInvalid(
        'DeleteOptions',
        'propagationPolicy',
        'Invalid value: "' + policy + '": orphanDependents and deletionPropagation cannot be both set',
      );
    }
    out.propagationPolicy = policy as DeleteOptions['propagationPolicy'];
  } else if (orphan !== undefined) {
    out.propagationPolicy = orphan ? 'Orphan' : 'Background';
    out.orphanDependents = orphan;
  }
  const grace = typeof b.gracePeriodSeconds === 'number' ? b.gracePeriodSeconds : parseInt0(q, 'gracePeriodSeconds');
  if (grace !== undefined && grace !== null) {
    if (grace < 0) throw optionsInvalid('DeleteOptions', 'gracePeriodSeconds', `Invalid value: ${grace}: must be >= 0`);
    out.gracePeriodSeconds = grace;
  }
  if (b.preconditions && typeof b.preconditions === 'object') {
    const p = b.preconditions as { uid?: unknown; resourceVersion?: unknown };
    out.preconditions = {};
    if (typeof p.uid === 'string') out.preconditions.uid = p.uid;
    if (typeof p.resourceVersion === 'string') out.preconditions.resourceVersion = p.resourceVersion;
  }
  return out;
}
