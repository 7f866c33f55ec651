// The registry with the real kind definitions (apis/registry.ts) and the default admission:
// schema errors, transition rules that need the old object, the status split for a kind with
// CEL rules, and core Events / Leases through the same machinery.
import { expect } from 'chai';
import fs from 'node:fs';
import { allKinds } from '../../../apis/registry.js';
import { Registry } from '../../../runtime/apiserver/registry.js';
import { Store } from '../../../runtime/store/store.js';
import { statusOf, tempDir } from './registry-fixtures.js';

const ctx = { userAgent: 'kubectl/v1.32.5' };
const SBX = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'sandboxes' };
const CS = { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'changesets' };
const EV = { group: '', version: 'v1', resource: 'events' };
const LEASE = { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' };

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

  const sandbox = (name: string, spec: Record<string, unknown> = { runtime: 'procbox', image: 'alpine:3.20' }) => ({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name },
    spec,
  });

  it('admission defaults the object and refuses unknown fields under Strict (400) and bad values (422)', async () => {
    const s = (await reg.create(SBX, 'default', sandbox('a') as any, { fieldValidation: 'Strict' }, ctx)).object;
    expect(s.spec.workspace?.path).to.equal('/work');
    const unknown = await statusOf(() =>
      reg.create(SBX, 'default', sandbox('b', { runtime: 'procbox', foo: 1 }) as any, { fieldValidation: 'Strict' }, ctx),
    );
    expect(unknown).to.deep.include({
      code: 400,
      reason: 'BadRequest',
      message: 'Sandbox in version "v1alpha1" cannot be handled as a Sandbox: strict decoding error: unknown field "spec.foo"',
    });
    const warn = await reg.create(SBX, 'default', sandbox('c', { runtime: 'procbox', foo: 1 }) as any, { fieldValidation: 'Warn' }, ctx);
    expect(warn.warnings).to.deep.equal(['unknown field "spec.foo"']);
    expect(warn.object.spec.foo).to.equal(undefined);
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
    await reg.patch(CS, 'default', 'cs1', 'merge', { spec: { decision: 'Reject' } }, { fieldValidation: 'Strict' }, ctx);
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
    expect(st.object.status.phase).to.equal('Rejected');
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
      { fieldSelector: 'involvedObject.namespace=default,involvedObject.kind=Sandbox,involvedObject.uid=u2,involvedObject.name=box' },
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
    const stale = { ...c, spec: { ...c.spec, holderIdentity: 'b' } };
    await reg.update(LEASE, 'default', 'leader', { ...c, spec: { ...c.spec, holderIdentity: 'a2' } }, {}, ctx);
    expect((await statusOf(() => reg.update(LEASE, 'default', 'leader', stale, {}, ctx))).reason).to.equal('Conflict');
  });
});
