// A full host disk under the workspace volume (docs/decisions/0008-full-host-disk.md), on a state directory of
// the test's own (a 512 MiB tmpfs): the volume grows while the host has room; once the disk is
// full (a file beside it fills it), a sandbox that writes more gets ENOSPC at write time, never
// EIO; what every sandbox wrote before is still there (also after a
// restart); the other sandbox keeps working; deleting the writer gives the space back to the
// host and writes resume. And the image is never sparse.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync, statfsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import { fillToTheBrim, mountTmpfs, unmountTmpfs } from '../../fulldisk.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { sh, skipReason } from './fixture.js';

const MiB = 1024 * 1024;
const hostFree = (dir: string) => {
  const st = statfsSync(dir);
  return st.bavail * st.bsize;
};

describe('procbox: a full host disk under the workspace volume', function () {
  this.timeout(240_000);
  let dir: string | undefined;
  let rt: ProcboxRuntime | undefined;

  before(async function () {
    skipWith(this, skipReason());
    const m = mountTmpfs('512m');
    skipWith(this, m.why);
    dir = m.dir!;
    rt = new ProcboxRuntime({ stateDir: dir });
    await rt.start();
    skipWith(this, rt.volumeStore().quota ? undefined : `no btrfs volume store here: ${rt.volumeStore().reason}`);
  });
  after(async () => {
    if (rt) {
      for (const s of await rt.list().catch(() => [])) await rt.destroy(s.id).catch(() => undefined);
      await rt.close();
    }
    if (dir) unmountTmpfs(dir);
  });

  const image = () => join(dir!, 'procbox', 'workspaces.img');
  const files = (n: number, tag: string) => `for i in $(seq 1 ${n}); do echo ${tag}-$i > /work/${tag}$i; done; sync`;
  const check = (n: number, tag: string) => `for i in $(seq 1 ${n}); do cat /work/${tag}$i; done`;
  const expected = (n: number, tag: string) => Array.from({ length: n }, (_, i) => `${tag}-${i + 1}\n`).join('');

  it('the image is fully allocated on the host and btrfs does not discard into it', () => {
    const st = statSync(image());
    expect(st.blocks * 512, 'allocated bytes of the image').to.be.at.least(st.size);
    const line = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .find((l) => l.split(' ')[4] === rt!.volumeStore().dir)!;
    expect(line, 'the volume is mounted').to.be.a('string');
    expect(line.split(' - ')[1]).to.not.match(/discard/);
  });

  it('the volume grows with what a sandbox writes, while the host has room', async () => {
    await rt!.create({ id: 'writer' });
    const size0 = statSync(image()).size;
    // 300 MiB, paced like a build writing its output (the volume grows between the polls).
    const w = await sh(
      rt!,
      'writer',
      'for i in $(seq 1 30); do dd if=/dev/zero of=/work/g$i bs=1M count=10 2>&1 || exit 1; sleep 0.1; done; echo done',
      120_000,
    );
    expect(w.out).to.match(/done\n$/);
    expect(statSync(image()).size, `grown from ${size0}`).to.be.above(300 * MiB);
    expect(statSync(image()).blocks * 512, 'still fully allocated').to.be.at.least(statSync(image()).size);
  });

  it('a write past the disk fails with ENOSPC in the sandbox; nothing written before is lost; the other sandbox keeps working', async () => {
    await rt!.create({ id: 'other' });
    expect((await sh(rt!, 'other', files(50, 'o'))).code).to.equal(0);
    expect((await sh(rt!, 'writer', files(50, 'w'))).code).to.equal(0);
    // The rest of the state directory fills the disk (checkpoints, logs, the database...).
    fillToTheBrim(join(dir!, 'brim'));
    const big = await sh(
      rt!,
      'writer',
      'dd if=/dev/zero of=/work/big bs=1M count=1024 conv=fsync 2>&1; echo rc=$?',
      120_000,
    );
    expect(big.out, 'the write fails at write time').to.match(/No space left on device/);
    expect(big.out).to.not.match(/Input\/output error/);
    expect(big.out).to.match(/rc=1/);
    // What the sandbox wrote before, and what it could write, committed: the writeback of a
    // sparse image on a full disk failed here (and btrfs turned read-only, EIO for every sandbox).
    const synced = await sh(rt!, 'writer', 'sync /work/w1 2>&1; echo x > /work/after 2>&1; sync 2>&1; echo rc=$?');
    expect(synced.out, synced.out).to.not.match(/Input\/output error/);
    // btrfs recorded no failed write.
    expect(execFileSync('btrfs', ['device', 'stats', rt!.volumeStore().dir], { encoding: 'utf8' })).to.not.match(
      /errs\s+[1-9]/,
    );
    expect((await sh(rt!, 'writer', check(50, 'w'))).out).to.equal(expected(50, 'w'));
    // A new file: written, or refused with ENOSPC while the disk is full; never an I/O error.
    const other = await sh(
      rt!,
      'other',
      `${check(50, 'o')}; ls /work | wc -l; (echo hi > /work/hi.txt) 2>&1; echo rc=$?`,
    );
    expect(other.err).to.equal('');
    expect(other.out).to.not.match(/Input\/output error/);
    expect(other.out.startsWith(`${expected(50, 'o')}50\n`), other.out).to.equal(true);
    expect(other.out.slice(-200)).to.match(/(\nrc=0|No space left on device\nrc=[12])\n$/);
    expect((await rt!.readFile('other', '/work/o7')).toString()).to.equal('o-7\n');
  });

  it('deleting the writer gives its space back to the host; writes resume; a restart keeps every file', async () => {
    const before = hostFree(dir!);
    await rt!.destroy('writer');
    await eventually(
      () => hostFree(dir!) > before + 100 * MiB,
      30_000,
      'the host to get the space of the deleted sandbox back',
    );
    expect(statSync(image()).blocks * 512).to.be.at.least(statSync(image()).size);
    const w = await sh(rt!, 'other', 'dd if=/dev/zero of=/work/ten bs=1M count=10 conv=fsync 2>&1 && echo ok');
    rmSync(join(dir!, 'brim'));
    expect(w.out).to.match(/ok\n$/);
    await rt!.close();
    rt = new ProcboxRuntime({ stateDir: dir! });
    await rt.start();
    expect((await sh(rt, 'other', check(50, 'o'))).out).to.equal(expected(50, 'o'));
  });
});
