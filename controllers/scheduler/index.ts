// Wiring of the scheduler and the node controller (controllers/README.md): both only when the
// process schedules (`ControllerDeps.scheduling`: `fluxctl controller --scheduler`, `fluxctl serve
// --scheduler`). Without it every process runs the sandboxes with no spec.nodeName itself, as
// embedded `fluxctl serve` always did (see docs/scale-out.md, Scheduling).
import { checkpoint as checkpointKind } from '../../apis/checkpoint.js';
import { lease } from '../../apis/core.js';
import { NODE_LEASE_NAMESPACE, node as nodeKind } from '../../apis/node.js';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Checkpoint, Node, Sandbox, Volume } from '../../apis/zz_generated.types.js';
import { volume as volumeKind } from '../../apis/volume.js';
import { keyOf, type Manager } from '../../runtime/controller/index.js';
import { gvrOf, type KubeObject } from '../../runtime/meta/types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { NodeLifecycleReconciler, type LeaseObj } from '../node/lifecycle.js';
import { SchedulerReconciler } from './reconciler.js';

/** The Sandbox cache index of spec.nodeName (the scheduler's usage, the node controller's sandboxes). */
export const NODE_NAME_INDEX = 'fluxvm.dev/spec.nodeName';

export function register(manager: Manager, d: ControllerDeps): Registration {
  if (!d.scheduling) return { controllers: [], subresources: [] };
  const sandboxes = manager.informer<Sandbox>(gvrOf(sandboxKind));
  sandboxes.cache.addIndex(NODE_NAME_INDEX, (s) => (s.spec?.nodeName ? [s.spec.nodeName] : []));
  const nodes = manager.informer<Node>(gvrOf(nodeKind));
  const checkpoints = manager.informer<Checkpoint>(gvrOf(checkpointKind));
  const volumes = manager.informer<Volume>(gvrOf(volumeKind));
  const leases = manager.informer<KubeObject>(gvrOf(lease));
  const boundTo = (n: string) => sandboxes.cache.byIndex(NODE_NAME_INDEX, n);
  const unscheduled = () =>
    sandboxes.cache
      .list()
      .filter((s) => !s.spec?.nodeName)
      .map(keyOf);

  const scheduler = manager
    .controllerFor<Sandbox>(sandboxKind)
    .named('scheduler')
    // A Node appearing, turning Ready or changing labels may fit the waiting sandboxes.
    .watches(nodeKind, () => unscheduled())
    // A Volume appearing or bound may place the sandboxes waiting for it.
    .watches(volumeKind, () => unscheduled())
    .concurrency(d.concurrency?.scheduler ?? 1)
    .complete(
      (c) =>
        new SchedulerReconciler({
          client: c.client,
          nodes: () => nodes.cache.list(),
          boundTo,
          sandbox: (ns, name) => sandboxes.cache.get(ns, name),
          checkpoint: (ns, name) => checkpoints.cache.get(ns, name),
          volume: (ns, name) => volumes.cache.get(ns, name),
          cached: (k) => sandboxes.cache.get(k.namespace, k.name),
          recorder: c.recorder,
          log: c.log,
          clock: c.clock,
        }),
    );

  const lifecycle = manager
    .controllerFor<Node>(nodeKind)
    .named('node-lifecycle')
    .watches(lease, (l: KubeObject) =>
      l.metadata.namespace === NODE_LEASE_NAMESPACE ? [{ namespace: '', name: l.metadata.name! }] : [],
    )
    .watches(sandboxKind, (s: Sandbox) => (s.spec?.nodeName ? [{ namespace: '', name: s.spec.nodeName }] : []))
    .complete(
      (c) =>
        new NodeLifecycleReconciler({
          client: c.client,
          node: (n) => nodes.cache.get(undefined, n),
          lease: (n) => leases.cache.get(NODE_LEASE_NAMESPACE, n) as LeaseObj | undefined,
          boundTo,
          gracePeriodMs: d.nodeGracePeriodMs,
          recorder: c.recorder,
          log: c.log,
          clock: c.clock,
        }),
    );
  return { controllers: [scheduler.controller, lifecycle.controller], subresources: [] };
}
