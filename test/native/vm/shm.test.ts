// RAM files of the VM backend in /dev/shm (a template's boot, a fork, a conversion): named
// after the runtime's state directory, and those a crash left are removed by the next start()
// of that directory's runtime, never another's. No QEMU runs here (start() alone).
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { shmFile, shmPrefix } from '../../../native/vm/state.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';

describe('native/vm: RAM files a crash left in /dev/shm', function () {
  this.timeout(60_000);
  before(function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
  });

  it("start() removes its own state directory's, not another's; a planted directory or link stops nothing", async () => {
    const dirs = [0, 1].map(() => mkdtempSync(join(tmpdir(), 'fluxvm-shm-')));
    // What a crash in a fork leaves, for each of two state directories.
    const [mine, theirs] = dirs.map((d) => shmFile(d, 'fork')) as [string, string];
    writeFileSync(mine, 'x');
    writeFileSync(theirs, 'x');
    // What another local user can plant under this runtime's names (/dev/shm is everyone's):
    // a directory holding a file, and a symlink to a file of theirs.
    const planted = join(dirname(mine), `${shmPrefix(dirs[0]!)}planted-dir.ram`);
    const link = join(dirname(mine), `${shmPrefix(dirs[0]!)}planted-link.ram`);
    const target = join(dirs[1]!, 'victim');
    mkdirSync(planted);
    writeFileSync(join(planted, 'inside'), 'x');
    writeFileSync(target, 'keep');
    symlinkSync(target, link);
    const rt = new VmRuntime({ stateDir: dirs[0]!, warmPool: 0 });
    try {
      await rt.start();
      expect(existsSync(mine), 'this runtime left it').to.equal(false);
      expect(existsSync(theirs), 'another runtime may be using it').to.equal(true);
      // The start went on; the directory and what it holds stay, the link goes, its target stays.
      expect(existsSync(join(planted, 'inside')), 'a directory is never removed').to.equal(true);
      expect(existsSync(link), 'the symlink itself is unlinked').to.equal(false);
      expect(readFileSync(target, 'utf8'), 'never followed').to.equal('keep');
    } finally {
      await rt.close();
      for (const f of [mine, theirs, link]) rmSync(f, { force: true }); // also when a check failed
      rmSync(planted, { recursive: true, force: true });
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    }
  });
});
