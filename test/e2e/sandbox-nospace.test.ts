// End to end (procbox): a sandbox's workspace past its disk quota, or on a state directory
// whose disk is full, answers 507 InsufficientStorage on files PUT and baseline, with a
// Status naming the cause, never 500.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { fillToTheBrim, mountTmpfs, unmountTmpfs } from '../fulldisk.js';
import { mountsOf } from '../../native/procbox/quota.js';
import {
  api,
  eventually,
  exec,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
  subPath,
} from './sandbox-helpers.js';

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
    skipWith(
      this,
      quota === 'true'
        ? undefined
        : 'no kernel-enforced workspace disk quota on this host (status.capabilities.limits.disk is not true)',
    );
    // 2 MiB a file (under the 3 MiB request body limit): the quota of 4 MiB is passed by the third.
    let big: Awaited<ReturnType<typeof api>> | undefined;
    for (let i = 0; i < 4; i++) {
      big = await api(fx!, 'PUT', subPath('default', 'tight', 'files'), {
        query: { path: `/work/big${i}` },
        raw: Buffer.alloc(2 * 1024 * 1024, 7),
      });
      if (big.status !== 200 && big.status !== 201) break;
    }
    expect(big!.status, big!.body.toString()).to.equal(507);
    expect(big!.json).to.include({ kind: 'Status', reason: 'InsufficientStorage', code: 507 });
    expect(big!.json.message).to.match(/^the sandbox's disk is full: /);
    await exec(fx!, 'tight', 'rm -f /work/big*');
    const small = await api(fx!, 'PUT', subPath('default', 'tight', 'files'), {
      query: { path: '/work/small' },
      raw: Buffer.from('ok'),
    });
    expect(small.status, small.body.toString()).to.be.oneOf([200, 201]);
  });
});

describe('e2e: a sandbox on a full state-directory disk (tmpfs) is 507, not 500', function () {
  this.timeout(240_000);
  let fx: Fluxctl | undefined;
  let dir: string | undefined;
  before(async function () {
    skipWith(this, sandboxSkipReason());
    // 512 MiB: room for the workspace volume (256 MiB at least, fully allocated) and its reserve.
    const m = mountTmpfs('512m');
    skipWith(this, m.why);
    dir = m.dir;
    // The store's default reserve: the delete on the full disk is paid from it.
    fx = await startFluxctl({ stateDir: dir });
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
  const volumesOfSandbox = () =>
    mountsOf(image()).flatMap((m) => fs.readdirSync(path.join(m, 'vols')).filter((n) => n.startsWith(`${uid}~`)));

  it('files PUT and baseline answer 507 InsufficientStorage when the disk is full', async () => {
    uid = await makeSandbox(fx!, 'full');
    const quota = mountsOf(image()).length > 0;
    // Where the store is a btrfs image (the next test needs it), the volume is seen before the disk fills (it answers
    // EIO after).
    if (quota) expect(volumesOfSandbox(), 'the sandbox has a volume in the store').to.have.length(1);
    // 50 small files, and 150 MiB over which the volume grows (the space a delete gives back:
    // the image never shrinks below its 256 MiB).
    const wrote = await exec(
      fx!,
      'full',
      'for i in $(seq 1 50); do echo x > /work/f$i; done; for i in $(seq 1 15); do dd if=/dev/zero of=/work/g$i bs=1M count=10 2>&1 || exit 1; sleep 0.1; done; sync',
    );
    expect(wrote.exitCode, wrote.stdout).to.equal(0);
    fillToTheBrim(path.join(dir!, 'brim'));
    // The volume's allocated space fills up too: ENOSPC at write time, never an I/O error.
    const dd = await exec(fx!, 'full', 'dd if=/dev/zero of=/work/fill bs=1M count=2048 2>&1; echo rc=$?');
    expect(dd.stdout)
      .to.match(/No space left on device/)
      .and.not.match(/Input\/output error/);
    // btrfs gives back space it held for a transaction once that commits, later on a busy host
    // (a loaded run's PUT found 1 MiB free): what came free is filled again, at most 3 times,
    // until the PUT finds the disk full.
    let put = await api(fx!, 'PUT', subPath('default', 'full', 'files'), {
      query: { path: '/work/big' },
      raw: Buffer.alloc(1024 * 1024, 7),
    });
    for (let refill = 1; put.status === 200 && refill <= 3; refill++) {
      await exec(fx!, 'full', `dd if=/dev/zero of=/work/refill${refill} bs=64k count=100000 2>/dev/null; sync`);
      put = await api(fx!, 'PUT', subPath('default', 'full', 'files'), {
        query: { path: `/work/big${refill}` },
        raw: Buffer.alloc(1024 * 1024, 7),
      });
    }
    expect(put.status, put.body.toString()).to.equal(507);
    expect(put.json).to.include({ kind: 'Status', reason: 'InsufficientStorage', code: 507 });
    for (let i = 0; i < 200; i++)
      await api(fx!, 'PUT', subPath('default', 'full', 'files'), {
        query: { path: `/work/p${i}` },
        raw: Buffer.from('x'),
      });
    const base = await api(fx!, 'POST', subPath('default', 'full', 'baseline'), { body: { paths: ['/work'] } });
    expect(base.status, base.body.toString()).to.be.oneOf([200, 201, 507]);
    if (base.status === 507) expect(base.json).to.include({ reason: 'InsufficientStorage' });
    const dry = await api(fx!, 'POST', subPath('default', 'full', 'dryrun'), {
      body: { command: ['sh', '-c', 'echo x > /work/y'] },
    });
    expect(dry.status, dry.body.toString()).to.be.oneOf([200, 507]);
    if (dry.status === 507) expect(dry.json).to.include({ reason: 'InsufficientStorage' });
  });

  it('the delete works on the full disk; with space back the store leaves its read-only mode by itself and writes resume; a restart finds nothing of the sandbox', async function () {
    skipWith(
      this,
      mountsOf(image()).length
        ? undefined
        : 'no btrfs volume store on this host (plain directories): no image to give space back',
    );
    // What the sandbox wrote before the disk filled up is still there (no EIO, no loss).
    expect((await exec(fx!, 'full', 'cat /work/f1 /work/f7 /work/f50')).stdout).to.equal('x\nx\nx\n');
    const put = await api(fx!, 'PUT', subPath('default', 'full', 'files'), {
      query: { path: '/work/more' },
      raw: Buffer.alloc(64 * 1024 * 1024, 7),
    });
    expect(put.status).to.be.oneOf([413, 507]);
    // The disk is still full (the file beside the state stays): the delete must get through
    // (the Terminating status write of a deleting object is a step of its deletion).
    await kubectlOk(fx!, ['delete', 'sbx', 'full', '--timeout=60s']);
    expect((await fx!.kubectl(['get', 'sbx', 'full'])).stderr).to.match(/NotFound/);
    // Space back on the disk (the file beside the state goes): the store leaves its
    // read-and-delete-only mode by itself, no restart.
    fs.rmSync(path.join(dir!, 'brim'), { force: true });
    let last = '';
    await eventually(
      async () => {
        const r = await fx!.kubectl(['create', 'secret', 'generic', 'after-full', '--from-literal=a=b']);
        last = r.stderr;
        return r.code === 0;
      },
      60_000,
      'a create to succeed after the delete on the full disk',
    ).catch((e) => {
      const st = fs.statfsSync(dir!);
      throw new Error(
        `${(e as Error).message}; last answer: ${last.trim()}; free on the disk: ${st.bavail * st.bsize} bytes; image ${fs.statSync(image()).size} bytes`,
      );
    });
    await fx!.stop({ keepState: true });
    fx = await startFluxctl({ stateDir: dir });
    expect(volumesOfSandbox()).to.deep.equal([]);
    await makeSandbox(fx, 'after');
    expect((await exec(fx, 'after', 'echo ok > /work/f && cat /work/f')).stdout).to.equal('ok\n');
  });
});
