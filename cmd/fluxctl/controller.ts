// `fluxctl controller`: the controllers of `fluxctl serve` as their own process, against a
// remote API server (a kubeconfig, through client-node) and the Runtime of a node agent
// (RemoteRuntime), optionally behind a leader-election Lease (the controller Deployment of
// crds/install/). Also home of the controller wiring both commands share: addControllers
// (every reconciler on a Manager, returning the subresources the API server must serve) and
// sandboxSubresourcesOnly (the subresources for an API server whose controllers run elsewhere).
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { register as registerAgentSandbox } from '../../controllers/agentsandbox/index.js';
import { register as registerAgentSession } from '../../controllers/agentsession/index.js';
import { changesetSubresources, register as registerChangeset } from '../../controllers/changeset/index.js';
import { register as registerCheckpoint } from '../../controllers/checkpoint/index.js';
import { register as registerGrant } from '../../controllers/grant/index.js';
import { register as registerQuota } from '../../controllers/quota/index.js';
import type { ControllerDeps as RegisterDeps, Register, Subresource } from '../../controllers/common/register.js';
import { register as registerSandbox } from '../../controllers/sandbox/index.js';
import { register as registerScheduler } from '../../controllers/scheduler/index.js';
import { register as registerVolume } from '../../controllers/volume/index.js';
import { SandboxStateStore } from '../../controllers/sandbox/state.js';
import { FileWatches } from '../../controllers/common/filewatch.js';
import { sandboxSubresources } from '../../controllers/sandbox/subresources.js';
import { RemoteRuntime } from '../../native/agent/client.js';
import { NodeRuntimes } from '../../controllers/common/noderuntimes.js';
import type { Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import { ClientNodeClient, clientNode } from '../../runtime/client/clientnode.js';
import { Manager, type Logger } from '../../runtime/controller/index.js';
import { createLogger, type LogLevel } from '../../runtime/log/log.js';
import { Metrics } from '../../runtime/metrics/metrics.js';
import { parseListen } from './listen.js';
import { agentTLSOf, clusterCALink, type AgentLinkTLS } from './agent-link.js';
import { registerServingSigner } from '../../controllers/node/signer.js';
import { CliError } from './util.js';
import { localRuntime, type SandboxDefaults } from './localruntime.js';
import { fenceRuntime } from './fence.js';

export type { Subresource } from '../../controllers/common/register.js';

/** The controllers' dependencies (controllers/common/register.ts) plus the changeset flags as they are spelled here. */
export interface ControllerDeps extends Omit<RegisterDeps, 'changeset'> {
  /**
   * The Sandbox controller runs in the node agents (`fluxctl node-agent --kubeconfig`, each for
   * the sandboxes bound to its node): this process leaves it out (`--route-by-node`).
   */
  sandboxesOnNodes?: boolean;
  changesetRetentionSeconds?: number;
  changesetMaxTtlSeconds?: number;
  changesetApplyDelayMs?: number;
  /** Who claims changeset applies (status.applyClaim.holder): the leader election identity. */
  identity?: string;
}

/**
 * Every kind's register (controllers/<kind>/index.ts), in order. Adding a kind is adding its
 * register here (controllers/README.md).
 */
export const REGISTRATIONS: Register[] = [
  registerSandbox,
  registerScheduler, // only with ControllerDeps.scheduling (fluxctl controller --scheduler)
  registerCheckpoint,
  registerChangeset,
  registerAgentSession,
  registerGrant,
  registerAgentSandbox,
  registerQuota,
  registerVolume,
];

/**
 * Adds every controller (Sandbox, Checkpoint, Changeset, AgentSession, and Grant where the
 * process has an egress proxy) to `manager` (before
 * it starts) and returns their subresource handlers, for the API server that serves them. The
 * runtime must be started. Used by `fluxctl serve` and `fluxctl controller`.
 */
export function addControllers(manager: Manager, d: ControllerDeps): Subresource[] {
  const deps: RegisterDeps = {
    client: d.client,
    runtime: d.runtime,
    stateDir: d.stateDir,
    log: d.log,
    ...(d.nodeName ? { nodeName: d.nodeName } : {}),
    ...(d.scheduling ? { scheduling: true, nodeGracePeriodMs: d.nodeGracePeriodMs } : {}),
    ...(d.agentSessionTokens ? { agentSessionTokens: d.agentSessionTokens } : {}),
    ...(d.agentSessionPreviews ? { agentSessionPreviews: d.agentSessionPreviews } : {}),
    ...(d.egress ? { egress: d.egress } : {}),
    ...(d.authorize ? { authorize: d.authorize } : {}),
    ...(d.provenanceSigner ? { provenanceSigner: d.provenanceSigner } : {}),
    // One file-watch registry for every kind (the host's watcher limit, one watcher per path).
    fileWatches: d.fileWatches ?? new FileWatches(d.runtime),
    changeset: {
      retentionSeconds: d.changesetRetentionSeconds,
      maxTtlSeconds: d.changesetMaxTtlSeconds,
      applyDelayMsPerFile: d.changesetApplyDelayMs,
      ...(d.identity ? { identity: d.identity } : {}),
    },
  };
  // Split mode: the node agents run the Sandbox and Volume controllers of their nodes (nodeagent-owner.ts).
  return REGISTRATIONS.filter((r) => !(d.sandboxesOnNodes && (r === registerSandbox || r === registerVolume))).flatMap(
    (register) => register(manager, deps).subresources,
  );
}

/**
 * The same subresource handlers without any controller: for an API server whose controllers
 * run in `fluxctl controller` and whose sandboxes run on a node agent. Baselines taken through
 * it live in this server's state dir; changeset diff/files read staged blobs from this
 * server's state dir (so they need the controller to share it: see README of native/agent).
 */
export function subresourcesOnly(d: Pick<ControllerDeps, 'client' | 'runtime' | 'stateDir' | 'log'>): Subresource[] {
  const state = new SandboxStateStore(path.join(d.stateDir, 'runtime', 'controller', 'sandboxes'));
  return [
    ...sandboxSubresources({ client: d.client, runtime: d.runtime, state, log: d.log }, new FileWatches(d.runtime)),
    ...changesetSubresources({ client: d.client, runtime: d.runtime, stateDir: d.stateDir }),
  ];
}

export interface NodeAgentRef extends AgentLinkTLS {
  url: string;
  /** The agent's bearer token; optional with a client certificate (mTLS). */
  tokenFile?: string;
}

/** Every Node's agent (--route-by-node): token and/or mTLS, the CA of their certificates (agent-link.ts). */
export interface NodeRoutingRef extends AgentLinkTLS {
  tokenFile?: string;
}

/**
 * The Runtime that routes each sandbox's calls to the node agent of the node it is bound to
 * (controllers/common/noderuntimes.ts), reading Nodes and Sandboxes through `client`.
 */
export function nodeRuntimes(r: NodeRoutingRef, client: Client, log: Logger, requireNode = true): NodeRuntimes {
  return new NodeRuntimes({
    client,
    requireNode,
    ...(r.tokenFile ? { token: readTokenFile(r.tokenFile) } : {}),
    tls: () => agentTLSOf(r),
    log,
  });
}

/** A RemoteRuntime for the agent (token read from its file). Throws CliError on an unreadable or empty token file. */
export function remoteRuntime(a: NodeAgentRef): RemoteRuntime {
  const t = agentTLSOf(a);
  return new RemoteRuntime({ url: a.url, ...(a.tokenFile ? { token: readTokenFile(a.tokenFile) } : {}), ...t });
}

export function readTokenFile(file: string): string {
  let token: string;
  try {
    token = fs.readFileSync(file, 'utf8').trim();
  } catch (e) {
    throw new CliError(`error: cannot read the token file ${file}: ${(e as Error).message}`);
  }
  if (!token) throw new CliError(`error: the token file ${file} is empty`);
  return token;
}

/**
 * Starts a runtime. A node agent may come up after us, so a RemoteRuntime is retried every
 * second until `deadlineMs` or the signal; resolves false (logged) when it never started.
 */
export async function startRuntime(
  rt: Runtime,
  log: Logger,
  opts: { deadlineMs?: number; signal?: AbortSignal } = {},
): Promise<boolean> {
  const deadline = Date.now() + (opts.deadlineMs ?? 0);
  for (let attempt = 0; ; attempt++) {
    try {
      await rt.start();
      return true;
    } catch (e) {
      const remote = rt instanceof RemoteRuntime || rt instanceof NodeRuntimes;
      if (!remote || Date.now() >= deadline || opts.signal?.aborted) {
        log.error('runtime unavailable; sandbox controllers not started', { error: String(e) });
        return false;
      }
      if (attempt % 10 === 0) log.error('node agent not reachable yet; retrying', { error: String(e) });
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

/** "15s", "500ms", "2m" or plain seconds -> milliseconds. Throws CliError otherwise. */
export function parseDurationMs(v: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(v.trim());
  if (!m) throw new CliError(`error: invalid duration for ${flag}: "${v}"`);
  const n = Number(m[1]);
  return m[2] === 'ms' ? n : m[2] === 'm' ? n * 60_000 : n * 1000;
}

export interface ControllerOptions {
  /** Limits of sandboxes without spec.resources, for the in-process runtime (no --node-agent). */
  sandboxDefaults?: SandboxDefaults;
  /** Kubeconfig of the API server; absent: in-cluster config, else $KUBECONFIG / ~/.kube/config. */
  kubeconfig?: string;
  /** Run the scheduler and the node controller (controllers/scheduler/; --scheduler, --node-grace-period). */
  scheduler?: boolean;
  nodeGracePeriodMs?: number;
  leaderElect?: boolean;
  leaderElectionNamespace?: string;
  leaderElectionId?: string;
  /** Default: $POD_NAME, else <hostname>-<pid>. */
  identity?: string;
  leaseDurationMs?: number;
  renewDeadlineMs?: number;
  retryPeriodMs?: number;
  /** The node agent; absent: the node runtime (procbox, vm) in this process (single host). */
  nodeAgent?: NodeAgentRef;
  /** Instead of one node agent: each sandbox's calls go to the agent of its node (Node status.addresses). */
  routeByNode?: NodeRoutingRef;
  /** --node-ca-secret NS/NAME: the agent link's cluster CA (made when absent); the signer runs here. */
  nodeCaSecret?: string;
  stateDir: string;
  /** Serves /healthz, /readyz (ready once the informers synced) and /metrics on this address. */
  healthListen?: string;
  nodeName?: string;
  quiet?: boolean;
  /** --log-level (default info). */
  logLevel?: LogLevel;
  changesetRetentionSeconds?: number;
  changesetMaxTtlSeconds?: number;
  /** Test-only pause after each file an apply writes (FLUXVM_TEST_CHANGESET_APPLY_DELAY_MS, as serve). */
  changesetApplyDelayMs?: number;
}

function loadClient(file: string | undefined, identity: string): ClientNodeClient {
  const kc = new (clientNode().KubeConfig)();
  try {
    if (file) kc.loadFromFile(file);
    else kc.loadFromDefault();
  } catch (e) {
    throw new CliError(`error: cannot load the kubeconfig ${file ?? '(default)'}: ${(e as Error).message}`);
  }
  if (!kc.getCurrentCluster()) throw new CliError(`error: no cluster in the kubeconfig ${file ?? '(default)'}`);
  // The identity in the user agent: the API server's audit log then tells the candidates apart.
  return new ClientNodeClient(kc, { userAgent: `fluxvm-controller/${identity}` });
}

/** Runs the controllers until SIGTERM/SIGINT; resolves 0 after a graceful stop (the Lease released). */
export async function runController(o: ControllerOptions, signal?: AbortSignal): Promise<number> {
  const log: Logger = createLogger({ level: o.quiet ? 'silent' : (o.logLevel ?? 'info') });
  const identity = o.identity || process.env.POD_NAME || `${os.hostname()}-${process.pid}`;
  const client = loadClient(o.kubeconfig, identity);
  const ac = new AbortController();
  const onSignal = (sig: string) => {
    log.info('received a signal, shutting down', { signal: sig });
    ac.abort();
  };
  process.once('SIGTERM', () => onSignal('SIGTERM'));
  process.once('SIGINT', () => onSignal('SIGINT'));
  signal?.addEventListener('abort', () => ac.abort(), { once: true });

  fs.mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
  const metrics = new Metrics({ defaults: true });
  // The cluster CA of the agent link (agent-link.ts): verify agents with it, present our own client certificate.
  const cluster = o.nodeCaSecret ? await clusterCALink(client, o.nodeCaSecret, identity, log) : undefined;
  const runtime: Runtime = o.routeByNode
    ? // With the signer here, no agent is verifiable before it runs: start without waiting for one.
      nodeRuntimes({ ...o.routeByNode, ...cluster?.link }, client, log, !cluster)
    : o.nodeAgent
      ? remoteRuntime(o.nodeAgent)
      : localRuntime(o.stateDir, log, { sandboxDefaults: o.sandboxDefaults, metrics });
  const manager = new Manager({
    client,
    log,
    metrics,
    // Lost the Lease: exit at once, as client-go users do (klog.Fatalf in OnStoppedLeading).
    // Another controller may already lead; nothing of this process may act after this line.
    // The Deployment restarts the pod, which campaigns again.
    onLostLeadership: () => {
      log.error('lost the leader election Lease; exiting', { identity });
      process.exit(LOST_LEADERSHIP_EXIT_CODE);
    },
    leaderElection: o.leaderElect
      ? {
          namespace: o.leaderElectionNamespace ?? 'fluxvm-system',
          name: o.leaderElectionId ?? 'fluxvm-controller',
          identity,
          ...(o.leaseDurationMs ? { leaseDurationMs: o.leaseDurationMs } : {}),
          ...(o.renewDeadlineMs ? { renewDeadlineMs: o.renewDeadlineMs } : {}),
          ...(o.retryPeriodMs ? { retryPeriodMs: o.retryPeriodMs } : {}),
        }
      : undefined,
  });

  let health: http.Server | undefined;
  if (o.healthListen) {
    const { host, port } = parseListen(o.healthListen);
    health = http.createServer((req, res) => {
      const p = (req.url ?? '/').split('?')[0];
      if (p === '/metrics') {
        // controller-runtime's metrics endpoint; on the health address (loopback or the pod network).
        void metrics.render().then((text) => res.writeHead(200, { 'content-type': metrics.contentType }).end(text));
        return;
      }
      const ok = p === '/healthz' || p === '/livez' || (p === '/readyz' && manager.hasSynced());
      res.writeHead(p === '/healthz' || p === '/livez' || p === '/readyz' ? (ok ? 200 : 503) : 404, {
        'content-type': 'text/plain',
      });
      res.end(ok ? 'ok' : 'not ready');
    });
    await new Promise<void>((resolve, reject) => health!.once('error', reject).listen(port, host, () => resolve()));
  }

  const up = await startRuntime(runtime, log, { deadlineMs: 24 * 3600_000, signal: ac.signal });
  let failed = false;
  if (up) {
    const nodeName = o.nodeName ?? ((runtime instanceof RemoteRuntime && runtime.nodeName()) || undefined);
    addControllers(manager, {
      // API writes are fenced by the manager's client; the Runtime's calls here.
      client: manager.client,
      ...(o.scheduler ? { scheduling: true, nodeGracePeriodMs: o.nodeGracePeriodMs } : {}),
      runtime: o.leaderElect
        ? fenceRuntime(runtime, {
            leading: () => manager.leading(),
            onRefused: (what) => log.error('runtime call refused: this process no longer leads', { call: what }),
          })
        : runtime,
      stateDir: o.stateDir,
      log,
      nodeName,
      sandboxesOnNodes: !!o.routeByNode,
      changesetRetentionSeconds: o.changesetRetentionSeconds,
      changesetMaxTtlSeconds: o.changesetMaxTtlSeconds,
      changesetApplyDelayMs: o.changesetApplyDelayMs,
      identity,
    });
    // The signer of the agents' serving certificates (controllers/node/signer.ts).
    if (cluster) registerServingSigner(manager, cluster.ca);
    process.stdout.write(
      `fluxvm controller ${identity} against ${client.kc.getCurrentCluster()?.server}` +
        `${o.routeByNode ? ', node agents by Node' : o.nodeAgent ? `, node agent ${o.nodeAgent.url}` : ', local runtime'}` +
        `${o.leaderElect ? `, leader election on ${o.leaderElectionNamespace ?? 'fluxvm-system'}/${o.leaderElectionId ?? 'fluxvm-controller'}` : ''}\n`,
    );
    failed = await manager.start(ac.signal).then(
      () => false,
      (e) => {
        log.error('manager failed', { error: String(e) });
        return true;
      },
    );
  }
  await runtime.close().catch((e) => log.error('runtime close failed', { error: String(e) }));
  if (health) await new Promise((r) => health!.close(r));
  return !failed && (up || ac.signal.aborted) ? 0 : 1;
}

/** Exit status of `fluxctl controller --leader-elect` when it loses its Lease. */
export const LOST_LEADERSHIP_EXIT_CODE = 3;
