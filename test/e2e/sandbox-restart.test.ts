// End to end: `fluxctl serve` killed with SIGKILL while sandboxes run, then started again on
// the same state directory. The sandboxes are adopted (same workspace, still Running, exec
// works), a dry-run copy left behind is reaped, and deleting afterwards leaves nothing.
import { expect } from 'chai';
import { existsSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  exec,
  hostProcesses,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
  subPath,
} from './sandbox-helpers.js';

describe('e2e: sandboxes survive a crash of fluxctl serve', function () {
  this.timeout(180_000);
  let fx: Fluxctl | undefined;
  let stateDir = '';

  before(function () {
    skipWith(this, sandboxSkipReason());
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    // The restarted server was given the state dir, so it does not remove it itself.
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('kill -9 and restart: sandboxes are adopted with their files and background processes; delete still cleans up', async () => {
    fx = await startFluxctl();
    stateDir = fx.stateDir;
    const uid = await makeSandbox(fx, 'durable');
    await exec(fx, 'durable', 'echo persisted > /work/p; sleep 5151 >/dev/null 2>&1 &');
    // A dry-run in flight when the server dies leaves its copy behind.
    const inflight = api(fx, 'POST', subPath('default', 'durable', 'dryrun'), {
      body: { command: ['sleep', '3031'] },
    }).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 1500));
    const sbxDir = join(stateDir, 'runtime', 'procbox', 'sandboxes');
    expect(readdirSync(sbxDir).some((d) => d.includes('-dryrun-'))).to.equal(true);
    await fx.kill9();
    await inflight;
    fx = await startFluxctl({ stateDir });
    await kubectlOk(fx, ['wait', 'sbx/durable', '--for=condition=Ready', '--timeout=30s']);
    expect((await exec(fx, 'durable', 'cat /work/p')).stdout).to.equal('persisted\n');
    expect(hostProcesses('sleep 5151')).to.have.length(1);
    // The orphaned dry-run copy is gone.
    for (let i = 0; i < 50 && readdirSync(sbxDir).some((d) => d.includes('-dryrun-')); i++)
      await new Promise((r) => setTimeout(r, 100));
    expect(readdirSync(sbxDir).filter((d) => d.includes('-dryrun-'))).to.deep.equal([]);
    expect(hostProcesses('sleep 3031')).to.deep.equal([]);
    await kubectlOk(fx, ['delete', 'sbx', 'durable', '--timeout=30s']);
    expect(hostProcesses('sleep 5151')).to.deep.equal([]);
    expect(existsSync(join(sbxDir, uid))).to.equal(false);
  });
});
