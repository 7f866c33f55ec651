// The scheduler: binds a Sandbox whose spec.nodeName is empty to a Node (decide.ts), with a
// conflict-safe write: a PUT carrying the resourceVersion it read, so of two schedulers racing
// (two controller replicas in a failover, or a retry) one wins and the other gets 409, re-reads,
// sees the binding and stops: never two bindings. spec.nodeName is immutable once set (CEL rule),
// so even a blind write could not move a bound sandbox.
//
// A fork (workspace.source.sandboxRef) or a restore (checkpointRef) goes to the node that holds
// its data: the source sandbox's node, the checkpoint's status.nodeName. It is not copied across
// nodes; when that node cannot take it the sandbox stays unscheduled with the reason.
//
// No node fits: status condition Scheduled=False, reason Unschedulable, kube's message
// ("0/3 nodes are available: 1 Insufficient memory, 2 node(s) were not ready."), phase Pending,
// an Event FailedScheduling when the message changes; retried when a Node changes and every 30 s.
import type { Checkpoint, Node, Sandbox, Volume } from '../../apis/zz_generated.types.js';
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
import { sandboxesGVR } from '../common/kinds.js';
import { SANDBOX_FINALIZER } from '../sandbox/reconciler.js';
import {
  decide,
  memoryRequest,
  nodeReady,
  rejection,
  unschedulableMessage,
  type Decision,
  type NodeUsage,
} from './decide.js';
import { bindVolumes, volumePlacement } from './volumes.js';

export const SCHEDULED = 'Scheduled';
export const UNSCHEDULABLE_RETRY_MS = 30_000;
const TERMINAL = new Set(['Failed', 'Expired']);

export interface SchedulerDeps {
  client: Client;
  /** The Nodes (the informer's cache). */
  nodes(): readonly Node[];
  /** The sandboxes bound to `node` (the informer's spec.nodeName index). */
  boundTo(node: string): readonly Sandbox[];
  /** A sandbox or checkpoint from the cache (fork and restore sources). */
  sandbox(namespace: string, name: string): Sandbox | undefined;
  checkpoint(namespace: string, name: string): Checkpoint | undefined;
  /** A Volume from the cache (a sandbox's spec.volumes; absent: volumes are not scheduled). */
  volume?(namespace: string, name: string): Volume | undefined;
  /** The cached sandbox (the API is read on a conflict). */
  cached(key: ObjectKey): Sandbox | undefined;
  recorder?: Pick<EventRecorder, 'event'>;
  log: Logger;
  clock?: Clock;
}

/** What a node's sandboxes take; `assumed` adds bindings this scheduler made that the cache has not seen yet. */
export function usageOf(
  sandboxes: readonly Sandbox[],
  assumed?: ReadonlyMap<string, { node: string; memory: number }>,
  node?: string,
): NodeUsage {
  const u = { sandboxes: 0, memory: 0 };
  for (const s of sandboxes) {
    const phase = s.status?.phase;
    if (phase === 'Failed' || phase === 'Expired') continue;
    u.sandboxes++;
    u.memory += memoryRequest(s);
  }
  if (assumed?.size && node)
    for (const [uid, a] of assumed)
      if (a.node === node && !sandboxes.some((s) => s.metadata.uid === uid)) {
        u.sandboxes++;
        u.memory += a.memory;
      }
  return u;
}

export class SchedulerReconciler implements Reconciler {
  private readonly clock: Clock;
  /** uid -> the binding made and not yet seen in the cache (kube's assumed pods). */
  private readonly assumed = new Map<string, { node: string; memory: number }>();

  constructor(private readonly d: SchedulerDeps) {
    this.clock = d.clock ?? realClock;
  }

  /** The node holding a fork's or a restore's data: a name, 'wait' while the source is unbound, or undefined. */
  private dataNode(s: Sandbox): { node: string; what: string } | { wait: string } | undefined {
    const vols = this.d.volume ? volumePlacement(s, this.d.volume) : undefined;
    if (vols && 'wait' in vols) return vols;
    if (vols && 'conflict' in vols) return { wait: vols.conflict };
    const fromVolumes = vols?.node ? { node: vols.node, what: vols.what! } : undefined;
    const fromSource = this.sourceNode(s);
    if (fromVolumes && fromSource && 'node' in fromSource && fromSource.node !== fromVolumes.node)
      return {
        wait: `the data of ${fromSource.what} is on node ${fromSource.node} and ${fromVolumes.what} on node ${fromVolumes.node}; data is not copied between nodes`,
      };
    return fromSource ?? fromVolumes;
  }

  private sourceNode(s: Sandbox): { node: string; what: string } | { wait: string } | undefined {
    const src = s.spec?.workspace?.source;
    const ns = s.metadata.namespace ?? '';
    if (src?.sandboxRef) {
      const p = this.d.sandbox(ns, src.sandboxRef.name);
      const n = p?.spec?.nodeName ?? p?.status?.nodeName;
      return n
        ? { node: n, what: `the source sandbox ${src.sandboxRef.name}` }
        : { wait: `waiting for the source sandbox ${src.sandboxRef.name} to be bound to a node` };
    }
    if (src?.checkpointRef) {
      const c = this.d.checkpoint(ns, src.checkpointRef.name);
      const n = c?.status?.nodeName;
      return n
        ? { node: n, what: `the checkpoint ${src.checkpointRef.name}` }
        : { wait: `waiting for the checkpoint ${src.checkpointRef.name} to be taken on a node` };
    }
    return undefined;
  }

  private usage(node: string): NodeUsage {
    return usageOf(this.d.boundTo(node), this.assumed, node);
  }

  /** The decision for `s` from the current view (pure but for the reads of the caches). */
  decision(s: Sandbox): Decision {
    for (const [uid, a] of this.assumed) {
      const seen = this.d.boundTo(a.node).some((x) => x.metadata.uid === uid);
      if (seen) this.assumed.delete(uid);
    }
    const nodes = this.d.nodes();
    const data = this.dataNode(s);
    if (data && 'wait' in data) return { message: data.wait, reasons: {} };
    if (data) {
      const n = nodes.find((x) => x.metadata.name === data.node);
      const why = n ? rejection(s, n, this.usage(data.node)) : 'node not found';
      if (!why) return { node: data.node, score: 0 };
      return {
        message: `the data of ${data.what} is on node ${data.node}, which cannot take it: ${why} (data is not copied between nodes)`,
        reasons: { [why]: 1 },
      };
    }
    const usage = new Map<string, NodeUsage>();
    for (const n of nodes) usage.set(n.metadata.name!, this.usage(n.metadata.name!));
    return decide(s, nodes, usage);
  }

  async reconcile(key: ObjectKey): Promise<Result> {
    let s = this.d.cached(key) ?? (await this.read(key));
    for (let attempt = 0; ; attempt++) {
      if (!s || s.metadata.deletionTimestamp || TERMINAL.has(s.status?.phase ?? '')) return done();
      // Pinned by the user: only its unbound volumes follow it (a bound one elsewhere fails it on the node).
      if (s.spec?.nodeName) return this.bindUnboundVolumes(s, s.spec.nodeName).then(() => done());
      const d = this.decision(s);
      if (d.node === undefined) return this.unschedulable(s, d.message);
      try {
        await this.bindUnboundVolumes(s, d.node);
        await this.bind(s, d.node);
        return done();
      } catch (e) {
        // Someone else wrote the sandbox (another scheduler's binding, a user's label): re-read and
        // decide again; a bound sandbox ends the loop above.
        // The store commits writes in groups: a read right after a conflict may still show the old
        // version, so wait a little (10, 20, ... ms) before reading; past 5 tries the queue retries.
        if (!isConflict(e) || attempt >= 4) throw e;
        await new Promise((r) => setTimeout(r, 10 * (attempt + 1)));
        s = await this.read(key);
      }
    }
  }

  /** Binds the sandbox's volumes that are on no node yet to `node` (its first sandbox's; see volumes.ts). */
  private async bindUnboundVolumes(s: Sandbox, node: string): Promise<void> {
    const vols = this.d.volume ? volumePlacement(s, this.d.volume) : undefined;
    if (vols && 'unbound' in vols && vols.unbound.length) await bindVolumes(this.d.client, vols.unbound, node);
  }

  private async read(key: ObjectKey): Promise<Sandbox | undefined> {
    try {
      return await this.d.client.get<Sandbox>(sandboxesGVR, key.namespace || undefined, key.name);
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw e;
    }
  }

  private async bind(s: Sandbox, node: string): Promise<void> {
    // resourceVersion is the precondition: 409 when the sandbox changed since it was read. The
    // Sandbox controller's finalizer rides on the bind: the node agent's first pass would add it
    // with a write of its own (a round trip to the API server before the runtime create) and, from
    // the bind on, the node's agent is the one to remove it (its cleanup on delete, runtime/controller/finalizer.ts).
    const finalizers = s.metadata.finalizers ?? [];
    const bound = await this.d.client.update<Sandbox>(
      sandboxesGVR,
      s.metadata.namespace,
      {
        ...s,
        metadata: {
          ...s.metadata,
          finalizers: finalizers.includes(SANDBOX_FINALIZER) ? finalizers : [...finalizers, SANDBOX_FINALIZER],
        },
        spec: { ...s.spec, nodeName: node },
      },
      { fieldManager: 'fluxvm-scheduler' },
    );
    this.assumed.set(s.metadata.uid!, { node, memory: memoryRequest(s) });
    // A sandbox that was unschedulable says it is scheduled now (kube's PodScheduled=True).
    const prev = getCondition(bound.status?.conditions, SCHEDULED);
    if (prev && prev.status !== 'True') {
      await writeStatus(
        this.d.client,
        sandboxesGVR,
        bound,
        (c) => ({
          ...c.status,
          conditions: setCondition(
            c.status?.conditions,
            { type: SCHEDULED, status: 'True', reason: 'Scheduled', message: `bound to node ${node}` },
            this.clock.now(),
          ),
        }),
        { fieldManager: 'fluxvm-scheduler' },
      ).catch((err) =>
        this.d.log.debug?.('Scheduled condition not updated; the node agent writes status next', { err }),
      );
    }
    // Not waited for (the recorder never throws): the next sandbox in the queue is not held by
    // this one's Event write, a round trip per binding for a burst of creates.
    void this.d.recorder?.event(
      bound,
      'Normal',
      'Scheduled',
      `Successfully assigned ${s.metadata.namespace}/${s.metadata.name} to ${node}`,
    );
  }

  private async unschedulable(s: Sandbox, message: string): Promise<Result> {
    const prev = getCondition(s.status?.conditions, SCHEDULED);
    if (prev?.status !== 'False' || prev.message !== message || s.status?.phase !== 'Pending') {
      try {
        await writeStatus(
          this.d.client,
          sandboxesGVR,
          s,
          (c) => ({
            ...c.status,
            phase: 'Pending' as const,
            conditions: setCondition(
              c.status?.conditions,
              {
                type: SCHEDULED,
                status: 'False',
                reason: 'Unschedulable',
                message,
                observedGeneration: s.metadata.generation,
              },
              this.clock.now(),
            ),
          }),
          { fieldManager: 'fluxvm-scheduler' },
        );
      } catch (e) {
        if (!isConflict(e)) throw e;
        return requeueAfter(100); // changed meanwhile: decide again on the new version
      }
      await this.d.recorder?.event(s, 'Warning', 'FailedScheduling', message);
    }
    return requeueAfter(UNSCHEDULABLE_RETRY_MS);
  }
}

export { nodeReady, unschedulableMessage };
