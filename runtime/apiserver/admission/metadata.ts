// ObjectMeta validation with the rules and messages of k8s.io/apimachinery: names are
// DNS-1123 subdomains (labels for namespaces), label and annotation keys are qualified
// names, label values are at most 63 characters, annotations at most 256 KiB in total.
// Returns causes; never throws.
import type { StatusCause } from '../../meta/types.js';
import { isPlainObject } from './paths.js';

const LABEL_FMT = '[a-z0-9]([-a-z0-9]*[a-z0-9])?';
const SUBDOMAIN_FMT = `${LABEL_FMT}(\\.${LABEL_FMT})*`;
const QNAME_FMT = '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]';
const LABEL_VALUE_FMT = `(${QNAME_FMT})?`;
const LABEL_RE = new RegExp(`^${LABEL_FMT}$`);
const SUBDOMAIN_RE = new RegExp(`^${SUBDOMAIN_FMT}$`);
const QNAME_RE = new RegExp(`^${QNAME_FMT}$`);
const LABEL_VALUE_RE = new RegExp(`^${LABEL_VALUE_FMT}$`);
const TOTAL_ANNOTATION_BYTES = 256 * 1024;

/**
 * ObjectMeta fields only the server sets (JSON names). The one list: create drops the
 * client's values of these, and pruning keeps them as known ObjectMeta fields, so a field
 * added here is both known and never taken from a client on create.
 */
export const SERVER_OWNED_META_FIELDS = [
  'uid',
  'resourceVersion',
  'generation',
  'creationTimestamp',
  'deletionTimestamp',
  'deletionGracePeriodSeconds',
  'selfLink',
] as const;

/** Problems with a DNS-1123 label (names of namespaces), in kube's words; [] when valid. */
export function dns1123LabelErrors(v: string): string[] {
  const errs: string[] = [];
  if (v.length > 63) errs.push('must be no more than 63 characters');
  if (!LABEL_RE.test(v))
    errs.push(
      `a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '${LABEL_FMT}')`,
    );
  return errs;
}

/** Problems with a DNS-1123 subdomain (object names), in kube's words; [] when valid. */
export function dns1123SubdomainErrors(v: string): string[] {
  const errs: string[] = [];
  if (v.length > 253) errs.push('must be no more than 253 characters');
  if (!SUBDOMAIN_RE.test(v))
    errs.push(
      `a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '${SUBDOMAIN_FMT}')`,
    );
  return errs;
}

/** Problems with a qualified name (`prefix/name`), the form of label and annotation keys. */
export function qualifiedNameErrors(v: string): string[] {
  const errs: string[] = [];
  const parts = v.split('/');
  let name = v;
  if (parts.length === 2) {
    const [prefix] = parts;
    name = parts[1];
    if (prefix.length === 0) errs.push('prefix part must be non-empty');
    else for (const e of dns1123SubdomainErrors(prefix)) errs.push(`prefix part ${e}`);
  } else if (parts.length > 2) {
    return [
      `a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '${QNAME_FMT}') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')`,
    ];
  }
  if (name.length === 0) errs.push('name part must be non-empty');
  else if (name.length > 63) errs.push('name part must be no more than 63 characters');
  if (name.length > 0 && !QNAME_RE.test(name))
    errs.push(
      `name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '${QNAME_FMT}')`,
    );
  return errs;
}

export function labelValueErrors(v: string): string[] {
  const errs: string[] = [];
  if (v.length > 63) errs.push('must be no more than 63 characters');
  if (!LABEL_VALUE_RE.test(v))
    errs.push(
      `a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '${LABEL_VALUE_FMT}')`,
    );
  return errs;
}

const invalid = (field: string, value: unknown, msg: string): StatusCause => ({
  reason: 'FieldValueInvalid',
  field,
  message: `Invalid value: ${JSON.stringify(value)}: ${msg}`,
});

/**
 * Validates `metadata` of an object of a kind that is `namespaced` (or a Namespace itself
 * when `isNamespace`). Type errors (labels not a map of strings, ...) are causes too.
 */
/** kube's ValidatePathSegmentName (RBAC object names such as `system:discovery`). */
export function pathSegmentNameErrors(v: string): string[] {
  if (v === '.' || v === '..') return [`may not be '${v}'`];
  return /[/%]/.test(v) ? [`may not contain '/' or '%'`] : [];
}

export function validateMetadata(
  meta: unknown,
  opts: { namespaced: boolean; isNamespace: boolean; pathSegmentNames?: boolean },
): StatusCause[] {
  const causes: StatusCause[] = [];
  if (meta === undefined)
    return [
      {
        reason: 'FieldValueRequired',
        field: 'metadata.name',
        message: 'Required value: name or generateName is required',
      },
    ];
  if (!isPlainObject(meta))
    return [
      { reason: 'FieldValueTypeInvalid', field: 'metadata', message: 'Invalid value: "metadata": must be an object' },
    ];
  const nameErrs = opts.isNamespace
    ? dns1123LabelErrors
    : opts.pathSegmentNames
      ? pathSegmentNameErrors
      : dns1123SubdomainErrors;

  const { name, generateName, namespace } = meta;
  if (name === undefined || name === '') {
    if (generateName === undefined || generateName === '')
      causes.push({
        reason: 'FieldValueRequired',
        field: 'metadata.name',
        message: 'Required value: name or generateName is required',
      });
  } else if (typeof name !== 'string') {
    causes.push(invalid('metadata.name', name, 'must be a string'));
  } else {
    for (const e of nameErrs(name)) causes.push(invalid('metadata.name', name, e));
  }
  if (generateName !== undefined && generateName !== '') {
    if (typeof generateName !== 'string')
      causes.push(invalid('metadata.generateName', generateName, 'must be a string'));
    else {
      // A prefix is valid when it would be valid with a suffix appended (kube's MaskTrailingDash).
      const masked =
        generateName.length > 1 && generateName.endsWith('-') ? `${generateName.slice(0, -1)}a` : generateName;
      for (const e of nameErrs(masked)) causes.push(invalid('metadata.generateName', generateName, e));
    }
  }
  if (namespace !== undefined && namespace !== '') {
    if (!opts.namespaced) {
      causes.push({
        reason: 'FieldValueForbidden',
        field: 'metadata.namespace',
        message: 'Forbidden: not allowed on this type',
      });
    } else if (typeof namespace !== 'string') {
      causes.push(invalid('metadata.namespace', namespace, 'must be a string'));
    } else {
      for (const e of dns1123LabelErrors(namespace)) causes.push(invalid('metadata.namespace', namespace, e));
    }
  }

  if (meta.labels !== undefined) {
    if (!isPlainObject(meta.labels))
      causes.push(invalid('metadata.labels', meta.labels, 'must be a map of string keys to string values'));
    else
      for (const [k, v] of Object.entries(meta.labels)) {
        for (const e of qualifiedNameErrors(k)) causes.push(invalid('metadata.labels', k, e));
        if (typeof v !== 'string') causes.push(invalid(`metadata.labels.${k}`, v, 'must be a string'));
        else for (const e of labelValueErrors(v)) causes.push(invalid('metadata.labels', v, e));
      }
  }
  if (meta.annotations !== undefined) {
    if (!isPlainObject(meta.annotations))
      causes.push(invalid('metadata.annotations', meta.annotations, 'must be a map of string keys to string values'));
    else {
      let total = 0;
      for (const [k, v] of Object.entries(meta.annotations)) {
        for (const e of qualifiedNameErrors(k.toLowerCase())) causes.push(invalid('metadata.annotations', k, e));
        if (typeof v !== 'string') causes.push(invalid(`metadata.annotations.${k}`, v, 'must be a string'));
        else total += Buffer.byteLength(k) + Buffer.byteLength(v);
      }
      if (total > TOTAL_ANNOTATION_BYTES)
        causes.push({
          reason: 'FieldValueTooLong',
          field: 'metadata.annotations',
          message: `Too long: may not be more than ${TOTAL_ANNOTATION_BYTES} bytes`,
        });
    }
  }
  if (meta.finalizers !== undefined) {
    if (!Array.isArray(meta.finalizers))
      causes.push(invalid('metadata.finalizers', meta.finalizers, 'must be a list of strings'));
    else
      meta.finalizers.forEach((f, i) => {
        if (typeof f !== 'string') causes.push(invalid(`metadata.finalizers[${i}]`, f, 'must be a string'));
        else for (const e of qualifiedNameErrors(f)) causes.push(invalid(`metadata.finalizers[${i}]`, f, e));
      });
  }
  if (meta.ownerReferences !== undefined) {
    if (!Array.isArray(meta.ownerReferences))
      causes.push(invalid('metadata.ownerReferences', meta.ownerReferences, 'must be a list'));
    else
      meta.ownerReferences.forEach((r, i) => {
        const base = `metadata.ownerReferences[${i}]`;
        if (!isPlainObject(r)) {
          causes.push(invalid(base, r, 'must be an object'));
          return;
        }
        for (const f of ['apiVersion', 'kind', 'name', 'uid'])
          if (typeof r[f] !== 'string' || r[f] === '')
            causes.push({ reason: 'FieldValueRequired', field: `${base}.${f}`, message: 'Required value' });
      });
  }
  return causes;
}
