import { expect } from 'chai';
import { StatusError } from '../../../../runtime/meta/errors.js';
import { P, TBL, sandbox, startFixture, type Fixture } from './fixture.js';
import { loose } from '../../../support/objects.js';

const json = (o: unknown) => JSON.stringify(o);

describe('apiserver/http server: reads and writes', () => {
  let f: Fixture;
  beforeEach(() => {
    f = startFixture({
      admit: (_def, obj, _old, opts) => {
        const warnings: string[] = [];
        if (loose(obj).spec && 'foo' in loose(obj).spec) {
          if (opts.fieldValidation === 'Strict') {
            throw new StatusError(
              400,
              'BadRequest',
              `${obj.kind} in version "v1alpha1" cannot be handled as a ${obj.kind}: strict decoding error: unknown field "spec.foo"`,
            );
          }
          if (opts.fieldValidation === 'Warn') warnings.push('unknown field "spec.foo"');
        }
        if (loose(obj).spec && 'bar' in loose(obj).spec) warnings.push('ünï\ncode');
        return { object: obj, warnings };
      },
    });
  });
  afterEach(() => f.close());

  const create = (name: string, headers: Record<string, string> = { 'content-type': 'application/json' }) =>
    f.server.app.inject({ method: 'POST', url: P, headers, payload: json(sandbox(name)) });

  it('creates from JSON, from a body without Content-Type, and from YAML', async () => {
    const a = await create('a');
    expect(a.statusCode).to.equal(201);
    expect(a.headers['content-type']).to.equal('application/json');
    expect(a.json().metadata).to.include({ name: 'a', namespace: 'default' });
    const b = await f.server.app.inject({ method: 'POST', url: P, payload: Buffer.from(json(sandbox('b'))) });
    expect(b.statusCode, b.body).to.equal(201);
    const y = await f.server.app.inject({
      method: 'POST',
      url: P,
      headers: { 'content-type': 'application/yaml' },
      payload:
        'apiVersion: fluxvm.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: c\nspec:\n  runtime: vm\n  image: "2026-01-01"\n',
    });
    expect(y.statusCode, y.body).to.equal(201);
    expect(y.json().spec.image).to.equal('2026-01-01');
  });

  it('refuses malformed bodies with 400 and unknown media types with 415, never 500', async () => {
    const cases: Array<[string, string, number]> = [
      ['application/json', '{bad', 400],
      ['application/json', '', 400],
      ['application/json', '[1,2]', 400],
      ['application/json', '"str"', 400],
      ['application/json', '{"metadata":"x"}', 400],
      ['application/yaml', 'a: [unclosed', 400],
      ['text/plain', 'hello', 415],
    ];
    for (const [ct, body, code] of cases) {
      const r = await f.server.app.inject({ method: 'POST', url: P, headers: { 'content-type': ct }, payload: body });
      expect(r.statusCode, `${ct} ${body}`).to.equal(code);
      expect(r.json().kind).to.equal('Status');
      expect(r.json().code).to.equal(code);
    }
    expect(f.errorsLogged).to.deep.equal([]);
  });

  it('answers 413 RequestEntityTooLarge over 3 MiB', async () => {
    const big = sandbox('big', { metadata: { name: 'big', annotations: { x: 'a'.repeat(3 * 1024 * 1024 + 10) } } });
    const r = await f.server.app.inject({
      method: 'POST',
      url: P,
      headers: { 'content-type': 'application/json' },
      payload: json(big),
    });
    expect(r.statusCode).to.equal(413);
    expect(r.json()).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'Request entity too large: limit is 3145728',
      reason: 'RequestEntityTooLarge',
      code: 413,
    });
  });

  it('gets a Table for lists and single objects, with includeObject and v1beta1', async () => {
    await create('a');
    await create('b');
    const list = await f.server.app.inject({ url: `${P}?limit=500`, headers: { accept: TBL } });
    expect(list.headers['content-type']).to.equal('application/json');
    const t = list.json();
    expect(t.kind).to.equal('Table');
    expect(t.apiVersion).to.equal('meta.k8s.io/v1');
    expect(t.metadata.resourceVersion).to.match(/^\d+$/);
    expect(t.columnDefinitions.map((c: any) => c.name)).to.deep.equal([
      'Name',
      'Runtime',
      'Phase',
      'Network',
      'Node',
      'Address',
      'Image',
      'Age',
    ]);
    expect(t.columnDefinitions.find((c: any) => c.name === 'Image').priority).to.equal(1);
    expect(t.rows.map((r: any) => r.cells.slice(0, 3))).to.deep.equal([
      ['a', 'vm', null],
      ['b', 'vm', null],
    ]);
    expect(t.rows[0].cells[7]).to.match(/^\d+s$/);
    expect(t.rows[0].object.kind).to.equal('PartialObjectMetadata');
    expect(t.rows[0].object.apiVersion).to.equal('meta.k8s.io/v1');
    expect(t.rows[0].object.metadata.labels).to.deep.equal({ tier: 'gold' });

    const one = (await f.server.app.inject({ url: `${P}/a`, headers: { accept: TBL } })).json();
    expect(one.kind).to.equal('Table');
    expect(one.rows).to.have.length(1);
    expect(one.metadata.resourceVersion).to.equal(one.rows[0].object.metadata.resourceVersion);

    const full = (await f.server.app.inject({ url: `${P}?includeObject=Object`, headers: { accept: TBL } })).json();
    expect(full.rows[0].object.kind).to.equal('Sandbox');
    expect(full.rows[0].object.spec.image).to.equal('alpine:3.20');
    const none = (await f.server.app.inject({ url: `${P}?includeObject=None`, headers: { accept: TBL } })).json();
    expect(none.rows[0].object).to.equal(null);
    const bad = await f.server.app.inject({ url: `${P}?includeObject=Everything`, headers: { accept: TBL } });
    expect(bad.statusCode).to.equal(400);

    const beta = (
      await f.server.app.inject({ url: P, headers: { accept: 'application/json;as=Table;v=v1beta1;g=meta.k8s.io' } })
    ).json();
    expect(beta.apiVersion).to.equal('meta.k8s.io/v1beta1');
    expect(beta.rows[0].object.apiVersion).to.equal('meta.k8s.io/v1beta1');

    const pom = (
      await f.server.app.inject({
        url: P,
        headers: { accept: 'application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io' },
      })
    ).json();
    expect(pom.kind).to.equal('PartialObjectMetadataList');
    expect(pom.items.map((i: any) => i.metadata.name)).to.deep.equal(['a', 'b']);

    const plain = (
      await f.server.app.inject({ url: P, headers: { accept: 'application/vnd.kubernetes.protobuf,application/json' } })
    ).json();
    expect(plain.kind).to.equal('SandboxList');
  });

  it('lists all namespaces, pages with limit/continue, and filters by label and field', async () => {
    for (const n of ['a', 'b', 'c']) await create(n);
    const all = (await f.server.app.inject({ url: '/apis/fluxvm.dev/v1alpha1/sandboxes' })).json();
    expect(all.items.map((i: any) => i.metadata.name)).to.deep.equal(['a', 'b', 'c']);
    const p1 = (await f.server.app.inject({ url: `${P}?limit=2`, headers: { accept: TBL } })).json();
    expect(p1.rows).to.have.length(2);
    expect(p1.metadata.continue).to.be.a('string');
    expect(p1.metadata.remainingItemCount).to.equal(1);
    const p2 = (
      await f.server.app.inject({
        url: `${P}?limit=2&continue=${encodeURIComponent(p1.metadata.continue)}`,
        headers: { accept: TBL },
      })
    ).json();
    expect(p2.rows.map((r: any) => r.cells[0])).to.deep.equal(['c']);
    const byName = (await f.server.app.inject({ url: `${P}?fieldSelector=metadata.name%3Db` })).json();
    expect(byName.items.map((i: any) => i.metadata.name)).to.deep.equal(['b']);
    const byLabel = (await f.server.app.inject({ url: `${P}?labelSelector=tier%3Dsilver` })).json();
    expect(byLabel.items).to.deep.equal([]);
    const badLimit = await f.server.app.inject({ url: `${P}?limit=abc` });
    expect(badLimit.statusCode).to.equal(400);
  });

  it('patches with merge, JSON and apply patches; strategic merge is 415 with kube message', async () => {
    await create('a');
    const url = `${P}/a?fieldManager=kubectl-patch`;
    const m = await f.server.app.inject({
      method: 'PATCH',
      url,
      headers: { 'content-type': 'application/merge-patch+json' },
      payload: json({ spec: { image: 'debian:12' } }),
    });
    expect(m.statusCode).to.equal(200);
    expect(m.json().spec.image).to.equal('debian:12');
    const j = await f.server.app.inject({
      method: 'PATCH',
      url,
      headers: { 'content-type': 'application/json-patch+json' },
      payload: json([{ op: 'replace', path: '/spec/image', value: 'ubuntu:24.04' }]),
    });
    expect(j.statusCode).to.equal(200);
    expect(j.json().spec.image).to.equal('ubuntu:24.04');
    const ap = await f.server.app.inject({
      method: 'PATCH',
      url: `${P}/new?fieldManager=kubectl&fieldValidation=Strict&force=false`,
      headers: { 'content-type': 'application/apply-patch+yaml' },
      payload:
        'apiVersion: fluxvm.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: new\nspec:\n  runtime: vm\n  image: alpine\n',
    });
    expect(ap.statusCode, ap.body).to.equal(201);
    const smp = await f.server.app.inject({
      method: 'PATCH',
      url,
      headers: { 'content-type': 'application/strategic-merge-patch+json' },
      payload: json({ spec: { image: 'x' } }),
    });
    expect(smp.statusCode).to.equal(415);
    expect(smp.json()).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message:
        'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml',
      reason: 'UnsupportedMediaType',
      code: 415,
    });
    const force = await f.server.app.inject({
      method: 'PATCH',
      url: `${url}&force=true`,
      headers: { 'content-type': 'application/merge-patch+json' },
      payload: '{}',
    });
    expect(force.statusCode).to.equal(422);
    expect(force.json().details.causes[0].field).to.equal('force');
  });

  it('passes fieldValidation through: Strict refuses, Warn adds Warning headers', async () => {
    const body = json(sandbox('w', { spec: { runtime: 'vm', image: 'a', foo: 1 } }));
    const strict = await f.server.app.inject({
      method: 'POST',
      url: `${P}?fieldValidation=Strict`,
      headers: { 'content-type': 'application/json' },
      payload: body,
    });
    expect(strict.statusCode).to.equal(400);
    expect(strict.json().message).to.contain('unknown field "spec.foo"');
    const warn = await f.server.app.inject({
      method: 'POST',
      url: `${P}?fieldValidation=Warn`,
      headers: { 'content-type': 'application/json' },
      payload: body,
    });
    expect(warn.statusCode).to.equal(201);
    expect([warn.headers.warning].flat()).to.deep.equal(['299 - "unknown field \\"spec.foo\\""']);
    const uni = await f.server.app.inject({
      method: 'POST',
      url: P,
      headers: { 'content-type': 'application/json' },
      payload: json(sandbox('u', { spec: { runtime: 'vm', image: 'a', bar: 1 } })),
    });
    expect(uni.statusCode).to.equal(201);
    expect([uni.headers.warning].flat()).to.deep.equal(['299 - "\\u00fcn\\u00ef\\u000acode"']);
    const bad = await f.server.app.inject({
      method: 'POST',
      url: `${P}?fieldValidation=Loose`,
      headers: { 'content-type': 'application/json' },
      payload: body,
    });
    expect(bad.statusCode).to.equal(400);
  });

  it('honours dryRun=All on create, refuses other dryRun values', async () => {
    const r = await f.server.app.inject({
      method: 'POST',
      url: `${P}?dryRun=All`,
      headers: { 'content-type': 'application/json' },
      payload: json(sandbox('dry')),
    });
    expect(r.statusCode).to.equal(201);
    expect((await f.server.app.inject({ url: `${P}/dry` })).statusCode).to.equal(404);
    const bad = await f.server.app.inject({
      method: 'POST',
      url: `${P}?dryRun=Some`,
      headers: { 'content-type': 'application/json' },
      payload: json(sandbox('dry')),
    });
    expect(bad.statusCode).to.equal(422);
    expect(bad.json().message).to.equal(
      'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["Some"]: supported values: "All"',
    );
  });

  it('updates with PUT and the status subresource', async () => {
    const a = (await create('a')).json();
    a.spec.image = 'debian:12';
    const put = await f.server.app.inject({
      method: 'PUT',
      url: `${P}/a`,
      headers: { 'content-type': 'application/json' },
      payload: json(a),
    });
    expect(put.statusCode).to.equal(200);
    const stale = await f.server.app.inject({
      method: 'PUT',
      url: `${P}/a`,
      headers: { 'content-type': 'application/json' },
      payload: json(a),
    });
    expect(stale.statusCode).to.equal(409);
    expect(stale.json().reason).to.equal('Conflict');
    const st = await f.server.app.inject({
      method: 'PATCH',
      url: `${P}/a/status`,
      headers: { 'content-type': 'application/merge-patch+json' },
      payload: json({ status: { phase: 'Running' } }),
    });
    expect(st.statusCode, st.body).to.equal(200);
    expect(st.json().status.phase).to.equal('Running');
    const got = (await f.server.app.inject({ url: `${P}/a/status`, headers: { accept: TBL } })).json();
    expect(got.rows[0].cells[2]).to.equal('Running');
  });

  it('deletes with DeleteOptions from the body or the query', async () => {
    await create('a');
    const dry = await f.server.app.inject({
      method: 'DELETE',
      url: `${P}/a`,
      headers: { 'content-type': 'application/json' },
      payload: json({ kind: 'DeleteOptions', apiVersion: 'v1', dryRun: ['All'], propagationPolicy: 'Background' }),
    });
    expect(dry.statusCode).to.equal(200);
    expect((await f.server.app.inject({ url: `${P}/a` })).statusCode).to.equal(200);
    const bad = await f.server.app.inject({ method: 'DELETE', url: `${P}/a?propagationPolicy=Sideways` });
    expect(bad.statusCode).to.equal(422);
    for (const body of ['[1]', '{"gracePeriodSeconds":"x"}', '{"dryRun":"All"}', '"x"']) {
      const r = await f.server.app.inject({
        method: 'DELETE',
        url: `${P}/a`,
        headers: { 'content-type': 'application/json' },
        payload: body,
      });
      expect(r.statusCode, body).to.equal(400);
    }
    expect((await f.server.app.inject({ url: `${P}/a` })).statusCode).to.equal(200);
    const del = await f.server.app.inject({ method: 'DELETE', url: `${P}/a?propagationPolicy=Background` });
    expect(del.statusCode).to.equal(200);
    expect(del.json().metadata.name).to.equal('a');
    const gone = await f.server.app.inject({ url: `${P}/a` });
    expect(gone.statusCode).to.equal(404);
    expect(gone.json()).to.deep.equal({
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'sandboxes.fluxvm.dev "a" not found',
      reason: 'NotFound',
      details: { name: 'a', group: 'fluxvm.dev', kind: 'sandboxes' },
      code: 404,
    });
    await create('b');
    await create('c');
    const dc = await f.server.app.inject({ method: 'DELETE', url: `${P}?labelSelector=tier%3Dgold` });
    expect(dc.statusCode).to.equal(200);
    expect((await f.server.app.inject({ url: P })).json().items).to.deep.equal([]);
  });

  it("DELETE answers the object at the deletion's resourceVersion (the DELETED event's); 202 only for orphanDependents: false while finalizers hold it", async () => {
    const before = (await create('gone')).json().metadata.resourceVersion;
    const del = await f.server.app.inject({ method: 'DELETE', url: `${P}/gone` });
    expect(del.statusCode).to.equal(200);
    const rv = del.json().metadata.resourceVersion;
    expect(Number(rv)).to.be.greaterThan(Number(before));
    const events = async (from: string) =>
      (await f.server.app.inject({ url: `${P}?watch=true&resourceVersion=${from}&timeoutSeconds=1` })).body
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l))
        .map((e) => [e.type, e.object.metadata.name, e.object.metadata.resourceVersion]);
    expect(await events(before)).to.deep.equal([['DELETED', 'gone', rv]]);
    const held = (name: string) =>
      f.server.app.inject({
        method: 'POST',
        url: P,
        headers: { 'content-type': 'application/json' },
        payload: json({ ...sandbox(name), metadata: { name, finalizers: ['example.com/hold'] } }),
      });
    await held('kept');
    const marked = await f.server.app.inject({ method: 'DELETE', url: `${P}/kept?orphanDependents=false` });
    expect(marked.statusCode).to.equal(202);
    expect(marked.json().metadata.deletionTimestamp).to.be.a('string');
    expect(marked.json().metadata.resourceVersion).to.equal(
      (await f.server.app.inject({ url: `${P}/kept` })).json().metadata.resourceVersion,
    );
    await held('kept2');
    for (const body of [{ propagationPolicy: 'Background' }, { orphanDependents: true }, {}]) {
      const r = await f.server.app.inject({
        method: 'DELETE',
        url: `${P}/kept2`,
        headers: { 'content-type': 'application/json' },
        payload: json(body),
      });
      expect(r.statusCode, json(body)).to.equal(200);
    }
    // An immediate delete is 200 even with orphanDependents: false.
    await create('plain');
    const plain = await f.server.app.inject({
      method: 'DELETE',
      url: `${P}/plain`,
      headers: { 'content-type': 'application/json' },
      payload: json({ orphanDependents: false }),
    });
    expect(plain.statusCode).to.equal(200);
  });
});

describe('apiserver/http server: internal errors and metrics', () => {
  it('answers a registry bug with a logged 500 InternalError Status', async () => {
    const f = startFixture({
      wrap: (r) =>
        new Proxy(r, {
          get(t, p, recv) {
            if (p === 'list') return () => Promise.reject(new TypeError('boom'));
            const v = Reflect.get(t, p, recv);
            return typeof v === 'function' ? v.bind(t) : v;
          },
        }),
    });
    try {
      const r = await f.server.app.inject({ url: P });
      expect(r.statusCode).to.equal(500);
      expect(r.json()).to.include({ kind: 'Status', reason: 'InternalError', code: 500, status: 'Failure' });
      expect(f.errorsLogged).to.have.length(1);
      expect(f.errorsLogged[0]).to.contain('boom');
    } finally {
      await f.close();
    }
  });

  it('exposes request counters and latency histograms per verb, resource and code', async () => {
    const f = startFixture();
    try {
      await f.server.app.inject({ url: P });
      await f.server.app.inject({ url: `${P}/nope` });
      const m = await f.server.app.inject({ url: '/metrics' });
      expect(m.headers['content-type']).to.equal('text/plain; version=0.0.4; charset=utf-8');
      expect(m.body).to.contain(
        'apiserver_request_total{verb="LIST",group="fluxvm.dev",version="v1alpha1",resource="sandboxes",subresource="",scope="namespace",component="apiserver",code="200"} 1',
      );
      expect(m.body).to.contain(
        'apiserver_request_total{verb="GET",group="fluxvm.dev",version="v1alpha1",resource="sandboxes",subresource="",scope="resource",component="apiserver",code="404"} 1',
      );
      expect(m.body).to.match(
        /apiserver_request_duration_seconds_bucket\{le="\+Inf",verb="LIST",[^}]*component="apiserver"\} 1/,
      );
      expect(m.body).to.contain('apiserver_watch_count 0');
    } finally {
      await f.close();
    }
  });
});
