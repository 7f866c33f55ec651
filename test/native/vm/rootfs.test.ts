// The guest image with the Debian root filesystem (python3, git). Building it needs the
// Debian mirror and a few minutes (hack/vm-image.sh --rootfs), so this runs only when that
// image is already built, or when FLUXVM_TEST_ROOTFS=1 asks for the build.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { VmRuntime } from '../../../native/vm/vm.js';

const ROOT = new URL('../../../', import.meta.url).pathname;
const IMAGE = join(ROOT, 'native/vm/build/image-rootfs');
const HAVE_QEMU = spawnSync('qemu-system-x86_64', ['--version']).status === 0;

describe('native/vm VM with the Debian root filesystem', function () {
  this.timeout(120_000);
  let rt: VmRuntime;
  let stateDir: string;

  before(async function () {
    if (!HAVE_QEMU) {
      console.log('    skipped: qemu-system-x86_64 not installed (run hack/setup.sh)');
      this.skip();
    }
    if (!existsSync(join(IMAGE, 'image.json')) && process.env.FLUXVM_TEST_ROOTFS !== '1') {
      console.log(
        '    skipped: no rootfs image (build it with hack/vm-image.sh --rootfs, or set FLUXVM_TEST_ROOTFS=1)',
      );
      this.skip();
    }
    this.timeout(900_000);
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-rootfs-'));
    // Without imageDir the runtime runs hack/vm-image.sh --rootfs, which rebuilds only when an input changed.
    rt = new VmRuntime({ stateDir, rootfs: true, warmPool: 0 });
    await rt.start();
    await rt.create({ id: 'deb' });
  });

  after(async () => {
    if (!rt) return;
    await rt.destroy('deb').catch(() => undefined);
    await rt.close();
    for (const p of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
      try {
        if (readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(stateDir)) process.kill(Number(p), 'SIGKILL');
      } catch {
        // gone
      }
    }
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('has sh, coreutils, python3 and git, and the workspace on its own disk', async () => {
    const r = await rt.exec('deb', {
      argv: [
        'sh',
        '-c',
        'python3 -c "print(6*7)" && git init -q . && echo hi > a && git add a && git -c user.email=a@b -c user.name=n commit -qm first && git log --format=%s && /usr/bin/stat -c %m /work',
      ],
    });
    expect(r.exitCode, r.stderr.toString()).to.equal(0);
    expect(r.stdout.toString()).to.equal('42\nfirst\n/work\n');
  });

  it('keeps writes outside the workspace private to the guest (tmpfs overlay root)', async () => {
    await rt.writeFile('deb', '/etc/fluxvm-test', Buffer.from('x'));
    expect((await rt.readFile('deb', '/etc/fluxvm-test')).toString()).to.equal('x');
    const r = await rt.exec('deb', { argv: ['sh', '-c', 'grep " / " /proc/mounts | cut -d" " -f3'] });
    expect(r.stdout.toString().trim()).to.equal('overlay');
  });
});
