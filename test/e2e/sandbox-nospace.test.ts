// End to end (procbox): a sandbox's workspace past its disk quota, or on a state directory
// whose disk is full, answers 507 InsufficientStorage on files PUT and baseline, with a
// Status naming the cause, never 500.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { fillToTheBrim, mountTmpfs, unmountTmpfs } from '../fulldisk.js';
import { mountsOf } from '../../native/procbox/quota.js';
import { api, exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';

describe('e2e: a full sandbox workspace is 507, not 500', function () {
  this.timeout(180_000);
  let fx: Fluxctl | undefined;
  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
  });

  it('files PUT past the quota: 507 InsufficientStorage; a smaller one still works', async function () {
    await makeSandbox(fx!, 'tight', { resources: { disk: '4Mi' } });
    const quota = await kubectlOk(fx!, ['get', 'sbx', 'tight', '-o', 'jsonpath={.status.capabilities.limits.disk}']);
    skipWith(this, quota === 'true' ? undefined : 'no kernel-enforced workspace disk quota on this host (status.capabilities.limits.disk is not true)');
    // 2 MiB a file (under the 3 MiB request body limit): the quota of 4 MiB is passed by the third.
    let big: Awaited<ReturnType<typeof api>> | undefined;
    for (let i = 0; i < 4; i++) {
      big = await api(fx!, 'PUT', subPath('default', 'tight', 'files'), { query: { path: `/work/big${i}` }, raw: Buffer.alloc(2 * 1024 * 1024, 7) });
      if (big.status !== 200 && big.status !== 201) break;
    }
    expect(big!.status, big!.body.toString()).to.equal(507);
    expect(big!.json).to.include({ kind: 'Status', reason: 'InsufficientStorage', code: 507 });
    expect(big!.json.message).to.match(/^the sandbox's disk is full: /);
    await exec(fx!, 'tight', 'rm -f /work/big*');
    const small = await api(fx!, 'PUT', subPath('default', 'tight', 'files'), { query: { path: '/work/small' }, raw: Buffer.from('ok') });
    expect(small.status, small.body.toString()).to.be.oneOf([200, 201]);
  });
});

describe('e2e: a sandbox on a full state-directory disk (tmpfs) is 507, not 500', function () {
  this.timeout(240_000);
  let fx: Fluxctl | undefined;
  let dir: string | undefined;
  before(async function () {
    skipWith(this, sandboxSkipReason());
    const m = mountTmpfs('256m');
    skipWith(this, m.why);
    dir = m.dir;
    // No store reserve: a released reserve would put space back on this disk mid-test.
    fx = await startFluxctl({ stateDir: dir, args: ['--disk-reserve=0'] });
  });
  after(async () => {
    if (fx) {
      if (dir) fs.rmSync(path.join(dir, 'brim'), { force: true });
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop({ keepState: true });
    }
    if (dir) unmountTmpfs(dir);
  });

  let uid = '';
  const image = () => path.join(dir!, 'runtime', 'procbox', 'workspaces.img');
  /** The names in the volume store's vols/ that belong to the sandbox (its volume). */
  const volumesOfSandbox = () => mountsOf(image()).flatMap((m) => fs.readdirSync(path.join(m, 'vols')).filter((n) => n.startsWith(`${uid}~`)));

  it('files PUT and baseline answer 507 InsufficientStorage when the disk is full', async () => {
    uid = await makeSandbox(fx!, 'full');
    const quota = mountsOf(image()).length > 0;
    // Where the store is a btrfs image (the next test needs it), the volume is seen before the disk fills (it answers EIO after).
    if (quota) expect(volumesOfSandbox(), 'the sandbox has a volume in the store').to.have.length(1);
    fillToTheBrim(path.join(dir!, 'brim'));
    const put = await api(fx!, 'PUT', subPath('default', 'full', 'files'), { query: { path: '/work/big' }, raw: Buffer.alloc(1024 * 1024, 7) });
    expect(put.status, put.body.toString()).to.equal(507);
    expect(put.json).to.include({ kind: 'Status', reason: 'InsufficientStorage', code: 507 });
    for (let i = 0; i < 200; i++) await api(fx!, 'PUT', subPath('default', 'full', 'files'), { query: { path: `/work/f${i}` }, raw: Buffer.from('x') });
    const base = await api(fx!, 'POST', subPath('default', 'full', 'baseline'), { body: { paths: ['/work'] } });
    expect(base.status, base.body.toString()).to.be.oneOf([200, 201, 507]);
    if (base.status === 507) expect(base.json).to.include({ reason: 'InsufficientStorage' });
    const dry = await api(fx!, 'POST', subPath('default', 'full', 'dryrun'), { body: { command: ['sh', '-c', 'echo x > /work/y'] } });
    expect(dry.status, dry.body.toString()).to.be.oneOf([200, 507]);
    if (dry.status === 507) expect(dry.json).to.include({ reason: 'InsufficientStorage' });
  });

  it('with space back, the delete finishes although the volume store failed meanwhile (EIO); a restart mounts the store again and removes the volume', async function () {
    fs.rmSync(path.join(dir!, 'brim'), { force: true });
    await kubectlOk(fx!, ['delete', 'sbx', 'full', '--timeout=30s']);
    expect((await fx!.kubectl(['get', 'sbx', 'full'])).stderr).to.match(/NotFound/);
    skipWith(this, mountsOf(image()).length ? undefined : 'no btrfs volume store on this host (plain directories): there is no failed file system to mount again');
    await fx!.stop({ keepState: true });
    fx = await startFluxctl({ stateDir: dir, args: ['--disk-reserve=0'] });
    expect(volumesOfSandbox()).to.deep.equal([]);
    await makeSandbox(fx, 'after');
    expect((await exec(fx, 'after', 'echo ok > /work/f && cat /work/f')).stdout).to.equal('ok\n');
  });
});
