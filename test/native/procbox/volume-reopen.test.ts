// The btrfs volume store across restarts (quota.ts openVolumeStore): a second start on the same
// root finds its image and never makes a file system again, whether the image is still mounted
// (a server restart) or not (a reboot): what the store held is still there.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openVolumeStore, type VolumeOptions } from '../../../native/procbox/quota.js';
import { skipWith } from '../../skip.js';

describe('procbox volume store: reopened, not made again', function () {
  this.timeout(60_000);
  let base: string;
  let o: VolumeOptions;

  before(function () {
    skipWith(this, process.getuid?.() === 0 ? undefined : 'the btrfs volume store needs root (loop device, mount)');
    skipWith(this, existsSync('/dev/loop-control') ? undefined : 'no loop devices on this host');
  });
  beforeEach(() => {
    base = mkdtempSync(join(tmpdir(), 'fluxvm-volreopen-'));
    o = {
      root: join(base, 'root'),
      scope: `t${process.pid}`,
      mountBase: join(base, 'mnt'),
      enabled: true,
      imageBytes: 1 << 30,
    };
    mkdirSync(o.root, { recursive: true });
  });
  afterEach(() => {
    const target = join(o.mountBase, o.scope);
    try {
      execFileSync('umount', ['-l', target], { stdio: 'ignore' });
    } catch {
      // not mounted
    }
    rmSync(base, { recursive: true, force: true });
  });

  it('a restart with the image mounted and one after an unmount keep the image and its files', async function () {
    const first = await openVolumeStore(o);
    skipWith(this, first.quota ? undefined : `no btrfs volume store here: ${first.reason}`);
    const image = join(o.root, 'workspaces.img');
    const ino = statSync(image).ino;
    writeFileSync(join(first.dir, 'vols', 'marker'), 'kept');

    const again = await openVolumeStore(o); // still mounted: a server restart
    expect(again).to.deep.equal(first);
    expect(readFileSync(join(again.dir, 'vols', 'marker'), 'utf8')).to.equal('kept');

    execFileSync('umount', [first.dir]); // as after a reboot
    expect(existsSync(join(first.dir, 'vols', 'marker'))).to.equal(false);
    const remounted = await openVolumeStore(o);
    // The image is attached again, to whichever loop device is free now (another test may hold
    // the first one meanwhile): the same image, mount point and quota, not a new file system.
    expect(remounted.dev).to.match(/^\/dev\/loop\d+$/);
    expect({ ...remounted, dev: undefined }).to.deep.equal({ ...first, dev: undefined });
    expect(readFileSync(join(remounted.dir, 'vols', 'marker'), 'utf8')).to.equal('kept'); // a mkfs would have lost it
    expect(statSync(image).ino).to.equal(ino);
  });

  it('an image of an older version (sparse, mounted with discard) is made safe: shrunk to what it holds, fully allocated, remounted nodiscard, its files kept', async function () {
    const image = join(o.root, 'workspaces.img');
    const target = join(o.mountBase, o.scope);
    // As older versions made it: a sparse file of a nominal 2 GiB, btrfs mounted with the default discard.
    execFileSync('truncate', ['-s', String(2 * 2 ** 30), image]);
    execFileSync('mkfs.btrfs', ['-q', '-f', '-m', 'single', '-d', 'single', image], { stdio: 'ignore' });
    mkdirSync(target, { recursive: true });
    execFileSync('mount', ['-o', 'loop,noatime', image, target]);
    mkdirSync(join(target, 'vols'));
    writeFileSync(join(target, 'vols', 'marker'), 'kept');
    expect(statSync(image).blocks * 512).to.be.below(statSync(image).size);

    const vs = await openVolumeStore(o);
    skipWith(this, vs.quota ? undefined : `no btrfs volume store here: ${vs.reason}`);
    expect(vs.damaged, vs.damaged).to.equal(undefined);
    const st = statSync(image);
    expect(st.size, 'shrunk to what it holds plus the headroom').to.be.at.most(512 << 20);
    expect(st.blocks * 512, 'fully allocated').to.be.at.least(st.size);
    const line = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .find((l) => l.split(' ')[4] === target)!;
    expect(line.split(' - ')[1]).to.not.match(/discard/);
    expect(readFileSync(join(vs.dir, 'vols', 'marker'), 'utf8')).to.equal('kept');
  });
});
