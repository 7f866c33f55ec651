// A seeded fuzz of the API server over a real registry and SQLite store: random
// and adversarial bodies (alias bombs, depth bombs, patch amplification, wrong types, random
// JSON/YAML, garbage), query strings and headers against every resource, its collection,
// all-namespaces and /watch/ paths, the status and custom subresources; then raw sockets
// with hostile heads. It fails on any 5xx other than kube's 504 for a resourceVersion ahead
// of the store, on a non-Status error body, on a logged or counted server error, and when
// memory after the run has grown past a bound. Deterministic: the seed is printed.
import net from 'node:net';
import { expect } from 'chai';
import { allKinds } from '../../../apis/registry.js';
import type { KindDefinition, Schema } from '../../../apis/types.js';
import { MAX_DEPTH } from '../../../runtime/apiserver/limits.js';
import { sandbox, startFixture, type Fixture } from './http/fixture.js';
import { aliasBomb } from './hostile.js';
import { gc } from '../../support/gc.js';

/** mulberry32: small, fast, good enough for test input. */
function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n: number) => Math.floor(next() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)];
  return { next, int, pick, chance: (p: number) => next() < p };
}
type Rng = ReturnType<typeof prng>;

const WEIRD_VALUES: unknown[] = [
  { toString: 1 },
  { valueOf: {} },
  { __proto__: { polluted: true } },
  ['a', 'b'],
  [],
  {},
  null,
  7,
  -1,
  1e308,
  true,
  '',
  'x'.repeat(300),
  '\u0000\ud800',
  '../../etc/passwd',
  '9'.repeat(30),
];

const QUERY_VALUES = [
  '',
  'true',
  'True',
  'FALSE',
  '0',
  '1',
  'x',
  '-1',
  '18446744073709551615',
  '18446744073709551616',
  '99999999999999999999999',
  '1e3',
  '9007199254740993',
  'a in (b',
  'metadata.name=x',
  'spec.nope==1',
  '%00',
  'All',
  'Strict',
  'Foreground',
  'Sideways',
  'x'.repeat(5000),
];
const QUERY_NAMES = [
  'watch',
  'resourceVersion',
  'resourceVersionMatch',
  'labelSelector',
  'fieldSelector',
  'limit',
  'continue',
  'allowWatchBookmarks',
  'sendInitialEvents',
  'dryRun',
  'fieldManager',
  'fieldValidation',
  'force',
  'propagationPolicy',
  'gracePeriodSeconds',
  'orphanDependents',
  'includeObject',
  'pretty',
  'timeoutSeconds',
];

const CONTENT_TYPES = [
  'application/json',
  'application/yaml',
  'application/merge-patch+json',
  'application/json-patch+json',
  'application/apply-patch+yaml',
  'application/strategic-merge-patch+json',
  'application/vnd.kubernetes.protobuf',
  'text/plain',
  'application/json; charset=utf-16',
  '',
  ';;;',
];
const ACCEPTS = [
  'application/json',
  'application/json;as=Table;v=v1;g=meta.k8s.io',
  'application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io',
  'application/json;as=PartialObjectMetadata;v=v1beta1;g=meta.k8s.io',
  'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList',
  'application/vnd.kubernetes.protobuf',
  'text/html',
  '*/*;q=0',
  ';as=Table',
  'application/json;as=Table;v=v9;g=meta.k8s.io',
];

function randomJSON(r: Rng, depth = 0): unknown {
  const k = r.int(depth > 4 ? 4 : 7);
  switch (k) {
    case 0:
      return r.pick(WEIRD_VALUES);
    case 1:
      return r.int(1000) - 500;
    case 2:
      return r.pick(['a', 'spec', 'metadata', '', 'ünï']);
    case 3:
      return r.chance(0.5);
    case 4:
      return Array.from({ length: r.int(4) }, () => randomJSON(r, depth + 1));
    default: {
      const o: Record<string, unknown> = {};
      for (let i = r.int(5); i > 0; i--)
        o[r.pick(['apiVersion', 'kind', 'metadata', 'spec', 'status', 'name', 'labels', 'x', '$patch'])] = randomJSON(
          r,
          depth + 1,
        );
      return o;
    }
  }
}

/** The smallest value a schema accepts, roughly: required properties filled, first enum value, minimums. */
function minimal(s: Schema | undefined): unknown {
  if (!s) return 'x';
  if (s.enum?.length) return s.enum[0];
  switch (s.type) {
    case 'string':
      return 'x';
    case 'integer':
    case 'number':
      return s.minimum ?? 1;
    case 'boolean':
      return false;
    case 'array':
      return s.minItems ? [minimal(s.items)] : [];
    default: {
      const o: Record<string, unknown> = {};
      for (const k of s.required ?? []) if (k !== 'metadata') o[k] = minimal(s.properties?.[k]);
      return o;
    }
  }
}

/** A plausible object of the kind: what a client would send before it is mutated. */
function sampleOf(k: KindDefinition, name: string): Record<string, unknown> {
  const apiVersion = k.group ? `${k.group}/${k.version}` : k.version;
  if (k.kind === 'Sandbox') return { ...sandbox(name), metadata: { name } };
  return { ...(minimal(k.schema) as object), apiVersion, kind: k.kind, metadata: { name, labels: { a: 'b' } } };
}

/** Sets a random field (top level, metadata or spec) to a weird value. */
function mutate(r: Rng, o: Record<string, unknown>): Record<string, unknown> {
  const c = structuredClone(o) as Record<string, any>;
  for (let i = 1 + r.int(3); i > 0; i--) {
    const where = r.int(3);
    const v = r.pick(WEIRD_VALUES);
    if (where === 0) c[r.pick(['apiVersion', 'kind', 'metadata', 'spec', 'status'])] = v;
    else if (where === 1 && c.metadata && typeof c.metadata === 'object')
      c.metadata[
        r.pick([
          'name',
          'namespace',
          'generateName',
          'labels',
          'annotations',
          'finalizers',
          'ownerReferences',
          'resourceVersion',
          'uid',
          'managedFields',
          'generation',
          'deletionTimestamp',
        ])
      ] = v;
    else
      c.spec = {
        ...(typeof c.spec === 'object' && c.spec ? c.spec : {}),
        [r.pick(['image', 'runtime', 'x', 'ttlSeconds'])]: v,
      };
  }
  return c;
}

function nested(levels: number): string {
  return '{"a":'.repeat(levels) + '1' + '}'.repeat(levels);
}

/** A body and its content type; the kind's sample is the usual starting point. */
function body(r: Rng, k: KindDefinition, name: string, method: string): { payload: string | Buffer; type: string } {
  const sample = sampleOf(k, name);
  const json = (v: unknown) => JSON.stringify(v);
  switch (r.int(14)) {
    case 0:
      return { payload: aliasBomb(), type: r.pick(['application/yaml', 'application/apply-patch+yaml']) };
    case 1: {
      const deep = r.pick([MAX_DEPTH - 2, MAX_DEPTH, MAX_DEPTH + 1, 5000]);
      return {
        payload: `{"apiVersion":"${sample.apiVersion}","kind":"${k.kind}","metadata":{"name":"${name}"},"spec":${nested(deep)}}`,
        type: r.pick(CONTENT_TYPES.slice(0, 5)),
      };
    }
    case 2:
      return {
        payload: r.pick(['- ', '[', '{a: ']).repeat(r.pick([500, 1200, 20000])) + 'x',
        type: 'application/yaml',
      };
    case 3: {
      const ops: unknown[] = [{ op: 'add', path: '/spec/l', value: ['x'.repeat(1000)] }];
      for (let i = 0; i < 60; i++) ops.push({ op: 'copy', from: '/spec', path: `/spec/c${i}` });
      return { payload: json(ops), type: 'application/json-patch+json' };
    }
    case 4:
      return {
        payload: json(Array.from({ length: 10_001 }, () => ({ op: 'test', path: '/kind', value: k.kind }))),
        type: 'application/json-patch+json',
      };
    case 5:
      return {
        payload: json(
          Array.from({ length: 1 + r.int(4) }, () => ({
            op: r.pick(['add', 'remove', 'replace', 'move', 'copy', 'test', 'nope']),
            path: r.pick(['/kind', '/metadata/name', '/spec', '/metadata/labels/a', '', '/x/~2', '/-']),
            from: r.pick(['/spec', '/metadata', '', 7]),
            value: r.pick(WEIRD_VALUES),
          })),
        ),
        type: 'application/json-patch+json',
      };
    case 6:
    case 7:
      return {
        payload: json(mutate(r, sample)),
        type: r.pick(['application/json', 'application/apply-patch+yaml', 'application/merge-patch+json']),
      };
    case 8:
      return { payload: json(randomJSON(r)), type: r.pick(CONTENT_TYPES) };
    case 9:
      return {
        payload: Buffer.from(Array.from({ length: r.int(300) }, () => r.int(256))),
        type: r.pick(CONTENT_TYPES),
      };
    case 10:
      return { payload: '', type: r.pick(CONTENT_TYPES) };
    case 11:
      return {
        payload: `apiVersion: ${sample.apiVersion}\nkind: ${k.kind}\nmetadata:\n  name: ${name}\n  labels: &l {a: b}\n  annotations: *l\n`,
        type: 'application/yaml',
      };
    case 12:
      return {
        payload: json({ kind: 'DeleteOptions', apiVersion: 'v1', ...(randomJSON(r) as object) }),
        type: 'application/json',
      };
    default:
      return {
        payload: json(method === 'PATCH' ? { metadata: { labels: { x: r.pick(WEIRD_VALUES) } } } : sample),
        type: r.pick(CONTENT_TYPES.slice(0, 5)),
      };
  }
}

function path(r: Rng, k: KindDefinition, name: string): string {
  const root = k.group ? `/apis/${k.group}/${k.version}` : `/api/${k.version}`;
  const ns = k.namespaced
    ? r.pick([
        '/namespaces/default',
        '/namespaces/default',
        '/namespaces/default',
        '/namespaces/nope',
        '',
        '/namespaces/%2e%2e',
      ])
    : r.pick(['', '', '', '/namespaces/default']);
  const watch = r.chance(0.15) ? '/watch' : '';
  const subs = ['status', ...(k.customSubresources ?? []), ...Object.keys(k.fieldSubresources ?? {}), 'nosuch'];
  const n = r.pick([
    name,
    name,
    name,
    name,
    'missing',
    'UPPER',
    '%zz',
    encodeURIComponent('a/b'),
    'x'.repeat(300),
    '%00',
  ]);
  switch (r.int(4)) {
    case 0:
      return `${root}${watch}${ns}/${k.plural}`;
    case 1:
      return `${root}${watch}${ns}/${k.plural}/${n}`;
    case 2:
      return `${root}${watch}${ns}/${k.plural}/${n}/${r.pick(subs)}`;
    default:
      return r.pick([
        `${root}`,
        `${root}/${k.plural}/${n}/status/extra`,
        '/apis',
        '/api',
        '/openapi/v2',
        '/openapi/v3/apis/fluxvm.dev/v1alpha1',
        '/version',
        '/metrics',
        '/nope',
        `/apis/${k.group || 'x'}`,
      ]);
  }
}

function query(r: Rng): string {
  const parts: string[] = [];
  for (let i = r.int(4); i > 0; i--) {
    const name = r.pick(QUERY_NAMES);
    // A watch holds until its timeout: keep the fuzz's watches to the fixture's short hold.
    const value = name === 'timeoutSeconds' ? r.pick(['', '0', '-5', 'x']) : r.pick(QUERY_VALUES);
    parts.push(`${name}=${encodeURIComponent(value)}`);
  }
  if (r.chance(0.05)) parts.push('%zz=1');
  return parts.length ? `?${parts.join('&')}` : '';
}

/** kube's answer to a resourceVersion ahead of the store is a 504 (a plain one or an ERROR event in a 200 stream). */
function isTooLargeRV(code: number, b: string): boolean {
  if (code !== 504) return false;
  try {
    const s = JSON.parse(b);
    return s.reason === 'Timeout' && s.details?.causes?.[0]?.reason === 'ResourceVersionTooLarge';
  } catch {
    return false;
  }
}

describe('apiserver fuzz (seeded): no 5xx, no crash, Status bodies, bounded memory', function () {
  this.timeout(240_000);
  let f: Fixture;
  before(async () => {
    f = startFixture({ watchHoldSeconds: [0.02, 0.05] });
    await f.server.app.inject({
      method: 'POST',
      url: '/api/v1/namespaces',
      payload: JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'fuzz' } }),
      headers: { 'content-type': 'application/json' },
    });
  });
  after(() => f.close());

  it('every resource, subresource, verb, query and body shape', async () => {
    const seed = 1107;
    const r = prng(seed);
    console.log(`      seed ${seed}`);
    gc();
    const heap0 = process.memoryUsage().heapUsed;
    let maxRss = 0;
    const codes = new Map<number, number>();
    const failures: string[] = [];
    const seeded = new Map<string, number>();
    const N = 3000;
    for (const k of allKinds) {
      const base = k.group ? `/apis/${k.group}/${k.version}` : `/api/${k.version}`;
      await f.server.app.inject({
        method: 'POST',
        url: `${base}${k.namespaced ? '/namespaces/default' : ''}/${k.plural}`,
        payload: JSON.stringify(sampleOf(k, 'fz')),
        headers: { 'content-type': 'application/json' },
      });
    }
    for (let i = 0; i < N; i++) {
      const k = r.pick(allKinds);
      const name = r.pick(['fz', 'fz', `fz${r.int(5)}`]);
      // Keep a living object of the kind around to patch, update and delete.
      if (i % 50 === 0) {
        const base = k.group ? `/apis/${k.group}/${k.version}` : `/api/${k.version}`;
        const c = await f.server.app.inject({
          method: 'POST',
          url: `${base}${k.namespaced ? '/namespaces/default' : ''}/${k.plural}`,
          payload: JSON.stringify(sampleOf(k, name)),
          headers: { 'content-type': 'application/json' },
        });
        seeded.set(`${k.kind} ${c.statusCode}`, (seeded.get(`${k.kind} ${c.statusCode}`) ?? 0) + 1);
      }
      const method = r.pick(['GET', 'GET', 'POST', 'PUT', 'PATCH', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS']);
      const url = path(r, k, name) + query(r);
      const headers: Record<string, string> = {};
      if (r.chance(0.5)) headers.accept = r.pick(ACCEPTS);
      if (r.chance(0.05)) headers['if-none-match'] = r.pick(['*', '"x"', '']);
      let payload: string | Buffer | undefined;
      if (method !== 'GET' && method !== 'HEAD' && r.chance(0.9)) {
        const b = body(r, k, name, method);
        payload = b.payload;
        if (b.type) headers['content-type'] = b.type;
      }
      const res = await f.server.app.inject({
        method: method as 'GET',
        url,
        headers,
        ...(payload !== undefined ? { payload } : {}),
      });
      codes.set(res.statusCode, (codes.get(res.statusCode) ?? 0) + 1);
      const what = `#${i} ${method} ${url.slice(0, 200)} [${headers['content-type'] ?? ''}] ${String(payload ?? '').slice(0, 120)}`;
      if (res.statusCode >= 500 && !isTooLargeRV(res.statusCode, res.body))
        failures.push(`${res.statusCode} ${what}: ${res.body.slice(0, 300)}`);
      else if (res.statusCode >= 400 && method !== 'HEAD') {
        let s: any;
        try {
          s = JSON.parse(res.body);
        } catch {
          s = undefined;
        }
        if (s?.kind !== 'Status' || s.code !== res.statusCode)
          failures.push(`non-Status ${res.statusCode} body ${what}: ${res.body.slice(0, 200)}`);
      }
      // Watch streams carry errors as events: a 5xx there other than kube's 504 is a failure too.
      if (res.statusCode === 200 && res.body.includes('"type":"ERROR"')) {
        for (const line of res.body.split('\n').filter((l) => l.includes('"type":"ERROR"'))) {
          const ev = JSON.parse(line);
          if (ev.object.code >= 500 && !isTooLargeRV(ev.object.code, JSON.stringify(ev.object)))
            failures.push(`ERROR event ${ev.object.code} ${what}`);
        }
      }
      if (i % 100 === 0) maxRss = Math.max(maxRss, process.memoryUsage().rss);
      if (failures.length > 20) break;
    }
    await f.store.idle();
    gc();
    const grown = process.memoryUsage().heapUsed - heap0;
    console.log(
      `      ${N} requests; codes ${JSON.stringify(Object.fromEntries([...codes].sort((a, b) => a[0] - b[0])))}; heap grew ${(grown / 2 ** 20).toFixed(1)} MiB; max rss ${(maxRss / 2 ** 20).toFixed(0)} MiB`,
    );
    console.log(`      seeded objects (kind code: times): ${JSON.stringify(Object.fromEntries(seeded))}`);
    expect(failures, failures.join('\n')).to.deep.equal([]);
    expect(f.errorsLogged, f.errorsLogged.join('\n')).to.deep.equal([]);
    expect(f.server.metrics.unexpectedErrors).to.equal(0);
    // Bounded: the registry keeps a few objects; bombs and amplification leave nothing behind.
    expect(grown).to.be.below(128 * 2 ** 20);
    expect(maxRss).to.be.below(2 * 2 ** 30);
  });

  it('hostile heads on raw sockets: Upgrade, Connection, Expect, Transfer-Encoding, lengths, huge headers', async () => {
    const { port } = await f.server.listen('127.0.0.1', 0);
    const r = prng(4242);
    const failures: string[] = [];
    const paths = [
      '/healthz',
      '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes',
      '/api/v1/namespaces/default/secrets/fz',
      '/nope',
      '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/fz/exec',
      '*',
      '/%zz',
    ];
    for (let i = 0; i < 300; i++) {
      const lines = [
        `${r.pick(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'CONNECT', 'BREW', 'GET'])} ${r.pick(paths)} ${r.pick(['HTTP/1.1', 'HTTP/1.1', 'HTTP/1.0', 'HTTP/9'])}`,
        'Host: x',
      ];
      if (r.chance(0.4))
        lines.push(`Connection: ${r.pick(['Upgrade', 'close', 'keep-alive, Upgrade', 'upgrade, upgrade', ''])}`);
      if (r.chance(0.4)) lines.push(`Upgrade: ${r.pick(['websocket', 'h2c', 'SPDY/3.1', '', 'x'.repeat(100)])}`);
      if (r.chance(0.2)) lines.push(`Expect: ${r.pick(['100-continue', 'nope', ''])}`);
      if (r.chance(0.2)) lines.push(`Transfer-Encoding: ${r.pick(['chunked', 'gzip', 'chunked, chunked', 'x'])}`);
      if (r.chance(0.3)) lines.push(`Content-Length: ${r.pick(['0', '2', '-1', 'x', '99999999999', '2, 3'])}`);
      if (r.chance(0.1)) lines.push(`X-Big: ${'a'.repeat(r.pick([100, 20_000]))}`);
      if (r.chance(0.2)) lines.push(`Content-Type: ${r.pick(CONTENT_TYPES)}`);
      lines.push('Connection: close');
      const req = lines.join('\r\n') + '\r\n\r\n' + r.pick(['', '{}', '0\r\n\r\n', 'garbage']);
      const res = await new Promise<string>((resolve) => {
        const s = net.connect(port, '127.0.0.1');
        let buf = '';
        s.setEncoding('utf8');
        s.on('data', (d: string) => (buf += d));
        s.on('error', () => undefined);
        s.on('close', () => resolve(buf));
        // A request the server waits on (a body that never comes) ends when the client closes its side.
        s.end(req);
      });
      const code = Number(res.split(' ')[1] ?? 0);
      if (code >= 500) failures.push(`${code}: ${req.slice(0, 200)}`);
      if (code >= 400) {
        const b = res.slice(res.indexOf('\r\n\r\n') + 4);
        if (!b.includes('"kind":"Status"'))
          failures.push(`non-Status ${code}: ${req.slice(0, 200)} -> ${res.slice(0, 200)}`);
      }
    }
    expect(failures, failures.join('\n')).to.deep.equal([]);
    expect(f.errorsLogged, f.errorsLogged.join('\n')).to.deep.equal([]);
    expect(f.server.metrics.unexpectedErrors).to.equal(0);
  });
});
