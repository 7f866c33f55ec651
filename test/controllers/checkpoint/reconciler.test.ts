// The Checkpoint reconciler against the real in-process API server with an in-memory fake
// Runtime: Pending until the sandbox runs, Ready with kind/size/takenAt, a memory checkpoint
// refused with a clear condition, and the finalizer freeing the runtime checkpoint.
import { expect } from 'chai';
import { kstatus } from '../../kstatus.js';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EventRecorder } from '../../../runtime/controller/index.js';
import { CHECKPOINT_FINALIZER, CheckpointReconciler } from '../../../controllers/checkpoint/reconciler.js';
import { SandboxReconciler } from '../../../controllers/sandbox/reconciler.js';
import { SandboxStateStore } from '../../../controllers/sandbox/state.js';
import { checkpointsGVR, sandboxesGVR } from '../../../controllers/common/kinds.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { FakeRuntime } from '../sandbox/fake-runtime.js';

describe('CheckpointReconciler (fake runtime, real API server)', () => {
  let env: Env;
  let rt: FakeRuntime;
  let ckr: CheckpointReconciler;
  let sbr: Pick<SandboxReconciler, 'reconcile'>;
  let stateDir: string;
  const ck = (name: string, spec: Record<string, unknown>) =>
    env.client.create<any>(checkpointsGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name },
      spec,
    });
  const getCk = (name: string) => env.client.get<any>(checkpointsGVR, 'default', name);

  beforeEach(() => {
    env = makeEnv();
    rt = new FakeRuntime();
    stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'ck-state-'));
    const recorder = new EventRecorder({ client: env.client });
    ckr = new CheckpointReconciler({ client: env.client, runtime: rt, recorder, nodeName: 'node-a' });
    const sandboxes = new SandboxReconciler({
      client: env.client,
      runtime: rt,
      recorder,
      state: new SandboxStateStore(stateDir),
      nodeName: 'node-a',
    });
    // The sandbox's create runs in the background: a pass, its end, and the pass it brings.
    sbr = { reconcile: async (k) => (await sandboxes.reconcile(k), await sandboxes.idle(), sandboxes.reconcile(k)) };
  });
  afterEach(() => {
    env.close();
    fs.rmSync(stateDir, { recursive: true, force: true });
  });

  it('Pending until the sandbox runs, then Ready with kind, size, takenAt; taken once', async () => {
    const c = await ck('c1', { sandboxRef: { name: 's' } });
    expect((await ckr.reconcile({ namespace: 'default', name: 'c1' })).requeueAfterMs).to.equal(2000);
    let st = (await getCk('c1')).status;
    expect(st).to.include({ phase: 'Pending', readyToUse: false });
    expect(st.conditions[0].reason).to.equal('SandboxNotFound');
    expect(kstatus(await getCk('c1'))).to.deep.equal({ status: 'InProgress', reason: 'SandboxNotFound' });
    const s = await env.client.create<any>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 's' },
      spec: {},
    });
    await sbr.reconcile({ namespace: 'default', name: 's' });
    // The pass starts the checkpoint (Pending, Reconciling reason Checkpointing); its end brings the next pass.
    expect(await ckr.reconcile({ namespace: 'default', name: 'c1' })).to.deep.equal({});
    expect((await getCk('c1')).status.conditions.find((c: any) => c.type === 'Reconciling')).to.include({
      status: 'True',
      reason: 'Checkpointing',
    });
    await ckr.drain();
    await ckr.reconcile({ namespace: 'default', name: 'c1' });
    const got = await getCk('c1');
    st = got.status;
    expect(got.metadata.finalizers).to.deep.equal([CHECKPOINT_FINALIZER]);
    expect(st).to.include({ phase: 'Ready', readyToUse: true, kind: 'disk', size: 42, nodeName: 'node-a' });
    expect(st.takenAt).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(st.conditions[0]).to.include({ type: 'Ready', status: 'True', reason: 'Taken' });
    expect(rt.checkpoints.get(c.metadata.uid)!.sandboxId).to.equal(s.metadata.uid);
    rt.checkpoints.clear();
    await ckr.reconcile({ namespace: 'default', name: 'c1' });
    expect(rt.checkpoints.size).to.equal(0); // never re-taken
  });

  it("the sandbox is looked up in the checkpoint's own namespace only", async () => {
    await env.client.create({ group: '', version: 'v1', resource: 'namespaces' }, undefined, {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: 'other' },
    });
    await env.client.create<any>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 's' },
      spec: {},
    });
    await sbr.reconcile({ namespace: 'default', name: 's' });
    await env.client.create<any>(checkpointsGVR, 'other', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name: 'x' },
      spec: { sandboxRef: { name: 's' } },
    });
    expect((await ckr.reconcile({ namespace: 'other', name: 'x' })).requeueAfterMs).to.equal(2000);
    const st = (await env.client.get<any>(checkpointsGVR, 'other', 'x')).status;
    expect(st).to.include({ phase: 'Pending', readyToUse: false });
    expect(st.conditions[0].reason).to.equal('SandboxNotFound');
    expect(rt.checkpoints.size).to.equal(0);
  });

  it('a memory checkpoint waits for its sandbox, then fails with MemoryCheckpointUnsupported on a backend without them', async () => {
    await ck('m', { sandboxRef: { name: 's' }, memory: true });
    expect((await ckr.reconcile({ namespace: 'default', name: 'm' })).requeueAfterMs).to.equal(2000);
    expect((await getCk('m')).status.conditions[0].reason).to.equal('SandboxNotFound');
    await env.client.create<any>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 's' },
      spec: {},
    });
    await ckr.reconcile({ namespace: 'default', name: 'm' });
    const st = (await getCk('m')).status;
    expect(st).to.include({ phase: 'Failed', readyToUse: false });
    expect(st.conditions[0]).to.include({ status: 'False', reason: 'MemoryCheckpointUnsupported' });
    expect(kstatus(await getCk('m'))).to.deep.equal({ status: 'Failed', reason: 'MemoryCheckpointUnsupported' });
    expect(st.message).to.match(/cannot take memory checkpoints/);
  });

  it('a checkpoint a stopped process left Checkpointing (Pending) is taken by the next start', async () => {
    const s = await env.client.create<any>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 's' },
      spec: {},
    });
    await sbr.reconcile({ namespace: 'default', name: 's' });
    const c = await ck('c3', { sandboxRef: { name: 's' } });
    await ckr.reconcile({ namespace: 'default', name: 'c3' }); // starts it
    await ckr.drain();
    rt.checkpoints.clear(); // as if the process had stopped before it was written
    expect((await getCk('c3')).status.conditions.find((x: any) => x.type === 'Reconciling')).to.include({
      reason: 'Checkpointing',
    });
    // The next start: a new reconciler (nothing tracked in memory) over the same store and runtime.
    const next = new CheckpointReconciler({
      client: env.client,
      runtime: rt,
      recorder: new EventRecorder({ client: env.client }),
      nodeName: 'node-a',
    });
    expect(await next.reconcile({ namespace: 'default', name: 'c3' })).to.deep.equal({});
    await next.drain();
    await next.reconcile({ namespace: 'default', name: 'c3' });
    const st = (await getCk('c3')).status;
    expect(st).to.include({ phase: 'Ready', readyToUse: true });
    expect(st.conditions.find((x: any) => x.type === 'Reconciling')).to.equal(undefined);
    expect(rt.checkpoints.get(c.metadata.uid)!.sandboxId).to.equal(s.metadata.uid);
  });

  it('delete frees the runtime checkpoint through the finalizer', async () => {
    await env.client.create<any>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 's' },
      spec: {},
    });
    await sbr.reconcile({ namespace: 'default', name: 's' });
    const c = await ck('c2', { sandboxRef: { name: 's' } });
    await ckr.reconcile({ namespace: 'default', name: 'c2' });
    await ckr.drain();
    expect(rt.checkpoints.has(c.metadata.uid)).to.equal(true);
    await env.client.delete(checkpointsGVR, 'default', 'c2');
    await ckr.reconcile({ namespace: 'default', name: 'c2' });
    expect(rt.checkpoints.has(c.metadata.uid)).to.equal(false);
    let code = 0;
    await getCk('c2').catch((e) => (code = e.code));
    expect(code).to.equal(404);
  });
});
