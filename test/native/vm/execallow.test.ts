// The exec allow-list inside a real guest (agent/confine.c step 4, native/vm/confine.ts):
// on the Debian image, allowed programs run and nothing else does, also through the dynamic
// loader run as a program (`ld-linux... /usr/bin/ls`), a copy in the workspace or /tmp, or an
// anonymous file (memfd_create, execveat); resolveExecutables answers what the guest resolved.
// On the busybox image every program is /bin/sh's binary, so an allow-list is refused at create.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';

const ROOT = new URL('../../../', import.meta.url).pathname;
const ROOTFS = join(ROOT, 'native/vm/build/image-rootfs');
const LOADER = '/lib64/ld-linux-x86-64.so.2';

describe('native/vm: the exec allow-list in the guest (QEMU)', function () {
  this.timeout(900_000);
  let rt: VmRuntime;
  let stateDir: string;
  const sh = (script: string) => rt.exec('ea', { argv: ['sh', '-c', script], timeoutMs: 120_000 });

  before(async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    skipWith(
      this,
      existsSync(join(ROOTFS, 'image.json'))
        ? undefined
        : 'no Debian rootfs image (build it with flock /tmp/build.lock make vm-images)',
    );
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-execallow-'));
    rt = new VmRuntime({ stateDir, rootfs: true, warmPool: 0 });
    await rt.start();
    await rt.create({ id: 'ea', confinement: { execAllow: ['python3', 'no-such-program'] } });
  });
  after(async () => {
    if (!rt) return;
    for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
    await rt.close();
    for (const p of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
      try {
        if (readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(stateDir)) process.kill(Number(p), 'SIGKILL');
      } catch {
        // gone
      }
    }
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('says it enforces an allow-list on the Debian image, and resolveExecutables answers what the guest found', async () => {
    expect(rt.capabilities().confinement?.execAllowlist).to.equal(true);
    const r = await rt.resolveExecutables('ea');
    expect(r.programs.map((p) => p.name)).to.deep.equal(['python3']);
    expect(r.programs[0]!.realPath).to.match(/^\/usr\/bin\/python3\.\d+$/);
    expect(r.missing).to.deep.equal(['no-such-program']);
    expect(r.implied.map((p) => p.path)).to.include('/usr/bin/dash');
  });

  it('an allowed program runs; another does not, directly or through the dynamic loader', async () => {
    const ok = await rt.exec('ea', { argv: ['python3', '-c', 'print(6*7)'] });
    expect(ok.stdout.toString(), ok.stderr.toString()).to.equal('42\n');
    const ls = await sh(`ls / ; echo "ls=$?"; ${LOADER} /usr/bin/ls / ; echo "loader=$?"`);
    const out = ls.stdout.toString();
    expect(out, ls.stderr.toString()).to.match(/ls=12[67]/);
    expect(out).to.match(/loader=(?!0\n)\d+/);
    expect(out).to.not.include('usr');
  });

  it('a copy in the workspace or /tmp, and an anonymous file, do not run', async () => {
    const script = [
      'import shutil, subprocess, os, errno',
      "for d in ['/work', '/tmp']:",
      "    p = os.path.join(d, 'copied-ls')",
      "    shutil.copy('/usr/bin/ls', p); os.chmod(p, 0o755)",
      `    for argv in ([p, '/'], ['${LOADER}', p, '/']):`,
      '        try:',
      "            print('ran' if subprocess.run(argv, capture_output=True).returncode == 0 else 'refused', flush=True)",
      '        except OSError:',
      "            print('refused', flush=True)",
      'try:',
      "    os.memfd_create('x'); print('memfd made', flush=True)",
      'except OSError as e:',
      "    print('memfd', errno.errorcode[e.errno], flush=True)",
    ].join('\n');
    const r = await rt.exec('ea', { argv: ['python3', '-c', script] });
    expect(r.stdout.toString().trim().split('\n'), r.stderr.toString()).to.deep.equal([
      'refused',
      'refused',
      'refused',
      'refused',
      'memfd EPERM',
    ]);
  });

  it('on the busybox image an allow-list is refused at create, naming the field, and nothing is made', async () => {
    const bb = new VmRuntime({ stateDir: join(stateDir, 'bb'), warmPool: 0 });
    try {
      await bb.start();
      expect(bb.capabilities().confinement?.execAllowlist).to.equal(false);
      const e = await bb.create({ id: 'bb', confinement: { execAllow: ['python3'] } }).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(e).to.be.instanceOf(RuntimeError);
      expect((e as RuntimeError).code).to.equal('Unsupported');
      expect((e as Error).message).to.include('confinement.execAllow');
      expect(await bb.list()).to.deep.equal([]);
    } finally {
      await bb.close();
    }
  });
});
