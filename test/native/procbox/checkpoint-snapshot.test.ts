// procbox disk checkpoints on btrfs volumes: the layer freeze is a snapshot of the writable
// volume (checkpoint.ts freezeBySnapshot). The running sandbox is left as it was: no workspace
// remount (no helper `remount` run), the same record (volume, stack, work generation) and the
// same mount in its init, a writer started before keeps writing; the checkpoint restores
// byte-for-byte, also after more points.
import { expect } from 'chai';
import { existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { overlayAt } from '../../../native/procbox/mountinfo.js';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import { freezeCounts } from '../../../native/procbox/checkpoint.js';
import type { CheckpointRecord, LayerMeta, SandboxRecord } from '../../../native/procbox/state.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

describe('procbox checkpoint: btrfs snapshot freeze', function () {
  this.timeout(120_000);
  let fx: Fixture;
  before(function () {
    skipWith(this, skipReason());
  });
  beforeEach(async function () {
    fx = await makeRuntime();
    if (!fx.rt.volumeStore().quota) this.skip(); // no btrfs volume store: checkpoints are marks
    await fx.rt.create({ id: 'a' });
  });
  afterEach(async () => fx?.cleanup());

  const record = () =>
    JSON.parse(readFileSync(join(fx.stateDir, 'procbox', 'sandboxes', 'a', 'sandbox.json'), 'utf8')) as SandboxRecord;
  const mounted = async () => {
    const pid = (await fx.rt.inspect('a')).pid!;
    return overlayAt(readFileSync(`/proc/${pid}/mountinfo`, 'utf8'), '/work');
  };

  it('leaves the running sandbox as it was (no remount, same record and mount) and restores byte-for-byte', async () => {
    const pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    const runs: string[] = [];
    const run = pb.fileops.run.bind(pb.fileops);
    pb.fileops.run = (args, input) => {
      runs.push(args[0]!);
      return run(args, input);
    };
    // A background writer keeps a workspace file open for writing: a mark would be Busy, and
    // after a remount its writes would fail (its mount read-only).
    const w = await sh(
      fx.rt,
      'a',
      'head -c 100000 /dev/urandom > /work/r; printf one > /work/f; mkdir /work/d; echo x > /work/d/g; ' +
        '(exec 3>>/work/held; while :; do echo h >&3 || exit; sleep 0.05; done) >/dev/null 2>&1 &',
    );
    expect(w.code).to.equal(0);
    const r0 = (await sh(fx.rt, 'a', 'sha256sum /work/r')).out;
    const rec0 = record();
    const mount0 = await mounted();
    for (let i = 1; i <= 3; i++) {
      const ck = await fx.rt.checkpointDeferred('a', `ck${i}`);
      await ck.sync();
      expect((await sh(fx.rt, 'a', `printf ${i} >> /work/f`)).code).to.equal(0);
    }
    expect(
      runs.filter((r) => r === 'remount'),
      'workspace remounts by 3 checkpoints',
    ).to.deep.equal([]);
    expect(record()).to.deep.include({ vol: rec0.vol, layers: rec0.layers, gen: rec0.gen });
    expect(await mounted()).to.deep.equal(mount0);
    const n = (await fx.rt.readFile('a', '/work/held')).length;
    await eventually(
      async () => (await fx.rt.readFile('a', '/work/held')).length > n,
      10_000,
      'the writer started before the checkpoints to write on (/work/held to grow)',
    );
    expect((await sh(fx.rt, 'a', 'cat /work/f; rm -r /work/d /work/r')).out).to.equal('one123');
    await fx.rt.restore('a', 'ck2');
    expect((await sh(fx.rt, 'a', 'cat /work/f /work/d/g; sha256sum /work/r')).out).to.equal(`one1x\n${r0}`);
    await fx.rt.restore('a', 'ck1');
    expect((await sh(fx.rt, 'a', 'cat /work/f')).out).to.equal('one');
  });

  it('a snapshot of an upper over 1000 entries is followed by a mark (a fresh upper), then snapshots again', async () => {
    const pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    const remounts: number[] = [];
    const run = pb.fileops.run.bind(pb.fileops);
    pb.fileops.run = (args, input) => {
      if (args[0] === 'remount') remounts.push(1);
      return run(args, input);
    };
    expect(
      (await sh(fx.rt, 'a', 'mkdir /work/n && cd /work/n && for f in $(seq 1001); do : > $f; done')).code,
    ).to.equal(0);
    const per: number[] = [];
    for (let i = 1; i <= 3; i++) {
      const before = remounts.length;
      await (await fx.rt.checkpointDeferred('a', `ck${i}`)).sync();
      per.push(remounts.length - before);
      expect((await sh(fx.rt, 'a', `echo ${i} > /work/s${i}`)).code).to.equal(0);
    }
    expect(per, 'remounts per checkpoint').to.deep.equal([0, 1, 0]);
    expect(record().layers).to.have.length(1); // the mark's layer
    await fx.rt.restore('a', 'ck1');
    expect((await sh(fx.rt, 'a', 'ls /work/n | wc -l; ls /work/s1 2>&1 >/dev/null | wc -l')).out).to.equal('1001\n1\n');
    await (await fx.rt.checkpointDeferred('a', 'ck4')).sync();
    expect(pb.upperEntries.has('a')).to.equal(true); // counted by the snapshot
    await fx.rt.destroy('a');
    expect(pb.upperEntries.has('a'), 'a destroyed sandbox keeps no count in a long-lived server').to.equal(false);
  });

  it('a point flushes no file system (the snapshot is on disk when taken); a LayerMeta a host crash left empty or absent is rewritten at start', async () => {
    let pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    let syncfs = 0;
    const real = pb.fileops.syncfs.bind(pb.fileops);
    pb.fileops.syncfs = (path) => {
      syncfs++;
      return real(path);
    };
    expect(
      (await sh(fx.rt, 'a', 'mkdir /work/d && echo old > /work/d/old && head -c 5000 /dev/zero > /work/z')).code,
    ).to.equal(0);
    await (await fx.rt.checkpointDeferred('a', 'ck1')).sync();
    await fx.rt.restore('a', 'ck1'); // ck1's layer below a fresh upper: the next snapshot is a second layer
    // An opaque directory in the second layer: d of the layer below replaced as a whole.
    expect((await sh(fx.rt, 'a', 'rm -r /work/d && mkdir /work/d && echo new > /work/d/new')).code).to.equal(0);
    const ck2 = await fx.rt.checkpointDeferred('a', 'ck2');
    await ck2.sync();
    expect(syncfs, 'syncfs calls by two snapshot points').to.equal(0);
    const ckRec = JSON.parse(
      readFileSync(join(fx.stateDir, 'procbox', 'checkpoints', 'ck2.json'), 'utf8'),
    ) as CheckpointRecord;
    expect(ckRec.layers).to.have.length(2);
    const metaFile = (l: string) => `${pb.layerVol(l)}.json`;
    const meta = (l: string) => {
      const m = JSON.parse(readFileSync(metaFile(l), 'utf8')) as LayerMeta;
      return { id: m.id, sizeBytes: m.sizeBytes, opaque: m.opaque };
    };
    const [l1, l2] = ckRec.layers as [string, string];
    const want = [meta(l1), meta(l2)];
    expect(want[1]!.opaque).to.deep.equal(['d']);
    expect(ck2.sizeBytes).to.equal(want[0]!.sizeBytes + want[1]!.sizeBytes);
    // What a host crash before the next btrfs commit can leave of files written without fsync.
    rmSync(metaFile(l1));
    writeFileSync(metaFile(l2), '');
    await fx.rt.close();
    fx.rt = new ProcboxRuntime({ stateDir: fx.stateDir });
    await fx.rt.start();
    pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    expect(existsSync(metaFile(l1))).to.equal(true);
    expect([meta(l1), meta(l2)]).to.deep.equal(want);
    // Sizes read from the rewritten records: a point over the restored stack counts both layers.
    await fx.rt.restore('a', 'ck2');
    expect((await sh(fx.rt, 'a', 'ls /work/d')).out).to.equal('new\n');
    const ck3 = await fx.rt.checkpointDeferred('a', 'ck3');
    expect(ck3.sizeBytes).to.equal(ck2.sizeBytes);
  });

  it('a sandbox running only its init and idle standby is not frozen for a point or a restore; one running anything else is, a job in its own cgroup too', async () => {
    const pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    expect((await sh(fx.rt, 'a', 'printf one > /work/f')).code).to.equal(0);
    // The standby of the next command is spawned after the last one (AFTER_EXEC_DELAY_MS).
    await eventually(() => pb.standbys.has('a'), 10_000, 'the standby exec helper');
    const frozen = () => freezeCounts.snapshot;
    const ours = () => [pb.records.get('a')!.pid!, ...(pb.standbys.has('a') ? [pb.standbys.get('a')!.child.pid!] : [])];
    const f0 = frozen();
    const idle = await fx.rt.checkpointDeferred('a', 'idle');
    await idle.sync();
    expect(frozen(), 'an idle sandbox: no freeze').to.equal(f0);
    // Taken without the freeze, it restores byte-for-byte; the idle sandbox's restore freezes nothing either.
    expect((await sh(fx.rt, 'a', 'printf two > /work/f')).code).to.equal(0);
    await eventually(() => pb.standbys.has('a'), 10_000, 'the standby after the command');
    const r0 = freezeCounts.restore;
    await fx.rt.restore('a', 'idle');
    expect(freezeCounts.restore, 'an idle restore: no freeze').to.equal(r0);
    expect((await sh(fx.rt, 'a', 'cat /work/f')).out).to.equal('one');
    // A process left running by a command: frozen.
    expect((await sh(fx.rt, 'a', 'sleep 60 >/dev/null 2>&1 &')).code).to.equal(0);
    await eventually(() => pb.standbys.has('a'), 10_000, 'the standby after the command');
    await (await fx.rt.checkpointDeferred('a', 'busy')).sync();
    expect(frozen(), 'a process running: one freeze').to.equal(f0 + 1);
    await fx.rt.restore('a', 'busy');
    expect(freezeCounts.restore, 'a restore with a process running: one freeze').to.equal(r0 + 1);
    expect((await sh(fx.rt, 'a', 'pkill sleep; true')).code).to.equal(0);
    // A background job (its own child cgroup): frozen too.
    const job = await fx.rt.startJob('a', { id: 'j1', argv: ['sleep', '60'] });
    await (await fx.rt.checkpointDeferred('a', 'job')).sync();
    expect(frozen(), 'a job running: one more freeze').to.equal(f0 + 2);
    await fx.rt.killJob('a', job.id, 'SIGKILL');
    // A process in a child cgroup of the sandbox's only (not in its own list): frozen. The task
    // count sees it (a job's supervisor, above, is also listed in the sandbox's own cgroup).
    await eventually(() => pb.cgroups('a').holdsOnly(ours()), 10_000, 'the job gone');
    expect((await sh(fx.rt, 'a', 'sleep 60 >/dev/null 2>&1 &')).code).to.equal(0);
    await eventually(() => pb.standbys.has('a'), 10_000, 'the standby after the command');
    // The directory holdsOnly reads: the v1 pids cgroup, else the v2 one.
    const dirs = pb.cgroups('a').dirs();
    const pidsDir = dirs.find((d) => d.includes('/pids/')) ?? dirs.at(-1)!;
    const sleeper = readFileSync(join(pidsDir, 'cgroup.procs'), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map(Number)
      .find((p) => !ours().includes(p))!;
    const child = join(pidsDir, 'child');
    mkdirSync(child);
    try {
      writeFileSync(join(child, 'cgroup.procs'), String(sleeper));
      expect(
        readFileSync(join(pidsDir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number).sort(),
      ).to.deep.equal(ours().sort());
      await (await fx.rt.checkpointDeferred('a', 'child')).sync();
      expect(frozen(), 'a process in a child cgroup: one more freeze').to.equal(f0 + 3);
    } finally {
      process.kill(sleeper, 'SIGKILL');
      await eventually(() => readFileSync(join(child, 'cgroup.procs'), 'utf8') === '', 10_000, 'the sleeper gone');
      rmdirSync(child);
    }
  });
});
