// The node agent's view of the sandboxes it owns (node agents own by node): an
// informer of the Sandboxes bound to this node only (field selector spec.nodeName=<node>, as
// kubelet watches its pods), and the admission of `create` calls on it: an instance is created
// here only for a Sandbox bound to this node; any other is refused with a Conflict naming the
// node, before the runtime is touched. A miss in the cache (a binding newer than the watch) is
// checked against the API with the same selector before it is refused.
//
// startNodeSandboxes runs the Sandbox controller of this node in the agent (kubelet-style): a
// Manager whose Sandbox informer has the same field selector, over the node's own runtime, with
// status.nodeName this node. `fluxctl controller --route-by-node` leaves the Sandbox controller
// out and runs the other kinds, which reach a sandbox through the agent of its node.
import fs from 'node:fs';
import path from 'node:path';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { RuntimeError } from '../../native/runtime.js';
import { ClientNodeClient, clientNode } from '../../runtime/client/clientnode.js';
import { Informer, Manager, type Logger } from '../../runtime/controller/index.js';
import type { Metrics } from '../../runtime/metrics/metrics.js';
import type { Client } from '../../runtime/client/client.js';
import { register as registerSandbox } from '../../controllers/sandbox/index.js';
import { register as registerVolume } from '../../controllers/volume/index.js';
import { volume as volumeKind } from '../../apis/volume.js';
import type { Runtime } from '../../native/runtime.js';
import { gvrOf } from '../../runtime/meta/types.js';
import { CliError } from './util.js';

export interface OwnSandboxes {
  /** The agent's client of the API server (its kubeconfig). */
  client: ClientNodeClient;
  /** Resolves when `id` is the uid of a Sandbox bound to this node; throws RuntimeError Conflict otherwise. */
  admit(id: string): Promise<void>;
  /**
   * The node the Sandbox with uid `id` is bound to (spec.nodeName, else status.nodeName), or
   * undefined when no Sandbox has it. This node's from the watch; any other from a list of every
   * Sandbox (the API has no field selector on metadata.uid), asked only when the runtime has no
   * such instance (native/agent/server.ts holderOf).
   */
  holderOf(id: string): Promise<string | undefined>;
  /** The sandboxes bound to this node, as the watch sees them. */
  list(): Sandbox[];
  stop(): Promise<void>;
}

/** Where a pod's service account is mounted (kube's in-cluster config). */
export const SERVICEACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/**
 * The agent's API server: the --kubeconfig file; without it, inside a pod (KUBERNETES_SERVICE_HOST
 * set), the in-cluster config: the service account's token and CA under `inClusterRoot` +
 * SERVICEACCOUNT_DIR (the token file is read again as the kubelet rotates it) and
 * https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT. Undefined: neither (the agent runs
 * without an API server, as a plain runtime for one --node-agent controller).
 */
export function agentKubeConfig(o: {
  kubeconfig?: string;
  /** A prefix of SERVICEACCOUNT_DIR (tests: a directory holding a fake var/run/secrets/...); default ''. */
  inClusterRoot?: string;
  env?: NodeJS.ProcessEnv;
}): InstanceType<ReturnType<typeof clientNode>['KubeConfig']> | undefined {
  const kc = new (clientNode().KubeConfig)();
  if (o.kubeconfig) {
    try {
      kc.loadFromFile(o.kubeconfig);
    } catch (e) {
      throw new CliError(`error: cannot load the kubeconfig ${o.kubeconfig}: ${(e as Error).message}`);
    }
    return kc;
  }
  const env = o.env ?? process.env;
  if (!env.KUBERNETES_SERVICE_HOST) return undefined;
  if (!env.KUBERNETES_SERVICE_PORT)
    throw new CliError('error: in-cluster config: KUBERNETES_SERVICE_HOST is set but KUBERNETES_SERVICE_PORT is not');
  const dir = `${o.inClusterRoot ?? ''}${SERVICEACCOUNT_DIR}`;
  for (const f of ['token', 'ca.crt'])
    if (!fs.existsSync(path.join(dir, f)))
      throw new CliError(
        `error: in-cluster config: no ${path.join(dir, f)} (no --kubeconfig, and no service account token mounted)`,
      );
  const saved = { host: process.env.KUBERNETES_SERVICE_HOST, port: process.env.KUBERNETES_SERVICE_PORT };
  process.env.KUBERNETES_SERVICE_HOST = env.KUBERNETES_SERVICE_HOST;
  process.env.KUBERNETES_SERVICE_PORT = env.KUBERNETES_SERVICE_PORT;
  try {
    kc.loadFromCluster(o.inClusterRoot ?? '');
  } finally {
    for (const [k, v] of [
      ['KUBERNETES_SERVICE_HOST', saved.host],
      ['KUBERNETES_SERVICE_PORT', saved.port],
    ] as const)
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
  }
  return kc;
}

/** Starts the watch of this node's Sandboxes through `kc` (agentKubeConfig); resolves once it has listed them. */
export async function watchOwnSandboxes(
  kc: NonNullable<ReturnType<typeof agentKubeConfig>>,
  nodeName: string,
  log: Logger,
): Promise<OwnSandboxes> {
  const client = new ClientNodeClient(kc, { userAgent: `fluxvm-node-agent/${nodeName}` });
  const gvr = gvrOf(sandboxKind);
  const fieldSelector = `spec.nodeName=${nodeName}`;
  const informer = new Informer<Sandbox>({ client, gvr, fieldSelector, log, resyncMs: 0 });
  informer.cache.addIndex('uid', (s) => (s.metadata.uid ? [s.metadata.uid] : []));
  const ac = new AbortController();
  const run = informer.start(ac.signal);
  if (!(await informer.waitForSync(ac.signal))) throw new CliError('error: the sandbox watch never synced');
  const bound = (id: string) => informer.cache.byIndex('uid', id).length > 0;
  return {
    client,
    async admit(id) {
      if (id && bound(id)) return;
      if (id) {
        const live = await client.list<Sandbox>(gvr, undefined, { fieldSelector });
        if (live.items.some((s) => s.metadata.uid === id)) return;
      }
      throw new RuntimeError(
        'Conflict',
        `refused: runtime instance "${id}" is not a Sandbox bound to node "${nodeName}" (spec.nodeName); the agent of its node creates it`,
      );
    },
    async holderOf(id) {
      if (bound(id)) return nodeName;
      const all = await client.list<Sandbox>(gvr, undefined);
      const s = all.items.find((x) => x.metadata.uid === id);
      return s ? s.spec?.nodeName || s.status?.nodeName || undefined : undefined;
    },
    list: () => informer.cache.list(),
    async stop() {
      ac.abort();
      await run;
    },
  };
}

export interface NodeSandboxesOptions {
  nodeName: string;
  stateDir: string;
  log: Logger;
  /** The agent's registry (its /metrics): the controller's reconcile and work-queue metrics. */
  metrics?: Metrics;
}

/**
 * The agent's controller Manager, registered and not started: the Sandbox controller of this
 * node. test/deploy/manifests.test.ts reads its informers (cmd/fluxctl/permissions.ts
 * nodeAgentPermissions must cover them).
 */
export function nodeSandboxManager(client: Client, runtime: Runtime, o: NodeSandboxesOptions): Manager {
  const manager = new Manager({
    client,
    log: o.log,
    ...(o.metrics ? { metrics: o.metrics } : {}),
    fieldSelectors: {
      [`${gvrOf(sandboxKind).resource}.${gvrOf(sandboxKind).group}`]: `spec.nodeName=${o.nodeName}`,
      // The node's volumes (bound by spec.nodeName: the user's pin or the scheduler's, at the first sandbox).
      [`${gvrOf(volumeKind).resource}.${gvrOf(volumeKind).group}`]: `spec.nodeName=${o.nodeName}`,
    },
  });
  const deps = { client, runtime, stateDir: o.stateDir, log: o.log, nodeName: o.nodeName };
  registerSandbox(manager, deps);
  // The agent is the node: it makes, mounts and removes the volumes bound to it (its sandboxes bind them).
  registerVolume(manager, deps);
  return manager;
}

/** Runs the Sandbox controller for the sandboxes bound to `nodeName` on `runtime`, until stop(). */
export function startNodeSandboxes(
  own: OwnSandboxes,
  runtime: Runtime,
  o: NodeSandboxesOptions,
): { stop(): Promise<void> } {
  const manager = nodeSandboxManager(own.client, runtime, o);
  const ac = new AbortController();
  const run = manager
    .start(ac.signal)
    .catch((e) => o.log.error('node sandbox controller failed', { error: String(e) }));
  return {
    async stop() {
      ac.abort();
      await run;
    },
  };
}
