import { expect } from 'chai';
import { decodeProtobuf } from '../../../../runtime/apiserver/http/protobuf.js';
import { decodeBody, patchTypeOf, strategicToMerge } from '../../../../runtime/apiserver/http/negotiate.js';

// A tiny protobuf writer, enough to build the bodies kubectl's typed clients send.
const varint = (n: number): Buffer => {
  const out: number[] = [];
  do {
    let b = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) b |= 0x80;
    out.push(b);
  } while (n > 0);
  return Buffer.from(out);
};
const bytes = (no: number, b: Buffer | string) => {
  const buf = typeof b === 'string' ? Buffer.from(b) : b;
  return Buffer.concat([varint(no * 8 + 2), varint(buf.length), buf]);
};
const num = (no: number, n: number) => Buffer.concat([varint(no * 8), varint(n)]);
const entry = (no: number, k: string, v: Buffer | string) => bytes(no, Buffer.concat([bytes(1, k), bytes(2, v)]));
const envelope = (apiVersion: string, kind: string, raw: Buffer) =>
  Buffer.concat([
    Buffer.from([0x6b, 0x38, 0x73, 0]),
    bytes(1, Buffer.concat([bytes(1, apiVersion), bytes(2, kind)])),
    bytes(2, raw),
  ]);

describe('apiserver/http protobuf and strategic merge for core kinds', () => {
  it('decodes a Namespace as kubectl create namespace sends it', () => {
    const meta = Buffer.concat([bytes(1, 'team-a'), entry(11, 'tier', 'gold'), bytes(14, 'example.com/f'), num(7, 3)]);
    const ns = Buffer.concat([bytes(1, meta), bytes(2, bytes(1, 'kubernetes'))]);
    expect(decodeProtobuf(envelope('v1', 'Namespace', ns))).to.deep.equal({
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: 'team-a', generation: 3, labels: { tier: 'gold' }, finalizers: ['example.com/f'] },
      spec: { finalizers: ['kubernetes'] },
    });
  });

  it('decodes a Secret with binary data, stringData and type', () => {
    const secret = Buffer.concat([
      bytes(1, Buffer.concat([bytes(1, 'token'), bytes(3, 'team-a')])),
      entry(2, 'key', Buffer.from([0, 1, 255])),
      entry(4, 'plain', 'text'),
      bytes(3, 'Opaque'),
      num(5, 1),
    ]);
    const body = decodeBody('application/vnd.kubernetes.protobuf', envelope('v1', 'Secret', secret));
    expect(body).to.deep.equal({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'token', namespace: 'team-a' },
      data: { key: Buffer.from([0, 1, 255]).toString('base64') },
      stringData: { plain: 'text' },
      type: 'Opaque',
      immutable: true,
    });
  });

  it('refuses other kinds with 415 and garbage with 400', () => {
    expect(() => decodeProtobuf(envelope('v1', 'Pod', Buffer.alloc(0))))
      .to.throw()
      .with.property('code', 415);
    expect(() => decodeProtobuf(Buffer.from('{"kind":"Namespace"}')))
      .to.throw()
      .with.property('code', 400);
    expect(() => decodeProtobuf(Buffer.concat([Buffer.from([0x6b, 0x38, 0x73, 0]), Buffer.from([0x0a, 0x50])])))
      .to.throw()
      .with.property('code', 400);
  });

  it('takes strategic merge patches only for built-in kinds, rewritten as merge patches', () => {
    expect(() => patchTypeOf('application/strategic-merge-patch+json'))
      .to.throw()
      .with.property('code', 415);
    expect(patchTypeOf('application/strategic-merge-patch+json', true)).to.equal('strategic');
    expect(patchTypeOf('application/merge-patch+json; charset=utf-8')).to.equal('merge');
    expect(
      strategicToMerge({
        metadata: { labels: { a: 'b' }, '$setElementOrder/finalizers': [{}] },
        data: { $patch: 'delete' },
        spec: { $retainKeys: ['x'], x: 1, list: [{ name: 'a' }, { name: 'b', $patch: 'delete' }] },
      }),
    ).to.deep.equal({ metadata: { labels: { a: 'b' } }, data: null, spec: { x: 1, list: [{ name: 'a' }] } });
  });
});
