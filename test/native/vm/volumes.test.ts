// Named volumes in VMs (native/vm/volumes.ts), real QEMU and virtiofsd over a real volume (a
// loop-mounted ext4, native/volumes): what one VM writes the next reads, a read-only volume
// refuses writes on the host side too (a guest that remounts it read-write still gets EROFS),
// a symlink a guest plants in the volume never reaches the host, and a VM with volumes is never
// saved (checkpoint and fork refused, saying why).
import { expect } from 'chai';
import { existsSync, lstatSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { vmVolumesUnsupported } from '../../../native/vm/volumes.js';
import { NodeVolumes, volumesUnsupported } from '../../../native/volumes/volumes.js';
import { skipWith } from '../../skip.js';

describe('native/vm volumes (QEMU, virtiofsd)', function () {
  this.timeout(900_000);
  let stateDir: string;
  let vm: VmRuntime;
  let vols: NodeVolumes;
  let source: string;
  const VOL = 'vmvol-test';

  const sh = async (id: string, script: string) => {
    const r = await vm.exec(id, { argv: ['sh', '-c', script] });
    return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
  };

  before(async function () {
    skipWith(
      this,
      !qemuInstalled()
        ? 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'
        : (vmVolumesUnsupported() ?? volumesUnsupported()),
    );
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmvol-'));
    vols = new NodeVolumes({ stateDir, mountBase: join(stateDir, 'mnt') });
    await vols.ensure(VOL, 16 * 1024 * 1024);
    source = vols.mountPoint(VOL);
    vm = new VmRuntime({ stateDir: join(stateDir, 'vm'), warmPool: 0 });
    await vm.start();
  });
  after(async () => {
    if (vm) {
      for (const s of await vm.list()) await vm.destroy(s.id).catch(() => undefined);
      await vm.close();
    }
    if (vols) await vols.remove(VOL).catch(() => undefined);
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('a volume written by one VM is read by the next, after the first is gone', async () => {
    await vm.create({ id: 'w', volumes: [{ source, mountPath: '/data' }] });
    const w = await sh(
      'w',
      'echo from-w > /data/f && mkdir -p /data/d && echo deep > /data/d/g && sync && cat /data/f',
    );
    expect(w, w.err).to.include({ code: 0, out: 'from-w\n' });
    await vm.destroy('w');
    // The world: the bytes are in the volume's file system on the host, the VM is gone.
    expect(readFileSync(join(source, 'f'), 'utf8')).to.equal('from-w\n');
    expect((await vm.list()).map((s) => s.id)).to.not.include('w');
    await vm.create({ id: 'r', volumes: [{ source, mountPath: '/mnt/vol' }] });
    const r = await sh('r', 'cat /mnt/vol/f /mnt/vol/d/g');
    expect(r, r.err).to.include({ code: 0, out: 'from-w\ndeep\n' });
    await vm.destroy('r');
  });

  it('a read-only volume refuses writes in the guest and on the host (a guest remount does not help)', async () => {
    await vm.create({ id: 'ro', volumes: [{ source, mountPath: '/data', readOnly: true }] });
    expect((await sh('ro', 'cat /data/f')).out).to.equal('from-w\n');
    const plain = await sh('ro', 'echo x > /data/new');
    expect(plain.code).to.not.equal(0);
    expect(plain.err).to.match(/Read-only file system/);
    // The guest is root: it remounts its side read-write. The host's virtiofsd still refuses.
    const remount = await sh('ro', 'mount -o remount,rw /data && grep " /data " /proc/mounts');
    expect(remount.code, remount.err).to.equal(0);
    expect(remount.out).to.match(/ rw[ ,]/);
    const after = await sh('ro', 'echo x > /data/new; echo rc=$?; rm -f /data/f; echo rm=$?');
    expect(after.out).to.match(/rc=1/);
    expect(after.out).to.match(/rm=1/);
    expect(existsSync(join(source, 'new'))).to.equal(false);
    expect(readFileSync(join(source, 'f'), 'utf8')).to.equal('from-w\n');
    await vm.destroy('ro');
  });

  it('a symlink a guest plants in the volume (to /, to a host path) never reaches the host', async () => {
    const secretDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmvol-host-'));
    const secret = join(secretDir, 'secret');
    writeFileSync(secret, 'host-only\n');
    try {
      await vm.create({ id: 'a', volumes: [{ source, mountPath: '/data' }] });
      const plant = await sh(
        'a',
        `ln -s / /data/root && ln -s ${secretDir} /data/hostdir && echo pwned > /data/root${secretDir}-w 2>/dev/null; ` +
          `cat /data/hostdir/secret; echo rc=$?; echo pwned > /data/hostdir/secret; ls /data/root/ | head -50`,
      );
      // Resolved in the guest: the host's directory is not there, and / is the guest's own.
      expect(plant.out).to.not.include('host-only');
      expect(plant.out).to.match(/rc=1/);
      expect(readFileSync(secret, 'utf8')).to.equal('host-only\n');
      expect(existsSync(`${secretDir}-w`)).to.equal(false);
      // Through `..` from the volume's root: the guest's / again, never the host's mount point's parent.
      const up = await sh('a', `ls /data/../../ && cat /data/../..${secret}; echo rc=$?`);
      expect(up.out).to.not.include('host-only');
      await vm.destroy('a');
      // The links are in the volume as links (the host never followed them), and a next VM sees them as such.
      expect(lstatSync(join(source, 'root')).isSymbolicLink()).to.equal(true);
      expect(readlinkSync(join(source, 'root'))).to.equal('/');
      await vm.create({ id: 'b', volumes: [{ source, mountPath: '/data' }] });
      const b = await sh('b', `cat /data/hostdir/secret; echo rc=$?; readlink /data/root`);
      expect(b.out).to.not.include('host-only');
      expect(b.out).to.match(/rc=1\n\/\n/);
      await vm.destroy('b');
    } finally {
      rmSync(secretDir, { recursive: true, force: true });
      rmSync(`${secretDir}-w`, { force: true });
    }
  });

  it('a VM with volumes is never saved: checkpoint, fork and a start from a checkpoint are refused, saying why', async () => {
    await vm.create({ id: 'c', volumes: [{ source, mountPath: '/data' }] });
    const refused = async (p: Promise<unknown>) => {
      const e = await p.then(
        () => undefined,
        (x: unknown) => x,
      );
      expect(e).to.be.instanceOf(RuntimeError);
      expect((e as RuntimeError).code).to.equal('Unsupported');
      return (e as RuntimeError).message;
    };
    expect(await refused(vm.checkpoint('c', 'ck1', { memory: true }))).to.match(/mounts volumes.*not migratable/);
    expect(await refused(vm.checkpoint('c', 'ck2'))).to.match(/mounts volumes/);
    expect(await refused(vm.fork('c', ['c-1']))).to.match(/fork: sandbox c mounts volumes/);
    expect(
      await refused(vm.create({ id: 'c2', source: { sandboxId: 'c' }, volumes: [{ source, mountPath: '/data' }] })),
    ).to.match(/cannot start from a checkpoint or a fork/);
    // Still running and still writing its volume.
    const w = await sh('c', 'echo still > /data/c && cat /data/c');
    expect(w.out).to.equal('still\n');
    await vm.destroy('c');
  });

  it('a volume over the workspace or over / is refused at create, and nothing runs', async () => {
    for (const mountPath of ['/', '/work', '/work/sub']) {
      const e = await vm.create({ id: 'bad', volumes: [{ source, mountPath }] }).then(
        () => undefined,
        (x: unknown) => x as RuntimeError,
      );
      expect(e?.code, mountPath).to.equal('InvalidPath');
    }
    expect((await vm.list()).map((s) => s.id)).to.not.include('bad');
  });
});
