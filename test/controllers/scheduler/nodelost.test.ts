// Node registration and heartbeat (controllers/node/heartbeat.ts) and the node controller
// (controllers/node/lifecycle.ts) against the real in-process API server, on a FakeClock: a node
// registers with its capacity and Lease; when the Lease is older than the grace period the Node is
// Ready=False, a user's sandbox gets NodeLost and waits, a warm-pool member is deleted (its pool
// recreates it elsewhere); a renewed Lease clears NodeLost and the agent posts Ready=True again.
import { expect } from 'chai';
import { NODE_LEASE_NAMESPACE } from '../../../apis/node.js';
import type { Node, Sandbox } from '../../../apis/zz_generated.types.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { leasesGVR, nodesGVR, startNodeHeartbeat } from '../../../controllers/node/heartbeat.js';
import { ALLOCATED_DELAY_MS, NodeLifecycleReconciler, type LeaseObj } from '../../../controllers/node/lifecycle.js';
import { FakeClock } from '../../../runtime/controller/index.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';
import { FakeRuntime } from '../sandbox/fake-runtime.js';

const log = { info() {}, error() {}, debug() {}, warn() {} };

describe('node heartbeat and NodeLost (real API server, FakeClock)', () => {
  let env: Env;
  let clock: FakeClock;
  beforeEach(() => {
    env = makeEnv();
    clock = new FakeClock(Date.now());
  });
  afterEach(() => env.close());

  const sbx = (name: string, extra: Partial<Sandbox['metadata']> = {}): Sandbox => ({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, namespace: 'default', ...extra },
    spec: { nodeName: 'node-a' },
  });
  const get = (name: string) => env.client.get<Sandbox>(sandboxesGVR, 'default', name).catch(() => undefined);
  const lifecycle = () =>
    new NodeLifecycleReconciler({
      client: env.client,
      node: () => undefined,
      lease: () => undefined,
      boundTo: () => [],
      gracePeriodMs: 40_000,
      log,
      clock,
    });
  /** One lifecycle reconciler (made at the first pass) whose caches are read from the API before each pass. */
  let view: { nodes: Node[]; leases: LeaseObj[]; all: Sandbox[] } = { nodes: [], leases: [], all: [] };
  let reconciler: NodeLifecycleReconciler | undefined;
  async function pass() {
    view = {
      nodes: (await env.client.list<Node>(nodesGVR, undefined)).items,
      leases: (await env.client.list<LeaseObj>(leasesGVR, NODE_LEASE_NAMESPACE)).items,
      all: (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items,
    };
    reconciler ??= new NodeLifecycleReconciler({
      client: env.client,
      node: (n) => view.nodes.find((x) => x.metadata.name === n),
      lease: (n) => view.leases.find((x) => x.metadata.name === n),
      boundTo: (n) => view.all.filter((s) => s.spec?.nodeName === n),
      gracePeriodMs: 40_000,
      log,
      clock,
    });
    return reconciler.reconcile({ namespace: '', name: 'node-a' });
  }
  beforeEach(() => (reconciler = undefined));

  it('registers the Node with capacity, labels and a Lease; lost after the grace period; back when renewed', async () => {
    void lifecycle;
    const hb = startNodeHeartbeat({
      client: env.client,
      runtime: new FakeRuntime(),
      nodeName: 'node-a',
      log,
      clock,
      maxSandboxes: 7,
      memoryBytes: 1 << 30,
    });
    await hb.ready;
    const n = await env.client.get<Node>(nodesGVR, undefined, 'node-a');
    expect(n.metadata.labels).to.include({ 'kubernetes.io/hostname': 'node-a', 'fluxvm.dev/kvm': 'false' });
    expect(n.status?.allocatable).to.deep.include({ sandboxes: 7, memory: 1 << 30 });
    expect(n.status?.allocatable?.runtimes).to.include('procbox');
    expect(n.status?.conditions?.find((c) => c.type === 'Ready')?.status).to.equal('True');
    const lease = await env.client.get<LeaseObj>(leasesGVR, NODE_LEASE_NAMESPACE, 'node-a');
    expect(lease.spec).to.include({ holderIdentity: 'node-a' });

    const user = await env.client.create(sandboxesGVR, 'default', sbx('user'));
    await env.client.create(
      sandboxesGVR,
      'default',
      sbx('member', {
        labels: { 'agents.x-k8s.io/pool': 'p' },
        ownerReferences: [
          {
            apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
            kind: 'SandboxWarmPool',
            name: 'p',
            uid: 'pool-uid',
            controller: true,
          },
        ],
      }),
    );
    void user;
    // The agent stops heartbeating. Within the grace period nothing happens; the pass comes back
    // when the Lease would expire.
    hb.stop();
    await clock.advance(39_000);
    const res = await pass();
    expect(res.requeueAfterMs).to.be.within(100, 1_200);
    expect((await get('user'))?.status?.conditions?.find((c) => c.type === 'NodeLost')).to.equal(undefined);
    expect(await get('member')).to.not.equal(undefined);

    // Past the grace period the node is lost.
    await clock.advance(2_000);
    await pass();
    const lostNode = await env.client.get<Node>(nodesGVR, undefined, 'node-a');
    expect(lostNode.status?.conditions?.find((c) => c.type === 'Ready')).to.include({
      status: 'False',
      reason: 'HeartbeatLost',
    });
    const u = await get('user');
    expect(u?.status?.conditions?.find((c) => c.type === 'NodeLost')).to.include({
      status: 'True',
      reason: 'NodeLost',
    });
    expect(u?.metadata.deletionTimestamp).to.equal(undefined); // a user's sandbox waits for its node
    expect(await get('member')).to.equal(undefined); // the pool member is gone: the pool makes another

    // The agent comes back: the Lease is renewed, the agent posts Ready=True, NodeLost clears.
    const hb2 = startNodeHeartbeat({ client: env.client, runtime: new FakeRuntime(), nodeName: 'node-a', log, clock });
    await hb2.ready;
    hb2.stop();
    await pass();
    expect((await get('user'))?.status?.conditions?.find((c) => c.type === 'NodeLost')).to.include({
      status: 'False',
      reason: 'NodeReady',
    });
    // status.allocated follows ALLOCATED_DELAY_MS after the change (the member's deletion).
    await clock.advance(ALLOCATED_DELAY_MS);
    await pass();
    const back = await env.client.get<Node>(nodesGVR, undefined, 'node-a');
    expect(back.status?.conditions?.find((c) => c.type === 'Ready')?.status).to.equal('True');
    expect(back.status?.allocated).to.deep.equal({ sandboxes: 1, memory: 0 });
  });

  it('status.allocated is written once, ALLOCATED_DELAY_MS after a change, and not again on a Node cache that lags its own write', async () => {
    const hb = startNodeHeartbeat({ client: env.client, runtime: new FakeRuntime(), nodeName: 'node-a', log, clock });
    await hb.ready;
    hb.stop();
    await env.client.create(sandboxesGVR, 'default', sbx('one'));
    const stale = await env.client.get<Node>(nodesGVR, undefined, 'node-a');
    let all = (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items;
    let writes = 0;
    const counting = Object.create(env.client) as typeof env.client;
    counting.updateStatus = ((...a: Parameters<typeof env.client.updateStatus>) => {
      writes++;
      return env.client.updateStatus(...a);
    }) as typeof env.client.updateStatus;
    // The Node cache never sees the write (an informer a few ms behind, as every sandbox event
    // of one create brings a pass within those ms).
    const r = new NodeLifecycleReconciler({
      client: counting,
      node: () => stale,
      lease: () => undefined,
      boundTo: () => all,
      gracePeriodMs: 40_000,
      log,
      clock,
    });
    const key = { namespace: '', name: 'node-a' };
    // The pass that sees the change writes nothing yet: it comes back when the write is due.
    expect((await r.reconcile(key)).requeueAfterMs).to.equal(ALLOCATED_DELAY_MS);
    await clock.advance(ALLOCATED_DELAY_MS - 1);
    expect((await r.reconcile(key)).requeueAfterMs).to.equal(1);
    expect(writes).to.equal(0);
    await clock.advance(1);
    await r.reconcile(key);
    const after = await env.client.get<Node>(nodesGVR, undefined, 'node-a');
    expect(after.status?.allocated).to.deep.equal({ sandboxes: 1, memory: 0 });
    expect(writes).to.equal(1);
    await clock.advance(ALLOCATED_DELAY_MS);
    await r.reconcile(key);
    await r.reconcile(key);
    expect(writes).to.equal(1);
    expect((await env.client.get<Node>(nodesGVR, undefined, 'node-a')).metadata.resourceVersion).to.equal(
      after.metadata.resourceVersion,
    );
    // A real change is written (on the newest version: the stale one conflicts and is re-read).
    await env.client.create(sandboxesGVR, 'default', sbx('two'));
    all = (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items;
    await r.reconcile(key);
    await clock.advance(ALLOCATED_DELAY_MS);
    await r.reconcile(key);
    expect((await env.client.get<Node>(nodesGVR, undefined, 'node-a')).status?.allocated).to.deep.equal({
      sandboxes: 2,
      memory: 0,
    });
  });

  it('renews the Lease every period on the clock', async () => {
    const hb = startNodeHeartbeat({
      client: env.client,
      runtime: new FakeRuntime(),
      nodeName: 'node-b',
      log,
      clock,
      intervalMs: 10_000,
    });
    await hb.ready;
    const t0 = (await env.client.get<LeaseObj>(leasesGVR, NODE_LEASE_NAMESPACE, 'node-b')).spec!.renewTime!;
    await clock.advance(10_000);
    const { eventually } = await import('../../support/wait.js');
    await eventually(
      async () => {
        const t1 = (await env.client.get<LeaseObj>(leasesGVR, NODE_LEASE_NAMESPACE, 'node-b')).spec!.renewTime!;
        return Date.parse(t1) - Date.parse(t0) === 10_000;
      },
      5_000,
      'the Lease renewed 10 s later',
    );
    hb.stop();
  });
});
