// Named volumes on a real node: ext4 images made by NodeVolumes, bound into real procbox
// sandboxes (binds.c). Written by one sandbox, read by the next; read-only mounts; the size at
// the edge; a symlink planted inside never makes the host touch what it points at.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { NodeVolumes, volumesUnsupported } from '../../../native/volumes/volumes.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from '../procbox/fixture.js';
import { skipWith } from '../../skip.js';

const MiB = 1024 * 1024;

describe('named volumes (procbox + loop-mounted ext4)', function () {
  this.timeout(120_000);
  let fx: Fixture | undefined;
  let vols: NodeVolumes;
  let volState: string;
  const made: string[] = [];

  before(function () {
    skipWith(this, skipReason() ?? volumesUnsupported());
  });
  beforeEach(async () => {
    volState = mkdtempSync(join(tmpdir(), 'volumes-test-'));
    vols = new NodeVolumes({ stateDir: volState, mountBase: '/run/fluxvm/volumes-test' });
    fx = await makeRuntime();
  });
  afterEach(async () => {
    await fx?.cleanup();
    for (const id of made.splice(0)) await vols.remove(id);
    rmSync(volState, { recursive: true, force: true });
  });

  async function volume(id: string, size = 16 * MiB): Promise<string> {
    made.push(id);
    await vols.ensure(id, size);
    return vols.mountPoint(id);
  }

  it('a volume written by one sandbox is read by the next (the first deleted in between)', async () => {
    const src = await volume('shared');
    await fx!.rt.create({ id: 'writer', volumes: [{ source: src, mountPath: '/data' }] });
    const w = await sh(
      fx!.rt,
      'writer',
      'echo hello-from-writer > /data/note && mkdir /data/d && echo x > /data/d/y && id -u && stat -c %u /data/note',
    );
    expect(w.code, w.err).to.equal(0);
    await fx!.rt.destroy('writer');
    await fx!.rt.create({ id: 'reader', volumes: [{ source: src, mountPath: '/mnt/vol' }] });
    const r = await sh(
      fx!.rt,
      'reader',
      'cat /mnt/vol/note /mnt/vol/d/y && echo more >> /mnt/vol/note && cat /mnt/vol/note',
    );
    expect(r.code, r.err).to.equal(0);
    expect(r.out).to.equal('hello-from-writer\nx\nhello-from-writer\nmore\n');
    // The data is on the host's volume, not in a sandbox layer.
    expect(readFileSync(join(src, 'note'), 'utf8')).to.equal('hello-from-writer\nmore\n');
    // nosuid, nodev on the sandbox's mount.
    const m = await sh(fx!.rt, 'reader', "grep ' /mnt/vol ' /proc/self/mountinfo");
    expect(m.out)
      .to.match(/nosuid/)
      .and.to.match(/nodev/);
  });

  it('a readOnly mount refuses writes; a fork child sees the volume read-only', async () => {
    const src = await volume('ro');
    writeFileSync(join(src, 'seed'), 'seed\n');
    await fx!.rt.create({ id: 'ro', volumes: [{ source: src, mountPath: '/data', readOnly: true }] });
    const r = await sh(fx!.rt, 'ro', 'cat /data/seed; echo bad > /data/new; echo rc=$?; rm /data/seed; echo rc=$?');
    expect(r.out).to.equal('seed\nrc=2\nrc=1\n'); // a failed redirection is 2 in sh
    expect(r.err).to.match(/Read-only file system/);
    expect(existsSync(join(src, 'new'))).to.equal(false);
    await fx!.rt.create({ id: 'rw', volumes: [{ source: src, mountPath: '/data' }] });
    expect((await sh(fx!.rt, 'rw', 'echo ok > /data/w')).code).to.equal(0);
    await fx!.rt.fork('rw', ['rw-kid']);
    const k = await sh(fx!.rt, 'rw-kid', 'cat /data/w; echo no > /data/w; echo rc=$?');
    expect(k.out).to.equal('ok\nrc=2\n');
    expect(readFileSync(join(src, 'w'), 'utf8')).to.equal('ok\n');
  });

  it('the size is enforced at the edge: filling it exactly passes, one block more is ENOSPC', async () => {
    const size = 16 * MiB;
    const src = await volume('edge', size);
    expect(vols.usage('edge')).to.deep.equal({ capacityBytes: size, usedBytes: 0 });
    await fx!.rt.create({ id: 'fill', volumes: [{ source: src, mountPath: '/data' }] });
    const full = await sh(
      fx!.rt,
      'fill',
      `dd if=/dev/zero of=/data/full bs=4096 count=${size / 4096} conv=fsync 2>&1; echo rc=$?`,
    );
    expect(full.out, full.out).to.match(/rc=0\n$/);
    expect(statSync(join(src, 'full')).size).to.equal(size);
    expect(vols.usage('edge').usedBytes).to.equal(size);
    const past = await sh(fx!.rt, 'fill', 'dd if=/dev/zero of=/data/one bs=4096 count=1 conv=fsync 2>&1; echo rc=$?');
    expect(past.out)
      .to.match(/No space left on device/)
      .and.to.match(/rc=1\n$/);
    // Space comes back after a delete.
    const again = await sh(
      fx!.rt,
      'fill',
      'rm /data/full /data/one; sync; dd if=/dev/zero of=/data/one bs=4096 count=1 conv=fsync 2>&1; echo rc=$?',
    );
    expect(again.out).to.match(/rc=0\n$/);
  });

  it('a symlink planted in the volume never makes the host touch its target (usage, remount, delete)', async () => {
    const src = await volume('trap');
    const victimDir = mkdtempSync(join(tmpdir(), 'volumes-victim-'));
    const victim = join(victimDir, 'precious');
    writeFileSync(victim, 'keep me\n');
    try {
      await fx!.rt.create({ id: 'evil', volumes: [{ source: src, mountPath: '/data' }] });
      const e = await sh(
        fx!.rt,
        'evil',
        `ln -s ${victimDir} /data/link && ln -s ${victim} /data/file && ln -s / /data/root && ls -la /data`,
      );
      expect(e.code, e.err).to.equal(0);
      await fx!.rt.destroy('evil');
      // Usage is the file system's counters: the 1 GiB target is not counted.
      expect(vols.usage('trap').usedBytes).to.be.below(MiB);
      // A new sandbox binds the volume's root, not what the links point at.
      await fx!.rt.create({ id: 'next', volumes: [{ source: src, mountPath: '/data' }] });
      const n = await sh(fx!.rt, 'next', 'cat /data/file; echo rc=$?; readlink /data/link');
      expect(n.out).to.equal(`rc=1\n${victimDir}\n`); // the host path does not exist inside
      await fx!.rt.destroy('next');
      await vols.remove('trap');
      made.splice(made.indexOf('trap'), 1);
      expect(readFileSync(victim, 'utf8')).to.equal('keep me\n');
      expect(existsSync(vols.image('trap'))).to.equal(false);
      expect(vols.mounted('trap')).to.equal(false);
    } finally {
      rmSync(victimDir, { recursive: true, force: true });
    }
  });

  it('a checkpoint holds the volume only by reference: its contents are not in it and are not rolled back', async () => {
    const src = await volume('ck');
    const v = [{ source: src, mountPath: '/data' }];
    await fx!.rt.create({ id: 'ck-a', volumes: v });
    const w = await sh(
      fx!.rt,
      'ck-a',
      'echo one > /work/ws && dd if=/dev/urandom of=/data/big bs=1M count=8 2>/dev/null && echo v1 > /data/v',
    );
    expect(w.code, w.err).to.equal(0);
    const ck = await fx!.rt.checkpoint('ck-a', 'ck-1');
    expect(ck.sizeBytes).to.be.below(MiB); // the 8 MiB on the volume are not in it
    expect((await sh(fx!.rt, 'ck-a', 'echo two > /work/ws && echo v2 > /data/v')).code).to.equal(0);
    await fx!.rt.create({ id: 'ck-b', source: { checkpointId: 'ck-1' }, volumes: v });
    // The workspace is the checkpoint's; the volume is what it is now.
    expect((await sh(fx!.rt, 'ck-b', 'cat /work/ws /data/v')).out).to.equal('one\nv2\n');
    await fx!.rt.destroy('ck-b');
    await fx!.rt.deleteCheckpoint('ck-1');
  });

  it('with a read list (confinement.readPaths) the volumes stay readable, and a rw one writable', async () => {
    const src = await volume('ll');
    writeFileSync(join(src, 'r'), 'r\n');
    await fx!.rt.create({
      id: 'll',
      volumes: [
        { source: src, mountPath: '/data' },
        { source: src, mountPath: '/ro', readOnly: true },
      ],
      confinement: { readPaths: ['/work'] },
    });
    const r = await sh(
      fx!.rt,
      'll',
      'cat /data/r /ro/r && echo w > /data/w && cat /ro/w; cat /etc/hostname >/dev/null; ls /srv 2>&1; true',
    );
    expect(r.out).to.match(/^r\nr\nw\n/);
  });

  it('an unmounted volume (after a reboot) is refused, not its empty mount point; ensure mounts it again', async () => {
    const src = await volume('remount');
    writeFileSync(join(src, 'kept'), 'kept\n');
    execFileSync('umount', [src]);
    expect(vols.mounted('remount')).to.equal(false);
    const e = await rejects(fx!.rt.create({ id: 'early', volumes: [{ source: src, mountPath: '/data' }] }));
    expect(e.message).to.match(/is not mounted/);
    await vols.ensure('remount', 16 * MiB);
    await fx!.rt.create({ id: 'later', volumes: [{ source: src, mountPath: '/data' }] });
    expect((await sh(fx!.rt, 'later', 'cat /data/kept')).out).to.equal('kept\n');
  });

  it('sweep() unmounts the volumes of a removed state directory (image unlinked), and only those', async () => {
    await volume('kept');
    const goneState = mkdtempSync(join(tmpdir(), 'volumes-gone-'));
    const gone = new NodeVolumes({ stateDir: goneState, mountBase: vols.mountBase });
    await gone.ensure('orphan', 16 * MiB);
    rmSync(goneState, { recursive: true, force: true }); // the state directory went (all of it), its mount stayed
    expect(gone.mounted('orphan')).to.equal(true);
    expect(await vols.sweep()).to.equal(1);
    expect(gone.mounted('orphan')).to.equal(false);
    expect(vols.mounted('kept')).to.equal(true);
    rmdirSync(dirname(gone.mountPoint('orphan'))); // its scope's directory, empty now
  });

  it('the runtime refuses a bind over /, a system directory, the workspace, .. tricks, nesting and too many', async () => {
    const src = await volume('paths');
    const bad: Array<[string, Array<{ source: string; mountPath: string }>]> = [
      ['/', [{ source: src, mountPath: '/' }]],
      ['/work', [{ source: src, mountPath: '/work' }]],
      ['/work/sub', [{ source: src, mountPath: '/work/sub' }]],
      ['/data/../work', [{ source: src, mountPath: '/data/../work' }]],
      ['/proc', [{ source: src, mountPath: '/proc/x' }]],
      ['/etc', [{ source: src, mountPath: '/etc' }]],
      ['/tmp', [{ source: src, mountPath: '/tmp/v' }]],
      [
        'nested',
        [
          { source: src, mountPath: '/data' },
          { source: src, mountPath: '/data/inner' },
        ],
      ],
      [
        'duplicate',
        [
          { source: src, mountPath: '/data' },
          { source: src, mountPath: '/data/' },
        ],
      ],
      ['9', Array.from({ length: 9 }, (_, i) => ({ source: src, mountPath: `/v${i}` }))],
    ];
    for (const [what, volumes] of bad) {
      const e = await rejects(fx!.rt.create({ id: 'bad', volumes }));
      expect(e.message, what).to.match(/volumes/);
      expect(await fx!.rt.inspect('bad').catch(() => undefined), what).to.equal(undefined);
    }
    // 8 (the limit) passes.
    await fx!.rt.create({
      id: 'eight',
      volumes: Array.from({ length: 8 }, (_, i) => ({ source: src, mountPath: `/v${i}` })),
    });
    expect((await sh(fx!.rt, 'eight', 'echo a > /v0/a && cat /v7/a')).out).to.equal('a\n');
  });
});
