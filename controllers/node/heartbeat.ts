// Node registration and heartbeat, as kubelet does: whoever runs a node's runtime (`fluxctl
// node-agent`, or `fluxctl serve` for its own single node) creates its Node (nodes.fluxvm.dev)
// with labels and status (capacity from the runtime and the host, addresses, nodeInfo, Ready),
// then renews a Lease of the same name in `fluxvm-node-lease` every `intervalMs` (10 s). The
// node controller (lifecycle.ts) reads the Leases: a Lease older than its grace period makes
// the Node Ready=False and its sandboxes NodeLost. Each renewal also re-posts the Node's status
// when it is not Ready=True (after a lost heartbeat) or the capacity changed.
//
//   const hb = startNodeHeartbeat({ client, runtime, nodeName, log });  ...  await hb.stop();
import os from 'node:os';
import { lease, namespace } from '../../apis/core.js';
import { NODE_LEASE_NAMESPACE, node as nodeKind } from '../../apis/node.js';
import type { Node } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import {
  realClock,
  writeStatus,
  type Clock,
  type Logger,
  type Runnable,
  type TimerHandle,
} from '../../runtime/controller/index.js';
import { isAlreadyExists, isConflict, isNotFound, isStatusError } from '../../runtime/meta/errors.js';
import { gvrOf, type KubeObject } from '../../runtime/meta/types.js';
import { nodeNameOf } from '../common/kinds.js';
import { NODE_LABELS } from '../scheduler/decide.js';

export const nodesGVR = gvrOf(nodeKind);
export const leasesGVR = gvrOf(lease);
const namespacesGVR = gvrOf(namespace);

/** Default heartbeat period (kubelet renews its Lease every 10 s). */
export const HEARTBEAT_INTERVAL_MS = 10_000;
/** Default Lease duration written in the Lease (the node controller's default grace period). */
export const NODE_LEASE_SECONDS = 40;
/** Default sandboxes allocatable on a node (fluxctl node-agent --max-sandboxes). */
export const DEFAULT_MAX_SANDBOXES = 1000;
const MANAGER = 'fluxvm-node-agent';

export interface HeartbeatOptions {
  client: Client;
  runtime: Pick<Runtime, 'capabilities'>;
  nodeName: string;
  log: Logger;
  /** The node agent URL the API server and controllers dial (split mode); absent in embedded mode. */
  agentURL?: string;
  /** Extra labels for the Node (operator's, e.g. zone). */
  labels?: Record<string, string>;
  maxSandboxes?: number;
  /** Memory for sandboxes in bytes; default the host's total memory. */
  memoryBytes?: number;
  intervalMs?: number;
  leaseDurationSeconds?: number;
  clock?: Clock;
  version?: string;
}

export interface Heartbeat {
  /** Resolves after the first registration and Lease write (rejects when the first attempt fails). */
  ready: Promise<void>;
  /** One renewal now (tests). */
  beat(): Promise<void>;
  /** Stops renewing (the Lease is left to expire, as when a node dies; kubelet does the same). */
  stop(): void;
}

/** The Node's status from the runtime and the host. */
export function nodeStatus(o: HeartbeatOptions): NonNullable<Node['status']> {
  const vm = o.runtime.capabilities('vm');
  const procbox = o.runtime.capabilities('procbox');
  const runtimes = [
    ...(procbox.backend === 'procbox' ? (['procbox'] as const) : []),
    ...(vm.backend === 'vm' ? (['vm'] as const) : []),
  ];
  const kvm = vm.backend === 'vm' && vm.accelerator === 'kvm';
  const memory = o.memoryBytes ?? os.totalmem();
  const sandboxes = o.maxSandboxes ?? DEFAULT_MAX_SANDBOXES;
  return {
    addresses: [
      ...(o.agentURL ? [{ type: 'AgentURL' as const, address: o.agentURL }] : []),
      { type: 'Hostname' as const, address: os.hostname().slice(0, 253) || 'localhost' },
    ],
    capacity: { runtimes: [...runtimes], kvm, memory, sandboxes },
    allocatable: { runtimes: [...runtimes], kvm, memory, sandboxes },
    nodeInfo: {
      version: (o.version ?? '').slice(0, 64),
      kernelVersion: os.release().slice(0, 256),
      architecture: process.arch,
      hostname: os.hostname().slice(0, 253),
    },
  };
}

function nodeLabels(o: HeartbeatOptions, st: NonNullable<Node['status']>): Record<string, string> {
  return {
    ...(o.labels ?? {}),
    [NODE_LABELS.hostname]: o.nodeName.slice(0, 63),
    [NODE_LABELS.arch]: process.arch,
    [NODE_LABELS.kvm]: String(st.capacity?.kvm ?? false),
  };
}

const rfc3339micro = (ms: number) => new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');

/** Starts registering and heartbeating `nodeName`. */
export function startNodeHeartbeat(o: HeartbeatOptions): Heartbeat {
  const clock = o.clock ?? realClock;
  const interval = o.intervalMs ?? HEARTBEAT_INTERVAL_MS;
  const duration = o.leaseDurationSeconds ?? NODE_LEASE_SECONDS;
  let stopped = false;
  let timer: TimerHandle | undefined;
  let running: Promise<void> | undefined;

  const ensureNamespace = async () => {
    try {
      await o.client.create(namespacesGVR, undefined, {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name: NODE_LEASE_NAMESPACE },
      } as KubeObject);
    } catch (e) {
      // On a cluster the install creates the namespace and the agent may not create namespaces (403).
      if (!isAlreadyExists(e) && !(isStatusError(e) && e.code === 403)) throw e;
    }
  };

  const register = async () => {
    const st = nodeStatus(o);
    const labels = nodeLabels(o, st);
    let cur: Node;
    try {
      cur = await o.client.get<Node>(nodesGVR, undefined, o.nodeName);
    } catch (e) {
      if (!isNotFound(e)) throw e;
      cur = await o.client.create<Node>(
        nodesGVR,
        undefined,
        { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Node', metadata: { name: o.nodeName, labels }, spec: {} },
        { fieldManager: MANAGER },
      );
    }
    const curLabels = cur.metadata.labels ?? {};
    if (Object.entries(labels).some(([k, v]) => curLabels[k] !== v)) {
      cur = await o.client.update<Node>(
        nodesGVR,
        undefined,
        { ...cur, metadata: { ...cur.metadata, labels: { ...curLabels, ...labels } } },
        { fieldManager: MANAGER },
      );
    }
    const ready = cur.status?.conditions?.find((c) => c.type === 'Ready');
    const want = { ...cur.status, ...st };
    const same =
      ready?.status === 'True' &&
      JSON.stringify({ ...cur.status, conditions: undefined }) === JSON.stringify({ ...want, conditions: undefined });
    if (same) return;
    const now = new Date(clock.now()).toISOString().replace(/\.\d{3}Z$/, 'Z');
    const conditions = [
      ...(cur.status?.conditions ?? []).filter((c) => c.type !== 'Ready'),
      {
        type: 'Ready',
        status: 'True' as const,
        reason: 'NodeAgentReady',
        message: 'the node agent is posting ready status',
        lastTransitionTime: ready?.status === 'True' ? ready.lastTransitionTime : now,
      },
    ];
    await writeStatus(o.client, nodesGVR, cur, () => ({ ...want, conditions }), { fieldManager: MANAGER });
  };

  const renewLease = async () => {
    const now = rfc3339micro(clock.now());
    try {
      const cur = await o.client.get<KubeObject & { spec?: Record<string, unknown> }>(
        leasesGVR,
        NODE_LEASE_NAMESPACE,
        o.nodeName,
      );
      await o.client.update(
        leasesGVR,
        NODE_LEASE_NAMESPACE,
        { ...cur, spec: { ...cur.spec, holderIdentity: o.nodeName, leaseDurationSeconds: duration, renewTime: now } },
        { fieldManager: MANAGER },
      );
    } catch (e) {
      if (!isNotFound(e)) throw e;
      await o.client.create(
        leasesGVR,
        NODE_LEASE_NAMESPACE,
        {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: { name: o.nodeName, namespace: NODE_LEASE_NAMESPACE },
          spec: { holderIdentity: o.nodeName, leaseDurationSeconds: duration, acquireTime: now, renewTime: now },
        } as KubeObject,
        { fieldManager: MANAGER },
      );
    }
  };

  const beat = async (first = false) => {
    if (first) await ensureNamespace();
    // The Lease first: it is the heartbeat; the Node status only changes on a transition.
    for (let attempt = 0; ; attempt++) {
      try {
        await renewLease();
        await register();
        return;
      } catch (e) {
        if (!isConflict(e) || attempt >= 2) throw e;
      }
    }
  };

  const schedule = () => {
    if (stopped) return;
    timer = clock.setTimeout(() => {
      running = beat()
        .catch((err) => o.log.warn?.('node heartbeat failed; retried at the next period', { node: o.nodeName, err }))
        .finally(schedule);
    }, interval);
  };

  const ready = beat(true).finally(schedule);
  return {
    ready,
    beat: () => beat(),
    stop() {
      stopped = true;
      timer?.cancel();
      void running;
    },
  };
}

/**
 * The heartbeat as a manager Runnable, for a process whose manager runs the node's runtime
 * (embedded `fluxctl serve`: one node, named as the Sandbox controller names it, the host name):
 * registers the node at start, stops renewing when the manager stops.
 */
export function nodeHeartbeatRunnable(o: Omit<HeartbeatOptions, 'nodeName'> & { nodeName?: string }): Runnable {
  return {
    name: 'node-heartbeat',
    async start(signal: AbortSignal) {
      const hb = startNodeHeartbeat({ ...o, nodeName: o.nodeName ?? nodeNameOf() });
      await hb.ready.catch((err) => o.log.error('node registration failed; retried at the next period', { err }));
      if (!signal.aborted) await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
      hb.stop();
    },
  };
}
