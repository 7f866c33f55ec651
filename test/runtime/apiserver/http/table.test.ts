import { expect } from 'chai';
import { compileJSONPath, jsonPathCounts } from '../../../../runtime/apiserver/http/jsonpath.js';
import { CHUNK_CHARS, jsonOf, listJSON, listJSONChunks } from '../../../../runtime/apiserver/http/encode.js';
import { humanDuration, TableConvertor, tableCounts } from '../../../../runtime/apiserver/http/table.js';

describe('apiserver/http table', () => {
  it('renders ages like kube duration.HumanDuration', () => {
    const s = 1000;
    const cases: Array<[number, string]> = [
      [-3 * s, '<invalid>'],
      [-1 * s, '0s'],
      [0, '0s'],
      [19 * s, '19s'],
      [119 * s, '119s'],
      [120 * s, '2m'],
      [303 * s, '5m3s'],
      [12 * 60 * s, '12m'],
      [179 * 60 * s, '179m'],
      [3 * 3600 * s + 20 * 60 * s, '3h20m'],
      [5 * 3600 * s, '5h'],
      [10 * 3600 * s, '10h'],
      [53 * 3600 * s, '2d5h'],
      [48 * 3600 * s, '2d'],
      [40 * 24 * 3600 * s, '40d'],
      [(2 * 365 + 10) * 24 * 3600 * s, '2y10d'],
      [9 * 365 * 24 * 3600 * s, '9y'],
    ];
    for (const [ms, want] of cases) expect(humanDuration(ms), `${ms}ms`).to.equal(want);
  });

  it('evaluates the JSONPath subset printer columns use', () => {
    const obj = {
      metadata: { name: 'a', labels: { 'app.kubernetes.io/name': 'x' } },
      status: {
        conditions: [
          { type: 'Ready', status: 'True' },
          { type: 'Conflict', status: 'False' },
        ],
        n: 0,
      },
      spec: { argv: ['sh', '-c'] },
    };
    expect(compileJSONPath('.metadata.name').eval(obj)).to.deep.equal(['a']);
    expect(compileJSONPath('{.metadata.name}').eval(obj)).to.deep.equal(['a']);
    expect(compileJSONPath(".metadata.labels['app.kubernetes.io/name']").eval(obj)).to.deep.equal(['x']);
    expect(compileJSONPath('.status.conditions[?(@.type=="Ready")].status').eval(obj)).to.deep.equal(['True']);
    expect(compileJSONPath('.status.conditions[*].type').eval(obj)).to.deep.equal(['Ready', 'Conflict']);
    expect(compileJSONPath('.spec.argv[1]').eval(obj)).to.deep.equal(['-c']);
    expect(compileJSONPath('.spec.argv[-1]').eval(obj)).to.deep.equal(['-c']);
    expect(compileJSONPath('.status.n').eval(obj)).to.deep.equal([0]);
    expect(compileJSONPath('.status.missing.deeper').eval(obj)).to.deep.equal([]);
    expect(compileJSONPath('.status.n').first(obj)).to.equal(0);
    expect(compileJSONPath('.status.missing.deeper').first(obj)).to.equal(undefined);
    expect(compileJSONPath('.status.conditions[?(@.type=="Conflict")].status').first(obj)).to.equal('False');
    expect(() => compileJSONPath('.a[?(@.x~1)]')).to.throw(/invalid JSONPath/);
  });

  it('builds rows with an implicit Name column, typed cells, null for absent values', () => {
    const now = Date.parse('2026-01-01T00:10:00Z');
    const tc = new TableConvertor(
      {
        printerColumns: [
          { name: 'Phase', type: 'string', jsonPath: '.status.phase' },
          { name: 'CPUs', type: 'integer', jsonPath: '.spec.cpus', priority: 1 },
          { name: 'Paused', type: 'boolean', jsonPath: '.spec.paused' },
          { name: 'Ready', type: 'string', jsonPath: '.status.conditions[?(@.type=="Ready")].status' },
          { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' },
        ],
      },
      () => now,
    );
    const obj = {
      apiVersion: 'x/v1',
      kind: 'X',
      metadata: { name: 'demo', creationTimestamp: '2026-01-01T00:09:41Z', resourceVersion: '7' },
      spec: { cpus: 2.0, paused: false },
    };
    const t = tc.table([obj], { include: 'Metadata', metaVersion: 'v1', listMeta: { resourceVersion: '9' } });
    expect(t.kind).to.equal('Table');
    expect(t.apiVersion).to.equal('meta.k8s.io/v1');
    expect(t.metadata).to.deep.equal({ resourceVersion: '9' });
    expect(t.columnDefinitions!.map((c) => [c.name, c.type, c.format, c.priority])).to.deep.equal([
      ['Name', 'string', 'name', 0],
      ['Phase', 'string', '', 0],
      ['CPUs', 'integer', '', 1],
      ['Paused', 'boolean', '', 0],
      ['Ready', 'string', '', 0],
      ['Age', 'date', '', 0],
    ]);
    expect(t.rows[0].cells).to.deep.equal(['demo', null, 2, false, null, '19s']);
    expect(t.rows[0].object).to.deep.equal({
      kind: 'PartialObjectMetadata',
      apiVersion: 'meta.k8s.io/v1',
      metadata: obj.metadata,
    });
    expect(tc.table([obj], { include: 'Object', metaVersion: 'v1beta1' }).rows[0].object).to.equal(obj);
    expect(tc.table([obj], { include: 'None', metaVersion: 'v1' }).rows[0].object).to.equal(null);
    expect(tc.table([obj], { include: 'None', metaVersion: 'v1', headers: false }).columnDefinitions).to.equal(null);
  });

  it('defaults to Name and Age when a kind declares no columns', () => {
    const tc = new TableConvertor({ printerColumns: [] });
    expect(tc.columnDefinitions.map((c) => c.name)).to.deep.equal(['Name', 'Age']);
  });

  it('serializes Tables and lists to exactly the bytes JSON.stringify gives, frozen or not', () => {
    const tc = new TableConvertor(
      { printerColumns: [{ name: 'Phase', type: 'string', jsonPath: '.status.phase' }] },
      () => 0,
    );
    const mk = (name: string) => ({
      apiVersion: 'x/v1',
      kind: 'X',
      metadata: { name, creationTimestamp: '1970-01-01T00:00:00Z', labels: { 'a"b': 'c\\d' } },
      status: { phase: 'Up' },
    });
    const frozen = Object.freeze({ ...mk('f'), metadata: Object.freeze(mk('f').metadata) });
    const objs = [mk('a'), frozen, { apiVersion: 'x/v1', kind: 'X' } as any];
    for (const include of ['Metadata', 'Object', 'None'] as const) {
      for (const headers of [true, false]) {
        const opts = { include, metaVersion: 'v1beta1', listMeta: { resourceVersion: '5', continue: 'tok' }, headers };
        expect(tc.tableJSON(objs, opts), `${include} ${headers}`).to.equal(JSON.stringify(tc.table(objs, opts)));
        expect(tc.tableJSON(objs, opts), 'cached').to.equal(JSON.stringify(tc.table(objs, opts)));
      }
    }
    const list = { apiVersion: 'x/v1', kind: 'XList', metadata: { resourceVersion: '9' }, items: objs };
    expect(listJSON(list)).to.equal(JSON.stringify(list));
    expect(jsonOf(frozen)).to.equal(JSON.stringify(frozen));
    expect(jsonOf(undefined)).to.equal('null');
  });

  it('streams large lists and Tables in chunks that join to the same bytes', () => {
    const tc = new TableConvertor(
      { printerColumns: [{ name: 'Phase', type: 'string', jsonPath: '.status.phase' }] },
      () => 0,
    );
    const objs = Array.from({ length: 3000 }, (_, i) => ({
      apiVersion: 'x/v1',
      kind: 'X',
      metadata: { name: `o-${i}`, labels: { i: String(i) } },
      status: { phase: i % 2 ? 'Up' : 'Down' },
    }));
    for (const items of [objs, objs.slice(0, 1), []]) {
      const chunks = [...tc.tableChunks(items, { include: 'Metadata', metaVersion: 'v1' })];
      expect(chunks.join('')).to.equal(JSON.stringify(tc.table(items, { include: 'Metadata', metaVersion: 'v1' })));
      if (items.length > 1) expect(chunks.length).to.be.greaterThan(1);
      for (const c of chunks.slice(0, -1)) expect(c.length).to.be.within(CHUNK_CHARS, CHUNK_CHARS + 1024);
      // items before, after or without other fields
      for (const list of [
        { apiVersion: 'x/v1', kind: 'XList', metadata: { resourceVersion: '9', continue: 'c' }, items },
        { items, metadata: { resourceVersion: '9' }, kind: 'XList' },
        { kind: 'XList', items: undefined, metadata: {} },
      ]) {
        const parts = [...listJSONChunks(list)];
        expect(parts.join('')).to.equal(JSON.stringify(list));
        expect(parts.join('')).to.equal(listJSON(list));
      }
    }
  });
  it('compiles its JSONPaths once per kind, parses each distinct timestamp once per Table, and ages follow the clock', () => {
    let clock = Date.parse('2026-01-01T00:00:00Z');
    const c0 = jsonPathCounts.compiles;
    const tc = new TableConvertor(
      {
        printerColumns: [
          { name: 'Phase', type: 'string', jsonPath: '.status.phase' },
          { name: 'Ready', type: 'boolean', jsonPath: '.status.ready' },
          { name: 'Count', type: 'integer', jsonPath: '.status.count' },
          { name: 'Spec', type: 'string', jsonPath: '.spec' },
          { name: 'Expires', type: 'date', jsonPath: '.status.expiresAt' },
          { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' },
        ],
      },
      () => clock,
    );
    expect(jsonPathCounts.compiles - c0, 'compiled at construction').to.equal(6);
    const deepFreeze = <T>(o: T): T => {
      for (const v of Object.values(o as object)) if (v && typeof v === 'object') deepFreeze(v);
      return Object.freeze(o);
    };
    const objs = Array.from({ length: 100 }, (_, i) =>
      deepFreeze({
        apiVersion: 'x/v1',
        kind: 'X',
        // ten creation seconds among the 100 (objects created together share one)
        metadata: {
          name: `o-${i}`,
          creationTimestamp: new Date(clock - Math.floor(i / 10) * 1000).toISOString().replace('.000', ''),
        },
        spec: i % 3 ? { a: `"${i}"` } : undefined,
        status: {
          phase: i % 2 ? 'Up' : 'Down\n',
          ready: i % 2 === 0,
          count: i + 0.5,
          expiresAt: i % 4 === 0 ? 'not a time' : i % 4 === 1 ? 7 : i % 4 === 2 ? null : '2025-12-31T00:00:00Z',
        },
      }),
    );
    const opts = { include: 'Metadata' as const, metaVersion: 'v1' };
    const e0 = jsonPathCounts.evaluations;
    const d0 = tableCounts.dateParses;
    const first = [...tc.tableChunks(objs, opts)].join('');
    expect(jsonPathCounts.evaluations - e0, 'each path once per row').to.equal(100 * 6);
    // 10 creation times, 'not a time' and one past instant among the expiries (7 and null are not parsed)
    expect(tableCounts.dateParses - d0, 'timestamps parsed').to.equal(12);
    clock += 3 * 3600_000;
    const d1 = tableCounts.dateParses;
    const later = [...tc.tableChunks(objs, opts)].join('');
    expect(tableCounts.dateParses - d1, 'timestamps parsed again, once each').to.equal(12);
    expect(jsonPathCounts.compiles - c0, 'nothing compiled per list').to.equal(6);
    // The same bytes as JSON.stringify of the rows, at either time: ages move with the clock.
    const want = JSON.stringify(tc.table(objs, opts));
    expect(later).to.equal(want);
    expect(later).to.not.equal(first);
    expect(JSON.parse(later).rows[5].cells).to.deep.equal(['o-5', 'Up', false, 5, '{"a":"\\"5\\""}', null, '3h']);
    expect(JSON.parse(later).rows[0].cells.slice(5)).to.deep.equal(['<invalid>', '3h']);
    expect(JSON.parse(later).rows[3].cells.slice(5)).to.deep.equal(['27h', '3h']);
  });
});
