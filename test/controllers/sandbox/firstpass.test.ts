// The first pass of a procbox Sandbox (controllers/sandbox/firstpass.ts): the finalizer patch
// commits while the instance is created, not before it; the status is written after the patch
// (the same writes in the same order as before); a sandbox deleted before its finalizer was in
// has its instance destroyed. Real in-process API server and store, fake runtime, a client whose
// finalizer patch a test holds.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EventRecorder } from '../../../runtime/controller/index.js';
import type { Client } from '../../../runtime/client/client.js';
import type { KubeObject } from '../../../runtime/meta/types.js';
import { SANDBOX_FINALIZER, SandboxReconciler } from '../../../controllers/sandbox/reconciler.js';
import { SandboxStateStore } from '../../../controllers/sandbox/state.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { eventually, makeEnv, type Env } from '../../runtime/controller/env.js';
import { FakeRuntime } from './fake-runtime.js';

describe('SandboxReconciler first pass: the finalizer commits while the instance is created', () => {
  let env: Env;
  let rt: FakeRuntime;
  let r: SandboxReconciler;
  let stateDir: string;
  /** Held finalizer patches: release() lets them through. */
  let held: Array<() => void>;
  let patches: number;

  beforeEach(() => {
    env = makeEnv();
    rt = new FakeRuntime();
    held = [];
    patches = 0;
    stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sbx-first-'));
    const client = Object.create(env.client) as Client;
    client.patch = async (...a: Parameters<Client['patch']>) => {
      patches++;
      await new Promise<void>((resolve) => held.push(resolve));
      return env.client.patch(...a);
    };
    r = new SandboxReconciler({
      client,
      runtime: rt,
      recorder: new EventRecorder({ client: env.client }),
      state: new SandboxStateStore(stateDir),
      nodeName: 'node-a',
      healthIntervalMs: 30_000,
    });
  });
  afterEach(() => {
    env.close();
    fs.rmSync(stateDir, { recursive: true, force: true });
  });

  const create = (name: string) =>
    env.client.create<KubeObject>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name },
      spec: {},
    });
  const get = (name: string) => env.client.get<any>(sandboxesGVR, 'default', name);
  const release = () => held.splice(0).forEach((f) => f());

  it('creates the instance while the finalizer patch is held, and writes the status only after it', async () => {
    const o = await create('a');
    const pass = r.reconcile({ namespace: 'default', name: 'a' });
    await eventually(() => rt.createCalls === 1, 5000, 'the instance created while the finalizer patch is held');
    expect(patches, 'the finalizer patch was sent').to.equal(1);
    expect(rt.instances.has(o.metadata.uid!)).to.equal(true);
    const mid = await get('a');
    expect(mid.metadata.finalizers ?? [], 'no finalizer yet').to.deep.equal([]);
    expect(mid.status?.phase, 'no status before the finalizer').to.equal(undefined);
    release();
    const res = await pass;
    expect(res.requeueAfterMs).to.equal(30_000);
    const s = await get('a');
    expect(s.metadata.finalizers).to.deep.equal([SANDBOX_FINALIZER]);
    expect(s.status).to.include({ phase: 'Running', observedGeneration: 1 });
    // Two writes after the create: the finalizer (rv + 1), then the status (rv + 2).
    expect(Number(s.metadata.resourceVersion)).to.equal(Number(mid.metadata.resourceVersion) + 2);
  });

  it('a sandbox deleted before its finalizer was in: the patch is 404 and the instance is destroyed', async () => {
    const o = await create('b');
    const pass = r.reconcile({ namespace: 'default', name: 'b' });
    await eventually(() => rt.createCalls === 1, 5000, 'the instance created while the finalizer patch is held');
    await env.client.delete(sandboxesGVR, 'default', 'b');
    release();
    await pass;
    expect(rt.instances.has(o.metadata.uid!), 'the instance outlived its object').to.equal(false);
  });
});
