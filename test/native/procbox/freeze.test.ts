// Freeze: a speculation copy's processes are frozen while its changes are scanned
// and staged, and the real sandbox from the drift check through the last write of an apply,
// so the check and the write see the same tree. Holds nest, survive pause/resume, and a crash
// while frozen is thawed by the next runtime start. Real procbox, real staging, real apply.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { applyToSandbox, realDrift, withFrozen } from '../../../controllers/changeset/apply.js';
import { speculate } from '../../../controllers/changeset/speculate.js';
import { detectCgroups } from '../../../native/procbox/cgroups.js';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import { skipWith } from '../../skip.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

const cg = detectCgroups();

describe('procbox freeze around scans and applies', function () {
  this.timeout(60_000);
  let fx: Fixture;
  let dir: string;

  before(function () {
    skipWith(this, skipReason());
    skipWith(this, cg.v2 ? undefined : 'the tests read the unified hierarchy cgroup.events');
  });
  beforeEach(async () => {
    fx = await makeRuntime();
    dir = mkdtempSync(join(tmpdir(), 'freeze-cs-'));
  });
  afterEach(async () => {
    await fx.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  const frozen = (id: string) =>
    readFileSync(join(cg.v2!, 'fluxvm', fx.rt.hostKey(id), 'cgroup.events'), 'utf8').includes('frozen 1');
  /** The racer's counter, read from the host through the init's root (no exec: that would wait for a thaw). */
  const counter = async (id: string) =>
    readFileSync(`/proc/${(await fx.rt.inspect(id)).pid}/root/dev/shm/c`, 'utf8').trim();
  /** Starts a process in the sandbox that rewrites /dev/shm/c with an increasing number, forever. */
  const startRacer = async (id: string) => {
    const r = await sh(
      fx.rt,
      id,
      '(i=0; while :; do i=$((i+1)); echo $i > /dev/shm/c.t; mv -f /dev/shm/c.t /dev/shm/c; done) >/dev/null 2>&1 & until [ -s /dev/shm/c ]; do :; done',
    );
    expect(r.code).to.equal(0);
  };
  /** Waits (bounded) until the counter moves past `v`: the racer runs. */
  const moves = async (id: string, v: string) => {
    for (let i = 0; i < 5000; i++) {
      if ((await counter(id)) !== v) return true;
      await new Promise((r) => setImmediate(r));
    }
    return false;
  };

  it('speculation: a process left running in the copy is frozen between the scan and the staging', async () => {
    await fx.rt.create({ id: 'real' });
    // The command leaves a racer that rewrites 20 files, round after round, and exits.
    const files = Array.from({ length: 20 }, (_, i) => `/work/f${i + 1}`);
    const racer = `(r=0; while :; do r=$((r+1)); for f in ${files.join(' ')}; do echo $r > $f; done; done) >/dev/null 2>&1 & until [ -e /work/f20 ]; do :; done`;
    const { meta } = await speculate(fx.rt, 'real-spec', {
      uid: 'cs1',
      namespace: 'default',
      name: 'cs1',
      sandbox: { name: 'real', uid: 'real' },
      command: ['sh', '-c', racer],
      paths: ['/work'],
      timeoutSeconds: 30,
      dir,
    });
    await fx.rt.destroy('real-spec');
    expect(meta.unstaged).to.deep.equal([]);
    expect(meta.staged.map((e) => e.path).sort()).to.deep.equal([...files].sort());
    // Staged in file order while frozen: f1..fk hold round r+1 and the rest round r (the freeze
    // may land mid-round), never more than two rounds. Unfrozen, the racer moves on by many
    // rounds while the 20 files are read.
    // (One file may be empty: the freeze can land between the truncate and the write of `>`.)
    const texts = files.map((f) =>
      readFileSync(join(dir, 'blobs', meta.staged.find((e) => e.path === f)!.blob), 'utf8'),
    );
    expect(texts.filter((t) => t === '').length, texts.join(',')).to.be.at.most(1);
    const rounds = texts.filter((t) => t !== '').map(Number);
    const distinct = [...new Set(rounds)].sort((a, b) => a - b);
    expect(distinct.length, `rounds staged: ${rounds.join(',')}`).to.be.at.most(2);
    if (distinct.length === 2) expect(distinct[1]! - distinct[0]!).to.equal(1);
  });

  it('apply: the real sandbox is frozen from the drift check through the last write, then runs again', async () => {
    await fx.rt.create({ id: 'real' });
    await fx.rt.writeFile('real', '/work/a.txt', Buffer.from('old\n'));
    const { meta } = await speculate(fx.rt, 'real-spec', {
      uid: 'cs2',
      namespace: 'default',
      name: 'cs2',
      sandbox: { name: 'real', uid: 'real' },
      command: ['sh', '-c', 'echo new > /work/a.txt; for i in 1 2 3 4 5; do echo $i > /work/n$i; done'],
      paths: ['/work'],
      timeoutSeconds: 30,
      dir,
    });
    await fx.rt.destroy('real-spec');
    await startRacer('real');
    const seen = await withFrozen(fx.rt, 'real', async () => {
      expect(frozen('real')).to.equal(true);
      const before = await counter('real');
      const drift = await realDrift(fx.rt, meta, dir);
      expect(drift.count).to.equal(0);
      // 6 writes 20 ms apart: the racer, if it ran, would move the counter many times meanwhile.
      await applyToSandbox(fx.rt, meta, dir, { delayMsPerFile: 20 });
      const after = await counter('real');
      expect((await fx.rt.inspect('real')).state).to.equal('running'); // frozen, not paused
      return { before, after };
    });
    expect(seen.after).to.equal(seen.before);
    expect(frozen('real')).to.equal(false);
    expect(await moves('real', seen.after)).to.equal(true);
    expect((await fx.rt.readFile('real', '/work/a.txt')).toString()).to.equal('new\n');
    expect((await sh(fx.rt, 'real', 'cat /work/n5')).out).to.equal('5\n');
  });

  it('holds nest and outlast a resume; an error inside withFrozen still thaws', async () => {
    await fx.rt.create({ id: 's' });
    await startRacer('s');
    await fx.rt.freeze('s');
    await fx.rt.freeze('s');
    await fx.rt.pause('s');
    await fx.rt.resume('s'); // the user's resume leaves the freeze holds alone
    expect(frozen('s')).to.equal(true);
    await fx.rt.thaw('s');
    expect(frozen('s')).to.equal(true);
    await fx.rt.thaw('s');
    expect(frozen('s')).to.equal(false);
    await fx.rt.thaw('s'); // idempotent at zero
    const err = await withFrozen(fx.rt, 's', async () => {
      expect(frozen('s')).to.equal(true);
      throw new Error('boom');
    }).catch((e: Error) => e);
    expect(err).to.be.instanceOf(Error).with.property('message', 'boom');
    expect(frozen('s')).to.equal(false);
    expect(await moves('s', await counter('s'))).to.equal(true);
  });

  it('a crash while frozen: the next runtime start thaws the sandbox', async () => {
    await fx.rt.create({ id: 's' });
    await startRacer('s');
    await fx.rt.freeze('s');
    expect(frozen('s')).to.equal(true);
    await fx.rt.close(); // the process "dies" holding the freeze (close does not thaw)
    const again = new ProcboxRuntime({ stateDir: fx.stateDir });
    await again.start();
    fx.rt = again;
    expect(frozen('s')).to.equal(false);
    expect(await moves('s', await counter('s'))).to.equal(true);
    expect((await sh(again, 's', 'echo ok')).out).to.equal('ok\n');
  });

  it('a crash inside a short freeze of its own (a checkpoint mark, a restore remount: no hold on disk) is thawed at start; a paused sandbox stays frozen', async () => {
    // The state a kill -9 between the mark's freeze and its thaw leaves: the cgroup frozen, no
    // freeze hold in the record. (An AgentSession promote takes a checkpoint first; after such
    // a crash every exec of the parent joined the frozen cgroup and hung.)
    await fx.rt.create({ id: 's' });
    await fx.rt.create({ id: 'p' });
    await startRacer('s');
    await fx.rt.pause('p');
    writeFileSync(join(cg.v2!, 'fluxvm', fx.rt.hostKey('s'), 'cgroup.freeze'), '1');
    for (let i = 0; i < 1000 && !frozen('s'); i++) await new Promise((r) => setImmediate(r));
    expect(frozen('s')).to.equal(true);
    await fx.rt.close();
    const again = new ProcboxRuntime({ stateDir: fx.stateDir });
    await again.start();
    fx.rt = again;
    expect(frozen('s')).to.equal(false);
    expect(await moves('s', await counter('s'))).to.equal(true);
    expect((await sh(again, 's', 'echo ok')).out).to.equal('ok\n');
    expect(frozen('p')).to.equal(true);
    expect((await again.inspect('p')).state).to.equal('paused');
  });
});
