// procbox disk checkpoints on btrfs volumes: the layer freeze is a snapshot of the writable
// volume (checkpoint.ts freezeBySnapshot). The running sandbox is left as it was: no workspace
// remount (no helper `remount` run), the same record (volume, stack, work generation) and the
// same mount in its init, a writer started before keeps writing; the checkpoint restores
// byte-for-byte, also after more points.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { overlayAt } from '../../../native/procbox/mountinfo.js';
import type { SandboxRecord } from '../../../native/procbox/state.js';
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
});
