// `fluxctl node-agent`: the node agent of one node (the DaemonSet of crds/install/): the node
// runtime (procbox, plus vm where QEMU is installed) on --state-dir served over HTTP(S) by native/agent to remote
// controllers and API
// servers, authenticated with the bearer token in --token-file. Runs until SIGTERM/SIGINT,
// then stops serving and closes the runtime (sandboxes keep running and are adopted at the
// next start).
import { collectOrphans } from '../../native/orphans.js';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createAgentServer } from '../../native/agent/server.js';
import type { Logger } from '../../runtime/controller/index.js';
import { createLogger, type LogLevel } from '../../runtime/log/log.js';
import { readTokenFile } from './controller.js';
import { startNodeHeartbeat } from '../../controllers/node/heartbeat.js';
import { localRuntime, type SandboxDefaults } from './localruntime.js';
import { parseListen } from './listen.js';
import { CliError } from './util.js';
import { agentKubeConfig, startNodeSandboxes, watchOwnSandboxes } from './nodeagent-owner.js';
import { startEgress, type EgressOptions, type StartedEgress } from './egress.js';
import { Metrics } from '../../runtime/metrics/metrics.js';
import path from 'node:path';
import { bootstrapServingCert, certificateHost, placeholderCert, storedServingCert } from './nodeagent-tls.js';

export interface NodeAgentOptions {
  /** Limits of sandboxes without spec.resources (--default-*, --no-disk-quota). */
  sandboxDefaults?: SandboxDefaults;
  nodeName: string;
  listen: string;
  /** The callers' bearer token; optional with clientCAFile (mTLS alone). */
  tokenFile?: string;
  stateDir: string;
  tlsCert?: string;
  tlsKey?: string;
  /** --tls-bootstrap: the serving certificate from the signer through the Node (nodeagent-tls.ts). */
  tlsBootstrap?: boolean;
  /** --cert-dir: the bootstrapped key and certificate (default <state-dir>/pki). */
  certDir?: string;
  /** --client-ca-file: the cluster CA; callers must present a client certificate it signed (mTLS). */
  clientCAFile?: string;
  /** Leave the vm backend out even when QEMU is installed. */
  noVm?: boolean;
  quiet?: boolean;
  /** --log-level (default info). */
  logLevel?: LogLevel;
  /**
   * The API server (--kubeconfig): the agent then watches the Sandboxes bound to its node
   * (field selector spec.nodeName=<node>), runs their Sandbox controller itself (status.nodeName
   * this node), and refuses to create any other (409).
   */
  kubeconfig?: string;
  /** Prefix of the service account directory for the in-cluster config (tests); default ''. */
  inClusterRoot?: string;
  /** The host (or IP) the registered Node's AgentURL names (--advertise-address; a pod's status.podIP). */
  advertiseAddress?: string;
  /** Serves /metrics (the process's Prometheus registry) and /healthz here, without the token (--metrics-listen). */
  metricsListen?: string;
  /** The host egress proxy of allowList sandboxes (--egress-*); false: none (allowList is Unsupported). */
  egress?: EgressOptions | false;
}

/** The URL the Node's AgentURL names: the listen URL with `advertise` as its host (IPv6 bracketed). */
export function advertisedURL(listened: string, advertise?: string): string {
  if (!advertise) return listened;
  const u = new URL(listened);
  u.hostname = advertise.includes(':') && !advertise.startsWith('[') ? `[${advertise}]` : advertise;
  return u.toString().replace(/\/$/, '');
}

/** Serves /metrics and /healthz on `listen`; resolves with the server and its URL. */
async function serveMetrics(listen: string, metrics: Metrics): Promise<{ server: http.Server; url: string }> {
  const { host, port } = parseListen(listen);
  const server = http.createServer((req, res) => {
    const p = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && p === '/metrics')
      return void metrics
        .render()
        .then((text) => res.writeHead(200, { 'content-type': metrics.contentType }).end(text))
        .catch((e: unknown) => res.writeHead(500).end(String(e)));
    if (req.method === 'GET' && p === '/healthz') return void res.writeHead(200).end('ok');
    res.writeHead(404).end();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const a = server.address() as AddressInfo;
  const h = a.family === 'IPv6' ? `[${a.address}]` : a.address;
  return { server, url: `http://${h}:${a.port}` };
}

export async function runNodeAgent(o: NodeAgentOptions): Promise<number> {
  const log: Logger = createLogger({ level: o.quiet ? 'silent' : (o.logLevel ?? 'info') });
  if (!o.nodeName) throw new CliError('error: --node-name is required');
  if (!!o.tlsCert !== !!o.tlsKey) throw new CliError('error: --tls-cert and --tls-key go together');
  if (o.tlsBootstrap && o.tlsCert) throw new CliError('error: --tls-bootstrap and --tls-cert exclude each other');
  if (!o.tokenFile && !o.clientCAFile)
    throw new CliError(
      'error: --token-file or --client-ca-file (mTLS) is required: no agent takes unauthenticated calls',
    );
  const token = o.tokenFile ? readTokenFile(o.tokenFile) : undefined;
  const clientCA = o.clientCAFile ? fs.readFileSync(o.clientCAFile, 'utf8') : undefined;
  const { host, port } = parseListen(o.listen);
  const certHost = o.tlsBootstrap ? certificateHost(host, o.advertiseAddress) : '';
  const certDir = o.certDir ?? path.join(o.stateDir, 'pki');
  const stored = o.tlsBootstrap ? storedServingCert(certDir, clientCA, o.nodeName, certHost) : undefined;
  const tls =
    o.tlsCert && o.tlsKey
      ? { cert: fs.readFileSync(o.tlsCert), key: fs.readFileSync(o.tlsKey) }
      : o.tlsBootstrap
        ? (stored ?? (await placeholderCert()))
        : undefined;
  if (clientCA && !tls)
    throw new CliError('error: --client-ca-file needs TLS (--tls-bootstrap or --tls-cert/--tls-key)');
  fs.mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
  // What servers whose state directory is gone left on this host (native/orphans.ts), as serve does.
  await collectOrphans((m, f) => log.info(m, f));
  // The API server: --kubeconfig, else the in-cluster config inside a pod (checked before anything starts).
  const kc = agentKubeConfig({ kubeconfig: o.kubeconfig, inClusterRoot: o.inClusterRoot });
  if (o.tlsBootstrap && !kc)
    throw new CliError('error: --tls-bootstrap needs the API server (--kubeconfig or in-cluster)');
  // One registry for the runtime's operations and the controller's reconciles, as serve and controller have.
  const metrics = new Metrics({ defaults: true });
  // The egress proxy of allowList sandboxes (root only, as serve), with the operator's ceiling.
  let egress: StartedEgress | undefined;
  if (o.egress !== false && process.getuid?.() === 0) egress = await startEgress(o.stateDir, o.egress ?? {}, log);
  else if (o.egress !== false)
    log.info('not root: no egress proxy; network mode allowList is Unsupported on this node');
  // The same node runtime as embedded serve: procbox, and vm where QEMU is installed.
  const runtime = localRuntime(o.stateDir, log, {
    noVm: o.noVm,
    sandboxDefaults: o.sandboxDefaults,
    egress: egress?.hook,
    metrics,
  });
  try {
    await runtime.start();
  } catch (e) {
    await egress?.stop().catch(() => undefined);
    throw new CliError(`error: the node runtime cannot start on this host: ${(e as Error).message}`);
  }
  const owned = kc ? await watchOwnSandboxes(kc, o.nodeName, log) : undefined;
  // With the API server known, this agent reconciles its own sandboxes (kubelet-style).
  const reconciling = owned
    ? startNodeSandboxes(owned, runtime, { nodeName: o.nodeName, stateDir: o.stateDir, log, metrics })
    : undefined;
  const server = createAgentServer({
    runtime,
    token,
    tls,
    ...(clientCA ? { clientCA } : {}),
    nodeName: o.nodeName,
    ...(owned ? { admitCreate: (id: string) => owned.admit(id), holderOf: (id: string) => owned.holderOf(id) } : {}),
    log: { info: log.info, error: log.error },
  });
  let url: string;
  try {
    url = (await server.listen(host, port)).url;
  } catch (e) {
    await runtime.close();
    throw new CliError(`error: cannot listen on ${o.listen}: ${(e as Error).message}`);
  }
  const metricsServer = o.metricsListen ? await serveMetrics(o.metricsListen, metrics) : undefined;
  // With the API server known: register the Node (its agent URL, capacity) and renew its Lease.
  const agentURL = advertisedURL(url, o.advertiseAddress);
  const heartbeat = owned
    ? startNodeHeartbeat({ client: owned.client, runtime, nodeName: o.nodeName, log, agentURL })
    : undefined;
  process.stdout.write(
    `fluxvm node agent for node ${o.nodeName} listening on ${url}\n` +
      (owned ? `registered as ${agentURL}\n` : '') +
      (metricsServer ? `metrics on ${metricsServer.url}/metrics\n` : '') +
      `state directory: ${o.stateDir}\n`,
  );
  // The serving certificate from the signer (hook: nodeagent-tls.ts); a refusal stops the agent.
  const stop = new AbortController();
  let exitCode = 0;
  if (o.tlsBootstrap && !stored && owned && heartbeat)
    void heartbeat.ready
      .then(() =>
        bootstrapServingCert({
          client: owned.client,
          node: o.nodeName,
          host: certHost,
          certDir,
          log,
          signal: stop.signal,
          caPem: clientCA,
        }),
      )
      .then((kp) => {
        server.setServingCertificate(kp.cert, kp.key);
        process.stdout.write(`serving certificate issued by the cluster CA for ${o.nodeName} (${certHost})\n`);
      })
      .catch((e: unknown) => {
        if (stop.signal.aborted) return;
        process.stderr.write(`${(e as Error).message}\n`);
        exitCode = 1;
        stop.abort();
      });
  else if (stored) process.stdout.write(`serving certificate from ${certDir} (issued before, still valid)\n`);
  await new Promise<void>((resolve) => {
    const onSignal = (sig: string) => {
      log.info('received a signal, shutting down', { signal: sig });
      resolve();
    };
    process.once('SIGTERM', () => onSignal('SIGTERM'));
    process.once('SIGINT', () => onSignal('SIGINT'));
    stop.signal.addEventListener('abort', () => resolve(), { once: true });
  });
  stop.abort();
  heartbeat?.stop();
  metricsServer?.server.close();
  metricsServer?.server.closeAllConnections();
  await server.close();
  await reconciling?.stop();
  await owned?.stop();
  await runtime.close().catch((e) => log.error('runtime close failed', { error: String(e) }));
  await egress?.stop().catch((e) => log.error('egress proxy stop failed', { error: String(e) }));
  return exitCode;
}
