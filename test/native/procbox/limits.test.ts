// Default limits: a sandbox without resources is bounded in pids, memory (tmpfs
// included), CPU weight and workspace disk (bytes and inodes), each enforced by the kernel;
// the host keeps its free memory and disk. The real defaults are read back from the cgroup
// files, the tmpfs mounts and the btrfs qgroup; the attacks run against small defaults given
// through the runtime option (the real ones would take minutes to exhaust).
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, statfsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { detectCgroups } from '../../../native/procbox/cgroups.js';
import { DEFAULT_LIMITS } from '../../../native/procbox/procbox.js';
import { skipWith } from '../../skip.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

const MiB = 1024 * 1024;
const cg = detectCgroups();

function cgFile(fx: Fixture, ctl: 'memory' | 'pids' | 'cpu', id: string, file: string): string {
  return readFileSync(join(cg.v1[ctl]!, 'fluxvm', fx.rt.hostKey(id), file), 'utf8').trim();
}

/** MemAvailable of the host, bytes. */
function hostMemAvailable(): number {
  return Number(/MemAvailable:\s+(\d+) kB/.exec(readFileSync('/proc/meminfo', 'utf8'))![1]) * 1024;
}

/**
 * The limit (max_rfer, bytes) of qgroup `id` (e.g. 1/123) of the btrfs filesystem at `mnt`, and its member subvolumes'
 * paths.
 */
function qgroup(mnt: string, id: string): { limit: number; members: string[] } {
  const out = execFileSync('btrfs', ['qgroup', 'show', '-re', '-c', '--raw', mnt], { encoding: 'utf8' });
  // Columns: id, referenced, exclusive, max referenced, max exclusive, child, path.
  const line = out.split('\n').find((l) => l.startsWith(`${id} `))!;
  const f = line.trim().split(/\s+/);
  // The group's Child column names its member subvolumes' qgroups (0/<subvolume id>).
  const kids = new Set(f[5]!.split(','));
  const members = out
    .split('\n')
    .filter((l) => kids.has(l.split(/\s+/)[0]!))
    .map((l) => l.trim().split(/\s+/).pop()!);
  return { limit: Number(f[3]), members };
}

describe('procbox default limits', function () {
  this.timeout(120_000);
  let fx: Fixture;

  before(function () {
    skipWith(this, skipReason());
    skipWith(
      this,
      cg.v1.memory && cg.v1.pids && cg.v1.cpu
        ? undefined
        : 'the tests read cgroup v1 memory, pids and cpu files (this host layout)',
    );
  });

  afterEach(async () => {
    await fx?.cleanup();
  });

  it('a plain create gets the real defaults: pids 1024, memory 2 GiB, cpu weight 100, tmpfs half the memory, disk 10 GiB', async function () {
    fx = await makeRuntime();
    skipWith(this, fx.rt.volumeStore().quota ? undefined : `no disk quota here: ${fx.rt.volumeStore().reason}`);
    const info = await fx.rt.create({ id: 'plain' });
    expect(info.limits).to.deep.equal({
      memoryBytes: 2 * 1024 ** 3,
      pids: 1024,
      cpuWeight: 100,
      diskBytes: 10 * 1024 ** 3,
      tmpfsBytes: 1024 ** 3,
    });
    expect(DEFAULT_LIMITS).to.deep.equal({
      memoryBytes: 2 * 1024 ** 3,
      pids: 1024,
      cpuWeight: 100,
      diskBytes: 10 * 1024 ** 3,
    });
    expect(cgFile(fx, 'memory', 'plain', 'memory.limit_in_bytes')).to.equal(String(2 * 1024 ** 3));
    expect(cgFile(fx, 'pids', 'plain', 'pids.max')).to.equal('1024');
    expect(cgFile(fx, 'cpu', 'plain', 'cpu.shares')).to.equal('1024');
    // The processes of a command really are in those cgroups.
    const r = await sh(fx.rt, 'plain', 'cat /proc/self/cgroup; grep -E " /(tmp|dev/shm) " /proc/mounts');
    expect(r.code).to.equal(0);
    expect(r.out).to.match(/:memory:\/\n|:memory:\/$/m); // cgroup namespace root = the sandbox's cgroup
    for (const m of ['/tmp', '/dev/shm'])
      expect(r.out).to.match(new RegExp(` ${m} tmpfs [^ ]*size=${1024 * 1024}k`), m);
    const rec = JSON.parse(
      readFileSync(join(fx.stateDir, 'procbox', 'sandboxes', 'plain', 'sandbox.json'), 'utf8'),
    ) as { vol: string; qgroup: number };
    const g = qgroup(fx.rt.volumeStore().dir, `1/${rec.qgroup}`);
    expect(g.limit).to.equal(10 * 1024 ** 3);
    expect(g.members).to.deep.equal([`vols/${rec.vol}`]); // the writable layer is in the sandbox's group
    expect(fx.rt.capabilities().limits.disk).to.equal(true);
  });

  it('resources override the defaults per sandbox; fork children keep their parent limits', async () => {
    fx = await makeRuntime({ defaultLimits: { pids: 300 } });
    const info = await fx.rt.create({ id: 'own', resources: { pids: 77, memoryBytes: 256 * MiB, cpuWeight: 50 } });
    expect(info.limits).to.include({ pids: 77, memoryBytes: 256 * MiB, cpuWeight: 50, tmpfsBytes: 128 * MiB });
    expect(cgFile(fx, 'pids', 'own', 'pids.max')).to.equal('77');
    expect(cgFile(fx, 'cpu', 'own', 'cpu.shares')).to.equal('512');
    const { children } = await fx.rt.fork('own', ['own-child']);
    expect(children[0]!.limits).to.deep.equal(info.limits);
    expect(cgFile(fx, 'pids', 'own-child', 'pids.max')).to.equal('77');
    expect((await fx.rt.create({ id: 'dflt' })).limits!.pids).to.equal(300);
    const bad = await fx.rt.create({ id: 'bad', resources: { pids: -1 } }).catch((e: Error) => e);
    expect(bad).to.be.instanceOf(Error).with.property('code', 'InvalidArgument');
    expect((await fx.rt.list()).map((s) => s.id)).to.not.include('bad');
  });

  it('without the disk quota (diskQuota: false) the other limits stay and status says there is no disk limit', async () => {
    fx = await makeRuntime({ diskQuota: false });
    expect(fx.rt.volumeStore()).to.include({ quota: false, reason: 'disk quota disabled by the runtime options' });
    expect(fx.rt.capabilities().limits.disk).to.equal(false);
    const info = await fx.rt.create({ id: 'nq', resources: { diskBytes: 1 << 30 } });
    expect(info.limits).to.deep.equal({
      memoryBytes: 2 * 1024 ** 3,
      pids: 1024,
      cpuWeight: 100,
      tmpfsBytes: 1024 ** 3,
    });
    expect((await sh(fx.rt, 'nq', 'echo x > /work/x && cat /work/x')).out).to.equal('x\n');
  });

  it('fork bomb: stopped at the default pids limit; the host process count is back after', async () => {
    fx = await makeRuntime({ defaultLimits: { pids: 64 } });
    await fx.rt.create({ id: 'bomb' });
    const hostPids = () => readdirCount('/proc');
    const before = hostPids();
    // 500 background sleepers (detached from the exec's pipes); forks past 64 tasks fail.
    const r = await sh(
      fx.rt,
      'bomb',
      'for i in $(seq 500); do sleep 60 >/dev/null 2>&1 & done; echo all forked',
      60_000,
    );
    expect(r.out).to.not.include('all forked');
    expect(r.err).to.match(/fork/i); // the shell's fork failed (and dash gives up)
    const inside = Number(cgFile(fx, 'pids', 'bomb', 'pids.current'));
    expect(inside).to.be.at.most(64);
    expect(inside).to.be.at.least(50); // it did fork up to the limit
    expect(cgFile(fx, 'pids', 'bomb', 'pids.events')).to.match(/max [1-9]/);
    await fx.rt.destroy('bomb');
    expect(hostPids()).to.be.below(before + 20);
  });

  it('memory hog: OOM-killed at the default memory limit; the host keeps its free memory', async () => {
    fx = await makeRuntime({ defaultLimits: { memoryBytes: 64 * MiB } });
    await fx.rt.create({ id: 'hog' });
    const before = hostMemAvailable();
    // perl grows one string to 1 GiB.
    const r = await fx.rt.exec('hog', {
      argv: ['perl', '-e', '$x = "a" x (1024*1024*1024); print length($x)'],
      timeoutMs: 60_000,
    });
    expect(r.oomKilled).to.equal(true);
    expect(r.exitCode).to.equal(137);
    expect(Number(cgFile(fx, 'memory', 'hog', 'memory.max_usage_in_bytes'))).to.be.at.most(64 * MiB);
    // A hog that escaped would take the host's 1 GiB; the margin is for the rest of a busy host (other test
    // suites took 150 MiB meanwhile in a loaded run).
    expect(hostMemAvailable()).to.be.above(before - 512 * MiB);
    // The sandbox itself survives its OOM kill.
    expect((await sh(fx.rt, 'hog', 'echo alive')).out).to.equal('alive\n');
  });

  it('tmpfs fill: /tmp and /dev/shm stop at their size; their pages are charged to the sandbox memory', async () => {
    fx = await makeRuntime({ defaultLimits: { memoryBytes: 64 * MiB } });
    await fx.rt.create({ id: 'tmpfill' });
    const r = await sh(
      fx.rt,
      'tmpfill',
      'dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; echo rc=$?; dd if=/dev/zero of=/dev/shm/fill bs=1M count=200 2>&1; echo rc=$?; du -k /tmp/fill /dev/shm/fill',
    );
    expect(r.out).to.match(/No space left on device/);
    expect(r.out).to.not.match(/rc=0/);
    const kib = r.out
      .trim()
      .split('\n')
      .slice(-2)
      .map((l) => Number(l.split(/\s+/)[0]));
    for (const k of kib) expect(k).to.be.at.most(32 * 1024);
    expect(kib[0]! + kib[1]!).to.be.above(40 * 1024); // both really filled up
    // The pages stay charged to the sandbox's memory cgroup, not to the host.
    expect(Number(cgFile(fx, 'memory', 'tmpfill', 'memory.usage_in_bytes'))).to.be.at.least(
      kib[0]! * 1024 + kib[1]! * 1024 - 4 * MiB,
    );
    // What the host gives up is bounded by the sandbox's limit (measured there, not as the host's
    // available memory, which other processes move meanwhile: a loaded run's).
    expect(Number(cgFile(fx, 'memory', 'tmpfill', 'memory.limit_in_bytes'))).to.equal(64 * MiB);
  });

  it('disk fill: writing past the workspace quota fails with EDQUOT inside; the host keeps its free space', async function () {
    fx = await makeRuntime({ defaultLimits: { diskBytes: 64 * MiB } });
    skipWith(this, fx.rt.volumeStore().quota ? undefined : `no disk quota here: ${fx.rt.volumeStore().reason}`);
    await fx.rt.create({ id: 'diskfill' });
    // Workspaces live in the volume store, a btrfs image allocated whole when it was made (the
    // host cannot lose more than the image); what one sandbox may take of it is what the store's
    // used space grows by. (The host's free space would also count other processes' writes
    // meanwhile: a loaded run's.)
    const vs = fx.rt.volumeStore();
    const image = join(fx.stateDir, 'procbox', 'workspaces.img');
    const imageBlocks = statSync(image).blocks;
    const used = () => {
      const st = statfsSync(vs.dir);
      return (st.blocks - st.bfree) * st.bsize;
    };
    const before = used();
    const r = await sh(
      fx.rt,
      'diskfill',
      'dd if=/dev/zero of=/work/big bs=1M count=1024 conv=fsync 2>&1; echo rc=$?; sync; du -k /work/big',
      120_000,
    );
    expect(r.out).to.match(/Disk quota exceeded/);
    expect(r.out).to.not.match(/rc=0/);
    const kib = Number(r.out.trim().split('\n').pop()!.split(/\s+/)[0]);
    expect(kib).to.be.at.most(64 * 1024);
    expect(kib).to.be.above(32 * 1024);
    // 1 GiB was asked for: at most the quota (and slack for btrfs's metadata) was taken.
    expect(used() - before, 'bytes the volume store lost').to.be.below(64 * MiB + 32 * MiB);
    expect(statSync(image).blocks, "the image's blocks on the host").to.equal(imageBlocks);
    // Deleting frees the quota again.
    expect(
      (
        await sh(
          fx.rt,
          'diskfill',
          'rm /work/big && sync && dd if=/dev/zero of=/work/again bs=1M count=16 2>&1 && echo ok',
        )
      ).out,
    ).to.match(/ok\n$/);
  });

  it('the quota is per sandbox: its frozen layers count after a checkpoint; a fork child has its own', async function () {
    fx = await makeRuntime({ defaultLimits: { diskBytes: 32 * MiB } });
    skipWith(this, fx.rt.volumeStore().quota ? undefined : `no disk quota here: ${fx.rt.volumeStore().reason}`);
    await fx.rt.create({ id: 'q' });
    expect((await sh(fx.rt, 'q', 'dd if=/dev/zero of=/work/first bs=1M count=20 conv=fsync 2>&1')).code).to.equal(0);
    await fx.rt.checkpoint('q', 'q-ck'); // /work/first is in a frozen layer now
    await fx.rt.fork('q', ['q-kid']); // another mark of q; the child's writable layer is its own
    const kib = (out: string) => Number(out.trim().split('\n').pop()!.split(/\s+/)[0]);
    const r = await sh(fx.rt, 'q', 'dd if=/dev/zero of=/work/second bs=1M count=128 2>&1; sync; du -k /work/second');
    expect(r.out).to.match(/Disk quota exceeded/);
    expect(kib(r.out)).to.be.at.most(13 * 1024); // 32 MiB less the 20 of the frozen layer
    expect(kib(r.out)).to.be.at.least(4 * 1024);
    const k = await sh(fx.rt, 'q-kid', 'dd if=/dev/zero of=/work/big bs=1M count=128 2>&1; sync; du -k /work/big');
    expect(k.out).to.match(/Disk quota exceeded/);
    expect(kib(k.out)).to.be.above(24 * 1024); // the child's own 32 MiB (the shared layer is the parent's)
    expect(kib(k.out)).to.be.at.most(32 * 1024);
    await fx.rt.deleteCheckpoint('q-ck');
  });

  it('inode exhaustion: creating empty files stops at the same quota', async function () {
    fx = await makeRuntime({ defaultLimits: { diskBytes: 8 * MiB } });
    skipWith(this, fx.rt.volumeStore().quota ? undefined : `no disk quota here: ${fx.rt.volumeStore().reason}`);
    await fx.rt.create({ id: 'inodes' });
    // A shell builtin redirect per file (no fork): fast enough to reach the bound. Without a
    // quota this would go on to the cap of 2 million files.
    // (`true`, not `:`: a failed redirection of a special builtin ends the shell.)
    const r = await sh(
      fx.rt,
      'inodes',
      'cd /work && i=0; while [ $i -lt 2000000 ] && true > f$i; do i=$((i+1)); done; echo $i',
      120_000,
    );
    expect(Number(r.out)).to.be.below(2_000_000);
    expect(Number(r.out)).to.be.above(1000);
    expect(r.err).to.match(/Disk quota exceeded/);
  });
});

function readdirCount(dir: string): number {
  return readdirSync(dir).filter((n) => /^\d+$/.test(n)).length;
}
