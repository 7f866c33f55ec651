// End to end: a Sandbox without spec.resources is bounded by the node defaults (fluxctl serve
// --default-*), spec.resources overrides them, and status.limits says what is in force, as
// kubectl prints it; --warm-pool sets how many procbox inits wait for creates. The kernel side of
// each limit is tested in test/native/procbox/limits.test.ts.
import { expect } from 'chai';
import { existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually } from '../runtime/controller/env.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

const MiB = 1024 * 1024;

describe('e2e: sandbox default limits and status.limits', function () {
  this.timeout(120_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({
      args: ['--default-pids', '96', '--default-memory', '256Mi', '--default-disk', '64Mi', '--warm-pool', '3'],
    });
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
  });

  it('no spec.resources: the serve defaults are in force and in status.limits; the pids limit holds', async () => {
    await makeSandbox(fx, 'plain');
    const st = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'plain', '-o', 'json'])).status;
    expect(st.capabilities.limits).to.include({ memory: true, pids: true, cpu: true });
    const disk = st.capabilities.limits.disk === true;
    expect(st.limits).to.deep.equal({
      memoryBytes: 256 * MiB,
      pids: 96,
      cpuWeight: 100,
      tmpfsBytes: 128 * MiB,
      ...(disk ? { diskBytes: 64 * MiB } : {}),
    });
    expect((await kubectlOk(fx, ['get', 'sbx', 'plain', '-o', 'jsonpath={.status.limits.pids}'])).trim()).to.equal(
      '96',
    );
    if (disk) {
      const d = await exec(fx, 'plain', 'dd if=/dev/zero of=/work/big bs=1M count=256 2>&1; echo rc=$?');
      expect(d.stdout).to.match(/Disk quota exceeded/);
    }
    // 200 sleepers cannot start under a limit of 96.
    const r = await exec(fx, 'plain', 'for i in $(seq 200); do sleep 30 >/dev/null 2>&1 & done; echo all');
    expect(r.stdout).to.not.include('all');
    expect(r.stderr).to.match(/fork/i);
  });

  it('spec.resources overrides the defaults per sandbox', async () => {
    await makeSandbox(fx, 'own', { resources: { pids: 40, memory: '128Mi', disk: '32Mi' } });
    const st = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'own', '-o', 'json'])).status;
    expect(st.limits).to.include({ memoryBytes: 128 * MiB, pids: 40, cpuWeight: 100, tmpfsBytes: 64 * MiB });
    if (st.capabilities.limits.disk) expect(st.limits.diskBytes).to.equal(32 * MiB);
  });

  it('--warm-pool 3: three inits wait for creates, and the pool is refilled after a create takes one', async () => {
    // A pool init's root is <state>/runtime/procbox/pool/<name>/root until a create renames it away.
    const pool = join(fx.stateDir, 'runtime', 'procbox', 'pool');
    const waiting = () =>
      existsSync(pool) ? readdirSync(pool).filter((n) => existsSync(join(pool, n, 'root'))).length : 0;
    await eventually(() => waiting() === 3, 30_000, `three pool inits (now ${waiting()})`);
    await makeSandbox(fx, 'from-pool');
    await eventually(() => waiting() === 3, 30_000, `the pool refilled to three (now ${waiting()})`);
  });

  it('a bad --warm-pool is refused at start with the flag named', async () => {
    for (const bad of ['-1', '65', '2.5', 'many']) {
      const r = await fx.fluxctl([
        'serve',
        '--state-dir',
        join(tmpdir(), `never-created-${process.pid}`),
        '--warm-pool',
        bad,
      ]);
      expect(r.code, bad).to.not.equal(0);
      expect(r.stderr, bad).to.include(`--warm-pool must be an integer from 0 to 64, got "${bad}"`);
    }
  });

  it('a bad default is refused at start with the flag named', async () => {
    const r = await fx.fluxctl([
      'serve',
      '--state-dir',
      join(tmpdir(), `never-created-${process.pid}`),
      '--default-pids',
      '0',
    ]);
    expect(r.code).to.not.equal(0);
    expect(r.stderr).to.match(/--default-pids must be a positive integer/);
  });
});
