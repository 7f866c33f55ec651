// The registry with the real kind definitions (apis/registry.ts) and the default admission:
// schema errors, transition rules that need the old object, the status split for a kind with
// CEL rules, and core Events / Leases through the same machinery.
import { expect } from 'chai';
import fs from 'node:fs';
import { allKinds } from '../../../apis/registry.js';
import { Registry } from '../../../runtime/apiserver/registry.js';
import { Store } from '../../../runtime/store/store.js';
import { statusOf, tempDir } from './registry-fixtures.js';
import { loose } from '../../support/objects.js';

const ctx = { userAgent: 'kubectl/v1.32.5' };
const SBX = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' };
const CS = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'changesets' };
const EV = { group: '', version: 'v1', resource: 'events' };
const LEASE = { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' };
const SECRET = { group: '', version: 'v1', resource: 'secrets' };
const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');

describe('registry with the real kinds', () => {
  let dir: string;
  let store: Store;
  let reg: Registry;
  beforeEach(() => {
    dir = tempDir();
    store = new Store({ dir, compaction: { intervalMs: 0 } });
    reg = new Registry({ store, kinds: allKinds });
  });
  afterEach(() => {
    store.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const sandbox = (name: string, spec: Record<string, unknown> = { runtime: 'vm', image: 'alpine:3.20' }) => ({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name },
    spec,
  });

  it('admission defaults the object and refuses unknown fields under Strict (400) and bad values (422)', async () => {
    const s = (await reg.create(SBX, 'default', sandbox('a') as any, { fieldValidation: 'Strict' }, ctx)).object;
    expect(loose(s).spec.workspace?.path).to.equal('/work');
    const unknown = await statusOf(() =>
      reg.create(
        SBX,
        'default',
        sandbox('b', { runtime: 'procbox', foo: 1 }) as any,
        { fieldValidation: 'Strict' },
        ctx,
      ),
    );
    expect(unknown).to.deep.include({
      code: 400,
      reason: 'BadRequest',
      message:
        'Sandbox in version "v1alpha1" cannot be handled as a Sandbox: strict decoding error: unknown field "spec.foo"',
    });
    const warn = await reg.create(
      SBX,
      'default',
      sandbox('c', { runtime: 'procbox', foo: 1 }) as any,
      { fieldValidation: 'Warn' },
      ctx,
    );
    expect(warn.warnings).to.deep.equal(['unknown field "spec.foo"']);
    expect(loose(warn.object).spec.foo).to.equal(undefined);
    const bad = await statusOf(() =>
      reg.create(SBX, 'default', sandbox('d', { runtime: 'nope' }) as any, { fieldValidation: 'Strict' }, ctx),
    );
    expect(bad.code).to.equal(422);
    expect(bad.reason).to.equal('Invalid');
    expect(bad.details.kind).to.equal('Sandbox');
    expect(bad.details.causes.map((c: any) => c.field)).to.include('spec.runtime');
    expect(bad.message).to.match(/^Sandbox\.fluxvm\.dev "d" is invalid: spec\.runtime: /);
  });

  it('transition rules see the old object on update and patch', async () => {
    await reg.create(SBX, 'default', sandbox('box') as any, {}, ctx);
    const cs = {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name: 'cs1' },
      spec: { sandboxRef: { name: 'box' }, command: ['sh', '-c', 'true'] },
    };
    await reg.create(CS, 'default', cs as any, { fieldValidation: 'Strict' }, ctx);
    const imm = await statusOf(() =>
      reg.patch(CS, 'default', 'cs1', 'merge', { spec: { command: ['false'] } }, { fieldValidation: 'Strict' }, ctx),
    );
    expect(imm.code).to.equal(422);
    expect(imm.message).to.contain('command is immutable');
    // A decision before the speculation finished is refused; the controller's Pending allows it.
    const early = await statusOf(() =>
      reg.patch(CS, 'default', 'cs1', 'merge', { spec: { decision: 'Reject' } }, { fieldValidation: 'Strict' }, ctx),
    );
    expect(early.code).to.equal(422);
    await reg.patch(CS, 'default', 'cs1', 'merge', { status: { phase: 'Pending' } }, { subresource: 'status' }, ctx);
    await reg.patch(
      CS,
      'default',
      'cs1',
      'merge',
      { spec: { decision: 'Reject' } },
      { fieldValidation: 'Strict' },
      ctx,
    );
    const fin = await statusOf(() =>
      reg.patch(CS, 'default', 'cs1', 'merge', { spec: { decision: 'Approve' } }, { fieldValidation: 'Strict' }, ctx),
    );
    expect(fin.code).to.equal(422);
    expect(fin.details.causes[0]).to.deep.include({
      field: 'spec.decision',
      message: 'Forbidden: a rejected changeset is final: decision cannot change from Reject',
    });
    // A status write does not re-judge the (unchanged) spec and does not bump generation.
    const st = await reg.patch(
      CS,
      'default',
      'cs1',
      'merge',
      { status: { phase: 'Rejected' } },
      { subresource: 'status', fieldValidation: 'Strict' },
      ctx,
    );
    expect(loose(st.object).status.phase).to.equal('Rejected');
    expect(st.object.metadata.generation).to.equal(2);
  });

  it('core Events (with their field selectors) and Leases use the same machinery', async () => {
    const ev = (name: string, uid: string) => ({
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name },
      involvedObject: { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Sandbox', name: 'box', namespace: 'default', uid },
      reason: 'Booted',
      message: 'VM booted in 120ms',
      type: 'Normal',
      source: { component: 'fluxvm-controller' },
      count: 1,
    });
    await reg.create(EV, 'default', ev('e1', 'u1') as any, { fieldValidation: 'Strict' }, ctx);
    await reg.create(EV, 'default', ev('e2', 'u2') as any, { fieldValidation: 'Strict' }, ctx);
    const l = await reg.list(
      EV,
      'default',
      {
        fieldSelector:
          'involvedObject.namespace=default,involvedObject.kind=Sandbox,involvedObject.uid=u2,involvedObject.name=box',
      },
      ctx,
    );
    expect(l.kind).to.equal('EventList');
    expect(l.items.map((i) => i.metadata.name)).to.deep.equal(['e2']);
    const lease = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name: 'leader' },
      spec: { holderIdentity: 'a', leaseDurationSeconds: 15 },
    };
    const c = (await reg.create(LEASE, 'default', lease as any, { fieldValidation: 'Strict' }, ctx)).object;
    const stale = { ...c, spec: { ...loose(c).spec, holderIdentity: 'b' } };
    await reg.update(LEASE, 'default', 'leader', { ...c, spec: { ...loose(c).spec, holderIdentity: 'a2' } }, {}, ctx);
    expect((await statusOf(() => reg.update(LEASE, 'default', 'leader', stale, {}, ctx))).reason).to.equal('Conflict');
  });

  it('Secrets: stringData is merged into data as base64 and never stored; type defaults to Opaque (also when empty)', async () => {
    const secret = (name: string, extra: Record<string, unknown>) => ({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name },
      ...extra,
    });
    // kubectl create secret generic sends `type: ""`; stringData wins over the same data key.
    const made = await reg.create(
      SECRET,
      'default',
      secret('s', {
        type: '',
        data: { keep: b64('old'), a: b64('replaced') },
        stringData: { a: 'b', 'cfg.txt': 'grüße' },
      }) as any,
      { fieldValidation: 'Strict' },
      ctx,
    );
    const want = { keep: b64('old'), a: b64('b'), 'cfg.txt': b64('grüße') };
    expect(loose(made.object).data).to.deep.equal(want);
    expect(made.object).to.not.have.property('stringData');
    expect(loose(made.object).type).to.equal('Opaque');
    const got = await reg.get(SECRET, 'default', 's', ctx);
    expect(loose(got).data).to.deep.equal(want);
    expect(got).to.not.have.property('stringData');
    expect(loose(got).type).to.equal('Opaque');
    expect(JSON.stringify(got.metadata.managedFields)).to.not.include('stringData');

    // Absent type and no data at all.
    const plain = (await reg.create(SECRET, 'default', secret('p', { stringData: { x: 'y' } }) as any, {}, ctx)).object;
    expect(loose(plain).data).to.deep.equal({ x: b64('y') });
    expect(loose(plain).type).to.equal('Opaque');

    // Every write path: merge patch, update, dry run, server-side apply.
    const patched = await reg.patch(SECRET, 'default', 's', 'merge', { stringData: { a: 'c' } }, {}, ctx);
    expect(loose(patched.object).data).to.deep.equal({ ...want, a: b64('c') });
    expect(patched.object).to.not.have.property('stringData');
    const updated = await reg.update(SECRET, 'default', 'p', { ...plain, stringData: { z: '1' } } as any, {}, ctx);
    expect(loose(updated.object).data).to.deep.equal({ x: b64('y'), z: b64('1') });
    expect(updated.object).to.not.have.property('stringData');
    const dry = await reg.patch(SECRET, 'default', 'p', 'merge', { stringData: { x: 'dry' } }, { dryRun: true }, ctx);
    expect((loose(dry.object).data as Record<string, string>).x).to.equal(b64('dry'));
    expect(loose(await reg.get(SECRET, 'default', 'p', ctx)).data as Record<string, string>).to.include({
      x: b64('y'),
    });
    const applied = await reg.patch(
      SECRET,
      'default',
      'ssa',
      'apply',
      { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'ssa' }, stringData: { k: 'v' } },
      { fieldManager: 'tool' },
      ctx,
    );
    expect(loose(applied.object).data).to.deep.equal({ k: b64('v') });
    expect(applied.object).to.not.have.property('stringData');
    expect(loose(applied.object).type).to.equal('Opaque');

    // The type stays immutable; a stringData that is not a map of strings is a 422 naming it.
    const retype = await statusOf(() =>
      reg.patch(SECRET, 'default', 's', 'merge', { type: 'kubernetes.io/tls' }, {}, ctx),
    );
    expect(retype.code).to.equal(422);
    expect(retype.details.causes.map((c: any) => c.field)).to.include('type');
    const bad = await statusOf(() =>
      reg.create(SECRET, 'default', secret('bad', { stringData: { n: 1 } }) as any, {}, ctx),
    );
    expect(bad.code).to.equal(422);
    expect(bad.details.causes.map((c: any) => c.field)).to.include('stringData.n');
  });
});
