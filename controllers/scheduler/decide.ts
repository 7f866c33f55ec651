// The scheduler's decision, pure and allocation-light: filter the nodes a Sandbox may run on
// (kube's predicates, cut to what FluxVM has), score the rest by least allocated, and say why
// each rejected node was rejected in kube's words ("0/3 nodes are available: 1 Insufficient
// memory, 2 node(s) didn't match Pod's node affinity/selector"). No I/O: the controller
// (index.ts) feeds it the Nodes from its informer and the usage it counts from its Sandbox cache.
import { parseMemory } from '../../apis/quantity.js';
import type { Node, Sandbox } from '../../apis/zz_generated.types.js';

/** What the sandboxes bound to a node take (counted by the caller from its cache). */
export interface NodeUsage {
  sandboxes: number;
  memory: number;
}

export type Decision =
  { node: string; score: number } | { node?: undefined; message: string; reasons: Record<string, number> };

// The filters in the order they run; a node is rejected by the first that fails (as kube).
export const REASON = {
  notReady: 'node(s) were not ready',
  unschedulable: 'node(s) were unschedulable',
  runtime: "node(s) didn't have the sandbox's runtime",
  selector: "node(s) didn't match the sandbox's node affinity/selector",
  sandboxes: 'Too many sandboxes',
  memory: 'Insufficient memory',
} as const;

/** The memory a sandbox asks for, in bytes (spec.resources.memory; 0 without it, as a BestEffort pod). */
export function memoryRequest(s: Sandbox): number {
  const m = s.spec?.resources?.memory;
  if (m === undefined) return 0;
  // Cached per object: informer objects are replaced, never changed, so usage counts parse once.
  const hit = parsed.get(s);
  if (hit !== undefined) return hit;
  let v = 0;
  try {
    v = parseMemory(m);
  } catch {
    v = 0;
  }
  parsed.set(s, v);
  return v;
}
const parsed = new WeakMap<Sandbox, number>();

/** Whether the node's Ready condition is True. */
export function nodeReady(n: Node): boolean {
  return n.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
}

/**
 * Labels every node agent puts on its Node (heartbeat.ts), so a sandbox asks for them with
 * spec.nodeSelector: `fluxvm.dev/kvm: "true"` for a vm that must not run under TCG.
 */
export const NODE_LABELS = {
  hostname: 'kubernetes.io/hostname',
  kvm: 'fluxvm.dev/kvm',
  arch: 'kubernetes.io/arch',
} as const;

type Expr = { key: string; operator: 'In' | 'NotIn' | 'Exists' | 'DoesNotExist'; values?: string[] };

function exprMatches(e: Expr, labels: Record<string, string>): boolean {
  const has = Object.prototype.hasOwnProperty.call(labels, e.key);
  switch (e.operator) {
    case 'In':
      return has && (e.values ?? []).includes(labels[e.key]!);
    case 'NotIn':
      return !has || !(e.values ?? []).includes(labels[e.key]!);
    case 'Exists':
      return has;
    case 'DoesNotExist':
      return !has;
  }
}

/** spec.nodeSelector (every pair) and the required node affinity (any term, every expression of it). */
export function selectorMatches(s: Sandbox, labels: Record<string, string>): boolean {
  const sel = s.spec?.nodeSelector;
  if (sel) for (const k in sel) if (labels[k] !== sel[k]) return false;
  const terms = s.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms;
  if (!terms || terms.length === 0) return true;
  return terms.some((t) => (t.matchExpressions as Expr[]).every((e) => exprMatches(e, labels)));
}

/**
 * Why `n` cannot take `s` (a REASON value), or undefined when it can. `u` is what the node's
 * sandboxes take already.
 */
export function rejection(s: Sandbox, n: Node, u: NodeUsage): string | undefined {
  if (!nodeReady(n)) return REASON.notReady;
  if (n.spec?.unschedulable) return REASON.unschedulable;
  const a = n.status?.allocatable ?? {};
  const runtime = s.spec?.runtime ?? 'procbox';
  if (!(a.runtimes ?? []).includes(runtime)) return REASON.runtime;
  if (!selectorMatches(s, n.metadata.labels ?? {})) return REASON.selector;
  if (a.sandboxes !== undefined && u.sandboxes + 1 > a.sandboxes) return REASON.sandboxes;
  const mem = memoryRequest(s);
  if (mem > 0 && a.memory !== undefined && u.memory + mem > a.memory) return REASON.memory;
  return undefined;
}

/**
 * Least allocated (kube's NodeResourcesFit LeastAllocated): the mean over sandbox count and
 * memory of the free fraction after placing `s`, 0..100. A node without a bound on a resource
 * counts it as free. Not rounded to an integer as kube's is: with 1000 sandboxes allocatable one
 * sandbox moves the score by 0.05, and sandboxes without memory requests differ only there (kube
 * breaks its ties at random; here ties go to the first name, so rounding put every sandbox on it).
 */
export function score(s: Sandbox, n: Node, u: NodeUsage): number {
  const a = n.status?.allocatable ?? {};
  const free = (used: number, cap: number | undefined) => (cap ? Math.max(0, (cap - used) / cap) : 1);
  return 50 * (free(u.sandboxes + 1, a.sandboxes) + free(u.memory + memoryRequest(s), a.memory));
}

const NONE: NodeUsage = { sandboxes: 0, memory: 0 };

/**
 * The node for `s` among `nodes`: the best score, ties to the name first in order (stable,
 * so two schedulers with the same view pick the same node). Or the reasons no node fits.
 */
export function decide(s: Sandbox, nodes: readonly Node[], usage: ReadonlyMap<string, NodeUsage>): Decision {
  let best: string | undefined;
  let bestScore = -1;
  const reasons: Record<string, number> = {};
  for (const n of nodes) {
    const name = n.metadata.name!;
    const u = usage.get(name) ?? NONE;
    const why = rejection(s, n, u);
    if (why) {
      reasons[why] = (reasons[why] ?? 0) + 1;
      continue;
    }
    const sc = score(s, n, u);
    if (sc > bestScore || (sc === bestScore && name < best!)) {
      best = name;
      bestScore = sc;
    }
  }
  if (best !== undefined) return { node: best, score: bestScore };
  return { message: unschedulableMessage(nodes.length, reasons), reasons };
}

/** kube's FitError message: "0/3 nodes are available: 1 Insufficient memory, 2 node(s) were not ready." */
export function unschedulableMessage(total: number, reasons: Record<string, number>): string {
  const parts = Object.entries(reasons)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([r, c]) => `${c} ${r}`);
  return parts.length ? `0/${total} nodes are available: ${parts.join(', ')}.` : `0/${total} nodes are available.`;
}
