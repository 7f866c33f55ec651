// The Sandbox reconciler against the real in-process API server (registry, admission, SQLite)
// with an in-memory fake Runtime: status, conditions, events and the runtime's instances are
// asserted after each pass. procbox itself is covered end to end in test/e2e/sandbox*.test.ts.
import { expect } from 'chai';
import { kstatus } from '../../kstatus.js';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { EventRecorder, realClock, type Clock } from '../../../runtime/controller/index.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { SANDBOX_FINALIZER, SandboxReconciler } from '../../../controllers/sandbox/reconciler.js';
import { SandboxStateStore } from '../../../controllers/sandbox/state.js';
import { checkpointsGVR, sandboxesGVR } from '../../../controllers/common/kinds.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { FakeRuntime } from './fake-runtime.js';

const EVENTS = { group: '', version: 'v1', resource: 'events' };

describe('SandboxReconciler (fake runtime, real API server)', () => {
  let env: Env;
  let rt: FakeRuntime;
  let r: SandboxReconciler;
  let offset = 0;
  let stateDir: string;
  const clock: Clock = { now: () => Date.now() + offset, setTimeout: realClock.setTimeout };
  const key = (name: string) => ({ namespace: 'default', name });
  const cond = (o: any, type: string) => o.status?.conditions?.find((c: any) => c.type === type);
  const get = (name: string) => env.client.get<any>(sandboxesGVR, 'default', name);
  const create = (name: string, spec: Record<string, unknown> = {}) =>
    env.client.create<KubeObject>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name },
      spec,
    });
  // Events are recorded asynchronously (the reconciler does not wait for them): the recorder
  // the reconcilers get keeps each write's promise, and reasons() waits for all of them.
  const recorded: Promise<unknown>[] = [];
  const recorder = () => {
    const rec = new EventRecorder({ client: env.client });
    const event = rec.event.bind(rec);
    rec.event = (...a) => {
      const p = event(...a);
      recorded.push(p);
      return p;
    };
    return rec;
  };
  const reasons = async (name: string) => {
    await Promise.all(recorded);
    return (await env.client.list<any>(EVENTS, 'default')).items
      .filter((e) => e.involvedObject.name === name)
      .map((e) => e.reason);
  };
  /**
   * Runs passes until the reconciler stops asking to be run again at once (finalizer,
   * Terminating) and no background work it started (create, clone, teardown) is left: each
   * work's end is followed by the pass its enqueue would bring.
   */
  let kicks = 0; // keys the background work's end enqueued (the controller's enqueue)
  const settle = async (name: string) => {
    let res = await r.reconcile(key(name));
    for (let i = 0; i < 10; i++) {
      await r.idle();
      if (!kicks && res.requeueAfterMs !== 0) break;
      kicks = 0;
      res = await r.reconcile(key(name));
    }
    return res;
  };

  beforeEach(() => {
    env = makeEnv();
    rt = new FakeRuntime();
    offset = 0;
    kicks = 0;
    recorded.length = 0;
    stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-state-'));
    r = new SandboxReconciler({
      client: env.client,
      runtime: rt,
      recorder: recorder(),
      state: new SandboxStateStore(stateDir),
      nodeName: 'node-a',
      clock,
      healthIntervalMs: 30_000,
      enqueue: () => void kicks++,
    });
  });
  afterEach(() => {
    env.close();
    fs.rmSync(stateDir, { recursive: true, force: true });
  });

  it('creates the instance under the uid, reports Running/Ready with node, capabilities, startedAt; idempotent', async () => {
    const o = await create('a', { resources: { memory: '64Mi' } });
    const res = await settle('a');
    expect(res.requeueAfterMs).to.equal(30_000);
    const s = await get('a');
    expect(s.metadata.finalizers).to.deep.equal([SANDBOX_FINALIZER]);
    expect(s.status).to.include({ phase: 'Running', nodeName: 'node-a', observedGeneration: 1 });
    expect(s.status.capabilities.backend).to.equal('procbox');
    expect(s.status.conditions[0]).to.include({
      type: 'Ready',
      status: 'True',
      reason: 'Running',
      observedGeneration: 1,
    });
    expect(rt.instances.get(o.metadata.uid!)!.cfg.resources).to.deep.equal({ memoryBytes: 64 * 2 ** 20 });
    const rv = s.metadata.resourceVersion;
    await settle('a');
    expect((await get('a')).metadata.resourceVersion).to.equal(rv); // nothing changed: no write
    expect(rt.instances.size).to.equal(1);
    expect(await reasons('a')).to.deep.equal(['Started']);
  });

  it('ttlSeconds: requeues to expiry, then destroys the instance and reports Expired (object kept)', async () => {
    const o = await create('t', { ttlSeconds: 5 });
    const res = await settle('t');
    expect(res.requeueAfterMs).to.be.within(3000, 5000);
    expect((await get('t')).status.expiresAt).to.match(/Z$/);
    offset = 6000;
    await settle('t');
    const s = await get('t');
    expect(s.status.phase).to.equal('Expired');
    expect(s.status.conditions[0]).to.include({ status: 'False', reason: 'Expired' });
    expect(kstatus(s)).to.deep.equal({ status: 'Failed', reason: 'Expired' });
    expect(rt.instances.has(o.metadata.uid!)).to.equal(false);
    expect(await reasons('t')).to.include('Expired');
    await settle('t'); // stays Expired, never recreated, not re-reported
    expect(rt.instances.size).to.equal(0);
    const ev = (await env.client.list<any>(EVENTS, 'default')).items.find(
      (e) => e.involvedObject.name === 't' && e.reason === 'Expired',
    );
    expect(ev.count).to.equal(1);
  });

  it('spec.paused pauses and resumes the instance; Ready follows', async () => {
    const o = await create('p');
    await settle('p');
    await env.client.patch(sandboxesGVR, 'default', 'p', 'merge', { spec: { paused: true } });
    await settle('p');
    let s = await get('p');
    expect(s.status.phase).to.equal('Paused');
    expect(s.status.conditions[0]).to.include({ status: 'True', reason: 'Paused', observedGeneration: 2 });
    expect(kstatus(s).status, 'a paused sandbox is Current').to.equal('Current');
    expect(rt.instances.get(o.metadata.uid!)!.info.state).to.equal('paused');
    await env.client.patch(sandboxesGVR, 'default', 'p', 'merge', { spec: { paused: false } });
    await settle('p');
    s = await get('p');
    expect(s.status.phase).to.equal('Running');
    expect(await reasons('p')).to.include.members(['Started', 'Paused', 'Running']);
  });

  it('an instance that died out of band is revived and an Event says so', async () => {
    const o = await create('d');
    await settle('d');
    rt.kill(o.metadata.uid!);
    await settle('d');
    expect(rt.instances.get(o.metadata.uid!)!.info.state).to.equal('running');
    expect(await reasons('d')).to.include('Restarted');
    expect((await get('d')).status.phase).to.equal('Running');
  });

  it('an instance that died and cannot be restarted says why (reason, first line, Event, Stalled when diagnosed) and is retried with backoff', async () => {
    const o = await create('r');
    await settle('r');
    rt.kill(o.metadata.uid!);
    rt.failRevive = new RuntimeError('Internal', 'qemu could not start (exit 1): Could not open disk', 'QemuFailed');
    let res = await settle('r');
    expect(res.requeueAfterMs).to.equal(1000);
    let s = await get('r');
    expect(s.status.phase).to.equal('Starting');
    expect(cond(s, 'Ready')).to.include({
      status: 'False',
      reason: 'QemuFailed',
      message:
        'the sandbox stopped and restarting it failed: qemu could not start (exit 1): Could not open disk (attempt 1, retried in 1 s)',
    });
    expect(cond(s, 'Stalled')).to.include({ status: 'True', reason: 'QemuFailed' });
    expect(await reasons('r')).to.include('QemuFailed');
    res = await settle('r');
    expect(res.requeueAfterMs, 'a pass during the backoff does not try again').to.be.within(1, 1000);
    rt.failRevive = undefined;
    offset += 1000;
    await settle('r');
    s = await get('r');
    expect(s.status.phase).to.equal('Running');
    expect(cond(s, 'Stalled')).to.equal(undefined);
    expect(await reasons('r')).to.include('Restarted');
  });

  it('an instance lost with its state fails the sandbox instead of silently starting empty', async () => {
    const o = await create('l');
    await settle('l');
    await rt.destroy(o.metadata.uid!);
    await settle('l');
    const s = await get('l');
    expect(s.status.phase).to.equal('Failed');
    expect(s.status.conditions[0].reason).to.equal('InstanceLost');
    expect(rt.instances.size).to.equal(0);
  });

  it('an instance the runtime failed (SandboxInfo.failed) is Failed with its reason and a Warning, never revived, and stays Failed', async () => {
    const o = await create('g', { runtime: 'procbox' });
    await settle('g');
    rt.failInstance(o.metadata.uid!, 'GuestProtocolError', 'guest agent protocol violation: frame of 4294967295 bytes');
    const res = await settle('g');
    expect(res.requeueAfterMs, 'no health requeue for a Failed sandbox').to.equal(undefined);
    const s = await get('g');
    expect(s.status.phase).to.equal('Failed');
    expect(s.status.conditions[0]).to.include({ type: 'Ready', status: 'False', reason: 'GuestProtocolError' });
    expect(s.status.conditions[0].message).to.match(/frame of 4294967295 bytes/);
    expect(await reasons('g')).to.include('GuestProtocolError');
    expect(await reasons('g')).to.not.include('Restarted');
    await settle('g');
    expect(rt.instances.get(o.metadata.uid!)!.info.state, 'not revived').to.equal('stopped');
    expect((await get('g')).status.phase).to.equal('Failed');
  });

  it('delete: Terminating, then the finalizer destroys the instance and its stored state', async () => {
    const o = await create('x');
    await settle('x');
    const store = new SandboxStateStore(stateDir);
    await store.saveBaseline(o.metadata.uid!, {
      mode: 'sha256',
      paths: ['/work'],
      files: {},
      takenAt: new Date().toISOString(),
    });
    await env.client.delete(sandboxesGVR, 'default', 'x');
    await settle('x');
    expect(rt.instances.size).to.equal(0);
    expect(fs.existsSync(path.join(stateDir, o.metadata.uid!))).to.equal(false);
    try {
      await get('x');
      expect.fail('the object should be gone');
    } catch (e) {
      expect((e as any).code).to.equal(404);
    }
    expect(await reasons('x')).to.include.members(['Terminating', 'Destroyed']);
  });

  it('a permanent create error is Failed (not retried); a transient one is Starting, said at once and retried with backoff (1 s doubling); a diagnosed one is Stalled', async () => {
    rt.failCreate = new RuntimeError('Unsupported', 'network mode allowList is not supported');
    await create('f', { network: { mode: 'allowList', allow: ['a.com'] } });
    await settle('f');
    let s = await get('f');
    expect(s.status.phase).to.equal('Failed');
    expect(s.status.conditions[0]).to.include({ reason: 'CreateFailed' });
    expect(s.status.message).to.match(/allowList/);
    rt.failCreate = new RuntimeError('Internal', 'disk full\nsecond line');
    await create('g');
    let res = await settle('g');
    expect(res.requeueAfterMs).to.equal(1000);
    s = await get('g');
    expect(s.status.phase).to.equal('Starting');
    expect(cond(s, 'Ready')).to.include({
      status: 'False',
      reason: 'CreateFailed',
      message: 'creating the sandbox failed: disk full (attempt 1, retried in 1 s)',
    });
    expect(cond(s, 'Reconciling')).to.include({ status: 'True', reason: 'CreateFailed' });
    expect(cond(s, 'Stalled')).to.equal(undefined);
    // A pass before the backoff ended (a watch event) does not try again.
    const creates = rt.createCalls;
    res = await settle('g');
    expect(res.requeueAfterMs).to.be.within(1, 1000);
    expect(rt.createCalls).to.equal(creates);
    // The runtime's diagnosis (RuntimeError.reason) is the reason, and Stalled: retrying will not fix it.
    rt.failCreate = new RuntimeError('Internal', 'qemu could not start (exit 1): Permission denied', 'QemuFailed');
    offset += 1000;
    res = await settle('g');
    expect(res.requeueAfterMs).to.equal(2000);
    s = await get('g');
    expect(s.status.phase).to.equal('Starting');
    expect(cond(s, 'Ready')).to.include({ status: 'False', reason: 'QemuFailed' });
    expect(cond(s, 'Stalled')).to.include({
      status: 'True',
      reason: 'QemuFailed',
      message:
        'creating the sandbox failed: qemu could not start (exit 1): Permission denied (attempt 2, retried in 2 s)',
    });
    expect(cond(s, 'Reconciling')).to.equal(undefined);
    expect(await reasons('g')).to.include.members(['CreateFailed', 'QemuFailed']);
    rt.failCreate = undefined;
    offset += 2000;
    await settle('g');
    s = await get('g');
    expect(s.status.phase).to.equal('Running');
    expect(cond(s, 'Stalled')).to.equal(undefined);
  });

  it('sources: a fork waits for its parent (Pending) then uses its uid; a checkpoint source waits for readyToUse', async () => {
    await create('child', { workspace: { source: { sandboxRef: { name: 'mom' } } } });
    expect((await settle('child')).requeueAfterMs).to.equal(2000);
    expect((await get('child')).status).to.include({ phase: 'Pending' });
    expect((await get('child')).status.conditions[0].reason).to.equal('SourceNotFound');
    expect(kstatus(await get('child'))).to.deep.equal({ status: 'InProgress', reason: 'SourceNotFound' });
    const mom = await create('mom');
    await settle('mom');
    await settle('child');
    const c = await get('child');
    expect(c.status.phase).to.equal('Running');
    expect(rt.instances.get(c.metadata.uid)!.cfg.source).to.deep.equal({ sandboxId: mom.metadata.uid });

    await create('fromck', { workspace: { source: { checkpointRef: { name: 'ck' } } } });
    await settle('fromck');
    expect((await get('fromck')).status.conditions[0].reason).to.equal('SourceNotFound');
    const ck = await env.client.create<any>(checkpointsGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name: 'ck' },
      spec: { sandboxRef: { name: 'mom' } },
    });
    await settle('fromck');
    expect((await get('fromck')).status.conditions[0].reason).to.equal('SourceNotReady');
    await env.client.updateStatus(checkpointsGVR, 'default', { ...ck, status: { phase: 'Ready', readyToUse: true } });
    await settle('fromck');
    const f = await get('fromck');
    expect(f.status.phase).to.equal('Running');
    expect(rt.instances.get(f.metadata.uid)!.cfg.source).to.deep.equal({ checkpointId: ck.metadata.uid });
  });

  it("children waiting for one parent are forked together in one runtime.fork when their spec is the parent's", async () => {
    const mom = await create('mom', { resources: { pids: 50 } });
    await settle('mom');
    const kids = ['k1', 'k2', 'k3'];
    for (const k of kids)
      await create(k, { resources: { pids: 50 }, workspace: { source: { sandboxRef: { name: 'mom' } } } });
    await create('odd', { workspace: { source: { sandboxRef: { name: 'mom' } } } }); // different resources: not batched
    const all = async () => Promise.all([...kids, 'odd'].map((k) => get(k)));
    const siblings = (s: any) =>
      cache.filter((c) => c.metadata.uid !== s.metadata.uid && c.spec?.workspace?.source?.sandboxRef?.name === 'mom');
    let cache = await all();
    r = new SandboxReconciler({
      client: env.client,
      runtime: rt,
      recorder: recorder(),
      state: new SandboxStateStore(stateDir),
      nodeName: 'node-a',
      clock,
      siblings,
      enqueue: () => void kicks++,
    });
    await settle('k2');
    cache = await all();
    expect(rt.forkCalls).to.have.length(1);
    expect(rt.forkCalls[0]!.sort()).to.deep.equal(
      cache
        .slice(0, 3)
        .map((c) => c.metadata.uid)
        .sort(),
    );
    for (const k of [...kids, 'odd']) await settle(k);
    expect(rt.forkCalls).to.have.length(1);
    for (const k of [...kids, 'odd']) {
      const s = await get(k);
      expect(s.status.phase, k).to.equal('Running');
      expect(rt.instances.get(s.metadata.uid)!.cfg.source).to.deep.equal({ sandboxId: mom.metadata.uid });
      expect(await reasons(k)).to.deep.equal(['Started']);
    }
  });

  it("sources are looked up in the sandbox's own namespace only: another namespace's sandbox or checkpoint is not found", async () => {
    const NS = { group: '', version: 'v1', resource: 'namespaces' };
    await env.client.create(NS, undefined, { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'other' } });
    await create('mom');
    await settle('mom');
    const ck = await env.client.create<any>(checkpointsGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name: 'ck' },
      spec: { sandboxRef: { name: 'mom' } },
    });
    await env.client.updateStatus(checkpointsGVR, 'default', { ...ck, status: { phase: 'Ready', readyToUse: true } });
    for (const [name, source] of [
      ['fork', { sandboxRef: { name: 'mom' } }],
      ['fromck', { checkpointRef: { name: 'ck' } }],
    ] as const) {
      await env.client.create<KubeObject>(sandboxesGVR, 'other', {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: { name },
        spec: { workspace: { source } },
      });
      expect((await r.reconcile({ namespace: 'other', name })).requeueAfterMs, name).to.equal(2000);
      const st = (await env.client.get<any>(sandboxesGVR, 'other', name)).status;
      expect(st.phase, name).to.equal('Pending');
      expect(st.conditions[0].reason, name).to.equal('SourceNotFound');
    }
    expect(rt.instances.size).to.equal(1); // only mom
  });

  it('a vm sandbox a stopped process left Starting/Creating is created by the next start, or reported Running when its instance is there', async () => {
    const vrt = new FakeRuntime({ backend: 'vm' });
    const fresh = () =>
      new SandboxReconciler({
        client: env.client,
        runtime: vrt,
        recorder: recorder(),
        state: new SandboxStateStore(stateDir),
        nodeName: 'node-a',
        clock,
        enqueue: () => void kicks++,
      });
    const first = fresh();
    const a = await create('va', { runtime: 'vm' });
    const b = await create('vb', { runtime: 'vm' });
    vrt.before = (op, _id, cfg) =>
      op === 'create' && cfg?.id === a.metadata.uid ? new Promise<void>(() => undefined) : Promise.resolve();
    for (const n of ['va', 'vb']) await first.reconcile(key(n)); // both creates start; va's is held
    for (const n of ['va', 'vb'])
      expect(
        (await get(n)).status.conditions.find((c: any) => c.type === 'Reconciling'),
        n,
      ).to.include({ status: 'True', reason: 'Creating' });
    // The process stops: va's create never happened; vb's did (its status still says Creating).
    for (let i = 0; i < 100 && !vrt.instances.has(b.metadata.uid!); i++) await new Promise((res) => setImmediate(res));
    expect(vrt.instances.has(b.metadata.uid!)).to.equal(true);
    vrt.before = undefined; // va's held create stays held for good: the old process is gone
    expect(vrt.instances.has(a.metadata.uid!)).to.equal(false);
    const next = fresh();
    for (const n of ['va', 'vb']) {
      let res = await next.reconcile(key(n));
      await next.idle();
      res = await next.reconcile(key(n));
      const s = await get(n);
      expect(s.status.phase, n).to.equal('Running');
      expect(
        s.status.conditions.find((c: any) => c.type === 'Reconciling'),
        n,
      ).to.equal(undefined);
      expect(res.requeueAfterMs, n).to.equal(30_000);
    }
    expect([...vrt.instances.keys()].sort()).to.deep.equal([a.metadata.uid, b.metadata.uid].sort());
    expect(await reasons('va')).to.deep.equal(['Started']);
    expect(await reasons('vb')).to.deep.equal(['Started']);
  });

  it('a runtime the node does not run, a git source that cannot be cloned and a self-fork fail with a clear reason', async () => {
    await create('vm', { runtime: 'vm' });
    await create('git', { workspace: { source: { git: { url: 'https://example.com/r.git' } } } });
    await create('self', { workspace: { source: { sandboxRef: { name: 'self' } } } });
    for (const [n, reason] of [
      ['vm', 'RuntimeUnavailable'],
      ['git', 'CloneFailed'],
      ['self', 'InvalidSource'],
    ]) {
      await settle(n!);
      const s = await get(n!);
      expect(s.status.phase, n).to.equal('Failed');
      expect(s.status.conditions[0].reason, n).to.equal(reason);
      expect(kstatus(s), n).to.deep.equal({ status: 'Failed', reason });
    }
    expect(rt.instances.size).to.equal(0); // the git sandbox's instance went with the failed clone
  });
});
