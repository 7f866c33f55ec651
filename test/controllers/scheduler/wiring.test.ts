// The scheduler's wiring (controllers/scheduler/index.ts register) on a real Manager and the
// in-process API server: with ControllerDeps.scheduling an unbound Sandbox is bound once a Ready
// Node appears (the Node watch wakes it); without it nothing is registered.
import { expect } from 'chai';
import type { Node, Sandbox } from '../../../apis/zz_generated.types.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { nodesGVR } from '../../../controllers/node/heartbeat.js';
import { register } from '../../../controllers/scheduler/index.js';
import { Manager } from '../../../runtime/controller/index.js';
import { eventually } from '../../support/wait.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { FakeRuntime } from '../sandbox/fake-runtime.js';

const log = { info() {}, error() {}, debug() {}, warn() {} };

describe('scheduler wiring (Manager, real API server)', () => {
  let env: Env;
  let ac: AbortController;
  beforeEach(() => {
    env = makeEnv();
    ac = new AbortController();
  });
  afterEach(() => {
    ac.abort();
    env.close();
  });

  it('registers nothing without scheduling', () => {
    const manager = new Manager({ client: env.client });
    const r = register(manager, { client: env.client, runtime: new FakeRuntime(), stateDir: '/nonexistent', log });
    expect(r.controllers).to.deep.equal([]);
  });

  it('binds an unbound sandbox when a Ready node appears', async () => {
    const manager = new Manager({ client: env.client });
    const r = register(manager, {
      client: env.client,
      runtime: new FakeRuntime(),
      stateDir: '/nonexistent',
      log,
      scheduling: true,
    });
    expect(r.controllers).to.have.length(2);
    const done = manager.start(ac.signal);
    await env.client.create<Sandbox>(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 'waiting', namespace: 'default' },
      spec: {},
    });
    await eventually(
      async () =>
        (await env.client.get<Sandbox>(sandboxesGVR, 'default', 'waiting')).status?.conditions?.some(
          (c) => c.type === 'Scheduled' && c.reason === 'Unschedulable' && c.message === '0/0 nodes are available.',
        ),
      10_000,
      'Unschedulable with no nodes',
    );
    const made = await env.client.create<Node>(nodesGVR, undefined, {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Node',
      metadata: { name: 'n1' },
      spec: {},
    });
    const alloc = { runtimes: ['procbox' as const], kvm: false, memory: 1 << 30, sandboxes: 10 };
    // The node controller writes status.allocated meanwhile: retry on a conflict, as an agent would.
    await eventually(
      async () =>
        env.client
          .updateStatus<Node>(nodesGVR, undefined, {
            ...(await env.client.get<Node>(nodesGVR, undefined, made.metadata.name!)),
            status: {
              allocatable: alloc,
              capacity: alloc,
              conditions: [
                {
                  type: 'Ready',
                  status: 'True',
                  reason: 'R',
                  message: '',
                  lastTransitionTime: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
                },
              ],
            },
          })
          .then(() => true)
          .catch(() => false),
      5_000,
      'the Node status written',
    );
    await eventually(
      async () => (await env.client.get<Sandbox>(sandboxesGVR, 'default', 'waiting')).spec?.nodeName === 'n1',
      10_000,
      'bound to n1 (woken by the Node, not the 30 s retry)',
    );
    ac.abort();
    await done;
  });
});
