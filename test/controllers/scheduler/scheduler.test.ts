// The scheduler: the decision table (runtime, capacity, selector, affinity, unschedulable and
// not-Ready nodes, least allocated, the reasons when nothing fits) on the pure decide(), and the
// reconciler against the real in-process API server (SQLite): binding, Unschedulable with kube's
// message, forks to their source's node, and two schedulers racing never producing two bindings.
import { isConflict } from '../../../runtime/meta/errors.js';
import { expect } from 'chai';
import type { Node, Sandbox } from '../../../apis/zz_generated.types.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { nodesGVR } from '../../../controllers/node/heartbeat.js';
import { decide, type NodeUsage } from '../../../controllers/scheduler/decide.js';
import { runsHere } from '../../../controllers/scheduler/gate.js';
import { SchedulerReconciler } from '../../../controllers/scheduler/reconciler.js';
import { SANDBOX_FINALIZER } from '../../../controllers/sandbox/reconciler.js';
import { makeEnv, type Env } from '../../runtime/controller/env.js';

const GI = 1024 ** 3;
type NodeOpts = {
  ready?: boolean;
  unschedulable?: boolean;
  runtimes?: ('procbox' | 'vm')[];
  memory?: number;
  max?: number;
  labels?: Record<string, string>;
  kvm?: boolean;
};

function node(name: string, o: NodeOpts = {}): Node {
  const alloc = {
    runtimes: o.runtimes ?? ['procbox'],
    kvm: o.kvm ?? false,
    memory: o.memory ?? 8 * GI,
    sandboxes: o.max ?? 100,
  };
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Node',
    metadata: { name, labels: o.labels ?? {} },
    spec: o.unschedulable ? { unschedulable: true } : {},
    status: {
      capacity: alloc,
      allocatable: alloc,
      conditions: [
        {
          type: 'Ready',
          status: o.ready === false ? 'False' : 'True',
          reason: 'R',
          message: '',
          lastTransitionTime: '2026-01-01T00:00:00Z',
        },
      ],
    },
  };
}

function sbx(name: string, spec: Sandbox['spec'] = {}, labels?: Record<string, string>): Sandbox {
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: { name, namespace: 'default', ...(labels ? { labels } : {}) },
    spec,
  };
}

const none = new Map<string, NodeUsage>();
const aff = (...matchExpressions: unknown[]) =>
  ({
    nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions }] } },
  }) as Sandbox['spec'] extends infer S ? (S extends { affinity?: infer A } ? A : never) : never;

describe('scheduler: decide (the table)', () => {
  const cases: Array<{ what: string; s: Sandbox; nodes: Node[]; usage?: Map<string, NodeUsage>; want: string }> = [
    { what: 'procbox on the only node', s: sbx('a'), nodes: [node('n1')], want: 'n1' },
    {
      what: 'runtime mismatch: vm needs a vm node',
      s: sbx('a', { runtime: 'vm' }),
      nodes: [node('n1'), node('n2', { runtimes: ['procbox', 'vm'] })],
      want: 'n2',
    },
    {
      what: 'runtime mismatch everywhere',
      s: sbx('a', { runtime: 'vm' }),
      nodes: [node('n1'), node('n2')],
      want: "0/2 nodes are available: 2 node(s) didn't have the sandbox's runtime.",
    },
    {
      what: 'KVM asked through the node label',
      s: sbx('a', { runtime: 'vm', nodeSelector: { 'fluxvm.dev/kvm': 'true' } }),
      nodes: [
        node('tcg', { runtimes: ['vm'], labels: { 'fluxvm.dev/kvm': 'false' } }),
        node('kvm', { runtimes: ['vm'], kvm: true, labels: { 'fluxvm.dev/kvm': 'true' } }),
      ],
      want: 'kvm',
    },
    {
      what: 'memory capacity',
      s: sbx('a', { resources: { memory: '2Gi' } }),
      nodes: [node('small', { memory: 1 * GI }), node('big', { memory: 4 * GI })],
      usage: new Map([['big', { sandboxes: 1, memory: 2 * GI }]]),
      want: 'big', // exactly full after placing: 2Gi + 2Gi = 4Gi passes
    },
    {
      what: 'memory one byte past the edge',
      s: sbx('a', { resources: { memory: 2 * GI + 1 } }),
      nodes: [node('big', { memory: 4 * GI })],
      usage: new Map([['big', { sandboxes: 1, memory: 2 * GI }]]),
      want: '0/1 nodes are available: 1 Insufficient memory.',
    },
    {
      what: 'sandbox count: at the limit fails',
      s: sbx('a'),
      nodes: [node('n1', { max: 3 })],
      usage: new Map([['n1', { sandboxes: 3, memory: 0 }]]),
      want: '0/1 nodes are available: 1 Too many sandboxes.',
    },
    {
      what: 'nodeSelector',
      s: sbx('a', { nodeSelector: { zone: 'b' } }),
      nodes: [node('n1', { labels: { zone: 'a' } }), node('n2', { labels: { zone: 'b' } })],
      want: 'n2',
    },
    {
      what: 'affinity In',
      s: sbx('a', { affinity: aff({ key: 'zone', operator: 'In', values: ['x', 'y'] }) }),
      nodes: [node('n1', { labels: { zone: 'z' } }), node('n2', { labels: { zone: 'y' } })],
      want: 'n2',
    },
    {
      what: 'affinity NotIn (a node without the label matches)',
      s: sbx('a', { affinity: aff({ key: 'zone', operator: 'NotIn', values: ['z'] }) }),
      nodes: [node('n1', { labels: { zone: 'z' } }), node('n2')],
      want: 'n2',
    },
    {
      what: 'affinity Exists',
      s: sbx('a', { affinity: aff({ key: 'gpu', operator: 'Exists' }) }),
      nodes: [node('n1'), node('n2', { labels: { gpu: '' } })],
      want: 'n2',
    },
    {
      what: 'affinity DoesNotExist',
      s: sbx('a', { affinity: aff({ key: 'gpu', operator: 'DoesNotExist' }) }),
      nodes: [node('n1', { labels: { gpu: '1' } }), node('n2')],
      want: 'n2',
    },
    {
      what: 'unschedulable (cordoned) node',
      s: sbx('a'),
      nodes: [node('n1', { unschedulable: true }), node('n2')],
      want: 'n2',
    },
    {
      what: 'least allocated wins',
      s: sbx('a'),
      nodes: [node('busy'), node('idle')],
      usage: new Map([
        ['busy', { sandboxes: 50, memory: 0 }],
        ['idle', { sandboxes: 5, memory: 0 }],
      ]),
      want: 'idle',
    },
    {
      // Found by the two-node e2e (twonodes-netns): with the agents' default of 1000 sandboxes a
      // node, one sandbox more moves the free fraction by 0.001; an integer score ties them all.
      what: 'least allocated wins by one sandbox out of 1000 (no memory requests)',
      s: sbx('a'),
      nodes: [node('a-first', { max: 1000 }), node('b-second', { max: 1000 })],
      usage: new Map([
        ['a-first', { sandboxes: 1, memory: 0 }],
        ['b-second', { sandboxes: 0, memory: 0 }],
      ]),
      want: 'b-second',
    },
    {
      what: 'no node fits: every reason counted, kube style',
      s: sbx('a', { resources: { memory: '2Gi' }, nodeSelector: { zone: 'a' } }),
      nodes: [
        node('n1', { ready: false }),
        node('n2', { labels: { zone: 'b' } }),
        node('n3', { labels: { zone: 'b' } }),
        node('n4', { labels: { zone: 'a' }, memory: GI }),
      ],
      // Sorted by reason, as kube sorts them.
      want: "0/4 nodes are available: 1 Insufficient memory, 2 node(s) didn't match the sandbox's node affinity/selector, 1 node(s) were not ready.",
    },
    { what: 'no nodes at all', s: sbx('a'), nodes: [], want: '0/0 nodes are available.' },
  ];
  for (const c of cases)
    it(c.what, () => {
      const d = decide(c.s, c.nodes, c.usage ?? none);
      expect(d.node ?? (d as { message: string }).message).to.equal(c.want);
    });

  it('the Sandbox controller runs bound sandboxes of its node, and unbound ones only without scheduling', () => {
    expect(runsHere({ spec: {} }, 'n1', false)).to.equal(true);
    expect(runsHere({ spec: {} }, 'n1', true)).to.equal(false);
    expect(runsHere({ spec: { nodeName: 'n1' } }, 'n1', true)).to.equal(true);
    expect(runsHere({ spec: { nodeName: 'n2' } }, 'n1', false)).to.equal(false);
  });
});

describe('scheduler: reconciler (real API server)', () => {
  let env: Env;
  beforeEach(() => (env = makeEnv()));
  afterEach(() => env.close());

  const log = { info() {}, error() {}, debug() {} };
  /** A scheduler whose caches are read straight from the API (a fresh view each pass), or a frozen view. */
  async function scheduler(view?: { nodes: Node[]; sandboxes: Sandbox[] }) {
    const listNodes = async () => (await env.client.list<Node>(nodesGVR, undefined)).items;
    const listSbx = async () => (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items;
    let nodes = view?.nodes ?? (await listNodes());
    let all = view?.sandboxes ?? (await listSbx());
    const r = new SchedulerReconciler({
      client: env.client,
      nodes: () => nodes,
      boundTo: (n) => all.filter((s) => s.spec?.nodeName === n),
      sandbox: (ns, name) => all.find((s) => s.metadata.name === name),
      checkpoint: () => undefined,
      cached: (k) => all.find((s) => s.metadata.name === k.name),
      log,
    });
    return {
      r,
      async refresh() {
        nodes = await listNodes();
        all = await listSbx();
      },
    };
  }
  const createNode = async (n: Node) => {
    const made = await env.client.create<Node>(nodesGVR, undefined, { ...n, status: undefined });
    return env.client.updateStatus<Node>(nodesGVR, undefined, { ...made, status: n.status });
  };
  const get = (name: string) => env.client.get<Sandbox>(sandboxesGVR, 'default', name);

  it('binds to the fitting node; no fit -> Scheduled=False Unschedulable with the reasons, bound once a node fits', async () => {
    await createNode(node('small', { memory: GI }));
    await env.client.create(sandboxesGVR, 'default', sbx('big', { resources: { memory: '2Gi' } }));
    await env.client.create(sandboxesGVR, 'default', sbx('tiny'));
    let s = await scheduler();
    await s.r.reconcile({ namespace: 'default', name: 'tiny' });
    expect((await get('tiny')).spec?.nodeName).to.equal('small');
    const res = await s.r.reconcile({ namespace: 'default', name: 'big' });
    expect(res.requeueAfterMs).to.equal(30_000);
    const big = await get('big');
    expect(big.spec?.nodeName).to.equal(undefined);
    expect(big.status?.phase).to.equal('Pending');
    expect(big.status?.conditions?.find((c) => c.type === 'Scheduled')).to.include({
      status: 'False',
      reason: 'Unschedulable',
      message: '0/1 nodes are available: 1 Insufficient memory.',
    });
    await createNode(node('large', { memory: 4 * GI }));
    s = await scheduler();
    await s.r.reconcile({ namespace: 'default', name: 'big' });
    const bound = await get('big');
    expect(bound.spec?.nodeName).to.equal('large');
    expect(bound.status?.conditions?.find((c) => c.type === 'Scheduled')).to.include({
      status: 'True',
      reason: 'Scheduled',
    });
  });

  it("the bind carries the Sandbox controller's finalizer (the node agent's first pass writes nothing before its create)", async () => {
    await createNode(node('a'));
    await env.client.create(sandboxesGVR, 'default', {
      ...sbx('fin'),
      metadata: { name: 'fin', namespace: 'default', finalizers: ['example.com/keep'] },
    });
    const s = await scheduler();
    await s.r.reconcile({ namespace: 'default', name: 'fin' });
    const got = await get('fin');
    expect(got.spec?.nodeName).to.equal('a');
    // One write: the binding and the finalizer together (generation 1 -> 2), others' finalizers kept.
    expect(got.metadata.finalizers).to.deep.equal(['example.com/keep', SANDBOX_FINALIZER]);
    expect(got.metadata.generation).to.equal(2);
  });

  it('a binding does not wait for its Scheduled Event to be written', async () => {
    await createNode(node('a'));
    await env.client.create(sandboxesGVR, 'default', sbx('quick'));
    const all = (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items;
    const nodes = (await env.client.list<Node>(nodesGVR, undefined)).items;
    const recorded: string[] = [];
    const r = new SchedulerReconciler({
      client: env.client,
      nodes: () => nodes,
      boundTo: (n) => all.filter((s) => s.spec?.nodeName === n),
      sandbox: () => undefined,
      checkpoint: () => undefined,
      cached: (k) => all.find((s) => s.metadata.name === k.name),
      // An Event write that never finishes (an API server slow to take it).
      recorder: { event: (_o, _t, reason) => (recorded.push(reason), new Promise(() => {})) },
      log,
    });
    const res = await Promise.race([
      r.reconcile({ namespace: 'default', name: 'quick' }).then(() => 'returned'),
      new Promise((resolve) => setTimeout(() => resolve('held by the Event'), 2_000)),
    ]);
    expect(res).to.equal('returned');
    expect(recorded).to.deep.equal(['Scheduled']);
    expect((await get('quick')).spec?.nodeName).to.equal('a');
  });

  it('a fork goes to the node holding its source, even when another node is emptier', async () => {
    await createNode(node('a'));
    await createNode(node('b'));
    await env.client.create(sandboxesGVR, 'default', sbx('src', { nodeName: 'a' }));
    await env.client.create(sandboxesGVR, 'default', sbx('filler1', { nodeName: 'a' }));
    await env.client.create(
      sandboxesGVR,
      'default',
      sbx('fork', { workspace: { source: { sandboxRef: { name: 'src' } } } }),
    );
    const s = await scheduler();
    await s.r.reconcile({ namespace: 'default', name: 'fork' });
    expect((await get('fork')).spec?.nodeName).to.equal('a');
  });

  it('two schedulers racing on one sandbox with stale views: one binding, never two', async () => {
    for (let round = 0; round < 10; round++) {
      await createNode(node(`x${round}`));
      await createNode(node(`y${round}`));
    }
    for (let round = 0; round < 10; round++) {
      const name = `race${round}`;
      await env.client.create(sandboxesGVR, 'default', sbx(name));
      // Two views that disagree on which node is emptier: each would pick a different node.
      const nodes = (await env.client.list<Node>(nodesGVR, undefined)).items.filter((n) =>
        n.metadata.name!.endsWith(String(round)),
      );
      const s0 = (await env.client.list<Sandbox>(sandboxesGVR, 'default')).items;
      const fake = (n: string) =>
        Array.from(
          { length: 10 },
          (_, i) => ({ ...sbx(`f${i}`, { nodeName: n }), metadata: { name: `f${i}`, uid: `f${n}${i}` } }) as Sandbox,
        );
      const one = await scheduler({ nodes, sandboxes: [...s0, ...fake(`x${round}`)] });
      const two = await scheduler({ nodes, sandboxes: [...s0, ...fake(`y${round}`)] });
      // As the workqueue does: a pass that ends in a Conflict (the winner's write not yet
      // committed when the loser re-read, past its own retries: a loaded machine) runs again.
      const pass = async (x: typeof one) => {
        for (const deadline = Date.now() + 10_000; ;) {
          try {
            return await x.r.reconcile({ namespace: 'default', name });
          } catch (e) {
            if (!isConflict(e) || Date.now() > deadline) throw e;
          }
        }
      };
      const results = await Promise.allSettled([pass(one), pass(two)]);
      for (const r of results)
        expect(r.status, String((r as PromiseRejectedResult).reason?.stack)).to.equal('fulfilled');
      const got = await get(name);
      expect([`x${round}`, `y${round}`]).to.include(got.spec?.nodeName);
      // The object was bound by exactly one write: generation 1 -> 2, never 3.
      expect(got.metadata.generation).to.equal(2);
    }
  });

  it('a bound sandbox cannot be re-bound: spec.nodeName is immutable (422)', async () => {
    await env.client.create(sandboxesGVR, 'default', sbx('pinned', { nodeName: 'a' }));
    const cur = await get('pinned');
    const err = await env.client
      .update(sandboxesGVR, 'default', { ...cur, spec: { ...cur.spec, nodeName: 'b' } })
      .catch((e) => e);
    expect(err.code).to.equal(422);
  });
});
