// The protobuf form of /openapi/v2: the gnostic `openapi.v2.Document` message that client-go's
// discovery asks for (Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf) and
// that `kubectl explain --output=plaintext-openapiv2` reads. Field numbers are those of
// gnostic's OpenAPIv2.proto. Encoded: the info, every definition (the schema keywords kube
// publishes, vendor extensions as YAML `Any`s, which is how kube-openapi reads
// x-kubernetes-group-version-kind) and the paths' operations without their parameters and
// responses (no client of this document reads those from the protobuf form). Pure.
import yaml from 'js-yaml';

export const OPENAPI_V2_PROTOBUF = 'application/com.github.proto-openapi.spec.v2@v1.0+protobuf';

/** A minimal protobuf writer: varints, length-delimited fields, doubles. */
class Writer {
  private readonly parts: Buffer[] = [];

  private varint(v: bigint | number): void {
    let n = BigInt.asUintN(64, BigInt(v));
    const bytes: number[] = [];
    do {
      let b = Number(n & 0x7fn);
      n >>= 7n;
      if (n) b |= 0x80;
      bytes.push(b);
    } while (n);
    this.parts.push(Buffer.from(bytes));
  }

  private tag(field: number, wire: number): void {
    this.varint((field << 3) | wire);
  }

  string(field: number, v: unknown): void {
    if (typeof v !== 'string' || v === '') return;
    this.bytes(field, Buffer.from(v, 'utf8'));
  }

  strings(field: number, v: unknown): void {
    if (Array.isArray(v)) for (const s of v) if (typeof s === 'string') this.bytes(field, Buffer.from(s, 'utf8'));
  }

  bytes(field: number, b: Buffer): void {
    this.tag(field, 2);
    this.varint(b.length);
    this.parts.push(b);
  }

  message(field: number, w: Writer): void {
    this.bytes(field, w.finish());
  }

  bool(field: number, v: unknown): void {
    if (v !== true) return;
    this.tag(field, 0);
    this.varint(1);
  }

  int(field: number, v: unknown): void {
    if (typeof v !== 'number' || !Number.isInteger(v) || v === 0) return;
    this.tag(field, 0);
    this.varint(v);
  }

  double(field: number, v: unknown): void {
    if (typeof v !== 'number') return;
    this.tag(field, 1);
    const b = Buffer.alloc(8);
    b.writeDoubleLE(v);
    this.parts.push(b);
  }

  finish(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** Any{yaml = 2}: a value as YAML text. */
function anyOf(v: unknown): Writer {
  const w = new Writer();
  w.string(2, yaml.dump(v, { noRefs: true }).trimEnd() || 'null');
  return w;
}

function vendorExtensions(w: Writer, field: number, o: Record<string, unknown>): void {
  for (const [k, v] of Object.entries(o)) {
    if (!k.startsWith('x-')) continue;
    const named = new Writer();
    named.string(1, k);
    named.message(2, anyOf(v));
    w.message(field, named);
  }
}

function schema(s: Record<string, unknown>): Writer {
  const w = new Writer();
  w.string(1, s.$ref);
  w.string(2, s.format);
  w.string(3, s.title);
  w.string(4, s.description);
  if (s.default !== undefined) w.message(5, anyOf(s.default));
  w.double(6, s.multipleOf);
  w.double(7, s.maximum);
  w.bool(8, s.exclusiveMaximum);
  w.double(9, s.minimum);
  w.bool(10, s.exclusiveMinimum);
  w.int(11, s.maxLength);
  w.int(12, s.minLength);
  w.string(13, s.pattern);
  w.int(14, s.maxItems);
  w.int(15, s.minItems);
  w.bool(16, s.uniqueItems);
  w.int(17, s.maxProperties);
  w.int(18, s.minProperties);
  w.strings(19, s.required);
  if (Array.isArray(s.enum)) for (const e of s.enum) w.message(20, anyOf(e));
  const ap = s.additionalProperties;
  if (ap !== undefined) {
    const item = new Writer();
    if (typeof ap === 'boolean') item.bool(2, ap);
    else if (ap && typeof ap === 'object') item.message(1, schema(ap as Record<string, unknown>));
    w.message(21, item);
  }
  if (s.type !== undefined) {
    const t = new Writer();
    t.strings(1, Array.isArray(s.type) ? s.type : [s.type]);
    w.message(22, t);
  }
  if (s.items && typeof s.items === 'object') {
    const items = new Writer();
    for (const it of Array.isArray(s.items) ? s.items : [s.items])
      items.message(1, schema(it as Record<string, unknown>));
    w.message(23, items);
  }
  if (Array.isArray(s.allOf)) for (const a of s.allOf) w.message(24, schema(a as Record<string, unknown>));
  if (s.properties && typeof s.properties === 'object') {
    const props = new Writer();
    for (const [name, sub] of Object.entries(s.properties as Record<string, unknown>)) {
      const named = new Writer();
      named.string(1, name);
      named.message(2, schema(sub as Record<string, unknown>));
      props.message(1, named);
    }
    w.message(25, props);
  }
  w.bool(27, s.readOnly);
  if (s.example !== undefined) w.message(30, anyOf(s.example));
  vendorExtensions(w, 31, s);
  return w;
}

const PATH_OPS: Record<string, number> = { get: 2, put: 3, post: 4, delete: 5, options: 6, head: 7, patch: 8 };

function operation(op: Record<string, unknown>): Writer {
  const w = new Writer();
  w.strings(1, op.tags);
  w.string(2, op.summary);
  w.string(3, op.description);
  w.string(5, op.operationId);
  w.strings(6, op.produces);
  w.strings(7, op.consumes);
  w.strings(10, op.schemes);
  vendorExtensions(w, 13, op);
  return w;
}

/** The Swagger 2.0 document (as swaggerFromV3 builds it) as an openapi.v2.Document message. */
export function encodeOpenAPIv2(doc: Record<string, unknown>): Buffer {
  const w = new Writer();
  w.string(1, doc.swagger);
  const info = (doc.info ?? {}) as Record<string, unknown>;
  const iw = new Writer();
  iw.string(1, info.title);
  iw.string(2, info.version);
  w.message(2, iw);
  const paths = new Writer();
  for (const [p, item] of Object.entries((doc.paths ?? {}) as Record<string, Record<string, unknown>>)) {
    const pi = new Writer();
    for (const [m, op] of Object.entries(item))
      if (PATH_OPS[m]) pi.message(PATH_OPS[m], operation(op as Record<string, unknown>));
    const named = new Writer();
    named.string(1, p);
    named.message(2, pi);
    paths.message(2, named);
  }
  w.message(8, paths);
  const defs = new Writer();
  for (const [name, s] of Object.entries((doc.definitions ?? {}) as Record<string, Record<string, unknown>>)) {
    const named = new Writer();
    named.string(1, name);
    named.message(2, schema(s));
    defs.message(1, named);
  }
  w.message(9, defs);
  return w.finish();
}
