import { expect } from 'chai';
import { ctx, makeEnv, statusOf, widget, W, G, type Env } from './registry-fixtures.js';
import { loose } from '../../support/objects.js';

const base = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure' };
const wdetails = (name: string) => ({ name, group: 'test.fluxvm.dev', kind: 'widgets' });

describe('registry: input errors', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('invalid and missing names are 422 Invalid naming metadata.name', async () => {
    const st = await statusOf(() => env.registry.create(W, 'default', widget('Bad_Name') as any, {}, ctx));
    expect(st.code).to.equal(422);
    expect(st.reason).to.equal('Invalid');
    expect(st.message).to.match(
      /^Widget\.test\.fluxvm\.dev "Bad_Name" is invalid: metadata\.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain/,
    );
    expect(st.details.causes).to.have.length(1);
    expect(st.details.causes[0]).to.include({ reason: 'FieldValueInvalid', field: 'metadata.name' });
    expect(
      await statusOf(() =>
        env.registry.create(
          W,
          'default',
          { apiVersion: 'test.fluxvm.dev/v1', kind: 'Widget', metadata: {} } as any,
          {},
          ctx,
        ),
      ),
    ).to.deep.equal({
      ...base,
      message: 'Widget.test.fluxvm.dev "" is invalid: metadata.name: Required value: name or generateName is required',
      reason: 'Invalid',
      details: {
        name: '',
        group: 'test.fluxvm.dev',
        kind: 'Widget',
        causes: [
          {
            reason: 'FieldValueRequired',
            field: 'metadata.name',
            message: 'Required value: name or generateName is required',
          },
        ],
      },
      code: 422,
    });
    const lab = await statusOf(() =>
      env.registry.create(W, 'default', widget('ok', {}, { labels: { 'bad key': 'v' } }) as any, {}, ctx),
    );
    expect(lab.code).to.equal(422);
    expect(lab.details.causes[0].field).to.equal('metadata.labels');
  });

  it('generateName makes a unique name', async () => {
    const r = await env.registry.create(
      W,
      'default',
      { apiVersion: 'test.fluxvm.dev/v1', kind: 'Widget', metadata: { generateName: 'job-' } } as any,
      {},
      ctx,
    );
    expect(r.object.metadata.name).to.match(/^job-[bcdfghjklmnpqrstvwxz2456789]{5}$/);
  });

  it('wrong apiVersion/kind, body/URL name and namespace mismatches are 400', async () => {
    expect(
      await statusOf(() => env.registry.create(W, 'default', { ...widget('a'), apiVersion: 'v1' } as any, {}, ctx)),
    ).to.deep.equal({
      ...base,
      message: 'the API version in the data (v1) does not match the expected API version (test.fluxvm.dev/v1)',
      reason: 'BadRequest',
      code: 400,
    });
    expect(
      (await statusOf(() => env.registry.create(W, 'default', { ...widget('a'), kind: 'Gadget' } as any, {}, ctx)))
        .code,
    ).to.equal(400);
    expect(
      (await statusOf(() => env.registry.create(W, 'default', widget('a', {}, { namespace: 'other' }) as any, {}, ctx)))
        .message,
    ).to.equal('the namespace of the provided object does not match the namespace sent on the request');
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    expect(await statusOf(() => env.registry.update(W, 'default', 'a', widget('b') as any, {}, ctx))).to.deep.equal({
      ...base,
      message: 'the name of the object (b) does not match the name on the URL (a)',
      reason: 'BadRequest',
      code: 400,
    });
    for (const body of [null, [], 'x', 7, { metadata: 'x' }])
      expect((await statusOf(() => env.registry.create(W, 'default', body as any, {}, ctx))).code).to.equal(400);
  });

  it('unknown resources and subresources are 404; a body over 3 MiB is 413', async () => {
    const nf = await statusOf(() =>
      env.registry.get({ group: 'x', version: 'v1', resource: 'nopes' }, 'default', 'a', ctx),
    );
    expect(nf).to.deep.include({
      code: 404,
      reason: 'NotFound',
      message: 'the server could not find the requested resource',
    });
    await env.registry.create(
      G,
      undefined,
      { apiVersion: 'test.fluxvm.dev/v1', kind: 'Gadget', metadata: { name: 'g' } },
      {},
      ctx,
    );
    expect(
      (
        await statusOf(() =>
          env.registry.patch(G, undefined, 'g', 'merge', { status: {} }, { subresource: 'status' }, ctx),
        )
      ).code,
    ).to.equal(404);
    const big = widget('big', { blob: 'x'.repeat(3 * 1024 * 1024) });
    expect(await statusOf(() => env.registry.create(W, 'default', big as any, {}, ctx))).to.deep.equal({
      ...base,
      message: 'Request entity too large: limit is 3145728',
      reason: 'RequestEntityTooLarge',
      code: 413,
    });
  });

  it('strategic merge patch is 415; apply without fieldManager is 400 with kube message', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    expect(await statusOf(() => env.registry.patch(W, 'default', 'a', 'strategic' as any, {}, {}, ctx))).to.deep.equal({
      ...base,
      message:
        'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml',
      reason: 'UnsupportedMediaType',
      code: 415,
    });
    const st = await statusOf(() => env.registry.patch(W, 'default', 'a', 'apply', widget('a'), {}, ctx));
    expect(st).to.deep.include({
      code: 400,
      reason: 'BadRequest',
      message: 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
    });
  });

  it('uid is immutable (422); creationTimestamp is kept; deletionTimestamp cannot be set by update', async () => {
    const a = (await env.registry.create(W, 'default', widget('a') as any, {}, ctx)).object;
    const st = await statusOf(() =>
      env.registry.update(W, 'default', 'a', { ...a, metadata: { ...a.metadata, uid: 'other' } }, {}, ctx),
    );
    expect(st.code).to.equal(422);
    expect(st.details.causes).to.deep.equal([
      { reason: 'FieldValueInvalid', field: 'metadata.uid', message: 'Invalid value: "other": field is immutable' },
    ]);
    const u = (
      await env.registry.update(
        W,
        'default',
        'a',
        { ...a, metadata: { ...a.metadata, creationTimestamp: '2001-01-01T00:00:00Z' }, spec: { color: 'x' } },
        {},
        ctx,
      )
    ).object;
    expect(u.metadata.creationTimestamp).to.equal(a.metadata.creationTimestamp);
    const dt = await statusOf(() =>
      env.registry.patch(
        W,
        'default',
        'a',
        'merge',
        { metadata: { deletionTimestamp: '2030-01-01T00:00:00Z' } },
        {},
        ctx,
      ),
    );
    expect(dt.code).to.equal(422);
    expect(dt.details.causes[0].field).to.equal('metadata.deletionTimestamp');
  });

  it('a client cannot set uid, creationTimestamp, resourceVersion, generation or deletionTimestamp through any write', async () => {
    const forged = {
      uid: 'forged-uid',
      creationTimestamp: '2001-01-01T00:00:00Z',
      resourceVersion: '999999',
      generation: 42,
      deletionTimestamp: '2030-01-01T00:00:00Z',
    };
    const attempt = async (label: string, write: () => Promise<unknown>) => {
      try {
        await write();
      } catch (e: any) {
        if (e?.status?.kind !== 'Status') throw e;
        expect(e.status.code, `${label}: ${e.status.message}`).to.be.within(400, 499);
      }
    };
    const creates: [string, (name: string, field: string, value: unknown) => Promise<unknown>][] = [
      [
        'create',
        (n, f, v) => env.registry.create(W, 'default', { ...widget(n), metadata: { name: n, [f]: v } } as any, {}, ctx),
      ],
      [
        'apply (create)',
        (n, f, v) =>
          env.registry.patch(
            W,
            'default',
            n,
            'apply',
            { ...widget(n), metadata: { name: n, [f]: v } },
            { fieldManager: 'm' },
            ctx,
          ),
      ],
    ];
    let i = 0;
    for (const [how, create] of creates)
      for (const [f, v] of Object.entries(forged)) {
        const name = `c${i++}`;
        await attempt(`${how} ${f}`, () => create(name, f, v));
        const o = (await env.registry.get(W, 'default', name, ctx).catch((e) => {
          if (e?.status?.code === 404) return undefined;
          throw e;
        })) as any;
        if (!o) continue; // refused
        expect(o.metadata[f], `${how} ${f}`).to.not.equal(v);
        expect(o.metadata.generation, `${how} ${f}`).to.equal(1);
        expect(o.metadata.deletionTimestamp, `${how} ${f}`).to.equal(undefined);
      }
    const a = (await env.registry.create(W, 'default', widget('a') as any, {}, ctx)).object;
    const writes: [string, (field: string, value: unknown) => Promise<unknown>][] = [
      [
        'update',
        (f, v) => env.registry.update(W, 'default', 'a', { ...a, metadata: { ...a.metadata, [f]: v } }, {}, ctx),
      ],
      ['merge patch', (f, v) => env.registry.patch(W, 'default', 'a', 'merge', { metadata: { [f]: v } }, {}, ctx)],
      [
        'JSON patch',
        (f, v) =>
          env.registry.patch(W, 'default', 'a', 'json', [{ op: 'add', path: `/metadata/${f}`, value: v }], {}, ctx),
      ],
      [
        'apply',
        (f, v) =>
          env.registry.patch(
            W,
            'default',
            'a',
            'apply',
            { ...widget('a'), metadata: { name: 'a', [f]: v } },
            { fieldManager: 'm' },
            ctx,
          ),
      ],
    ];
    for (const [how, write] of writes)
      for (const [f, v] of Object.entries(forged)) {
        await attempt(`${how} ${f}`, () => write(f, v));
        const now = (await env.registry.get(W, 'default', 'a', ctx)) as any;
        expect(now.metadata.uid, `${how} ${f}`).to.equal(a.metadata.uid);
        expect(now.metadata.creationTimestamp, `${how} ${f}`).to.equal(a.metadata.creationTimestamp);
        expect(now.metadata.resourceVersion, `${how} ${f}`).to.not.equal(forged.resourceVersion);
        expect(now.metadata.generation, `${how} ${f}`).to.equal(a.metadata.generation);
        expect(now.metadata.deletionTimestamp, `${how} ${f}`).to.equal(undefined);
      }
  });

  it('malformed list inputs are 400 and never 500', async () => {
    for (const opts of [
      { labelSelector: 'a in b' },
      { fieldSelector: 'spec.nope=1' },
      { continue: 'garbage' },
      { resourceVersion: 'abc' },
      { limit: -1 },
    ]) {
      const st = await statusOf(() => env.registry.list(W, 'default', opts as any, ctx));
      expect(st.code, JSON.stringify(opts)).to.equal(400);
    }
    expect(() => env.registry.watch(W, 'default', { labelSelector: '!!' }, ctx)).to.throw(
      /unable to parse requirement/,
    );
    const tooLarge = await statusOf(() => env.registry.list(W, 'default', { resourceVersion: '999999' }, ctx));
    expect(tooLarge).to.deep.include({ code: 504, reason: 'Timeout' });
    expect(tooLarge.message).to.match(/^Timeout: Too large resource version: 999999, current: \d+$/);
    expect(tooLarge.details).to.deep.equal({
      causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }],
      retryAfterSeconds: 1,
    });
  });
});

describe('registry: patch, apply and managedFields', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('concurrent patches of one object all land (retried after the competing commit), no 409', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const rv0 = env.store.currentRV;
    await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        env.registry.patch(W, 'default', 'a', 'merge', { metadata: { labels: { [`l${i}`]: 'v' } } }, {}, ctx),
      ),
    );
    const a = await env.registry.get(W, 'default', 'a', ctx);
    expect(Object.keys(a.metadata.labels ?? {})).to.have.length(20);
    expect(env.store.currentRV).to.equal(rv0 + 20);
    // With a client precondition the losers get 409 instead.
    const rv = a.metadata.resourceVersion;
    const rs = await Promise.allSettled(
      Array.from({ length: 5 }, (_, i) =>
        env.registry.patch(
          W,
          'default',
          'a',
          'merge',
          { metadata: { resourceVersion: rv, labels: { [`p${i}`]: 'v' } } },
          {},
          ctx,
        ),
      ),
    );
    expect(rs.filter((r) => r.status === 'fulfilled')).to.have.length(1);
    for (const r of rs.filter((r) => r.status === 'rejected'))
      expect((r as PromiseRejectedResult).reason.status.reason).to.equal('Conflict');
  });

  it('merge and JSON patches; a resourceVersion inside the patch is a precondition', async () => {
    const a = (await env.registry.create(W, 'default', widget('a', { color: 'red', size: 1 }) as any, {}, ctx)).object;
    const m = (
      await env.registry.patch(
        W,
        'default',
        'a',
        'merge',
        { spec: { size: null, shape: 'round' }, metadata: { labels: { t: 'g' } } },
        { fieldManager: 'kubectl-patch' },
        ctx,
      )
    ).object;
    expect(m.spec).to.deep.equal({ color: 'red', shape: 'round' });
    expect(m.metadata.labels).to.deep.equal({ t: 'g' });
    expect(m.metadata.generation).to.equal(2);
    const j = (
      await env.registry.patch(
        W,
        'default',
        'a',
        'json',
        [
          { op: 'test', path: '/spec/color', value: 'red' },
          { op: 'replace', path: '/spec/color', value: 'blue' },
        ],
        {},
        ctx,
      )
    ).object;
    expect(loose(j).spec.color).to.equal('blue');
    const failed = await statusOf(() =>
      env.registry.patch(W, 'default', 'a', 'json', [{ op: 'test', path: '/spec/color', value: 'red' }], {}, ctx),
    );
    expect(failed.code).to.equal(422);
    expect(
      await statusOf(() =>
        env.registry.patch(
          W,
          'default',
          'a',
          'merge',
          { metadata: { resourceVersion: a.metadata.resourceVersion }, spec: { color: 'x' } },
          {},
          ctx,
        ),
      ),
    ).to.deep.equal({
      ...base,
      message:
        'Operation cannot be fulfilled on widgets.test.fluxvm.dev "a": the object has been modified; please apply your changes to the latest version and try again',
      reason: 'Conflict',
      details: wdetails('a'),
      code: 409,
    });
    const ok = await env.registry.patch(
      W,
      'default',
      'a',
      'merge',
      { metadata: { resourceVersion: j.metadata.resourceVersion }, spec: { color: 'x' } },
      {},
      ctx,
    );
    expect(loose(ok.object).spec.color).to.equal('x');
    expect((await statusOf(() => env.registry.patch(W, 'default', 'missing', 'merge', {}, {}, ctx))).code).to.equal(
      404,
    );
  });

  it('records Update managers per field; client-written managedFields replace, [{}] clears', async () => {
    await env.registry.create(W, 'default', widget('a') as any, { fieldManager: 'creator' }, ctx);
    const p = (
      await env.registry.patch(
        W,
        'default',
        'a',
        'merge',
        { spec: { size: 2 } },
        { fieldManager: 'kubectl-patch' },
        ctx,
      )
    ).object;
    const mf = p.metadata.managedFields!;
    expect(mf.map((e) => [e.manager, e.operation])).to.deep.equal([
      ['creator', 'Update'],
      ['kubectl-patch', 'Update'],
    ]);
    expect(mf[1].fieldsV1).to.deep.equal({ 'f:spec': { 'f:size': {} } });
    expect(mf[0].fieldsV1).to.deep.equal({ 'f:spec': { '.': {}, 'f:color': {} } });
    const custom = [
      {
        manager: 'kubectl',
        operation: 'Apply',
        apiVersion: 'test.fluxvm.dev/v1',
        fieldsType: 'FieldsV1',
        fieldsV1: { 'f:spec': { 'f:color': {} } },
      },
    ];
    const r = (
      await env.registry.patch(
        W,
        'default',
        'a',
        'json',
        [
          { op: 'replace', path: '/metadata/managedFields', value: custom },
          { op: 'replace', path: '/metadata/resourceVersion', value: p.metadata.resourceVersion },
        ],
        { fieldManager: 'kubectl' },
        ctx,
      )
    ).object;
    expect(r.metadata.managedFields).to.deep.equal(custom);
    const c = (await env.registry.patch(W, 'default', 'a', 'merge', { metadata: { managedFields: [{}] } }, {}, ctx))
      .object;
    expect(c.metadata.managedFields).to.equal(undefined);
  });

  it('apply upserts, conflicts name the field and manager, force takes ownership, omitted fields are removed', async () => {
    const cfg = (spec: Record<string, unknown>) => ({
      apiVersion: 'test.fluxvm.dev/v1',
      kind: 'Widget',
      metadata: { name: 'a' },
      spec,
    });
    const c = await env.registry.patch(
      W,
      'default',
      'a',
      'apply',
      cfg({ color: 'red', size: 1 }),
      { fieldManager: 'kubectl' },
      ctx,
    );
    expect(c.created).to.equal(true);
    expect(c.object.metadata.managedFields?.[0]).to.deep.include({
      manager: 'kubectl',
      operation: 'Apply',
      fieldsV1: { 'f:spec': { '.': {}, 'f:color': {}, 'f:size': {} } },
    });
    await env.registry.patch(
      W,
      'default',
      'a',
      'merge',
      { spec: { color: 'blue' } },
      { fieldManager: 'kubectl-client-side-apply' },
      ctx,
    );
    const st = await statusOf(() =>
      env.registry.patch(
        W,
        'default',
        'a',
        'apply',
        cfg({ color: 'green', size: 1 }),
        { fieldManager: 'kubectl' },
        ctx,
      ),
    );
    expect(st).to.deep.equal({
      ...base,
      message:
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using test.fluxvm.dev/v1: .spec.color',
      reason: 'Conflict',
      details: {
        causes: [
          {
            reason: 'FieldManagerConflict',
            message: 'conflict with "kubectl-client-side-apply" using test.fluxvm.dev/v1',
            field: '.spec.color',
          },
        ],
      },
      code: 409,
    });
    const f = await env.registry.patch(
      W,
      'default',
      'a',
      'apply',
      cfg({ color: 'green', size: 1 }),
      { fieldManager: 'kubectl', force: true },
      ctx,
    );
    expect(f.created).to.equal(false);
    expect(f.object.spec).to.deep.equal({ color: 'green', size: 1 });
    expect(f.object.metadata.managedFields?.map((e) => e.manager)).to.deep.equal(['kubectl']);
    const removed = await env.registry.patch(
      W,
      'default',
      'a',
      'apply',
      cfg({ color: 'green' }),
      { fieldManager: 'kubectl' },
      ctx,
    );
    expect(removed.object.spec).to.deep.equal({ color: 'green' });
    expect(removed.object.metadata.generation).to.equal(4);
  });

  it('status subresource writes change only status', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const s = (
      await env.registry.patch(
        W,
        'default',
        'a',
        'merge',
        { spec: { color: 'ignored' }, metadata: { labels: { x: 'y' } }, status: { phase: 'Ready' } },
        { subresource: 'status', fieldManager: 'ctl' },
        ctx,
      )
    ).object;
    expect(s.spec).to.deep.equal({ color: 'red' });
    expect(s.metadata.labels).to.equal(undefined);
    expect(s.status).to.deep.equal({ phase: 'Ready' });
    expect(s.metadata.generation).to.equal(1);
    expect(s.metadata.managedFields?.find((e) => e.manager === 'ctl')).to.deep.include({
      subresource: 'status',
      fieldsV1: { 'f:status': { '.': {}, 'f:phase': {} } },
    });
  });
});
