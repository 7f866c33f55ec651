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
import { eventually } from '../support/wait.js';

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
    const sbxDir = join(stateDir, 'runtime', 'procbox', 'sandboxes');
    await eventually(
      () => readdirSync(sbxDir).some((d) => d.includes('-dryrun-')) && hostProcesses('sleep 3031').length > 0,
      30_000,
      'the dry-run copy to exist and run its command',
    );
    await fx.kill9();
    await inflight;
    fx = await startFluxctl({ stateDir });
    await kubectlOk(fx, ['wait', 'sbx/durable', '--for=condition=Ready', '--timeout=30s']);
    expect((await exec(fx, 'durable', 'cat /work/p')).stdout).to.equal('persisted\n');
    expect(hostProcesses('sleep 5151')).to.have.length(1);
    // The orphaned dry-run copy is gone.
    await eventually(
      () => !readdirSync(sbxDir).some((d) => d.includes('-dryrun-')),
      5000,
      'the orphaned dry-run copy to be removed',
    );
    expect(hostProcesses('sleep 3031')).to.deep.equal([]);
    await kubectlOk(fx, ['delete', 'sbx', 'durable', '--timeout=30s']);
    expect(hostProcesses('sleep 5151')).to.deep.equal([]);
    expect(existsSync(join(sbxDir, uid))).to.equal(false);
  });
});
