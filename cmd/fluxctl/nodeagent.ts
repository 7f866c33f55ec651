// `fluxctl node-agent`: the node agent of one node (the DaemonSet of crds/install/): a procbox
// Runtime on --state-dir served over HTTP(S) by native/agent to remote controllers and API
// servers, authenticated with the bearer token in --token-file. Runs until SIGTERM/SIGINT,
// then stops serving and closes the runtime (sandboxes keep running and are adopted at the
// next start).
import fs from 'node:fs';
import path from 'node:path';
import { createAgentServer } from '../../native/agent/server.js';
import { ProcboxRuntime } from '../../native/procbox/procbox.js';
import { consoleLogger, silentLogger, type Logger } from '../../runtime/controller/index.js';
import { readTokenFile } from './controller.js';
import { parseListen } from './serve.js';
import { CliError } from './util.js';

export interface NodeAgentOptions {
  nodeName: string;
  listen: string;
  tokenFile: string;
  stateDir: string;
  tlsCert?: string;
  tlsKey?: string;
  /** Warm pool of procbox inits (default 2, as serve). */
  warmPool?: number;
  quiet?: boolean;
}

export async function runNodeAgent(o: NodeAgentOptions): Promise<number> {
  const log: Logger = o.quiet ? silentLogger : consoleLogger;
  if (!o.nodeName) throw new CliError('error: --node-name is required');
  if (!!o.tlsCert !== !!o.tlsKey) throw new CliError('error: --tls-cert and --tls-key go together');
  const token = readTokenFile(o.tokenFile);
  const { host, port } = parseListen(o.listen);
  const tls = o.tlsCert && o.tlsKey ? { cert: fs.readFileSync(o.tlsCert), key: fs.readFileSync(o.tlsKey) } : undefined;
  fs.mkdirSync(o.stateDir, { recursive: true, mode: 0o700 });
  const runtime = new ProcboxRuntime({ stateDir: path.join(o.stateDir, 'runtime'), warmPool: o.warmPool ?? 2 });
  try {
    await runtime.start();
  } catch (e) {
    throw new CliError(`error: the procbox runtime cannot start on this host: ${(e as Error).message}`);
  }
  const server = createAgentServer({ runtime, token, tls, nodeName: o.nodeName, log: { info: log.info, error: log.error } });
  let url: string;
  try {
    url = (await server.listen(host, port)).url;
  } catch (e) {
    await runtime.close();
    throw new CliError(`error: cannot listen on ${o.listen}: ${(e as Error).message}`);
  }
  process.stdout.write(`fluxvm node agent for node ${o.nodeName} listening on ${url}\nstate directory: ${o.stateDir}\n`);
  await new Promise<void>((resolve) => {
    const onSignal = (sig: string) => {
      process.stderr.write(`received ${sig}, shutting down\n`);
      resolve();
    };
    process.once('SIGTERM', () => onSignal('SIGTERM'));
    process.once('SIGINT', () => onSignal('SIGINT'));
  });
  await server.close();
  await runtime.close().catch((e) => log.error('runtime close failed', { error: String(e) }));
  return 0;
}
