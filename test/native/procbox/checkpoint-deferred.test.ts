// procbox checkpointDeferred (rewind points): the mark and record are written at
// once and flushed by sync(); the checkpoint restores like any other; an existing record under
// the id (what a host crash before the flush leaves, the caller's own record of the id lost) is
// replaced, not answered as the stale state.
import { expect } from 'chai';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { skipWith } from '../../skip.js';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

describe('procbox checkpointDeferred', function () {
  this.timeout(120_000);
  let fx: Fixture;
  before(function () {
    skipWith(this, skipReason());
  });
  beforeEach(async () => {
    fx = await makeRuntime();
    await fx.rt.create({ id: 'a' });
  });
  afterEach(async () => fx?.cleanup());

  it('restores byte-for-byte before and after its sync; the record is on disk when sync resolves', async () => {
    expect((await sh(fx.rt, 'a', 'printf one > /work/f')).code).to.equal(0);
    const ck = await fx.rt.checkpointDeferred('a', 'ck1');
    expect(ck).to.include({ id: 'ck1', sandboxId: 'a', kind: 'disk' });
    const rec = join(fx.stateDir, 'procbox', 'checkpoints', 'ck1.json');
    expect(existsSync(rec), 'the record is written before the flush').to.equal(true);
    expect((await sh(fx.rt, 'a', 'printf two > /work/f; echo x > /work/g')).code).to.equal(0);
    await fx.rt.restore('a', 'ck1'); // before the flush: the page cache holds it
    expect((await sh(fx.rt, 'a', 'cat /work/f; test -e /work/g || echo nog')).out).to.equal('onenog\n');
    await ck.sync();
    await ck.sync(); // idempotent
    expect(JSON.parse(readFileSync(rec, 'utf8')).layers).to.be.an('array').that.is.not.empty;
    expect((await sh(fx.rt, 'a', 'printf three > /work/f')).code).to.equal(0);
    await fx.rt.restore('a', 'ck1');
    expect((await sh(fx.rt, 'a', 'cat /work/f')).out).to.equal('one');
  });

  it("a snapshot point's LayerMeta is written by its sync, off the step's path; until then it is served from memory", async function () {
    const pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
    if (!pb.vs.quota) return skipWith(this, `no btrfs volume store: ${pb.vs.reason ?? 'unknown'}`);
    // d/old in a lower layer (a mark), then d made anew: the upper's d is opaque (hides d/old).
    expect((await sh(fx.rt, 'a', 'mkdir /work/d && echo x > /work/d/old')).code).to.equal(0);
    await fx.rt.mark('a');
    expect((await sh(fx.rt, 'a', 'rm -r /work/d && mkdir /work/d && echo y > /work/d/new')).code).to.equal(0);
    const ck = await fx.rt.checkpointDeferred('a', 'ck-meta');
    const rec = JSON.parse(readFileSync(join(fx.stateDir, 'procbox', 'checkpoints', 'ck-meta.json'), 'utf8')) as {
      layers: string[];
    };
    const meta = `${pb.layerVol(rec.layers.at(-1)!)}.json`;
    expect(existsSync(meta), 'no LayerMeta file before the sync').to.equal(false);
    // Before the sync: restored, marked, then d removed. The diff must know the point's d was
    // opaque (from memory): d/old was not there to be deleted.
    await fx.rt.restore('a', 'ck-meta');
    const m = await fx.rt.mark('a');
    expect((await sh(fx.rt, 'a', 'rm -r /work/d')).code).to.equal(0);
    expect((await fx.rt.changesSince('a', m)).deleted).to.deep.equal(['/work/d/new']);
    await ck.sync();
    const written = JSON.parse(readFileSync(meta, 'utf8')) as { opaque: string[]; sizeBytes: number };
    expect(written).to.include({ sizeBytes: 2 });
    expect(written.opaque).to.deep.equal(['d']);
    expect(pb.unwrittenMetas.size).to.equal(0);
  });

  it('an existing record under the id is stale and replaced (the plain checkpoint keeps answering the first)', async () => {
    expect((await sh(fx.rt, 'a', 'printf old > /work/f')).code).to.equal(0);
    await fx.rt.checkpoint('a', 'ck-plain');
    await (await fx.rt.checkpointDeferred('a', 'ck-d')).sync();
    expect((await sh(fx.rt, 'a', 'printf new > /work/f')).code).to.equal(0);
    await fx.rt.checkpoint('a', 'ck-plain'); // idempotent: still the old state
    const again = await fx.rt.checkpointDeferred('a', 'ck-d'); // stale: taken anew
    await again.sync();
    expect((await sh(fx.rt, 'a', 'printf later > /work/f')).code).to.equal(0);
    await fx.rt.restore('a', 'ck-d');
    expect((await sh(fx.rt, 'a', 'cat /work/f')).out).to.equal('new');
    await fx.rt.restore('a', 'ck-plain');
    expect((await sh(fx.rt, 'a', 'cat /work/f')).out).to.equal('old');
    // Deleting both frees every layer only they held (gc reads records once, then forgets deleted ones).
    await fx.rt.deleteCheckpoint('ck-d');
    await fx.rt.deleteCheckpoint('ck-plain');
    expect((await sh(fx.rt, 'a', 'cat /work/f')).out).to.equal('old');
  });
});
