// Label and field selectors with Kubernetes syntax and semantics.
//
// Label selectors (k8s.io/apimachinery labels.Parse): comma-separated requirements,
// `k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k>N`, `k<N`.
// Field selectors (fields.ParseSelector): `f=v`, `f==v`, `f!=v`, comma-separated, with `\`
// escaping `,`, `=`, `!` and `\` in values.
// Both parsers throw a 400 BadRequest StatusError for malformed input and never anything else.
import { errors } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';

export type Matcher = (obj: KubeObject) => boolean;

type Op = 'exists' | '!' | '=' | '!=' | 'in' | 'notin' | 'gt' | 'lt';
export interface LabelRequirement {
  key: string;
  op: Op;
  values: string[];
}

const NAME_RE = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const DNS1123_SUBDOMAIN_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** Why `key` is not a valid label key (qualified name), or undefined when it is. */
export function labelKeyError(key: string): string | undefined {
  const parts = key.split('/');
  if (parts.length > 2)
    return `a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/'`;
  const name = parts[parts.length - 1];
  if (parts.length === 2) {
    const prefix = parts[0];
    if (!prefix) return 'prefix part must be non-empty';
    if (prefix.length > 253 || !DNS1123_SUBDOMAIN_RE.test(prefix))
      return `prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character`;
  }
  if (!name) return 'name part must be non-empty';
  if (name.length > 63) return 'name part must be no more than 63 characters';
  if (!NAME_RE.test(name))
    return `name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character`;
  return undefined;
}

/** Why `v` is not a valid label value, or undefined when it is ('' is valid). */
export function labelValueError(v: string): string | undefined {
  if (v === '') return undefined;
  if (v.length > 63) return 'must be no more than 63 characters';
  if (!NAME_RE.test(v))
    return `a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character`;
  return undefined;
}

type Tok = { t: 'id' | '!' | '=' | '==' | '!=' | 'in' | 'notin' | '(' | ')' | ',' | '>' | '<' | 'end'; v: string };

function lex(s: string): Tok[] {
  const out: Tok[] = [];
  let i = 0;
  const special = new Set(['!', '=', '(', ')', ',', '>', '<']);
  while (i < s.length) {
    const c = s[i];
    if (c === ' ' || c === '\t' || c === '\n' || c === '\r') {
      i++;
      continue;
    }
    if (c === '!' && s[i + 1] === '=') {
      out.push({ t: '!=', v: '!=' });
      i += 2;
    } else if (c === '=' && s[i + 1] === '=') {
      out.push({ t: '==', v: '==' });
      i += 2;
    } else if (special.has(c)) {
      out.push({ t: c as Tok['t'], v: c });
      i++;
    } else {
      let j = i;
      while (j < s.length && !special.has(s[j]) && !/\s/.test(s[j])) j++;
      const w = s.slice(i, j);
      out.push({ t: w === 'in' ? 'in' : w === 'notin' ? 'notin' : 'id', v: w });
      i = j;
    }
  }
  out.push({ t: 'end', v: '' });
  return out;
}

const bad = (selector: string, why: string) => errors.badRequest(`unable to parse requirement: ${why}`);

/** Parses a label selector; '' selects everything. Throws 400 BadRequest when malformed. */
export function parseLabelSelector(selector: string): LabelRequirement[] {
  const toks = lex(selector);
  let p = 0;
  const reqs: LabelRequirement[] = [];
  const peek = () => toks[p];
  const next = () => toks[p++];
  const desc = (t: Tok) => (t.t === 'end' ? 'end of string' : `'${t.v}'`);
  if (peek().t === 'end') return reqs;
  for (;;) {
    let negate = false;
    if (peek().t === '!') {
      negate = true;
      next();
    }
    const kt = next();
    if (kt.t !== 'id') throw bad(selector, `found ${desc(kt)}, expected: identifier`);
    const key = kt.v;
    const kerr = labelKeyError(key);
    if (kerr) throw bad(selector, `key: Invalid value: "${key}": ${kerr}`);
    if (negate) {
      reqs.push({ key, op: '!', values: [] });
    } else {
      const ot = peek();
      if (ot.t === ',' || ot.t === 'end') {
        reqs.push({ key, op: 'exists', values: [] });
      } else {
        next();
        if (ot.t === '=' || ot.t === '==' || ot.t === '!=' || ot.t === '>' || ot.t === '<') {
          // A value may be empty: `k=` selects objects whose label k is ''.
          let v = '';
          if (peek().t === 'id' || peek().t === 'in' || peek().t === 'notin') v = next().v;
          const op: Op = ot.t === '!=' ? '!=' : ot.t === '>' ? 'gt' : ot.t === '<' ? 'lt' : '=';
          if (op === 'gt' || op === 'lt') {
            if (!/^-?[0-9]+$/.test(v)) throw bad(selector, `for 'Gt', 'Lt' operators, the value must be an integer`);
          } else {
            const verr = labelValueError(v);
            if (verr) throw bad(selector, `values[0][${key}]: Invalid value: "${v}": ${verr}`);
          }
          reqs.push({ key, op, values: [v] });
        } else if (ot.t === 'in' || ot.t === 'notin') {
          const lp = next();
          if (lp.t !== '(') throw bad(selector, `found ${desc(lp)}, expected: '('`);
          const values: string[] = [];
          for (;;) {
            let v = '';
            if (peek().t === 'id' || peek().t === 'in' || peek().t === 'notin') v = next().v;
            const verr = labelValueError(v);
            if (verr) throw bad(selector, `values[${values.length}][${key}]: Invalid value: "${v}": ${verr}`);
            values.push(v);
            const sep = next();
            if (sep.t === ')') break;
            if (sep.t !== ',') throw bad(selector, `found ${desc(sep)}, expected: ',', ')'`);
          }
          reqs.push({ key, op: ot.t, values });
        } else {
          throw bad(selector, `found ${desc(ot)}, expected: in, notin, =, ==, !=, gt, lt`);
        }
      }
    }
    const sep = next();
    if (sep.t === 'end') break;
    if (sep.t !== ',') throw bad(selector, `found ${desc(sep)}, expected: ',' or 'end of string'`);
  }
  return reqs;
}

/** True when `labels` satisfy every requirement. */
export function labelsMatch(reqs: LabelRequirement[], labels: Record<string, string> | undefined): boolean {
  const l = labels ?? {};
  for (const r of reqs) {
    const has = Object.prototype.hasOwnProperty.call(l, r.key);
    const v = has ? l[r.key] : undefined;
    switch (r.op) {
      case 'exists':
        if (!has) return false;
        break;
      case '!':
        if (has) return false;
        break;
      case '=':
      case 'in':
        if (!has || !r.values.includes(v!)) return false;
        break;
      case '!=':
      case 'notin':
        if (has && r.values.includes(v!)) return false;
        break;
      case 'gt':
      case 'lt': {
        if (!has || !/^-?[0-9]+$/.test(v!)) return false;
        const n = Number(v);
        const w = Number(r.values[0]);
        if (r.op === 'gt' ? !(n > w) : !(n < w)) return false;
        break;
      }
    }
  }
  return true;
}

export interface FieldRequirement {
  field: string;
  op: '=' | '!=';
  value: string;
}

function splitUnescaped(s: string, sep: string): string[] {
  const out: string[] = [];
  let cur = '';
  for (let i = 0; i < s.length; i++) {
    if (s[i] === '\\' && i + 1 < s.length) {
      cur += s[i] + s[i + 1];
      i++;
    } else if (s[i] === sep) {
      out.push(cur);
      cur = '';
    } else cur += s[i];
  }
  out.push(cur);
  return out;
}

function unescapeFieldValue(v: string): string {
  let out = '';
  for (let i = 0; i < v.length; i++) {
    if (v[i] === '\\') {
      const n = v[i + 1];
      if (n === undefined || !'\\,=!'.includes(n))
        throw errors.badRequest(`invalid field selector: invalid escape sequence: \\${n ?? ''}`);
      out += n;
      i++;
    } else if (v[i] === ',' || v[i] === '=') {
      throw errors.badRequest(`invalid field selector: unescaped ${v[i]} in value`);
    } else out += v[i];
  }
  return out;
}

/** Parses a field selector; '' selects everything. Throws 400 BadRequest when malformed. */
export function parseFieldSelector(selector: string): FieldRequirement[] {
  if (selector.trim() === '') return [];
  const out: FieldRequirement[] = [];
  for (const term of splitUnescaped(selector, ',')) {
    if (term === '') continue;
    let op: FieldRequirement['op'] | undefined;
    let idx = -1;
    let len = 0;
    for (let i = 0; i < term.length; i++) {
      if (term[i] === '\\') {
        i++;
        continue;
      }
      if (term.startsWith('!=', i)) {
        op = '!=';
        len = 2;
      } else if (term.startsWith('==', i)) {
        op = '=';
        len = 2;
      } else if (term[i] === '=') {
        op = '=';
        len = 1;
      }
      if (op) {
        idx = i;
        break;
      }
    }
    if (!op) throw errors.badRequest(`invalid selector: '${selector}'; can't understand '${term}'`);
    const field = term.slice(0, idx).trim();
    if (!field) throw errors.badRequest(`invalid selector: '${selector}'; can't understand '${term}'`);
    out.push({ field, op, value: unescapeFieldValue(term.slice(idx + len)) });
  }
  return out;
}

/** Reads a dotted path (`spec.runtime`, `.spec.runtime`) as the string a field selector compares. */
export function fieldValue(obj: unknown, path: string): string {
  let cur: unknown = obj;
  for (const part of path.replace(/^\./, '').split('.')) {
    if (cur === null || typeof cur !== 'object') return '';
    cur = (cur as Record<string, unknown>)[part];
  }
  if (cur === undefined || cur === null) return '';
  if (typeof cur === 'object') return JSON.stringify(cur);
  return String(cur);
}

/**
 * Field selectors Kubernetes serves for built-in kinds, by `group/resource`, mapping the
 * selector name to the object path it reads.
 */
const BUILTIN_FIELDS: Record<string, Record<string, string>> = {
  '/events': {
    'involvedObject.kind': 'involvedObject.kind',
    'involvedObject.namespace': 'involvedObject.namespace',
    'involvedObject.name': 'involvedObject.name',
    'involvedObject.uid': 'involvedObject.uid',
    'involvedObject.apiVersion': 'involvedObject.apiVersion',
    'involvedObject.resourceVersion': 'involvedObject.resourceVersion',
    'involvedObject.fieldPath': 'involvedObject.fieldPath',
    reason: 'reason',
    reportingComponent: 'reportingComponent',
    source: 'source.component',
    type: 'type',
  },
  '/secrets': { type: 'type' },
  '/namespaces': { 'status.phase': 'status.phase' },
};

/**
 * Compiles a field selector for one kind. Supported: metadata.name, metadata.namespace, the
 * kind's selectableFields and the built-in fields of core kinds. Throws 400 BadRequest for
 * a malformed selector or an unsupported field.
 */
export function compileFieldSelector(
  selector: string | undefined,
  kind: { group: string; plural: string; selectableFields?: string[] },
): { matcher: Matcher; requirements: FieldRequirement[] } {
  const reqs = parseFieldSelector(selector ?? '');
  const fields: Record<string, string> = {
    'metadata.name': 'metadata.name',
    'metadata.namespace': 'metadata.namespace',
    ...(BUILTIN_FIELDS[`${kind.group}/${kind.plural}`] ?? {}),
  };
  for (const f of kind.selectableFields ?? []) {
    const p = f.replace(/^\./, '');
    fields[p] = p;
  }
  const getters = reqs.map((r) => {
    const p = fields[r.field];
    if (!p) throw errors.badRequest(`field label not supported: ${r.field}`);
    return { ...r, path: p };
  });
  const matcher: Matcher = (obj) =>
    getters.every((g) => {
      const v = fieldValue(obj, g.path);
      return g.op === '=' ? v === g.value : v !== g.value;
    });
  return { matcher, requirements: reqs };
}

/** Compiles a label selector into a matcher on metadata.labels. Throws 400 when malformed. */
export function compileLabelSelector(selector: string | undefined): Matcher {
  const reqs = parseLabelSelector(selector ?? '');
  if (reqs.length === 0) return () => true;
  return (obj) => labelsMatch(reqs, obj.metadata?.labels);
}
