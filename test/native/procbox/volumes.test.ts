// The workspace volume store (quota.ts): a sandbox record of before it (upper in
// sandboxes/<id>/upper, layers directly in <root>/layers) is adopted with its files, and moves
// to a volume (with the disk quota) at its first mark; checkpoints taken across the move restore.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import type { SandboxRecord } from '../../../native/procbox/state.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

describe('procbox volume store', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(function () {
    skipWith(this, skipReason());
  });
  afterEach(async () => {
    await fx?.cleanup();
  });

  it('adopts a sandbox of before the volume store with its files; its first mark moves it to a quota volume', async function () {
    fx = await makeRuntime({ defaultLimits: { diskBytes: 32 * 1024 * 1024 } });
    skipWith(this, fx.rt.volumeStore().quota ? undefined : `no disk quota here: ${fx.rt.volumeStore().reason}`);
    await fx.rt.create({ id: 'old' });
    expect(
      (await sh(fx.rt, 'old', 'echo kept > /work/keep.txt && mkdir -p /work/d && echo deep > /work/d/f')).code,
    ).to.equal(0);
    const pid = (await fx.rt.inspect('old')).pid!;
    await fx.rt.close();
    // Rewrite it into the old layout: the upper in the sandbox directory, no vol in the record.
    const root = join(fx.stateDir, 'procbox');
    const recFile = join(root, 'sandboxes', 'old', 'sandbox.json');
    const rec = JSON.parse(readFileSync(recFile, 'utf8')) as SandboxRecord;
    const vol = join(fx.rt.volumeStore().dir, 'vols', rec.vol!);
    process.kill(pid, 'SIGKILL');
    await eventually(() => !existsSync(`/proc/${pid}`), 10_000, `init ${pid} to be gone after SIGKILL`);
    execFileSync('cp', ['-a', join(vol, 'u'), join(root, 'sandboxes', 'old', 'upper')]);
    rmSync(vol, { recursive: true, force: true });
    delete rec.vol;
    delete rec.qgroup;
    writeFileSync(recFile, JSON.stringify(rec));

    const again = new ProcboxRuntime({ stateDir: fx.stateDir, defaultLimits: { diskBytes: 32 * 1024 * 1024 } });
    await again.start(); // the dead init is restarted on the old upper
    fx.rt = again;
    expect((await sh(again, 'old', 'cat /work/keep.txt /work/d/f')).out).to.equal('kept\ndeep\n');
    // The first mark (a checkpoint) freezes the old upper as a layer and moves to a volume.
    await again.checkpoint('old', 'old-ck');
    const moved = JSON.parse(readFileSync(recFile, 'utf8')) as SandboxRecord;
    expect(moved.vol).to.match(/^old~/);
    expect(moved.qgroup).to.equal(undefined); // an old record keeps the limit per volume
    expect(existsSync(join(root, 'sandboxes', 'old', 'upper'))).to.equal(false);
    expect(readdirSync(join(root, 'layers')).filter((n) => !n.endsWith('.json'))).to.have.length(1);
    const w = await sh(
      again,
      'old',
      'echo new > /work/new.txt; dd if=/dev/zero of=/work/big bs=1M count=64 2>&1; cat /work/keep.txt',
    );
    expect(w.out).to.match(/Disk quota exceeded/); // the new writable layer has the quota
    expect(w.out).to.match(/kept\n$/);
    await again.restore('old', 'old-ck');
    expect((await sh(again, 'old', 'cat /work/keep.txt; ls /work')).out).to.equal('kept\nd\nkeep.txt\n');
    await again.destroy('old');
    await again.deleteCheckpoint('old-ck');
    // Nothing of it is left in either place.
    expect(readdirSync(join(root, 'layers'))).to.deep.equal([]);
    expect(readdirSync(join(again.volumeStore().dir, 'vols')).filter((n) => n.startsWith('old~'))).to.deep.equal([]);
  });
});
