// The scheduler's decision: one Sandbox placed among 100 Nodes of fake capacity
// (runtimes, memory, sandbox count, labels), with 5000 sandboxes already bound (50 a node), as
// controllers/scheduler/ decides it: decide() alone (filters and least-allocated score over
// precomputed usage), and the reconciler's whole decision (usage counted from the spec.nodeName
// index of bound sandboxes, then decide()). Sandboxes vary: plain procbox, vm, a memory request,
// a nodeSelector, a required node affinity. Goal: <= 1 ms p50 with 100 nodes.
//   npx tsx bench/scheduler.ts [--nodes 100] [--bound 50] [--runs 20000]
import os from 'node:os';
import type { Node, Sandbox } from '../apis/zz_generated.types.js';
import { decide, type NodeUsage } from '../controllers/scheduler/decide.js';
import { SchedulerReconciler, usageOf } from '../controllers/scheduler/reconciler.js';
import { arg, median, percentile, section } from './lib.js';

const NODES = arg('nodes', 100);
const BOUND = arg('bound', 50);
const RUNS = arg('runs', 20000);
const GI = 1024 ** 3;

const nodes: Node[] = Array.from({ length: NODES }, (_, i) => {
  const alloc = {
    runtimes: i % 3 === 0 ? (['procbox', 'vm'] as ('procbox' | 'vm')[]) : (['procbox'] as ('procbox' | 'vm')[]),
    kvm: i % 3 === 0,
    memory: (16 + (i % 5) * 16) * GI,
    sandboxes: 200,
  };
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Node',
    metadata: {
      name: `node-${String(i).padStart(3, '0')}`,
      labels: { zone: `z${i % 4}`, 'fluxvm.dev/kvm': String(i % 3 === 0) },
    },
    spec: i % 17 === 0 ? { unschedulable: true } : {},
    status: {
      allocatable: alloc,
      capacity: alloc,
      conditions: [
        {
          type: 'Ready',
          status: i % 23 === 0 ? 'False' : 'True',
          reason: 'R',
          message: '',
          lastTransitionTime: '2026-01-01T00:00:00Z',
        },
      ],
    },
  };
});

const mk = (i: number, spec: Sandbox['spec']): Sandbox => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'Sandbox',
  metadata: { name: `s${i}`, namespace: 'default', uid: `u${i}` },
  spec,
});
const shapes: Sandbox['spec'][] = [
  {},
  { runtime: 'vm' },
  { resources: { memory: '2Gi' } },
  { nodeSelector: { zone: 'z1' } },
  {
    affinity: {
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: [
            {
              matchExpressions: [
                { key: 'zone', operator: 'In', values: ['z2', 'z3'] },
                { key: 'gpu', operator: 'DoesNotExist' },
              ],
            },
          ],
        },
      },
    },
  },
];
const pending = Array.from({ length: 1000 }, (_, i) => mk(i, shapes[i % shapes.length]));
const bound = new Map<string, Sandbox[]>();
for (const n of nodes)
  bound.set(
    n.metadata.name!,
    Array.from({ length: BOUND }, (_, j) =>
      mk(100000 + j, { nodeName: n.metadata.name!, resources: { memory: j % 2 ? '256Mi' : '1Gi' } }),
    ),
  );
const usage = new Map<string, NodeUsage>();
for (const [n, list] of bound) usage.set(n, usageOf(list));

function time(fn: (s: Sandbox) => unknown): number[] {
  const out: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const s = pending[i % pending.length]!;
    const t = process.hrtime.bigint();
    fn(s);
    out.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  return out;
}

const r = new SchedulerReconciler({
  client: undefined as never,
  nodes: () => nodes,
  boundTo: (n) => bound.get(n) ?? [],
  sandbox: () => undefined,
  checkpoint: () => undefined,
  cached: () => undefined,
  log: { info() {}, error() {} },
});
let placed = 0;
time((s) => (placed += decide(s, nodes, usage).node ? 1 : 0)); // warm-up
placed = 0;
const pure = time((s) => (placed += decide(s, nodes, usage).node ? 1 : 0));
const whole = time((s) => r.decision(s));
const f = (x: number) => `${(x * 1000).toFixed(1)} us`;
section('Scheduler decision', [
  `One Sandbox placed among ${NODES} Nodes of fake capacity (procbox everywhere, vm on a third, 16-80 GiB, 200 sandboxes each, 4 zones, some cordoned or not Ready) with ${NODES * BOUND} sandboxes already bound; the sandboxes cycle through plain, vm, a 2Gi memory request, a nodeSelector and a required node affinity. ${RUNS} decisions each, in process (\`npx tsx bench/scheduler.ts\`). ${os.cpus().length} CPUs, load average ${os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(' ')}.`,
  '',
  '| measure | p50 | p90 | p99 | goal |',
  '|---|---|---|---|---|',
  `| decide(): filters and least-allocated score over ${NODES} nodes (usage precomputed) | ${f(median(pure))} | ${f(percentile(pure, 90))} | ${f(percentile(pure, 99))} | p50 <= 1 ms |`,
  `| the reconciler's decision: usage counted from the ${NODES * BOUND} bound sandboxes (spec.nodeName index), then decide() | ${f(median(whole))} | ${f(percentile(whole, 90))} | ${f(percentile(whole, 99))} | p50 <= 1 ms |`,
  '',
  `${((100 * placed) / RUNS).toFixed(0)}% of the decisions found a node (the rest are the unschedulable shapes: none).`,
]);
