// `fluxctl node-agent`: the node agent of one node (the DaemonSet of crds/install/): the node
// runtime (procbox, plus vm where QEMU is installed) on --state-dir served over HTTP(S) by native/agent to remote
// controllers and API
// servers, authenticated with the bearer token in --token-file. Runs until SIGTERM/SIGINT,
// then stops serving and closes the runtime (sandboxes keep running and are adopted at the
// next start).
import { collectOrphans } from '../../native/orphans.js';
import fs from 'node:fs';
import { createAgentServer } from '../../native/agent/server.js';
import type { Logger } from '../../runtime/controller/index.js';
import { createLogger, type LogLevel } from '../../runtime/log/log.js';
import { readTokenFile } from './controller.js';
import { startNodeHeartbeat } from '../../controllers/node/heartbeat.js';
import { localRuntime, type SandboxDefaults } from './localruntime.js';
import { parseListen } from './listen.js';
import { CliError } from './util.js';
import { startNodeSandboxes, watchOwnSandboxes } from './nodeagent-owner.js';

export interface NodeAgentOptions {
  /** Limits of sandboxes without spec.resources (--default-*, --no-disk-quota). */
  sandboxDefaults?: SandboxDefaults;
  nodeName: string;
  listen: string;
  tokenFile: string;
  stateDir: string;
  tlsCert?: string;
  tlsKey?: string;
  /** Warm pool of procbox inits (default 2, as serve). */
  warmPool?: number;
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
}

export async function runNodeAgent(o: NodeAgentOptions): Promise<number> {
  const log: Logger = createLogger({ level: o.quiet ? 'silent' : (o.logLevel ?? 'info') });
  if (!o.nodeName) throw new CliError('error: --node-name is required');
  if (!!o.tlsCert !== !!o.tlsKey) throw new CliError('error: --tls-cert and --tls-key go together');
  const token = readTokenFile(o.tokenFile);
  const { host, port } = parseListen(o.listen);
  const tls = o.tlsCert && o.tlsKey ? { cert: fs.readFileSync(o.tlsCert), key: fs.readFileSync(o.tlsKey) } : undefined;
  fs.mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
  // What servers whose state directory is gone left on this host (native/orphans.ts), as serve does.
  await collectOrphans((m, f) => log.info(m, f));
  // The same node runtime as embedded serve: procbox, and vm where QEMU is installed.
  const runtime = localRuntime(o.stateDir, log, {
    procboxWarmPool: o.warmPool ?? 2,
    noVm: o.noVm,
    sandboxDefaults: o.sandboxDefaults,
  });
  try {
    await runtime.start();
  } catch (e) {
    throw new CliError(`error: the node runtime cannot start on this host: ${(e as Error).message}`);
  }
  const owned = o.kubeconfig ? await watchOwnSandboxes(o.kubeconfig, o.nodeName, log) : undefined;
  // With the API server known, this agent reconciles its own sandboxes (kubelet-style).
  const reconciling = owned
    ? startNodeSandboxes(owned, runtime, { nodeName: o.nodeName, stateDir: o.stateDir, log })
    : undefined;
  const server = createAgentServer({
    runtime,
    token,
    tls,
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
  // With the API server known: register the Node (its agent URL, capacity) and renew its Lease (issue 28).
  const heartbeat = owned
    ? startNodeHeartbeat({ client: owned.client, runtime, nodeName: o.nodeName, log, agentURL: url })
    : undefined;
  process.stdout.write(
    `fluxvm node agent for node ${o.nodeName} listening on ${url}\nstate directory: ${o.stateDir}\n`,
  );
  await new Promise<void>((resolve) => {
    const onSignal = (sig: string) => {
      log.info('received a signal, shutting down', { signal: sig });
      resolve();
    };
    process.once('SIGTERM', () => onSignal('SIGTERM'));
    process.once('SIGINT', () => onSignal('SIGINT'));
  });
  heartbeat?.stop();
  await server.close();
  await reconciling?.stop();
  await owned?.stop();
  await runtime.close().catch((e) => log.error('runtime close failed', { error: String(e) }));
  return 0;
}
