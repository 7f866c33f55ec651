// The smallest split deployment, as processes on loopback: `fluxctl node-agent` (procbox, one
// node, a bearer token), `fluxctl serve --no-controllers --node-agent URL` (the API server) and
// `fluxctl controller --node-agent URL`. Used by the split-mode tests that need one node; the
// multi-node ones (twonodes*, agent-tls) build their own.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { spawnFluxctl, type Proc } from './procs.js';

export interface SplitTopology {
  /** The temporary directory holding the token and the agent's and controller's state. */
  tmp: string;
  agent: Proc;
  fx: Fluxctl;
  ctrl: Proc;
  /** When the agent said it listens (the runtime's process start, for idle timing). */
  agentUpAt: number;
}

/** Starts the three processes (agent, API server, controller), in that order; each ready when this returns. */
export async function startSplit(prefix: string, nodeName: string): Promise<SplitTopology> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const tokenFile = path.join(tmp, 'token');
  fs.writeFileSync(tokenFile, `agent-token-${process.pid}-${Date.now()}\n`, { mode: 0o600 });
  const agent = await spawnFluxctl(
    ['node-agent', '--node-name', nodeName, '--listen', '127.0.0.1:0', '--token-file', tokenFile].concat([
      '--state-dir',
      path.join(tmp, 'agent'),
      '--warm-pool',
      '0',
      '--no-vm',
    ]),
    /listening on (http:\/\/\S+)/,
    60_000,
  );
  const agentUpAt = Date.now();
  const agentUrl = agent.matched[1]!;
  let fx: Fluxctl | undefined;
  try {
    fx = await startFluxctl({
      args: ['--no-controllers', '--node-agent', agentUrl, '--node-agent-token-file', tokenFile, '--quiet'],
      readyTimeoutMs: 120_000,
    });
    const ctrl = await spawnFluxctl(
      ['controller', '--kubeconfig', fx.kubeconfig, '--node-agent', agentUrl, '--token-file', tokenFile].concat([
        '--state-dir',
        path.join(tmp, 'controller'),
      ]),
      /fluxvm controller \S+ against/,
      60_000,
    );
    return { tmp, agent, fx, ctrl, agentUpAt };
  } catch (e) {
    // Nothing is left running when a start fails (the test's after hook has nothing to stop).
    await fx?.stop();
    await agent.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}

/** Stops what `startSplit` started (each must exit 0) and removes its directory; `s` may be undefined. */
export async function stopSplit(s: SplitTopology | undefined): Promise<void> {
  if (!s) return;
  expect(await s.ctrl.stop()).to.equal(0, s.ctrl.logs());
  expect(await s.fx.stop()).to.equal(0, s.fx.logs());
  expect(await s.agent.stop()).to.equal(0, s.agent.logs());
  fs.rmSync(s.tmp, { recursive: true, force: true });
}
