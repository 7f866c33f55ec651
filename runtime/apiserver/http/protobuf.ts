// Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) for
// the built-in kinds kubectl writes with its typed clients: `kubectl create namespace` and
// `kubectl create secret` POST protobuf, not JSON. Only request decoding: responses are JSON,
// which kubectl accepts. Envelope: the magic "k8s\0", then a runtime.Unknown message
// {1: typeMeta {1: apiVersion, 2: kind}, 2: raw, 3: contentEncoding, 4: contentType}; the
// field numbers below are those of k8s.io/api generated.proto.
import { errors } from '../../meta/errors.js';

const MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]);

interface Field {
  no: number;
  wire: number;
  /** varint / fixed value (as a number: fine for every field we read) */
  num?: number;
  bytes?: Buffer;
}

function readVarint(buf: Buffer, pos: number): [number, number] {
  let result = 0;
  let mul = 1;
  for (let i = 0; i < 10; i++) {
    if (pos >= buf.length) throw new Error('truncated varint');
    const b = buf[pos++];
    result += (b & 0x7f) * mul;
    if ((b & 0x80) === 0) return [result, pos];
    mul *= 128;
  }
  throw new Error('varint too long');
}

function fields(buf: Buffer): Field[] {
  const out: Field[] = [];
  let pos = 0;
  while (pos < buf.length) {
    let key: number;
    [key, pos] = readVarint(buf, pos);
    const no = Math.floor(key / 8);
    const wire = key & 7;
    switch (wire) {
      case 0: {
        let v: number;
        [v, pos] = readVarint(buf, pos);
        out.push({ no, wire, num: v });
        break;
      }
      case 1:
        if (pos + 8 > buf.length) throw new Error('truncated fixed64');
        out.push({ no, wire, num: Number(buf.readBigInt64LE(pos)) });
        pos += 8;
        break;
      case 2: {
        let len: number;
        [len, pos] = readVarint(buf, pos);
        if (pos + len > buf.length) throw new Error('truncated bytes');
        out.push({ no, wire, bytes: buf.subarray(pos, pos + len) });
        pos += len;
        break;
      }
      case 5:
        if (pos + 4 > buf.length) throw new Error('truncated fixed32');
        out.push({ no, wire, num: buf.readInt32LE(pos) });
        pos += 4;
        break;
      default:
        throw new Error(`unsupported wire type ${wire}`);
    }
  }
  return out;
}

const str = (f: Field) => (f.bytes ?? Buffer.alloc(0)).toString('utf8');

function time(b: Buffer): string {
  let seconds = 0;
  for (const f of fields(b)) if (f.no === 1) seconds = f.num ?? 0;
  return new Date(seconds * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

function map(entries: Field[], value: (f: Field) => unknown = str): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const e of entries) {
    let k = '';
    let v: unknown = value({ no: 2, wire: 2, bytes: Buffer.alloc(0) });
    for (const f of fields(e.bytes!)) {
      if (f.no === 1) k = str(f);
      else if (f.no === 2) v = value(f);
    }
    out[k] = v;
  }
  return out;
}

function objectMeta(b: Buffer): Record<string, unknown> {
  const m: Record<string, unknown> = {};
  const labels: Field[] = [];
  const annotations: Field[] = [];
  const finalizers: string[] = [];
  const owners: Record<string, unknown>[] = [];
  const managed: Record<string, unknown>[] = [];
  for (const f of fields(b)) {
    switch (f.no) {
      case 1:
        m.name = str(f);
        break;
      case 2:
        m.generateName = str(f);
        break;
      case 3:
        m.namespace = str(f);
        break;
      case 5:
        m.uid = str(f);
        break;
      case 6:
        m.resourceVersion = str(f);
        break;
      case 7:
        m.generation = f.num;
        break;
      case 8:
        m.creationTimestamp = time(f.bytes!);
        break;
      case 9:
        m.deletionTimestamp = time(f.bytes!);
        break;
      case 10:
        m.deletionGracePeriodSeconds = f.num;
        break;
      case 11:
        labels.push(f);
        break;
      case 12:
        annotations.push(f);
        break;
      case 13:
        owners.push(ownerReference(f.bytes!));
        break;
      case 14:
        finalizers.push(str(f));
        break;
      case 17:
        managed.push(managedFields(f.bytes!));
        break;
    }
  }
  for (const k of Object.keys(m)) if (m[k] === '') delete m[k];
  if (labels.length) m.labels = map(labels);
  if (annotations.length) m.annotations = map(annotations);
  if (finalizers.length) m.finalizers = finalizers;
  if (owners.length) m.ownerReferences = owners;
  if (managed.length) m.managedFields = managed;
  return m;
}

function ownerReference(b: Buffer): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const f of fields(b)) {
    if (f.no === 1) o.kind = str(f);
    else if (f.no === 3) o.name = str(f);
    else if (f.no === 4) o.uid = str(f);
    else if (f.no === 5) o.apiVersion = str(f);
    else if (f.no === 6) o.controller = f.num === 1;
    else if (f.no === 7) o.blockOwnerDeletion = f.num === 1;
  }
  return o;
}

function managedFields(b: Buffer): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const f of fields(b)) {
    if (f.no === 1) o.manager = str(f);
    else if (f.no === 2) o.operation = str(f);
    else if (f.no === 3) o.apiVersion = str(f);
    else if (f.no === 4) o.time = time(f.bytes!);
    else if (f.no === 6) o.fieldsType = str(f);
    else if (f.no === 7) {
      for (const r of fields(f.bytes!)) if (r.no === 1) o.fieldsV1 = JSON.parse(str(r));
    } else if (f.no === 8) o.subresource = str(f);
  }
  return o;
}

function strings(b: Buffer, no: number): string[] {
  return fields(b)
    .filter((f) => f.no === no)
    .map(str);
}

/** Per kind: the message fields other than metadata (field 1). */
const KINDS: Record<string, (fs: Field[], obj: Record<string, unknown>) => void> = {
  'v1/Namespace': (fs, obj) => {
    for (const f of fs) {
      if (f.no === 2) obj.spec = { finalizers: strings(f.bytes!, 1) };
      else if (f.no === 3) obj.status = { phase: strings(f.bytes!, 1)[0] };
    }
  },
  'v1/Secret': (fs, obj) => {
    const data = fs.filter((f) => f.no === 2);
    const stringData = fs.filter((f) => f.no === 4);
    if (data.length) obj.data = map(data, (f) => (f.bytes ?? Buffer.alloc(0)).toString('base64'));
    if (stringData.length) obj.stringData = map(stringData);
    for (const f of fs) {
      if (f.no === 3) obj.type = str(f);
      else if (f.no === 5) obj.immutable = f.num === 1;
    }
  },
};

// core/v1 ResourceQuota (`kubectl create quota` sends protobuf): spec {1: hard map<string,
// Quantity {1: string}>, 2: scopes, 3: scopeSelector}, status {1: hard, 2: used}.
const quantity = (f: Field) => strings(f.bytes ?? Buffer.alloc(0), 1)[0] ?? '0';
const resourceList = (b: Buffer, no: number) =>
  map(
    fields(b).filter((f) => f.no === no),
    quantity,
  );
KINDS['v1/ResourceQuota'] = (fs, obj) => {
  for (const f of fs) {
    if (f.no === 2) {
      const spec: Record<string, unknown> = { hard: resourceList(f.bytes!, 1) };
      const scopes = strings(f.bytes!, 2);
      if (scopes.length) spec.scopes = scopes;
      for (const sel of fields(f.bytes!).filter((x) => x.no === 3)) {
        const req = fields(sel.bytes!).filter((x) => x.no === 1);
        spec.scopeSelector = {
          matchExpressions: req.map((r) => ({
            scopeName: strings(r.bytes!, 1)[0] ?? '',
            operator: strings(r.bytes!, 2)[0] ?? '',
            values: strings(r.bytes!, 3),
          })),
        };
      }
      obj.spec = spec;
    } else if (f.no === 3) obj.status = { hard: resourceList(f.bytes!, 1), used: resourceList(f.bytes!, 2) };
  }
};

// rbac.authorization.k8s.io/v1 and the review kinds (kubectl create role|rolebinding and
// kubectl auth send these as protobuf); field numbers from their generated.proto.
function policyRule(b: Buffer): Record<string, unknown> {
  const r: Record<string, unknown> = {};
  const names = ['', 'verbs', 'apiGroups', 'resources', 'resourceNames', 'nonResourceURLs'];
  for (let no = 1; no <= 5; no++) {
    const v = strings(b, no);
    if (v.length) r[names[no]] = v;
  }
  return r;
}

function subject(b: Buffer): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const f of fields(b)) {
    const k = ['', 'kind', 'apiGroup', 'name', 'namespace'][f.no];
    if (k && str(f) !== '') o[k] = str(f);
  }
  return o;
}

function roleRef(b: Buffer): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const f of fields(b)) {
    const k = ['', 'apiGroup', 'kind', 'name'][f.no];
    if (k) o[k] = str(f);
  }
  return o;
}

function resourceAttributes(b: Buffer): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const f of fields(b)) {
    const k = ['', 'namespace', 'verb', 'group', 'version', 'resource', 'subresource', 'name'][f.no];
    if (k && str(f) !== '') o[k] = str(f);
  }
  return o;
}

function nonResourceAttributes(b: Buffer): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const f of fields(b)) {
    const k = ['', 'path', 'verb'][f.no];
    if (k && str(f) !== '') o[k] = str(f);
  }
  return o;
}

function accessSpec(b: Buffer): Record<string, unknown> {
  const spec: Record<string, unknown> = {};
  const groups: string[] = [];
  for (const f of fields(b)) {
    if (f.no === 1) spec.resourceAttributes = resourceAttributes(f.bytes!);
    else if (f.no === 2) spec.nonResourceAttributes = nonResourceAttributes(f.bytes!);
    else if (f.no === 3) spec.user = str(f);
    else if (f.no === 4) groups.push(str(f));
    else if (f.no === 6) spec.uid = str(f);
  }
  if (groups.length) spec.groups = groups;
  return spec;
}

const roleKind = (fs: Field[], obj: Record<string, unknown>) => {
  const rules = fs.filter((f) => f.no === 2).map((f) => policyRule(f.bytes!));
  if (rules.length) obj.rules = rules;
};
const bindingKind = (fs: Field[], obj: Record<string, unknown>) => {
  const subjects = fs.filter((f) => f.no === 2).map((f) => subject(f.bytes!));
  if (subjects.length) obj.subjects = subjects;
  for (const f of fs) if (f.no === 3) obj.roleRef = roleRef(f.bytes!);
};
KINDS['rbac.authorization.k8s.io/v1/Role'] = roleKind;
KINDS['rbac.authorization.k8s.io/v1/ClusterRole'] = roleKind;
KINDS['rbac.authorization.k8s.io/v1/RoleBinding'] = bindingKind;
KINDS['rbac.authorization.k8s.io/v1/ClusterRoleBinding'] = bindingKind;
KINDS['authentication.k8s.io/v1/SelfSubjectReview'] = () => undefined;
KINDS['authorization.k8s.io/v1/SelfSubjectAccessReview'] = (fs, obj) => {
  for (const f of fs) if (f.no === 2) obj.spec = accessSpec(f.bytes!);
};
KINDS['authorization.k8s.io/v1/SubjectAccessReview'] = KINDS['authorization.k8s.io/v1/SelfSubjectAccessReview'];
KINDS['authorization.k8s.io/v1/SelfSubjectRulesReview'] = (fs, obj) => {
  for (const f of fs) if (f.no === 2) obj.spec = { namespace: strings(f.bytes!, 1)[0] ?? '' };
};

export const PROTOBUF = 'application/vnd.kubernetes.protobuf';

/**
 * Decodes a protobuf-encoded built-in kind (KINDS) into its JSON form. Any other kind is a 415
 * (send JSON); a malformed body is a 400.
 */
export function decodeProtobuf(body: Buffer | undefined): Record<string, unknown> {
  if (!body || body.length < 4 || !body.subarray(0, 4).equals(MAGIC)) {
    throw errors.badRequest('protobuf body does not start with the Kubernetes magic number');
  }
  let apiVersion = '';
  let kind = '';
  let raw: Buffer | undefined;
  try {
    for (const f of fields(body.subarray(4))) {
      if (f.no === 1) {
        for (const t of fields(f.bytes!)) {
          if (t.no === 1) apiVersion = str(t);
          else if (t.no === 2) kind = str(t);
        }
      } else if (f.no === 2) raw = f.bytes;
      else if (f.no === 3 && str(f) !== '') throw errors.unsupportedMediaType(`unsupported content encoding ${str(f)}`);
    }
    const decode = KINDS[`${apiVersion}/${kind}`];
    if (!decode) {
      throw errors.unsupportedMediaType(
        `protobuf is not supported for ${apiVersion}, Kind=${kind}: the body of the request was in an unknown format - accepted media types include: application/json, application/yaml`,
      );
    }
    const obj: Record<string, unknown> = { apiVersion, kind, metadata: {} };
    const fs = fields(raw ?? Buffer.alloc(0));
    for (const f of fs) if (f.no === 1) obj.metadata = objectMeta(f.bytes!);
    decode(fs, obj);
    return obj;
  } catch (e) {
    if (e instanceof Error && e.name === 'StatusError') throw e;
    throw errors.badRequest(`protobuf decoding error: ${(e as Error).message}`);
  }
}
