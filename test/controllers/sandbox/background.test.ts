// Bounded work: the Sandbox and Checkpoint controllers run their slow runtime
// calls (create and fork, checkpoint, restore in place, teardown) as tracked background work.
// The controllers run in a real Manager against the real in-process API server, with ONE
// worker each, on an in-memory runtime whose operations a test holds on a gate: if a held
// operation kept the worker, nothing else of that controller could reconcile until the gate
// opens. The sandboxes are `runtime: vm` (a procbox create stays in the pass: reconciler.ts
// INLINE_CREATE). The assertions are on event order (another object converges while the gate is still
// closed) and on status, never on wall time.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { RuntimeError, type SandboxConfig } from '../../../native/runtime.js';
import { Manager, type Logger } from '../../../runtime/controller/index.js';
import type { SubresourceRequest } from '../../../runtime/apiserver/http/subresources.js';
import type { AnyObject } from '../../support/objects.js';
import { checkpointsGVR, sandboxesGVR } from '../../../controllers/common/kinds.js';
import { register as registerCheckpoint } from '../../../controllers/checkpoint/index.js';
import type { Registration } from '../../../controllers/common/register.js';
import { register as registerSandbox } from '../../../controllers/sandbox/index.js';
import { kstatus } from '../../kstatus.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { FakeRuntime } from './fake-runtime.js';
import { Gate } from '../../gate.js';
import { eventually } from '../../support/wait.js';

type Op = 'create' | 'fork' | 'checkpoint' | 'restore' | 'destroy';

/** A gate for the runtime operations it matches: they wait on it until open() (or fail()). */
class OpGate extends Gate {
  constructor(readonly matches: (op: Op, id: string, cfg?: SandboxConfig) => boolean) {
    super();
  }
}

const cond = (o: AnyObject, t: string) => (o.status?.conditions as any[] | undefined)?.find((c) => c.type === t);

describe('Sandbox and Checkpoint controllers: slow runtime operations are tracked background work (fake runtime, one worker)', function () {
  this.timeout(30_000);
  let env: Env;
  let rt: FakeRuntime;
  let gates: OpGate[];
  let ac: AbortController;
  let running: Promise<void>;
  let sc: Registration;
  let stateDir: string;
  let onStopped: () => void;

  const hold = (matches: OpGate['matches']) => {
    const g = new OpGate(matches);
    gates.push(g);
    return g;
  };
  const sandbox = (name: string, spec: Record<string, unknown> = {}) =>
    env.client.create<AnyObject>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name },
      spec: { runtime: 'vm', ...spec },
    });
  const checkpoint = (name: string, of: string) =>
    env.client.create<AnyObject>(checkpointsGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name },
      spec: { sandboxRef: { name: of } },
    });
  /** Polls the object until pred holds (watch-free: the controllers' own writes are what we wait for). */
  const until = async (
    gvr: typeof sandboxesGVR,
    name: string,
    pred: (o: AnyObject) => boolean,
    what: string,
  ): Promise<AnyObject> => {
    let last: AnyObject | undefined;
    return eventually(
      async () => {
        last = await env.client.get<AnyObject>(gvr, 'default', name).catch(() => undefined);
        return last && pred(last) ? last : undefined;
      },
      20_000,
      `${name}: ${what}`,
    ).catch((e: Error) => {
      throw new Error(`${e.message}; last status ${JSON.stringify(last?.status)}`);
    });
  };
  const phase = (p: string) => (o: AnyObject) => o.status?.phase === p;
  const restore = (name: string, ck: string) =>
    sc.subresources.find((s) => s.name === 'restore')!.handler.handle!({
      method: 'POST',
      namespace: 'default',
      name,
      subresource: 'restore',
      query: {},
      headers: {},
      body: Buffer.from(JSON.stringify({ checkpoint: ck })),
    } as unknown as SubresourceRequest);

  beforeEach(() => {
    env = makeEnv();
    // The vm backend (its create boots a machine: background work; procbox creates inline, see INLINE_CREATE).
    rt = new FakeRuntime({ backend: 'vm' });
    gates = [];
    rt.before = async (op, id, cfg) => {
      for (const g of gates) if (g.matches(op, id, cfg)) await g.wait(id);
    };
    stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'bg-work-'));
    onStopped = () => undefined;
    let controllersStopped = 0;
    const log: Logger = {
      info: (m) => void (m === 'controller stopped' && ++controllersStopped === 2 && onStopped()),
      error() {},
    };
    const manager = new Manager({ client: env.client, log });
    const deps = { client: env.client, runtime: rt, stateDir, log, concurrency: { sandbox: 1, checkpoint: 1 } };
    sc = registerSandbox(manager, deps);
    registerCheckpoint(manager, deps);
    ac = new AbortController();
    running = manager.start(ac.signal);
  });
  afterEach(async () => {
    for (const g of gates) g.open();
    ac.abort();
    await running;
    env.close();
    fs.rmSync(stateDir, { recursive: true, force: true });
  });

  it('a held VM create: Starting with Reconciling=True reason Creating; another sandbox reaches Running meanwhile; the open gate lands Running', async () => {
    const gate = hold((op, _id, cfg) => op === 'create' && cfg?.env?.HOLD === '1');
    await sandbox('slow', { env: [{ name: 'HOLD', value: '1' }] });
    await gate.reached();
    const held = await until(sandboxesGVR, 'slow', phase('Starting'), 'Starting');
    expect(cond(held, 'Reconciling')).to.include({ status: 'True', reason: 'Creating' });
    expect(cond(held, 'Ready')).to.include({ status: 'False', reason: 'Creating' });
    expect(kstatus(held)).to.deep.equal({ status: 'InProgress', reason: 'Creating' });
    // The one worker is free: another sandbox is created and runs while the first is held.
    await sandbox('fast');
    await until(sandboxesGVR, 'fast', phase('Running'), 'Running');
    expect((await env.client.get<AnyObject>(sandboxesGVR, 'default', 'slow')).status?.phase).to.equal('Starting');
    gate.open();
    const ran = await until(sandboxesGVR, 'slow', phase('Running'), 'Running');
    expect(cond(ran, 'Ready')).to.include({ status: 'True', reason: 'Running' });
    expect(cond(ran, 'Reconciling')).to.equal(undefined);
    expect(rt.instances.has(ran.metadata.uid!)).to.equal(true);
  });

  it('a held VM fork: the child shows Creating while a checkpoint of another sandbox completes and another fork runs', async () => {
    await sandbox('parent');
    const p = await until(sandboxesGVR, 'parent', phase('Running'), 'Running');
    const gate = hold(
      (op, _id, cfg) => op === 'create' && !!cfg?.source && 'sandboxId' in cfg.source && cfg.env?.HOLD === '1',
    );
    await sandbox('child', {
      env: [{ name: 'HOLD', value: '1' }],
      workspace: { source: { sandboxRef: { name: 'parent' } } },
    });
    await gate.reached();
    expect(cond(await until(sandboxesGVR, 'child', phase('Starting'), 'Starting'), 'Reconciling')).to.include({
      status: 'True',
      reason: 'Creating',
    });
    await checkpoint('ck', 'parent');
    expect((await until(checkpointsGVR, 'ck', phase('Ready'), 'Ready')).status?.readyToUse).to.equal(true);
    await sandbox('child2', { workspace: { source: { sandboxRef: { name: 'parent' } } } });
    const c2 = await until(sandboxesGVR, 'child2', phase('Running'), 'Running');
    expect(rt.instances.get(c2.metadata.uid!)!.cfg.source).to.deep.equal({ sandboxId: p.metadata.uid });
    expect((await env.client.get<AnyObject>(sandboxesGVR, 'default', 'child')).status?.phase).to.equal('Starting');
    gate.open();
    await until(sandboxesGVR, 'child', phase('Running'), 'Running');
  });

  it('a held checkpoint: Pending with Reconciling=True reason Checkpointing; another checkpoint and another sandbox complete meanwhile; the open gate lands Ready', async () => {
    await sandbox('a');
    await sandbox('b');
    const a = await until(sandboxesGVR, 'a', phase('Running'), 'Running');
    await until(sandboxesGVR, 'b', phase('Running'), 'Running');
    const gate = hold((op, id) => op === 'checkpoint' && id === a.metadata.uid);
    await checkpoint('held', 'a');
    await gate.reached();
    const h = await until(checkpointsGVR, 'held', (o) => cond(o, 'Ready')?.reason === 'Checkpointing', 'Checkpointing');
    expect(h.status).to.include({ phase: 'Pending', readyToUse: false });
    expect(cond(h, 'Reconciling')).to.include({ status: 'True', reason: 'Checkpointing' });
    expect(kstatus(h)).to.deep.equal({ status: 'InProgress', reason: 'Checkpointing' });
    await checkpoint('free', 'b');
    await until(checkpointsGVR, 'free', phase('Ready'), 'Ready');
    await sandbox('c');
    await until(sandboxesGVR, 'c', phase('Running'), 'Running');
    expect((await env.client.get<AnyObject>(checkpointsGVR, 'default', 'held')).status?.phase).to.equal('Pending');
    gate.open();
    const r = await until(checkpointsGVR, 'held', phase('Ready'), 'Ready');
    expect(r.status).to.include({ readyToUse: true, kind: 'disk', size: 42 });
    expect(cond(r, 'Ready')).to.include({ status: 'True', reason: 'Taken' });
    expect(cond(r, 'Reconciling')).to.equal(undefined);
    expect(rt.checkpoints.has(r.metadata.uid!)).to.equal(true);
  });

  it('a failure lands as the outcome: a checkpoint the runtime cannot take is Failed/Stalled, a create is Failed/Stalled, a transient create error is retried', async () => {
    await sandbox('a');
    const a = await until(sandboxesGVR, 'a', phase('Running'), 'Running');
    const ckGate = hold((op, id) => op === 'checkpoint' && id === a.metadata.uid);
    await checkpoint('bad', 'a');
    await ckGate.reached();
    ckGate.fail(new RuntimeError('Unsupported', 'the disk is not snapshotable'));
    const bad = await until(checkpointsGVR, 'bad', phase('Failed'), 'Failed');
    expect(cond(bad, 'Stalled')).to.include({ status: 'True', reason: 'CheckpointFailed' });
    expect(bad.status?.message).to.match(/not snapshotable/);
    expect(kstatus(bad)).to.deep.equal({ status: 'Failed', reason: 'CheckpointFailed' });

    const createGate = hold((op, _id, cfg) => op === 'create' && cfg?.env?.HOLD === 'bad');
    await sandbox('nope', { env: [{ name: 'HOLD', value: 'bad' }] });
    await createGate.reached();
    createGate.fail(new RuntimeError('InvalidArgument', 'no such image'));
    const nope = await until(sandboxesGVR, 'nope', phase('Failed'), 'Failed');
    expect(cond(nope, 'Stalled')).to.include({ status: 'True', reason: 'CreateFailed' });
    expect(nope.status?.message).to.match(/no such image/);

    // A transient error: Starting CreateFailed, thrown to the next pass (rate-limited retry), then
    // Running. The retry is held on a second gate, so the CreateFailed reading cannot be missed.
    const flaky = (op: Op, cfg?: SandboxConfig) => op === 'create' && cfg?.env?.HOLD === 'flaky';
    let firstSeen = 0;
    let retrySeen = 0;
    const first = hold((op, _id, cfg) => flaky(op, cfg) && firstSeen++ === 0);
    const retry = hold((op, _id, cfg) => flaky(op, cfg) && retrySeen++ === 0);
    await sandbox('retry', { env: [{ name: 'HOLD', value: 'flaky' }] });
    await first.reached();
    first.fail(new RuntimeError('Busy', 'the host is busy'));
    await retry.reached();
    const failed = await until(
      sandboxesGVR,
      'retry',
      (o) => cond(o, 'Ready')?.reason === 'CreateFailed',
      'CreateFailed',
    );
    expect(failed.status?.phase).to.not.equal('Running');
    retry.open();
    const ok = await until(sandboxesGVR, 'retry', phase('Running'), 'Running');
    expect(cond(ok, 'Ready')).to.include({ status: 'True', reason: 'Running' });
  });

  it('a held restore: the sandbox shows Reconciling=True reason Restoring (Ready stays True), a second restore is 409, others reconcile; then Reconciling goes', async () => {
    await sandbox('a');
    const a = await until(sandboxesGVR, 'a', phase('Running'), 'Running');
    await checkpoint('ck', 'a');
    const ck = await until(checkpointsGVR, 'ck', phase('Ready'), 'Ready');
    const gate = hold((op, id) => op === 'restore' && id === a.metadata.uid);
    const first = restore('a', 'ck');
    await gate.reached();
    const h = await until(sandboxesGVR, 'a', (o) => cond(o, 'Reconciling')?.reason === 'Restoring', 'Restoring');
    expect(h.status?.phase).to.equal('Running');
    expect(cond(h, 'Ready')).to.include({ status: 'True' });
    expect(kstatus(h)).to.deep.equal({ status: 'InProgress', reason: 'Restoring' });
    const second: { code?: number } | undefined = await Promise.resolve(restore('a', 'ck')).then(
      () => undefined,
      (e: { code?: number }) => e,
    );
    expect(second?.code).to.equal(409);
    await sandbox('b');
    await until(sandboxesGVR, 'b', phase('Running'), 'Running');
    expect(rt.restores).to.deep.equal([]);
    gate.open();
    expect(await Promise.resolve(first)).to.deep.equal({ sandbox: 'a', checkpoint: 'ck', memory: false });
    expect(rt.restores).to.deep.equal([[a.metadata.uid, ck.metadata.uid]]);
    const after = await until(sandboxesGVR, 'a', (o) => !cond(o, 'Reconciling'), 'Reconciling gone');
    expect(cond(after, 'Ready')).to.include({ status: 'True', reason: 'Running' });
    expect(kstatus(after).status).to.equal('Current');
  });

  it('a held teardown: the deleted sandbox stays Terminating (finalizer kept) while another sandbox runs; the open gate lets it go', async () => {
    await sandbox('a');
    const a = await until(sandboxesGVR, 'a', phase('Running'), 'Running');
    const gate = hold((op, id) => op === 'destroy' && id === a.metadata.uid);
    await env.client.delete(sandboxesGVR, 'default', 'a');
    await gate.reached();
    const t = await until(sandboxesGVR, 'a', phase('Terminating'), 'Terminating');
    expect(t.metadata.finalizers).to.include('fluxvm.dev/sandbox');
    await sandbox('b');
    await until(sandboxesGVR, 'b', phase('Running'), 'Running');
    expect(rt.instances.has(a.metadata.uid!)).to.equal(true);
    gate.open();
    await eventually(
      () =>
        env.client.get(sandboxesGVR, 'default', 'a').then(
          () => false,
          () => true,
        ),
      20_000,
      'the sandbox deleted',
    );
    expect(
      await env.client.get(sandboxesGVR, 'default', 'a').then(
        () => 'present',
        (e) => e.code,
      ),
    ).to.equal(404);
    expect(rt.instances.has(a.metadata.uid!)).to.equal(false);
  });

  it('a graceful stop waits for the create and the checkpoint in flight (drain), after the controllers stopped', async () => {
    await sandbox('a');
    const a = await until(sandboxesGVR, 'a', phase('Running'), 'Running');
    const createGate = hold((op, _id, cfg) => op === 'create' && cfg?.env?.HOLD === '1');
    const ckGate = hold((op, id) => op === 'checkpoint' && id === a.metadata.uid);
    const s = await sandbox('slow', { env: [{ name: 'HOLD', value: '1' }] });
    await checkpoint('ck', 'a');
    await createGate.reached();
    await ckGate.reached();
    const stopped = new Promise<void>((r) => (onStopped = r));
    let finished = false;
    void running.then(() => (finished = true));
    ac.abort();
    await stopped; // both controllers' workers have stopped
    await Promise.resolve();
    expect(finished, 'the manager waits for the work in flight').to.equal(false);
    createGate.open();
    await eventually(() => rt.instances.has(s.metadata.uid!), 20_000, 'the held create to finish');
    expect(finished, 'the checkpoint is still held').to.equal(false);
    ckGate.open();
    await running;
    expect(finished).to.equal(true);
    expect(rt.instances.has(s.metadata.uid!)).to.equal(true);
    expect(rt.checkpoints.size).to.equal(1);
  });
});
