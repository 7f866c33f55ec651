// The VM backend wherever the checkout is: a guest image in a directory
// QEMU's user cannot traverse (a clone under /root, a `mktemp -d`: mode 0700) boots, because
// the runtime stages the image into its state directory; a QEMU that cannot start fails the
// create at once with the first line of its error (not after a QMP timeout); an image the
// host does not have is refused. Real QEMU (TCG here); one template cold boot.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';

const BUILT_IMAGE = join(import.meta.dirname, '..', '..', '..', 'native', 'vm', 'build', 'image');

/** The image hack/vm-image.sh builds, copied into `dir` (built first when there is none). */
function copyImage(dir: string): void {
  if (!statSync(join(BUILT_IMAGE, 'image.json'), { throwIfNoEntry: false })) {
    const r = spawnSync(join(import.meta.dirname, '..', '..', '..', 'hack', 'vm-image.sh'), [], {
      encoding: 'utf8',
      timeout: 900_000,
    });
    if (r.status !== 0) throw new Error(`hack/vm-image.sh failed: ${r.stderr}`);
  }
  cpSync(BUILT_IMAGE, dir, { recursive: true });
}

async function rejection(p: Promise<unknown>): Promise<RuntimeError> {
  try {
    await p;
  } catch (e) {
    expect(e).to.be.instanceOf(RuntimeError);
    return e as RuntimeError;
  }
  throw new Error('expected a RuntimeError');
}

describe('native/vm from a private directory (0700 checkout)', function () {
  this.timeout(120_000);
  let priv: string;
  const runtimes: VmRuntime[] = [];

  before(function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    // Only root runs QEMU as another user (fluxvm-qemu); as anyone else QEMU can read what this process can.
    skipWith(
      this,
      process.getuid?.() === 0
        ? undefined
        : 'not root: QEMU runs as this user, so a private directory is no obstacle to it',
    );
    priv = mkdtempSync(join(tmpdir(), 'fluxvm-private-'));
    expect(statSync(priv).mode & 0o777).to.equal(0o700);
  });

  after(async () => {
    for (const rt of runtimes) {
      for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
      await rt.close();
    }
    if (priv) rmSync(priv, { recursive: true, force: true });
  });

  it('boots a VM whose image and state directory are inside a 0700 directory: the image is staged into the state directory', async function () {
    this.timeout(600_000);
    const img = join(priv, 'image');
    copyImage(img);
    const rt = new VmRuntime({ stateDir: join(priv, 'state'), imageDir: img, warmPool: 0 });
    runtimes.push(rt);
    await rt.start();
    const t0 = Date.now();
    const info = await rt.create({ id: 'private' });
    console.log(`      (created in ${Date.now() - t0} ms, template cold boot included)`);
    expect(info.state).to.equal('running');
    expect(
      (await rt.exec('private', { argv: ['sh', '-c', 'echo hi > /work/f && sync && cat /work/f'] })).stdout.toString(),
    ).to.equal('hi\n');
    // The QEMU user reads the image from the state directory (relative paths), not from `img`.
    const pid = (await rt.inspect('private')).pid!;
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    expect(cmd[cmd.indexOf('-kernel') + 1]).to.match(/^images\/[^/]+\/vmlinuz$/);
    expect(cmd.some((a) => a.includes(priv))).to.equal(false);
    const staged = readdirSync(join(priv, 'state', 'images'));
    expect(staged).to.have.length(1);
    expect(statSync(join(priv, 'state', 'images')).mode & 0o777).to.equal(0o711);
    // Hard links: no bytes copied on the same filesystem.
    expect(statSync(join(priv, 'state', 'images', staged[0]!, 'vmlinuz')).ino).to.equal(
      statSync(join(img, 'vmlinuz')).ino,
    );
    expect(rt.capabilities().images).to.deep.equal(['busybox']);
  });

  it("an image the host does not have is InvalidArgument reason ImageNotFound; the host's image by name works", async () => {
    const rt = runtimes[0]!;
    const e = await rejection(rt.create({ id: 'other-image', image: 'ubuntu:24.04' }));
    expect(e.code).to.equal('InvalidArgument');
    expect(e.reason).to.equal('ImageNotFound');
    expect(e.message).to.equal(
      'image "ubuntu:24.04" is not on this host (its VM images: busybox; leave the image out for that one)',
    );
    expect((await rt.list()).map((s) => s.id)).to.not.include('other-image');
    expect((await rt.create({ id: 'named-image', image: 'busybox' })).state).to.equal('running');
    expect((await rt.exec('named-image', { argv: ['true'] })).exitCode).to.equal(0);
  });

  it('a QEMU that exits on its own is reported at once (onInstanceStopped), not for a destroy; the VM revives', async () => {
    const rt = runtimes[0]!;
    const stopped: string[] = [];
    const seen: string[] = [];
    rt.onInstanceStopped((id) => {
      stopped.push(id);
      // What the reconciler's pass (which the listener enqueues) reads: stopped, so it revives.
      void rt.inspect(id).then((i) => seen.push(i.state));
    });
    const pid = (await rt.inspect('private')).pid!;
    const t0 = Date.now();
    process.kill(pid, 'SIGKILL');
    await eventually(() => stopped.length > 0, 5000, 'the stop to be told');
    expect(stopped).to.deep.equal(['private']);
    await eventually(() => seen.length > 0, 5000, 'the state at the time told');
    expect(seen, 'told only once QEMU is gone').to.deep.equal(['stopped']);
    console.log(`      (told ${Date.now() - t0} ms after the kill)`);
    expect((await rt.inspect('private')).state).to.equal('stopped');
    expect((await rt.inspect('private', { revive: true })).state).to.equal('running');
    expect((await rt.exec('private', { argv: ['cat', '/work/f'] })).stdout.toString()).to.equal('hi\n');
    // Killed while on idle standby (its guest stopped): revived running, not on standby.
    await rt.standby('private');
    expect((await rt.inspect('private')).standby).to.equal(true);
    process.kill((await rt.inspect('private')).pid!, 'SIGKILL');
    await eventually(() => stopped.length > 1, 5000, 'the second stop to be told');
    const back = await rt.inspect('private', { revive: true });
    expect(back.state).to.equal('running');
    expect(back.standby, 'the revived VM runs').to.equal(undefined);
    expect((await rt.exec('private', { argv: ['cat', '/work/f'] })).stdout.toString()).to.equal('hi\n');
    await rt.destroy('named-image');
    // A fixed window on purpose: a destroy must not be reported as a stop (no event says "not").
    await new Promise((r) => setTimeout(r, 300));
    expect(stopped, 'a destroy is not reported').to.deep.equal(['private', 'private']);
  });

  it('a QEMU that cannot start (its disk image is not a qcow2) fails the create within seconds with the first line of its error', async function () {
    this.timeout(60_000);
    const img = join(priv, 'broken');
    copyImage(img);
    writeFileSync(join(img, 'disk.qcow2'), 'not a disk image\n');
    const j = JSON.parse(readFileSync(join(img, 'image.json'), 'utf8'));
    writeFileSync(join(img, 'image.json'), JSON.stringify({ ...j, hash: `${j.hash}-broken` }));
    const rt = new VmRuntime({ stateDir: mkdtempSync(join(priv, 'state-')), imageDir: img, warmPool: 0 });
    runtimes.push(rt);
    await rt.start();
    const t0 = Date.now();
    const e = await rejection(rt.create({ id: 'broken' }));
    const ms = Date.now() - t0;
    expect(e.reason, e.message).to.equal('QemuFailed');
    expect(e.message).to.match(
      /^qemu could not start \(exit 1\): -drive id=disk,.*: Could not open backing file: .*Image is not in qcow2 format$/,
    );
    expect(e.message).to.not.include('\n');
    expect(ms, 'failed within seconds, not after a QMP timeout').to.be.below(8000);
    expect(await rt.list()).to.deep.equal([]);
  });
});
