// `fluxctl serve`: the composition root of embedded mode. Opens the store in --state-dir,
// builds the registry (with schema/CEL admission) and the HTTP API server, starts the
// controller manager on an in-process client, writes <state-dir>/kubeconfig, and shuts
// everything down in order on SIGTERM/SIGINT: stop accepting and end watches, stop the
// controllers, close the store.
// The other deployments are options of the same code path: --no-controllers (the controllers
// run in `fluxctl controller`), --node-agent (sandboxes on a node agent, reached through a
// RemoteRuntime by the controllers and the exec/files subresources), --aggregated (HTTPS with
// request-header authentication and delegated authorization, cmd/fluxctl/aggregated.ts).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { allKinds } from '../../apis/registry.js';
import { reviewKinds } from '../../apis/rbac.js';
import { admit } from '../../runtime/apiserver/admission/index.js';
import { createApiServer } from '../../runtime/apiserver/http/server.js';
import { Registry } from '../../runtime/apiserver/registry.js';
import { quotaAdmission } from './quota.js';
import { claimBindAtCreate } from '../../controllers/agentsandbox/bind.js';
import { CreateIdempotency } from '../../runtime/apiserver/idempotency.js';
import { localKubeconfig } from '../../runtime/client/clientnode.js';
import { InProcessClient } from '../../runtime/client/inprocess.js';
import {
  eventTTLController,
  GarbageCollector,
  gcResources,
  Manager,
  namespaceController,
  type Logger,
} from '../../runtime/controller/index.js';
import { DEFAULT_LOG_BYTES, DEFAULT_RESERVE_BYTES, Store } from '../../runtime/store/store.js';
import { addTestController } from './testcontroller.js';
import { localRuntime, type SandboxDefaults } from './localruntime.js';
import { collectOrphans } from '../../native/orphans.js';
import type { Runtime } from '../../native/runtime.js';
import type { AgentSession, Changeset, Sandbox } from '../../apis/zz_generated.types.js';
import { RemoteRuntime } from '../../native/agent/client.js';
import { nodeHeartbeatRunnable } from '../../controllers/node/heartbeat.js';
import { CliError } from './util.js';
import { isLoopback, parseListen } from './listen.js';
import {
  addControllers,
  nodeRuntimes,
  remoteRuntime,
  startRuntime,
  subresourcesOnly,
  type NodeAgentRef,
  type NodeRoutingRef,
} from './controller.js';
import { aggregatedAuth, type AggregatedOptions } from './aggregated.js';
import { embeddedAuth, type EmbeddedAuth } from '../../runtime/apiserver/auth/embedded.js';
import { SessionTokens, sessionTokenRules, sessionTokenScope } from '../../controllers/agentsession/tokens.js';
import { PREVIEW_PREFIX, PreviewStore } from '../../controllers/agentsession/previews.js';
import { PreviewProxy } from '../../controllers/agentsession/preview-proxy.js';
import { registerMcpRoutes } from './mcp/http.js';
import { agentSessionsGVR } from '../../controllers/agentsession/gvr.js';
import type { WriteGuard } from '../../runtime/apiserver/registry.js';
import { kubeconfigFor, tokenOf, writeKubeconfig } from './kubeconfig.js';
import { registerConsole } from './console-serve.js';
import { startEgress, type EgressOptions, type StartedEgress } from './egress.js';
import { egressEvents } from '../../controllers/sandbox/egress.js';
import { EventRecorder } from '../../runtime/controller/events.js';
import { createLogger, type LogLevel } from '../../runtime/log/log.js';
import { countBy, Metrics } from '../../runtime/metrics/metrics.js';
import { sandboxesGVR } from '../../controllers/common/kinds.js';
import { changesetsGVR } from '../../controllers/changeset/helpers.js';
import { PROVENANCE_KEY_PATH, ProvenanceSigner, provenanceKeyRoute } from '../../controllers/common/provenance.js';

export interface ServeOptions {
  stateDir: string;
  listen: string;
  /** Enables the test-only controller (e2e tests of wait, finalizers and events). */
  testController?: boolean;
  /** Hold the controllers behind a Lease (off by default in embedded mode: one process). */
  leaderElect?: boolean;
  quiet?: boolean;
  /** --log-level (default info; --quiet is silent). */
  logLevel?: LogLevel;
  /** The process's logger; default one built from logLevel/quiet (JSON lines on stderr, pretty on a terminal). */
  log?: Logger;
  /** Changesets: retention of finished ones (default 86400 s) and a cap on every TTL (tests shorten both). */
  changesetRetentionSeconds?: number;
  changesetMaxTtlSeconds?: number;
  /** Test-only failpoint: pause after each file an apply writes (SIGKILL-mid-apply tests). */
  changesetApplyDelayMs?: number;
  /**
   * Run the controllers in this process (default true). False: the API only, with the
   * controllers in `fluxctl controller` (split and aggregated deployments).
   */
  controllers?: boolean;
  /**
   * Sandboxes run on this node agent instead of an in-process procbox: the controllers (when
   * on) and the exec/files/... subresources reach it through a RemoteRuntime, as kube-apiserver
   * reaches kubelet for pods/exec.
   */
  nodeAgent?: NodeAgentRef;
  /** Each sandbox's subresources through the agent of its node (Node AgentURL) instead of one nodeAgent. */
  routeByNode?: NodeRoutingRef;
  /** Aggregated API server: HTTPS with delegated authentication and authorization. */
  aggregated?: AggregatedOptions;
  /**
   * Serve plain HTTP without authentication (loopback only; the default is HTTPS with the
   * state CA, bearer tokens, client certificates and RBAC).
   */
  insecureHttp?: boolean;
  /** kube's --token-auth-file: token,user,uid,"group1,group2" per line. */
  tokenAuthFile?: string;
  /** Events are deleted this long after their last write (--event-ttl, default 1 h as kube). */
  eventTtlMs?: number;
  /**
   * Limits of sandboxes without spec.resources (--default-memory, --default-pids, --default-cpu-weight, --default-disk,
   * --no-disk-quota).
   */
  sandboxDefaults?: SandboxDefaults;
  /** Size budget of the watch event log in bytes (--watch-log-budget, default 64 MiB). */
  watchLogBytes?: number;
  /** Disk reserve that pays for deletes on a full disk (--disk-reserve, default 8 MiB; 0: none). */
  diskReserveBytes?: number;
  /**
   * How long SIGTERM waits for in-flight reconciles (a running speculation) before closing
   * anyway (--shutdown-timeout, default 30 s); what is cut off is the restart path's to mark.
   */
  shutdownTimeoutMs?: number;
  /**
   * Request limits (runtime/apiserver/README.md): body and stored object size in bytes
   * (--max-request-body-bytes, --max-object-bytes, 3 MiB each) and how long a request may
   * take to arrive or a connection idle, in ms (--request-header-timeout 32 s,
   * --request-read-timeout 60 s, --idle-timeout 90 s).
   */
  /** Merge the context into this kubeconfig file (fluxctl serve --write-kubeconfig, default ~/.kube/config). */
  writeKubeconfig?: string;
  /** The host egress proxy for allowList sandboxes (--egress-*); false: none (allowList is Unsupported). */
  egress?: EgressOptions | false;
  limits?: {
    maxRequestBodyBytes?: number;
    maxObjectBytes?: number;
    headersTimeoutMs?: number;
    requestTimeoutMs?: number;
    keepAliveTimeoutMs?: number;
  };
}

export interface Served {
  url: string;
  kubeconfig: string;
  /** Stops everything (idempotent); resolves when the store is closed. */
  stop(): Promise<void>;
  /** Resolves when the server has stopped (after stop()). */
  stopped: Promise<void>;
}

// Kept importable from here (tests, older callers); they live in listen.ts so that
// controller.ts and nodeagent.ts need not import serve.ts (which imports controller.ts).
export { isLoopback, parseListen } from './listen.js';

export async function serve(o: ServeOptions): Promise<Served> {
  const { host, port } = parseListen(o.listen);
  const log: Logger = o.log ?? createLogger({ level: o.quiet ? 'silent' : (o.logLevel ?? 'info') });
  // One registry for the process: the API server's /metrics shows the controllers' too.
  const metrics = new Metrics({ defaults: true });
  if (o.insecureHttp && !isLoopback(host)) {
    throw new CliError(
      `error: --insecure-http serves without TLS or authentication and is allowed on a loopback address only, not ${host}: drop --insecure-http (HTTPS is the default)`,
    );
  }
  if (o.insecureHttp && o.tokenAuthFile)
    throw new CliError('error: --token-auth-file needs HTTPS: drop --insecure-http');
  fs.mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
  const kubeconfig = path.resolve(o.stateDir, 'kubeconfig');
  let embedded: EmbeddedAuth | undefined;
  // AgentSession tokens: the authenticator knows them from here on; the controller attaches its
  // sessions and serves agentsessions/token over the same instance.
  const sessionTokens = new SessionTokens(path.join(o.stateDir, 'agentsessions'));
  // Preview URLs: /preview/<token>/ is served outside the API from the start (every token is
  // the one 404 until the runtime and the AgentSession controller are attached).
  const previews = new PreviewStore(path.join(o.stateDir, 'agentsessions'));
  const previewProxy = new PreviewProxy({ store: previews, log });
  if (!o.aggregated && !o.insecureHttp) {
    try {
      embedded = await embeddedAuth({
        stateDir: o.stateDir,
        host,
        tokenAuthFile: o.tokenAuthFile,
        knownAdminToken: tokenOf(kubeconfig),
        extraTokens: [sessionTokens.authenticate],
        scopes: [sessionTokenScope],
        scopeRules: [sessionTokenRules],
      });
    } catch (e) {
      throw new CliError(`error: ${(e as Error).message}`);
    }
  }
  // The node's runtime comes up in the background from here (the egress proxy; procbox's volume
  // store mkfs/mount/quota, helper probe and warm pool; QEMU's checks: mostly other processes)
  // while the store, the registry and the API are set up; it is awaited below, before the
  // controllers and subresources that use it are added, so no sandbox is created before it is
  // up. Off with --test-controller (that one acts on Sandboxes itself); with controllers off,
  // a node agent still serves the subresources; without one there is nothing to serve them with.
  const runController = o.controllers !== false;
  const node = bringUpNode(o, runController, log, metrics);
  // a rejection (bad --egress-* flags) is thrown where it is awaited, not reported as unhandled first
  node.catch(() => undefined);
  /** Ends what bringUpNode started, when serve() fails before it returns. */
  const abortNode = async () => {
    const n = await node.catch(() => undefined);
    await n?.runtime?.close().catch(() => undefined);
    await n?.egress?.stop().catch(() => undefined);
  };
  // The access reviews are answered by the embedded authorizer; without it (--insecure-http,
  // --aggregated, where kube-apiserver serves them) they are not served at all, never stored.
  const kinds = embedded ? allKinds : allKinds.filter((k) => !reviewKinds.includes(k));
  const store = new Store({
    dir: o.stateDir,
    reserveBytes: o.diskReserveBytes ?? DEFAULT_RESERVE_BYTES,
    compaction: { maxBytes: o.watchLogBytes ?? DEFAULT_LOG_BYTES },
  });
  if (store.diskFull)
    log.error('the disk of the state directory is full: serving reads and deletes only until space is freed', {
      stateDir: o.stateDir,
    });
  const guard: WriteGuard | undefined = embedded?.guard;
  // Creates with an Idempotency-Key: one record per user and key, 24 h, beside the store.
  const idempotency = new CreateIdempotency(path.join(o.stateDir, 'idempotency.db'));
  const registry = new Registry({
    store,
    idempotency,
    quota: quotaAdmission(store, kinds, o.sandboxDefaults?.defaultLimits),
    coWriters: [claimBindAtCreate()], // a SandboxClaim bound to a warm Sandbox in its create (agentsandbox/bind.ts)
    kinds,
    ...(guard ? { guard } : {}),
    ...(o.limits?.maxObjectBytes ? { maxObjectBytes: o.limits.maxObjectBytes } : {}),
    admit: (def, obj, old, opts) =>
      admit(def, obj, old, { fieldValidation: opts.fieldValidation ?? 'Strict', subresource: opts.subresource }),
  });
  let auth: Awaited<ReturnType<typeof aggregatedAuth>> | undefined;
  try {
    auth = o.aggregated ? await aggregatedAuth(o.aggregated, log) : undefined;
  } catch (e) {
    store.close();
    await abortNode();
    throw e;
  }
  try {
    await embedded?.start(registry, kinds);
  } catch (e) {
    embedded?.close();
    store.close();
    await abortNode();
    throw e;
  }
  let draining = false;
  const server = createApiServer({
    registry,
    kinds,
    log,
    metrics,
    ready: () => !draining,
    ...(o.limits?.maxRequestBodyBytes ? { bodyLimit: o.limits.maxRequestBodyBytes } : {}),
    headersTimeoutMs: o.limits?.headersTimeoutMs,
    requestTimeoutMs: o.limits?.requestTimeoutMs,
    keepAliveTimeoutMs: o.limits?.keepAliveTimeoutMs,
    ...(auth ?? {}),
    ...(embedded
      ? {
          https: embedded.https,
          authenticate: embedded.authenticate,
          authorize: embedded.authorize,
          virtual: embedded.virtual,
          audit: embedded.audit,
        }
      : {}),
  });
  // Provenance: one signer for the changeset controller and the public key at /.well-known/fluxvm/.
  const provenanceSigner = new ProvenanceSigner(o.stateDir);
  server.registerRawRoute(PROVENANCE_KEY_PATH, provenanceKeyRoute(provenanceSigner));
  server.registerRawRoute(PREVIEW_PREFIX, {
    request: (req, res) => previewProxy.request(req, res),
    upgrade: (req, socket, head) => previewProxy.upgrade(req, socket, head),
  });
  registerMcpRoutes(server, { authenticate: embedded?.authenticate ?? auth?.authenticate, log }); // /mcp, /llms.txt
  let addr: { host: string; port: number; url: string };
  try {
    addr = await server.listen(host, port);
  } catch (e) {
    embedded?.close();
    store.close();
    await abortNode();
    const code = (e as NodeJS.ErrnoException).code;
    throw new CliError(
      `error: cannot listen on ${o.listen}: ${code === 'EADDRINUSE' ? 'address already in use' : (e as Error).message}`,
    );
  }
  // An unspecified listen address is reached (and certified) as 127.0.0.1.
  const reach = addr.host === '0.0.0.0' || addr.host === '::' ? '127.0.0.1' : addr.host;
  const url = `${o.aggregated || embedded ? 'https' : 'http'}://${reach.includes(':') ? `[${reach}]` : reach}:${addr.port}`;
  if (embedded) {
    writeKubeconfig(
      kubeconfig,
      kubeconfigFor(url, { caPem: embedded.ca.certPem, token: embedded.adminToken }, { user: 'fluxvm-admin' }),
    );
  } else {
    const tmp = `${kubeconfig}.tmp`;
    fs.writeFileSync(tmp, yaml.dump(localKubeconfig(url)), { mode: 0o600 });
    fs.renameSync(tmp, kubeconfig);
  }

  registerConsole(server, { apiUrl: url, caPem: embedded?.ca.certPem, log }); // the review console at /console/
  const client = new InProcessClient(registry, { userAgent: 'fluxvm-controller' });
  // Until the AgentSession controller attaches its informer (after the runtime started), a
  // session token's session is read from the store.
  sessionTokens.attach((ns, name) => client.get<AgentSession>(agentSessionsGVR, ns, name).catch(() => undefined));
  const manager = new Manager({
    client,
    log,
    metrics,
    leaderElection: o.leaderElect
      ? { namespace: 'default', name: 'fluxvm-controller', identity: `${os.hostname()}-${process.pid}` }
      : undefined,
  });
  // The API's own controllers (kube-controller-manager's garbage collector and namespace
  // controller, kube-apiserver's event TTL) run whatever else this process runs.
  const resources = gcResources(registry.kinds());
  manager.add(new GarbageCollector({ manager, client, resources, log }));
  manager.add(namespaceController({ manager, client, resources, log }));
  manager.add(eventTTLController({ manager, client, ttlMs: o.eventTtlMs, log }));
  if (o.testController) addTestController(manager);
  // The node's runtime (procbox, or a remote node agent with --node-agent, started above) and the
  // Sandbox/Checkpoint/Changeset controllers and subresources; none on hosts where procbox
  // cannot start (the API still serves; sandboxes then stay Pending).
  let runtime: Runtime | undefined;
  let egress: StartedEgress | undefined;
  let runtimeUp: boolean;
  try {
    ({ runtime, egress, up: runtimeUp } = await node);
    // --route-by-node: the agents of the Nodes in this API, reached through its own client.
    if (o.routeByNode) runtimeUp = await startRuntime((runtime = nodeRuntimes(o.routeByNode, client, log, false)), log);
  } catch (e) {
    await server.close().catch(() => undefined);
    embedded?.close();
    store.close();
    throw e;
  }
  if (egress)
    manager.add(
      egressEvents({
        client,
        aggregator: egress.aggregator,
        recorder: new EventRecorder({ client, component: 'fluxvm-egress', log }),
      }),
    );
  if (runtime && runtimeUp) {
    const subs = runController
      ? addControllers(manager, {
          client,
          runtime,
          stateDir: o.stateDir,
          log,
          agentSessionTokens: sessionTokens,
          agentSessionPreviews: previews,
          provenanceSigner,
          authorize: embedded?.authorize ?? auth?.authorize,
          nodeName: (runtime instanceof RemoteRuntime && runtime.nodeName()) || undefined,
          changesetRetentionSeconds: o.changesetRetentionSeconds,
          changesetMaxTtlSeconds: o.changesetMaxTtlSeconds,
          changesetApplyDelayMs: o.changesetApplyDelayMs,
          // Grants are bound in this node's egress proxy (the value stays in its memory).
          ...(egress ? { egress: egress.proxy } : {}),
        })
      : subresourcesOnly({ client, runtime, stateDir: o.stateDir, log });
    for (const s of subs) server.registerSubresource(s.plural, s.name, s.handler);
    if (runController) previewProxy.attachRuntime(runtime);
    if (runController) {
      // The controllers' informers (the same instances): counted at scrape time.
      const sandboxes = manager.informer<Sandbox>(sandboxesGVR);
      const changesets = manager.informer<Changeset>(changesetsGVR);
      metrics.countFrom('fluxvm_sandboxes', () => countBy(sandboxes.cache.list(), (s) => s.status?.phase ?? 'Pending'));
      metrics.countFrom('fluxvm_changesets', () =>
        countBy(changesets.cache.list(), (c) => c.status?.phase ?? 'Pending'),
      );
    }
  }
  // Embedded: this process runs its node's sandboxes, so it registers the node and heartbeats.
  if (runtime && runtimeUp && runController && !(runtime instanceof RemoteRuntime))
    manager.add(nodeHeartbeatRunnable({ client, runtime, log }));
  const ac = new AbortController();
  const managerDone = manager.start(ac.signal).catch((e) => log.error('manager failed', { error: String(e) }));

  let stopping: Promise<void> | undefined;
  let resolveStopped!: () => void;
  const stopped = new Promise<void>((r) => (resolveStopped = r));
  // Shutdown: the controllers stop first while the API keeps answering, for at most
  // --shutdown-timeout; a reconcile still running then (a speculation) is cut off, and the
  // restart path marks it interrupted. Then the API closes, the runtime and the store.
  const shutdownMs = o.shutdownTimeoutMs ?? 30_000;
  const within = <T>(p: Promise<T>, ms: number) =>
    new Promise<boolean>((resolve) => {
      const t = setTimeout(() => resolve(false), Math.max(0, ms));
      void p.finally(() => {
        clearTimeout(t);
        resolve(true);
      });
    });
  const stop = () =>
    (stopping ??= (async () => {
      const deadline = Date.now() + shutdownMs;
      draining = true; // /readyz answers 503 from now on
      ac.abort();
      if (!(await within(managerDone, shutdownMs)))
        log.error('shutdown timeout: in-flight reconciles are left to the restart path', {
          shutdownTimeoutMs: shutdownMs,
        });
      previewProxy.close(); // open preview WebSockets and kept-alive upstream connections
      await server.close().catch((e) => log.error('server close failed', { error: String(e) }));
      const closing = runtime?.close().catch((e) => log.error('runtime close failed', { error: String(e) }));
      if (closing && !(await within(closing, deadline - Date.now())))
        log.error('shutdown timeout: the runtime did not close in time');
      await egress?.stop().catch((e) => log.error('egress proxy stop failed', { error: String(e) }));
      embedded?.close();
      store.close();
      idempotency.close();
      resolveStopped();
    })());
  return { url, kubeconfig, stop, stopped };
}

/**
 * The egress proxy (root, unless --no-egress) and the node's runtime for serve, started: a
 * RemoteRuntime with --node-agent, else procbox (and vm where QEMU is installed) unless the
 * controllers are off or the test controller runs. `up` is false where the runtime cannot start.
 * Rejects only when the egress proxy cannot start (bad --egress-* flags, ports in use).
 */
async function bringUpNode(
  o: ServeOptions,
  runController: boolean,
  log: Logger,
  metrics: Metrics,
): Promise<{ runtime?: Runtime; egress?: StartedEgress; up: boolean }> {
  let runtime: Runtime | undefined;
  let egress: StartedEgress | undefined;
  if (o.nodeAgent) runtime = remoteRuntime(o.nodeAgent);
  else if (!o.testController && runController && !o.routeByNode) {
    // What servers whose state directory is gone left on this host (native/orphans.ts).
    await collectOrphans((m, f) => log.info(m, f));
    if (o.egress !== false && process.getuid?.() === 0) egress = await startEgress(o.stateDir, o.egress ?? {}, log);
    // procbox, and vm where QEMU is installed
    runtime = localRuntime(o.stateDir, log, { sandboxDefaults: o.sandboxDefaults, egress: egress?.hook, metrics });
  }
  return { runtime, egress, up: runtime ? await startRuntime(runtime, log, { deadlineMs: 30_000 }) : false };
}

/**
 * The server's last line of defence: an exception nothing caught (a bug reached through one
 * sandbox's input, say) is logged and the process keeps serving every other sandbox, instead
 * of Node's default of exiting. Per-sandbox failures are handled where they happen (a VM
 * guest breaking the agent protocol fails that Sandbox, native/vm/agent-client.ts); this only
 * keeps one missed case from taking the control plane down. Returns the uninstaller.
 */
export function installProcessGuard(log: Logger): () => void {
  const onException = (e: unknown) =>
    log.error('uncaught exception; the server keeps serving', {
      error: e instanceof Error ? (e.stack ?? e.message) : String(e),
    });
  const onRejection = (e: unknown) =>
    log.error('unhandled promise rejection; the server keeps serving', {
      error: e instanceof Error ? (e.stack ?? e.message) : String(e),
    });
  // Node's warnings (MaxListenersExceeded, deprecations) become log lines too: Node's own
  // listener prints them as plain text, which would break the JSON lines on stderr.
  const onWarning = (w: Error) => log.warn?.('process warning', { name: w.name, warning: w.message, stack: w.stack });
  const nodeWarningListeners = process.listeners('warning');
  process.removeAllListeners('warning');
  process.on('uncaughtException', onException);
  process.on('unhandledRejection', onRejection);
  process.on('warning', onWarning);
  return () => {
    process.off('uncaughtException', onException);
    process.off('unhandledRejection', onRejection);
    process.off('warning', onWarning);
    for (const l of nodeWarningListeners) process.on('warning', l);
  };
}

/** The CLI entry: serves until SIGTERM/SIGINT, then shuts down gracefully and exits 0. */
export async function runServe(o: ServeOptions): Promise<number> {
  const log = o.log ?? createLogger({ level: o.quiet ? 'silent' : (o.logLevel ?? 'info') });
  installProcessGuard(log);
  const s = await serve({ ...o, log });
  let merged = '';
  if (o.writeKubeconfig && !o.aggregated) {
    // --write-kubeconfig: this server's context merged into ~/.kube/config (or the file named).
    const { mergeIntoKubeconfig } = await import('./kubeconfig.js');
    try {
      const { context } = mergeIntoKubeconfig(o.writeKubeconfig, s.kubeconfig);
      merged = `context "${context}" merged into ${o.writeKubeconfig} and made current: kubectl and fluxctl use it with no flag`;
    } catch (e) {
      await s.stop();
      throw new CliError(`error: --write-kubeconfig: ${(e as Error).message}`);
    }
  }
  const rel = path.relative(process.cwd(), s.kubeconfig);
  const shown = rel && !rel.startsWith('..') ? `./${rel}` : s.kubeconfig;
  if (o.aggregated) {
    // The local kubeconfig would be anonymous here: clients come through kube-apiserver.
    process.stdout.write(
      [
        `fluxvm API server listening on ${s.url} (aggregated)`,
        `state directory: ${o.stateDir}`,
        'Requests are authenticated by front-proxy certificate (X-Remote-User/-Group) or delegated to kube-apiserver;',
        'register it with crds/install/aggregated/apiservice.yaml and use kubectl against the cluster.',
        '',
      ].join('\n'),
    );
  } else
    process.stdout.write(
      [
        `fluxvm API server listening on ${s.url}${o.insecureHttp ? ' (plain HTTP, no authentication: loopback only)' : ''}`,
        `state directory: ${o.stateDir}`,
        ...(o.insecureHttp
          ? []
          : [
              `kubeconfig: ${s.kubeconfig} (0600: the server's CA and the admin token, group system:masters; keep it private)`,
              `audit log: ${path.join(o.stateDir, 'audit.log')}`,
            ]),
        ...(merged ? [merged] : []),
        '',
        'Point kubectl and fluxctl at it:',
        `  export KUBECONFIG=${s.kubeconfig}`,
        '  kubectl get sandboxes',
        `  fluxctl get sandboxes          # fluxctl also finds ${shown} on its own`,
        ...(o.insecureHttp
          ? []
          : [
              '  fluxctl admin create-user NAME --group G -n NAMESPACE   # a kubeconfig for another user (client certificate)',
            ]),
        '',
      ].join('\n'),
    );
  const onSignal = (sig: string) => {
    log.info('received a signal, shutting down', { signal: sig });
    void s.stop();
  };
  process.once('SIGTERM', () => onSignal('SIGTERM'));
  process.once('SIGINT', () => onSignal('SIGINT'));
  await s.stopped;
  return 0;
}
