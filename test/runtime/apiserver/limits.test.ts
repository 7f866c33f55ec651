// Hostile input at the registry and the decoder: nesting depth at its edge through
// every write path (create, update, merge patch, JSON patch, apply: admission, pruning, the
// field manager), YAML alias bombs, JSON patch operation counts and amplification, and
// values of the wrong type. Each refusal is a 4xx Status and leaves the store unchanged.
import { expect } from 'chai';
import {
  checkJSONDepth,
  checkYAMLValue,
  MAX_DEPTH,
  MAX_JSON_PATCH_OPS,
  valueDepth,
} from '../../../runtime/apiserver/limits.js';
import { decodeBody } from '../../../runtime/apiserver/http/negotiate.js';
import { applyJsonPatch } from '../../../runtime/apiserver/patch.js';
import { aliasBomb } from './hostile.js';
import { ctx, makeEnv, statusOf, W, widget, type Env } from './registry-fixtures.js';

/** An object nesting `levels` objects: nest(1) = {a: 'x'}. */
function nest(levels: number): Record<string, unknown> {
  let v: unknown = 'x';
  for (let i = 0; i < levels; i++) v = { a: v };
  return v as Record<string, unknown>;
}

const withoutMF = (o: any) => ({ ...o, metadata: { ...o.metadata, managedFields: undefined } });

/** A Widget whose whole body nests exactly `depth` levels (the body itself is level 1). */
const deepWidget = (name: string, depth: number) => widget(name, nest(depth - 1));

describe('hostile input: nesting depth', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it(`an object nesting exactly ${MAX_DEPTH} levels survives create, PUT, merge patch, JSON patch and apply; one more is 400 and nothing is stored`, async () => {
    const created = await env.registry.create(W, 'default', deepWidget('deep', MAX_DEPTH) as any, {}, ctx);
    expect(valueDepth(withoutMF(created.object))).to.equal(MAX_DEPTH);
    const got = await env.registry.get(W, 'default', 'deep', ctx);
    expect((got as any).spec).to.deep.equal(nest(MAX_DEPTH - 1));

    const put = {
      ...deepWidget('deep', MAX_DEPTH),
      metadata: { name: 'deep', resourceVersion: got.metadata.resourceVersion },
    };
    (put as any).spec = { b: nest(MAX_DEPTH - 2) };
    await env.registry.update(W, 'default', 'deep', put as any, {}, ctx);
    await env.registry.patch(W, 'default', 'deep', 'merge', { spec: { c: nest(MAX_DEPTH - 2) } }, {}, ctx);
    await env.registry.patch(
      W,
      'default',
      'deep',
      'json',
      [{ op: 'replace', path: '/spec/c', value: nest(MAX_DEPTH - 2) }],
      {},
      ctx,
    );
    const applied = await env.registry.patch(
      W,
      'default',
      'deep',
      'apply',
      { ...widget('deep'), spec: { d: nest(MAX_DEPTH - 2) } },
      { fieldManager: 'deep' },
      ctx,
    );
    expect(valueDepth(withoutMF(applied.object))).to.equal(MAX_DEPTH);
    // Server-side apply recorded a field set as deep as the object (the field manager's walk).
    expect(JSON.stringify(applied.object.metadata.managedFields)).to.include('"f:d"');

    const before = await env.registry.get(W, 'default', 'deep', ctx);
    const tooDeep = await statusOf(() =>
      env.registry.create(W, 'default', deepWidget('deeper', MAX_DEPTH + 1) as any, {}, ctx),
    );
    expect(tooDeep).to.deep.include({ code: 400, reason: 'BadRequest' });
    expect(tooDeep.message).to.include(`limit of ${MAX_DEPTH} levels`);
    expect((await statusOf(() => env.registry.get(W, 'default', 'deeper', ctx))).code).to.equal(404);
    for (const [type, patch] of [
      ['merge', { spec: { e: nest(MAX_DEPTH - 1) } }],
      ['apply', { ...widget('deep'), spec: { e: nest(MAX_DEPTH - 1) } }],
      // A copy of a deep subtree below itself doubles the depth (a body never could).
      ['json', [{ op: 'copy', from: '/spec', path: '/spec/c/a/z' }]],
    ] as const) {
      const st = await statusOf(() =>
        env.registry.patch(W, 'default', 'deep', type, patch, { fieldManager: 'x' }, ctx),
      );
      expect(st.code, type).to.equal(400);
      expect(st.message, type).to.include('nests deeper');
    }
    expect((await env.registry.get(W, 'default', 'deep', ctx)).metadata.resourceVersion).to.equal(
      before.metadata.resourceVersion,
    );
  });

  it('the decoder refuses JSON and YAML depth bombs before parsing them recursively', () => {
    const jsonAtLimit = Buffer.from('['.repeat(MAX_DEPTH) + ']'.repeat(MAX_DEPTH));
    expect(decodeBody('application/json', jsonAtLimit)).to.be.an('array');
    const bomb = Buffer.from('['.repeat(3 * 1024 * 1024 - 2) + ']]');
    expect(() => decodeBody('application/json', bomb)).to.throw(`limit of ${MAX_DEPTH} levels`);
    // Brackets inside strings are not nesting.
    checkJSONDepth(`{"a":"${'['.repeat(MAX_DEPTH * 2)}"}`);
    expect(() => checkJSONDepth('['.repeat(MAX_DEPTH + 1))).to.throw('nests deeper');

    const yamlAtLimit = Buffer.from('- '.repeat(MAX_DEPTH) + 'x');
    expect(valueDepth(decodeBody('application/yaml', yamlAtLimit))).to.equal(MAX_DEPTH);
    for (const y of ['- '.repeat(MAX_DEPTH + 1) + 'x', '- '.repeat(500_000) + 'x', '['.repeat(200_000)]) {
      expect(() => decodeBody('application/yaml', Buffer.from(y)), y.slice(0, 10)).to.throw(
        /deeper than the limit|nests deeper/,
      );
    }
  });
});

describe('hostile input: YAML aliases', () => {
  it('the billion-laughs bomb is refused as excessive aliasing (the time is printed, not asserted)', () => {
    const bomb = Buffer.from(aliasBomb());
    expect(bomb.length).to.be.below(700);
    expect(() => decodeBody('application/yaml', bomb)).to.throw('excessive aliasing');
    // Refusal times, median of 21 after a warm-up, for the report (target: < 10 ms).
    const depthJSON = Buffer.from('['.repeat(3 * 1024 * 1024 - 2) + ']]');
    const depthYAML = Buffer.from('- '.repeat(1024 * 1024) + 'x');
    for (const [what, b, type] of [
      ['alias bomb', bomb, 'application/yaml'],
      ['3 MiB JSON depth bomb', depthJSON, 'application/json'],
      ['2 MiB YAML depth bomb', depthYAML, 'application/yaml'],
    ] as const) {
      const times: number[] = [];
      for (let i = 0; i < 22; i++) {
        const t0 = process.hrtime.bigint();
        expect(() => decodeBody(type, b)).to.throw();
        if (i > 0) times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
      times.sort((a, b) => a - b);
      console.log(
        `      ${what} (${b.length} bytes) refused in ${times[10].toFixed(2)} ms (median), ${times[20].toFixed(2)} ms (max)`,
      );
    }
  });

  it('ordinary aliases pass; the go-yaml ratio rule decides, and cycles are refused by depth', () => {
    const few = 'apiVersion: v1\nkind: Secret\nmetadata: {name: a, labels: &l {x: "y"}, annotations: *l}\n';
    expect((decodeBody('application/yaml', Buffer.from(few)) as any).metadata.annotations).to.deep.equal({ x: 'y' });
    // 1000 aliases of an 11-node list in a small document: more than 1000 nodes, over 99% of them aliased.
    const many = `base: &b [${Array(10).fill('1').join(',')}]\nl: [${Array(1000).fill('*b').join(',')}]\n`;
    expect(() => decodeBody('application/yaml', Buffer.from(many))).to.throw('excessive aliasing');
    const fine = `base: &b [${Array(10).fill('1').join(',')}]\nl: [${Array(99).fill('*b').join(',')}]\n`;
    expect((decodeBody('application/yaml', Buffer.from(fine)) as any).l).to.have.length(99);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(() => checkYAMLValue(cyclic)).to.throw('nests deeper');
  });
});

describe('hostile input: JSON patch bounds', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it(`${MAX_JSON_PATCH_OPS} operations apply; one more is 413 before any is`, () => {
    const ops = Array.from({ length: MAX_JSON_PATCH_OPS }, () => ({ op: 'test', path: '/a', value: 1 }));
    expect(applyJsonPatch({ a: 1 }, ops)).to.deep.equal({ a: 1 });
    expect(() => applyJsonPatch({ a: 1 }, [...ops, { op: 'test', path: '/a', value: 1 }])).to.throw(
      `The allowed maximum operations in a JSON patch is ${MAX_JSON_PATCH_OPS}, got ${MAX_JSON_PATCH_OPS + 1}`,
    );
  });

  it('copy amplification stops at the object size limit with 413, nothing stored, memory bounded', async () => {
    await env.registry.create(W, 'default', widget('amp', { blob: 'x'.repeat(100_000) }) as any, {}, ctx);
    const before = await env.registry.get(W, 'default', 'amp', ctx);
    // The billion-laughs shape: a small body of repeated copies doubling the document.
    const ops = [{ op: 'add', path: '/spec/l', value: [] }];
    for (let i = 0; i < 1000; i++) ops.push({ op: 'copy', from: '/spec', path: `/spec/c${i}` } as any);
    const heap0 = process.memoryUsage().heapUsed;
    const st = await statusOf(() => env.registry.patch(W, 'default', 'amp', 'json', ops, {}, ctx));
    expect(st).to.deep.include({ code: 413, reason: 'RequestEntityTooLarge' });
    expect(process.memoryUsage().heapUsed - heap0).to.be.below(256 * 1024 * 1024);
    // Copy-then-remove pairs keep the size flat but are bounded by the total bytes copied.
    const churn: Array<Record<string, string>> = [];
    for (let i = 0; i < 100; i++)
      churn.push({ op: 'copy', from: '/spec/blob', path: '/spec/tmp' }, { op: 'remove', path: '/spec/tmp' });
    expect((await statusOf(() => env.registry.patch(W, 'default', 'amp', 'json', churn, {}, ctx))).message).to.include(
      'accumulated size increase of copy',
    );
    expect((await env.registry.get(W, 'default', 'amp', ctx)).metadata.resourceVersion).to.equal(
      before.metadata.resourceVersion,
    );
  });

  it('merge patch and apply past the object size limit are 413 and store nothing', async () => {
    await env.registry.create(W, 'default', widget('big') as any, {}, ctx);
    const before = await env.registry.get(W, 'default', 'big', ctx);
    const huge = 'x'.repeat(3 * 1024 * 1024);
    expect(
      (await statusOf(() => env.registry.patch(W, 'default', 'big', 'merge', { spec: { huge } }, {}, ctx))).code,
    ).to.equal(413);
    const apply = { ...widget('big'), spec: { huge } };
    expect(
      (await statusOf(() => env.registry.patch(W, 'default', 'big', 'apply', apply, { fieldManager: 'm' }, ctx))).code,
    ).to.equal(413);
    expect((await env.registry.get(W, 'default', 'big', ctx)).metadata.resourceVersion).to.equal(
      before.metadata.resourceVersion,
    );
  });
});

describe('hostile input: values of the wrong type', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  const weird: unknown[] = [{ toString: 1 }, ['a'], { a: 1 }, 7, true];

  it('apiVersion and kind that are not strings are 400 naming the field, on create, PUT and apply', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const rv = (await env.registry.get(W, 'default', 'a', ctx)).metadata.resourceVersion;
    for (const field of ['apiVersion', 'kind'])
      for (const v of weird) {
        const body = { ...widget('a'), [field]: v };
        for (const call of [
          () => env.registry.create(W, 'default', body as any, {}, ctx),
          () =>
            env.registry.update(
              W,
              'default',
              'a',
              { ...body, metadata: { name: 'a', resourceVersion: rv } } as any,
              {},
              ctx,
            ),
          () => env.registry.patch(W, 'default', 'a', 'apply', body, { fieldManager: 'm' }, ctx),
          () =>
            env.registry.patch(W, 'default', 'a', 'json', [{ op: 'replace', path: `/${field}`, value: v }], {}, ctx),
        ]) {
          const st = await statusOf(call);
          expect(st.code, `${field}=${JSON.stringify(v)}`).to.equal(400);
          expect(st.details.causes[0].field).to.equal(field);
        }
      }
  });

  it('metadata fields of the wrong type are 422 naming the field, never 500', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const rv = (await env.registry.get(W, 'default', 'a', ctx)).metadata.resourceVersion;
    const fields = [
      'name',
      'namespace',
      'generateName',
      'resourceVersion',
      'uid',
      'labels',
      'annotations',
      'finalizers',
      'ownerReferences',
      'generation',
    ];
    let n = 0;
    for (const f of fields)
      for (const v of weird) {
        if (f === 'generation' && v === 7) continue;
        if (f === 'finalizers' && Array.isArray(v)) continue;
        const meta = { name: 'a', [f]: v };
        const fresh = { name: `n${n++}`, [f]: v };
        for (const [what, call] of [
          ['create', () => env.registry.create(W, 'default', { ...widget('x'), metadata: fresh } as any, {}, ctx)],
          [
            'update',
            () =>
              env.registry.update(
                W,
                'default',
                'a',
                { ...widget('a'), metadata: { resourceVersion: rv, ...meta } } as any,
                {},
                ctx,
              ),
          ],
          ['merge', () => env.registry.patch(W, 'default', 'a', 'merge', { metadata: { [f]: v } }, {}, ctx)],
          [
            'apply',
            () =>
              env.registry.patch(
                W,
                'default',
                'a',
                'apply',
                { ...widget('a'), metadata: meta },
                { fieldManager: 'm' },
                ctx,
              ),
          ],
        ] as const) {
          let st: Record<string, any>;
          try {
            st = await statusOf(call);
          } catch (e) {
            throw new Error(`${what} metadata.${f}=${JSON.stringify(v)}: ${(e as Error).message}`);
          }
          expect(st.code, `${what} metadata.${f}=${JSON.stringify(v)}: ${st.message}`).to.be.oneOf([400, 422]);
          const named = JSON.stringify(st.details?.causes ?? []) + st.message;
          expect(named, `${what} ${f}`).to.include(`metadata.${f}`);
        }
      }
    expect((await env.registry.get(W, 'default', 'a', ctx)).metadata.resourceVersion).to.equal(rv);
  });
});
