// The node controller (kube's node lifecycle controller, cut down): for each Node it reads the
// node's heartbeat Lease (fluxvm-node-lease/<node>). While the Lease was renewed within the grace
// period (default 40 s, `gracePeriodMs`) the node is alive. Once it is older:
//   - the Node gets Ready=False, reason HeartbeatLost;
//   - every sandbox bound to it (spec.nodeName) gets condition NodeLost=True;
//   - a sandbox that may be recreated elsewhere, a warm-pool member (controller ownerReference
//     a SandboxWarmPool, controllers/agentsandbox/pool.ts), is deleted: the pool stops counting it
//     at once and creates a replacement, which the scheduler binds to a Ready node. Its finalizer
//     stays until the lost node's agent comes back and destroys the instance (as a pod on a lost
//     kubelet stays Terminating);
//   - any other sandbox (a user's, or a claimed one: it has state) waits, as a StatefulSet pod
//     does: it is never recreated elsewhere; deleting it is the user's call.
// When the Lease is renewed again, NodeLost goes False (reason NodeReady) and the node agent posts
// Ready=True itself (heartbeat.ts). The controller also writes status.allocated (informational),
// ALLOCATED_DELAY_MS after it changed (the scheduler counts from its own cache, never from it).
import type { Node, Sandbox } from '../../apis/zz_generated.types.js';
import type { Client } from '../../runtime/client/client.js';
import {
  done,
  getCondition,
  realClock,
  requeueAfter,
  setCondition,
  writeStatus,
  type Clock,
  type EventRecorder,
  type Logger,
  type ObjectKey,
  type Reconciler,
  type Result,
} from '../../runtime/controller/index.js';
import { isConflict, isNotFound } from '../../runtime/meta/errors.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { sandboxesGVR } from '../common/kinds.js';
import type { NodeUsage } from '../scheduler/decide.js';
import { usageOf } from '../scheduler/reconciler.js';
import { nodesGVR } from './heartbeat.js';

export const NODE_LOST = 'NodeLost';
/** Default grace period: a node whose Lease is older is lost (kube's node-monitor-grace-period). */
export const NODE_GRACE_MS = 40_000;
/**
 * status.allocated is written this long after the pass that first saw it differ, with whatever
 * changed meanwhile: off the path of the create that changed it (the bind, the agent's writes and
 * the client's watch all land within these ms), and one write for a burst of creates.
 */
export const ALLOCATED_DELAY_MS = 1_000;

export type LeaseObj = KubeObject & { spec?: { renewTime?: string; acquireTime?: string } };

export interface NodeLifecycleDeps {
  client: Client;
  node(name: string): Node | undefined;
  lease(name: string): LeaseObj | undefined;
  boundTo(node: string): readonly Sandbox[];
  gracePeriodMs?: number;
  recorder?: Pick<EventRecorder, 'event'>;
  log: Logger;
  clock?: Clock;
}

/** Whether the sandbox may be recreated on another node when its node is lost. */
export function recreatableElsewhere(s: Sandbox): boolean {
  const owner = s.metadata.ownerReferences?.find((o) => o.controller);
  return owner?.kind === 'SandboxWarmPool' && owner.apiVersion.startsWith('extensions.agents.x-k8s.io/');
}

export class NodeLifecycleReconciler implements Reconciler {
  private readonly clock: Clock;
  private readonly grace: number;
  /**
   * Per node, the status.allocated this controller wrote last and the resourceVersion it wrote
   * over: while the Node cache still shows that version, it is behind the write, not wrong.
   */
  private readonly wrote = new Map<string, { usage: NodeUsage; over?: string }>();
  /** Per node, when a pass first saw status.allocated differ (its write is due ALLOCATED_DELAY_MS later). */
  private readonly dirtySince = new Map<string, number>();

  constructor(private readonly d: NodeLifecycleDeps) {
    this.clock = d.clock ?? realClock;
    this.grace = d.gracePeriodMs ?? NODE_GRACE_MS;
  }

  /** Milliseconds since the node last heartbeated (its Lease's renewTime, else the Node's creation). */
  heartbeatAge(n: Node): number {
    const l = this.d.lease(n.metadata.name!);
    const t = Date.parse(l?.spec?.renewTime ?? l?.spec?.acquireTime ?? n.metadata.creationTimestamp ?? '');
    return Number.isNaN(t) ? Infinity : this.clock.now() - t;
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    const n = this.d.node(key.name);
    if (!n || n.metadata.deletionTimestamp) return done();
    const name = n.metadata.name!;
    const age = this.heartbeatAge(n);
    const bound = this.d.boundTo(name);
    const lost = age > this.grace;
    if (lost) await this.markNodeLost(n, age);
    for (const s of bound) await this.sandbox(s, name, lost, age);
    const dueIn = await this.writeAllocated(n, bound);
    const next = lost ? this.grace : Math.max(100, this.grace - age + 100);
    return requeueAfter(dueIn === undefined ? next : Math.min(next, dueIn));
  }

  private async markNodeLost(n: Node, age: number): Promise<void> {
    const ready = getCondition(n.status?.conditions, 'Ready');
    if (ready?.status === 'False' && ready.reason === 'HeartbeatLost') return;
    const message = `the node agent has not renewed its Lease for ${Math.round(age / 1000)} s (grace period ${this.grace / 1000} s)`;
    try {
      await writeStatus(this.d.client, nodesGVR, n, (c) => ({
        ...c.status,
        conditions: setCondition(
          c.status?.conditions,
          { type: 'Ready', status: 'False', reason: 'HeartbeatLost', message },
          this.clock.now(),
        ),
      }));
      await this.d.recorder?.event(n, 'Warning', 'NodeNotReady', message);
    } catch (e) {
      if (isNotFound(e)) return;
      throw e; // a conflict: retried (rate-limited) on a fresh read
    }
  }

  private async sandbox(s: Sandbox, node: string, lost: boolean, age: number): Promise<void> {
    if (s.metadata.deletionTimestamp) return;
    const cur = getCondition(s.status?.conditions, NODE_LOST);
    if (!lost) {
      if (cur?.status !== 'True') return;
      await this.setNodeLost(s, 'False', 'NodeReady', `node ${node} heartbeats again`);
      return;
    }
    if (recreatableElsewhere(s)) {
      try {
        await this.d.client.delete(sandboxesGVR, s.metadata.namespace, s.metadata.name!, {
          preconditions: { uid: s.metadata.uid! },
        });
        await this.d.recorder?.event(
          s,
          'Warning',
          NODE_LOST,
          `node ${node} is lost; the warm-pool member is deleted so its pool recreates it on another node`,
        );
      } catch (e) {
        if (!isNotFound(e) && !isConflict(e)) throw e;
      }
      return;
    }
    if (cur?.status === 'True') return;
    const msg = `node ${node} has not heartbeated for ${Math.round(age / 1000)} s; the sandbox keeps its state there and waits for the node to return (delete it to give up)`;
    await this.setNodeLost(s, 'True', NODE_LOST, msg);
    await this.d.recorder?.event(s, 'Warning', NODE_LOST, msg);
  }

  private async setNodeLost(s: Sandbox, status: 'True' | 'False', reason: string, message: string): Promise<void> {
    try {
      await writeStatus(this.d.client, sandboxesGVR, s, (c) => ({
        ...c.status,
        conditions: setCondition(c.status?.conditions, { type: NODE_LOST, status, reason, message }, this.clock.now()),
      }));
    } catch (e) {
      if (isNotFound(e)) return;
      throw e; // a conflict: the next pass reads the new version
    }
  }

  /**
   * status.allocated, when it differs from the bound sandboxes. Every sandbox event brings a pass
   * (a bind, then the agent's finalizer and status writes, all within a few ms), and the Node
   * cache lags this controller's own write: a pass that took the lag for a difference wrote again
   * on the stale version, got 409, read and wrote once more, three requests at the API server
   * while the sandbox it counted was being created. A cache still at the version this controller
   * wrote over is taken as holding what it wrote.
   */
  private async writeAllocated(n: Node, bound: readonly Sandbox[]): Promise<number | undefined> {
    const u = usageOf(bound);
    const name = n.metadata.name!;
    const same = (a: { sandboxes?: number; memory?: number } | undefined) =>
      a?.sandboxes === u.sandboxes && a.memory === u.memory;
    const mine = this.wrote.get(name);
    const cached = mine && n.metadata.resourceVersion === mine.over ? mine.usage : n.status?.allocated;
    if (same(cached)) {
      this.dirtySince.delete(name);
      return undefined;
    }
    // Due ALLOCATED_DELAY_MS after the first pass that saw the difference; until then, a requeue.
    const now = this.clock.now();
    const since = this.dirtySince.get(name) ?? now;
    this.dirtySince.set(name, since);
    if (now - since < ALLOCATED_DELAY_MS) return since + ALLOCATED_DELAY_MS - now;
    this.dirtySince.delete(name);
    try {
      let over = n.metadata.resourceVersion;
      await writeStatus(this.d.client, nodesGVR, n, (c) => {
        over = c.metadata.resourceVersion; // the version written over (a newer one after a conflict)
        return { ...c.status, allocated: u };
      });
      this.wrote.set(name, { usage: u, over });
    } catch (e) {
      if (!isConflict(e) && !isNotFound(e)) throw e;
    }
    return undefined;
  }
}
