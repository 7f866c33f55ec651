import { expect } from 'chai';
import { collect, ctx, makeEnv, statusOf, tick, widget, W, G, EV, NS, type Env } from './registry-fixtures.js';
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

describe('registry: finalizers, delete and dryRun', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  it('finalizer lifecycle: deletionTimestamp once, no new finalizers, DELETED when the last goes', async () => {
    await env.registry.create(W, 'default', widget('a', { color: 'r' }, { finalizers: ['x.dev/one'] }) as any, {}, ctx);
    const w = collect(env, { resourceVersion: String(env.store.currentRV) });
    const d = await env.registry.delete(W, 'default', 'a', { propagationPolicy: 'Foreground' }, ctx);
    expect(d.deleted).to.equal(false);
    const m = d.object.metadata;
    expect(m.deletionTimestamp).to.match(/Z$/);
    expect(m.deletionGracePeriodSeconds).to.equal(0);
    expect(m.generation).to.equal(2);
    const again = await env.registry.delete(W, 'default', 'a', {}, ctx);
    expect(again.object.metadata.resourceVersion).to.equal(m.resourceVersion);
    const add = await statusOf(() =>
      env.registry.patch(W, 'default', 'a', 'merge', { metadata: { finalizers: ['x.dev/one', 'x.dev/two'] } }, {}, ctx),
    );
    expect(add).to.deep.equal({
      ...base,
      message:
        'Widget.test.fluxvm.dev "a" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"x.dev/two"}',
      reason: 'Invalid',
      details: {
        name: 'a',
        group: 'test.fluxvm.dev',
        kind: 'Widget',
        causes: [
          {
            reason: 'FieldValueForbidden',
            field: 'metadata.finalizers',
            message:
              'Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"x.dev/two"}',
          },
        ],
      },
      code: 422,
    });
    const spec = (await env.registry.patch(W, 'default', 'a', 'merge', { spec: { color: 'b' } }, {}, ctx)).object;
    expect(spec.metadata.deletionTimestamp).to.equal(m.deletionTimestamp);
    const fin = await env.registry.patch(W, 'default', 'a', 'merge', { metadata: { finalizers: null } }, {}, ctx);
    expect(fin.object.metadata.finalizers).to.equal(undefined);
    expect((await statusOf(() => env.registry.get(W, 'default', 'a', ctx))).code).to.equal(404);
    await tick();
    expect(w.names()).to.deep.equal(['MODIFIED a', 'MODIFIED a', 'DELETED a']);
    w.stream.close();
  });

  it('delete preconditions are 409 with kube messages', async () => {
    const a = (await env.registry.create(W, 'default', widget('a') as any, {}, ctx)).object;
    expect(
      (await statusOf(() => env.registry.delete(W, 'default', 'a', { preconditions: { uid: 'u' } }, ctx))).message,
    ).to.equal(
      `Operation cannot be fulfilled on widgets.test.fluxvm.dev "a": Precondition failed: UID in precondition: u, UID in object meta: ${a.metadata.uid}`,
    );
    const rv = await statusOf(() =>
      env.registry.delete(W, 'default', 'a', { preconditions: { resourceVersion: '1' } }, ctx),
    );
    expect(rv).to.deep.include({ code: 409, reason: 'Conflict' });
    expect(rv.message).to.match(
      /Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: \d+$/,
    );
    const ok = await env.registry.delete(
      W,
      'default',
      'a',
      { preconditions: { uid: a.metadata.uid, resourceVersion: a.metadata.resourceVersion } },
      ctx,
    );
    expect(ok.deleted).to.equal(true);
  });

  it('dryRun on every write computes the result and persists nothing, no events', async () => {
    await env.registry.create(W, 'default', widget('a', { color: 'r' }, { finalizers: ['f'] }) as any, {}, ctx);
    const rv = env.store.currentRV;
    const w = collect(env, { resourceVersion: String(rv) });
    const c = await env.registry.create(W, 'default', widget('b') as any, { dryRun: true }, ctx);
    expect(c.object.metadata.uid).to.be.a('string');
    expect((await statusOf(() => env.registry.get(W, 'default', 'b', ctx))).code).to.equal(404);
    const u = await env.registry.patch(W, 'default', 'a', 'merge', { spec: { color: 'z' } }, { dryRun: true }, ctx);
    expect(loose(u.object).spec.color).to.equal('z');
    expect(u.object.metadata.generation).to.equal(2);
    await env.registry.patch(W, 'default', 'n', 'apply', widget('n'), { dryRun: true, fieldManager: 'kubectl' }, ctx);
    await env.registry.update(
      W,
      'default',
      'a',
      { ...(await env.registry.get(W, 'default', 'a', ctx)), status: { p: 1 } },
      { dryRun: true, subresource: 'status' },
      ctx,
    );
    const d = await env.registry.delete(W, 'default', 'a', { dryRun: true }, ctx);
    expect(d.object.metadata.deletionTimestamp).to.be.a('string');
    await env.registry.deleteCollection(W, 'default', { dryRun: true }, ctx);
    expect(env.store.currentRV).to.equal(rv);
    const a = await env.registry.get(W, 'default', 'a', ctx);
    expect(loose(a).spec.color).to.equal('r');
    expect(a.metadata.deletionTimestamp).to.equal(undefined);
    await tick();
    expect(w.events).to.deep.equal([]);
    w.stream.close();
  });

  it('deleteCollection honours selectors', async () => {
    for (const [n, app] of [
      ['a', 'x'],
      ['b', 'y'],
      ['c', 'x'],
    ])
      await env.registry.create(W, 'default', widget(n, {}, { labels: { app } }) as any, {}, ctx);
    const r = await env.registry.deleteCollection(W, 'default', { labelSelector: 'app=x' }, ctx);
    expect(r.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'c']);
    expect((await env.registry.list(W, 'default', {}, ctx)).items.map((i) => i.metadata.name)).to.deep.equal(['b']);
  });

  it('the default namespace cannot be deleted', async () => {
    expect(await statusOf(() => env.registry.delete(NS, undefined, 'default', {}, ctx))).to.deep.equal({
      ...base,
      message: 'namespaces "default" is forbidden: this namespace may not be deleted',
      reason: 'Forbidden',
      details: { name: 'default', kind: 'namespaces' },
      code: 403,
    });
  });

  it('deleting a namespace marks it Terminating and leaves its content to the namespace controller; creating in it is 403', async () => {
    await env.registry.create(
      NS,
      undefined,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'team' } },
      {},
      ctx,
    );
    await env.registry.create(W, 'team', widget('a') as any, {}, ctx);
    const d = await env.registry.delete(NS, undefined, 'team', {}, ctx);
    expect(d.deleted).to.equal(false);
    const ns = await env.registry.get(NS, undefined, 'team', ctx);
    expect(loose(ns).status.phase).to.equal('Terminating');
    expect(loose(ns).spec.finalizers).to.deep.equal(['kubernetes']);
    // The request itself deletes nothing inside (runtime/controller/namespace.ts does, level-based).
    expect((await env.registry.list(W, 'team', {}, ctx)).items.map((i) => i.metadata.name)).to.deep.equal(['a']);
    expect((await statusOf(() => env.registry.create(W, 'team', widget('b') as any, {}, ctx))).code).to.equal(403);
    // Once the kubernetes finalizer is removed (what the controller does when it is empty), it goes.
    await env.registry.delete(W, 'team', 'a', {}, ctx);
    // spec.finalizers is left alone by a write to the namespace itself (kube's strategy) ...
    await env.registry.patch(NS, undefined, 'team', 'merge', { spec: { finalizers: [] } }, {}, ctx);
    expect(loose(await env.registry.get(NS, undefined, 'team', ctx)).spec.finalizers).to.deep.equal(['kubernetes']);
    // ... and changes through namespaces/finalize.
    await env.registry.patch(
      NS,
      undefined,
      'team',
      'merge',
      { spec: { finalizers: [] } },
      { subresource: 'finalize' },
      ctx,
    );
    expect((await statusOf(() => env.registry.get(NS, undefined, 'team', ctx))).code).to.equal(404);
  });
});

describe('registry: list pagination and resourceVersion', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv({}, { compaction: { intervalMs: 0, maxEvents: 3 } })));
  afterEach(() => env.close());

  it('limit/continue walk one consistent snapshot with remainingItemCount', async () => {
    for (const n of ['e', 'd', 'c', 'b', 'a']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const p1 = await env.registry.list(W, 'default', { limit: 2 }, ctx);
    expect(p1.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b']);
    expect(p1.metadata.remainingItemCount).to.equal(3);
    // Changes between pages do not show: later pages read at the first page's resourceVersion.
    const cBefore = await env.registry.get(W, 'default', 'c', ctx);
    await env.registry.create(W, 'default', widget('f') as any, {}, ctx);
    await env.registry.delete(W, 'default', 'c', {}, ctx);
    await env.registry.patch(W, 'default', 'd', 'merge', { spec: { color: 'changed' } }, {}, ctx);
    const p2 = await env.registry.list(W, 'default', { limit: 2, continue: p1.metadata.continue }, ctx);
    expect(p2.items.map((i) => i.metadata.name)).to.deep.equal(['c', 'd']);
    expect(p2.items[0]).to.deep.equal(cBefore);
    expect(loose(p2.items[1]).spec.color).to.equal('red');
    expect(p2.metadata.resourceVersion).to.equal(p1.metadata.resourceVersion);
    expect(p2.metadata.remainingItemCount).to.equal(1);
    const p3 = await env.registry.list(W, 'default', { limit: 2, continue: p2.metadata.continue }, ctx);
    expect(p3.items.map((i) => i.metadata.name)).to.deep.equal(['e']);
    expect(p3.metadata.continue).to.equal(undefined);
    expect(p3.metadata.remainingItemCount).to.equal(undefined);
    const now = await env.registry.list(W, 'default', {}, ctx);
    expect(now.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b', 'd', 'e', 'f']);
    // resourceVersionMatch=Exact reads the same snapshot.
    const exact = await env.registry.list(
      W,
      'default',
      { resourceVersion: p1.metadata.resourceVersion, resourceVersionMatch: 'Exact' },
      ctx,
    );
    expect(exact.items.map((i) => i.metadata.name)).to.deep.equal(['a', 'b', 'c', 'd', 'e']);
    expect(exact.metadata.resourceVersion).to.equal(p1.metadata.resourceVersion);
    const sel = await env.registry.list(W, undefined, { limit: 1, fieldSelector: 'metadata.name!=a' }, ctx);
    expect(sel.items.map((i) => i.metadata.name)).to.deep.equal(['b']);
    expect(sel.metadata.remainingItemCount).to.equal(undefined);
    expect(sel.metadata.continue).to.be.a('string');
  });

  it('a continue token older than compaction is 410 Expired', async () => {
    for (const n of ['a', 'b', 'c']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const p1 = await env.registry.list(W, 'default', { limit: 1 }, ctx);
    for (const n of ['d', 'e', 'f', 'g', 'h']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    env.store.compact();
    expect(
      await statusOf(() => env.registry.list(W, 'default', { limit: 1, continue: p1.metadata.continue }, ctx)),
    ).to.deep.equal({
      ...base,
      message:
        'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response.',
      reason: 'Expired',
      code: 410,
    });
  });

  it('field selectors of the kind and of core Events', async () => {
    await env.registry.create(W, 'default', widget('a', { color: 'red' }) as any, {}, ctx);
    await env.registry.create(W, 'default', widget('b', { color: 'blue' }) as any, {}, ctx);
    expect(
      (await env.registry.list(W, undefined, { fieldSelector: 'spec.color=blue' }, ctx)).items.map(
        (i) => i.metadata.name,
      ),
    ).to.deep.equal(['b']);
    const ev = (name: string, uid: string) => ({
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name },
      involvedObject: { kind: 'Widget', name: 'a', namespace: 'default', uid },
      reason: 'Booted',
      type: 'Normal',
    });
    await env.registry.create(EV, 'default', ev('e1', 'u1') as any, {}, ctx);
    await env.registry.create(EV, 'default', ev('e2', 'u2') as any, {}, ctx);
    const l = await env.registry.list(
      EV,
      'default',
      {
        fieldSelector:
          'involvedObject.namespace=default,involvedObject.kind=Widget,involvedObject.uid=u2,involvedObject.name=a',
      },
      ctx,
    );
    expect(l.items.map((i) => i.metadata.name)).to.deep.equal(['e2']);
  });
});

describe('registry: watch semantics', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv({ bookmarkIntervalMs: 20 }, { compaction: { intervalMs: 0, maxEvents: 2 } })));
  afterEach(() => env.close());

  it('too old resourceVersion: one ERROR 410 event, then the stream closes', async () => {
    for (const n of ['a', 'b', 'c', 'd']) await env.registry.create(W, 'default', widget(n) as any, {}, ctx);
    const cut = env.store.compact();
    const w = collect(env, { resourceVersion: '1' });
    await tick();
    expect(w.events).to.deep.equal([
      {
        type: 'ERROR',
        object: { ...base, message: `too old resource version: 1 (${cut})`, reason: 'Expired', code: 410 },
      },
    ]);
    expect(w.closed()).to.equal(true);
  });

  it('selectors filter events; leaving the selection is DELETED, entering is ADDED', async () => {
    await env.registry.create(W, 'default', widget('a', {}, { labels: { app: 'x' } }) as any, {}, ctx);
    const w = collect(env, { labelSelector: 'app=x', resourceVersion: String(env.store.currentRV) });
    await env.registry.create(W, 'default', widget('b', {}, { labels: { app: 'y' } }) as any, {}, ctx);
    await env.registry.patch(W, 'default', 'a', 'merge', { metadata: { labels: { app: 'y' } } }, {}, ctx);
    await env.registry.patch(W, 'default', 'b', 'merge', { metadata: { labels: { app: 'x' } } }, {}, ctx);
    await env.registry.patch(W, 'default', 'b', 'merge', { spec: { n: 1 } }, {}, ctx);
    await env.registry.delete(W, 'default', 'a', {}, ctx);
    await env.registry.delete(W, 'default', 'b', {}, ctx);
    await tick();
    expect(w.names()).to.deep.equal(['DELETED a', 'ADDED b', 'MODIFIED b', 'DELETED b']);
    w.stream.close();
  });

  it('namespace scoping: a watch in one namespace does not see another', async () => {
    await env.registry.create(
      NS,
      undefined,
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'other' } },
      {},
      ctx,
    );
    const w = collect(env, {}, 'default');
    const all = collect(env, {}, ''); // '' = every namespace
    await env.registry.create(W, 'other', widget('x') as any, {}, ctx);
    await env.registry.create(W, 'default', widget('y') as any, {}, ctx);
    await tick();
    expect(w.names()).to.deep.equal(['ADDED y']);
    expect(all.names()).to.deep.equal(['ADDED x', 'ADDED y']);
    w.stream.close();
    all.stream.close();
  });

  it('sendInitialEvents: ADDED then a BOOKMARK marking the end of initial events; periodic bookmarks', async () => {
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    const w = collect(env, {
      sendInitialEvents: true,
      allowWatchBookmarks: true,
      resourceVersionMatch: 'NotOlderThan',
    });
    await tick();
    expect(w.events[0].type).to.equal('ADDED');
    expect(w.events[1]).to.deep.equal({
      type: 'BOOKMARK',
      object: {
        kind: 'Widget',
        apiVersion: 'test.fluxvm.dev/v1',
        metadata: {
          resourceVersion: String(env.store.currentRV),
          annotations: { 'k8s.io/initial-events-end': 'true' },
        },
      },
    });
    await env.registry.create(W, 'default', widget('b') as any, {}, ctx);
    await tick(60);
    const bm = w.events.filter((e) => e.type === 'BOOKMARK').slice(1);
    expect(bm.length).to.be.greaterThan(0);
    expect(bm[bm.length - 1].object.metadata.resourceVersion).to.equal(String(env.store.currentRV));
    w.stream.close();
  });

  it('no bookmarks unless allowed; timeoutSeconds closes the stream', async () => {
    const w = collect(env, { timeoutSeconds: 0.05 });
    await tick(80);
    expect(w.events).to.deep.equal([]);
    expect(w.closed()).to.equal(true);
  });

  it('RV ahead of the store: one ERROR event 504 ResourceVersionTooLarge, as kube, then the stream ends', async () => {
    const current = env.store.currentRV;
    const w = collect(env, { resourceVersion: String(current + 1) });
    await env.registry.create(W, 'default', widget('later') as any, {}, ctx);
    await tick();
    expect(w.events.map((e: any) => e.type)).to.deep.equal(['ERROR']);
    expect((w.events[0] as any).object).to.deep.include({
      kind: 'Status',
      code: 504,
      reason: 'Timeout',
      message: `Timeout: Too large resource version: ${current + 1}, current: ${current}`,
    });
    expect((w.events[0] as any).object.details).to.deep.equal({
      causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }],
      retryAfterSeconds: 1,
    });
    expect(w.closed()).to.equal(true);
  });

  it('resourceVersion is an unsigned 64-bit decimal: exact beyond 2^53, garbage and overflow are 400', async () => {
    // 2^53 + 1 would round to 2^53 as a float: the message must carry it exactly.
    const huge = '9007199254740993';
    const w = collect(env, { resourceVersion: huge });
    await tick();
    expect((w.events[0] as any).object.message).to.equal(
      `Timeout: Too large resource version: ${huge}, current: ${env.store.currentRV}`,
    );
    const list = await statusOf(() =>
      env.registry.list(W, 'default', { resourceVersion: '18446744073709551615' }, ctx),
    );
    expect(list).to.deep.include({ code: 504, reason: 'Timeout' });
    for (const rv of ['18446744073709551616', '-1', '1e3', '0x10', ' 1', '1.0', '99999999999999999999999']) {
      expect((await statusOf(() => env.registry.list(W, 'default', { resourceVersion: rv }, ctx))).code, rv).to.equal(
        400,
      );
      expect(() => env.registry.watch(W, 'default', { resourceVersion: rv }, ctx), rv).to.throw(
        /must be an unsigned 64-bit decimal integer/,
      );
    }
  });

  it('resume from the last seen resourceVersion gives exactly the missed events', async () => {
    const w1 = collect(env, {});
    await env.registry.create(W, 'default', widget('a') as any, {}, ctx);
    await tick();
    const last = w1.events[w1.events.length - 1].object.metadata.resourceVersion!;
    w1.stream.close();
    await env.registry.create(W, 'default', widget('b') as any, {}, ctx);
    const w2 = collect(env, { resourceVersion: last });
    await tick();
    expect(w2.names()).to.deep.equal(['ADDED b']);
    w2.stream.close();
  });
});
