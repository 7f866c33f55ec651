// Crash safety of the workspace changes that take several steps (README "Crash safety"): a
// mark (checkpoint, fork), a restore and a compaction are interrupted at each step, by a
// kill -9 of the server process (crash-child.ts, for every step of a mark) or by a throw from
// the fault hook that abandons the runtime where a crash would (the rest); then a new runtime
// adopts the sandbox. It must be usable with every acknowledged change present: its record
// names directories that exist, its init has that stack mounted, checkpoints and restores
// work, a restart of its init keeps the files, and no volume the record does not name is left.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ProcboxRuntime, type FaultPoint, type ProcboxOptions } from '../../../native/procbox/procbox.js';
import { overlayAt } from '../../../native/procbox/mountinfo.js';
import type { SandboxRecord } from '../../../native/procbox/state.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { gone, makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

const CHILD = join(import.meta.dirname, 'crash-child.ts');
const REPO = join(import.meta.dirname, '..', '..', '..');

async function killInit(pid: number): Promise<void> {
  process.kill(pid, 'SIGKILL');
  await eventually(() => gone(pid), 10_000, `init ${pid} to be gone after SIGKILL`);
}

describe('mountinfo: the overlay on a mount point', () => {
  const line = (id: number, mp: string, opts: string, fstype = 'overlay') =>
    `${id} 1 0:${id} / ${mp} rw,relatime - ${fstype} none rw,${opts}`;
  it('reads upperdir and the lowerdir+ layers in order, unescaping \\ooo', () => {
    const info = [
      line(20, '/', 'size=4k', 'tmpfs'),
      line(
        21,
        '/work',
        'lowerdir+=/l/b/u,lowerdir+=/l/a\\054x/u,upperdir=/v/s\\040t/u,workdir=/v/s/w-1,redirect_dir=off',
      ),
    ].join('\n');
    expect(overlayAt(info, '/work')).to.deep.equal({ upper: '/v/s t/u', lowers: ['/l/b/u', '/l/a,x/u'] });
  });
  it('the last mount listed on the point wins; a colon list of lowerdir is split; other points and types are not it', () => {
    const info = [
      line(21, '/work', 'lowerdir+=/old,upperdir=/old/u'),
      line(22, '/work', 'lowerdir=/x:/y,upperdir=/new/u'),
      line(23, '/w\\040x', 'upperdir=/z'),
    ].join('\n');
    expect(overlayAt(info, '/work')).to.deep.equal({ upper: '/new/u', lowers: ['/x', '/y'] });
    expect(overlayAt(info, '/w x')).to.deep.equal({ upper: '/z', lowers: [] });
    expect(overlayAt(info, '/tmp')).to.equal(undefined);
    expect(overlayAt(line(24, '/work', 'size=1k', 'tmpfs'), '/work')).to.equal(undefined);
  });
});

describe('procbox crash safety', function () {
  this.timeout(120_000);
  let fx: Fixture;
  let opts: Omit<ProcboxOptions, 'stateDir'>;
  /** The fault point at which the runtime's hook throws (once). */
  let throwAt: FaultPoint | undefined;
  const logs: string[] = [];
  const hooks = (): Omit<ProcboxOptions, 'stateDir'> => ({
    ...opts,
    log: (m) => logs.push(m),
    faultHook: (p) => {
      if (p !== throwAt) return;
      throwAt = undefined;
      throw new Error(`crash at ${p}`);
    },
  });

  before(function () {
    skipWith(this, skipReason());
  });
  beforeEach(async () => {
    // A checkpoint here is a mark (the freeze fork and workspace marks use): its crash safety
    // is what these cases check. The btrfs snapshot checkpoint has its own cases below.
    opts = { checkpointFreeze: 'mark' };
    throwAt = undefined;
    logs.length = 0;
    fx = await makeRuntime(hooks());
  });
  afterEach(() => fx.cleanup());

  const record = (id: string) =>
    JSON.parse(readFileSync(join(fx.stateDir, 'procbox', 'sandboxes', id, 'sandbox.json'), 'utf8')) as SandboxRecord;
  const vols = () => join(fx.rt.volumeStore().dir, 'vols');

  /** A new runtime on the state directory, as after a server restart (the old one is abandoned). */
  async function adopt(): Promise<void> {
    fx.rt = new ProcboxRuntime({ ...hooks(), stateDir: fx.stateDir });
    await fx.rt.start();
  }

  /** Runs the operation in a child runtime that SIGKILLs itself at `point`; then a new runtime adopts. */
  async function killedAt(
    point: FaultPoint,
    op: 'checkpoint' | 'restore',
    id: string,
    ck: string,
    opt: { killInit?: boolean } = {},
  ): Promise<void> {
    const pid = (await fx.rt.inspect(id)).pid!;
    await fx.rt.close(); // the parent's runtime steps aside: one runtime per state directory
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', CHILD, fx.stateDir, point, JSON.stringify(opts), op, id, ck],
      { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    child.stdout.on('data', (b) => (out += b));
    child.stderr.on('data', (b) => (out += b));
    const signal = await new Promise<NodeJS.Signals | null>((resolve) =>
      child.on('close', (_code, sig) => resolve(sig)),
    );
    expect(signal, `the child was not killed at ${point}: ${out}`).to.equal('SIGKILL');
    if (opt.killInit) await killInit(pid); // the host went down too: the next start restarts the init
    await adopt();
  }

  /** Throws from the fault hook at `point` inside `fn`, abandons that runtime and adopts with a new one. */
  async function thrownAt(point: FaultPoint, fn: () => Promise<unknown>): Promise<void> {
    throwAt = point;
    const err = await fn().then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).to.equal(`crash at ${point}`);
    await fx.rt.close();
    await adopt();
  }

  /**
   * The sandbox after adoption: running; its record without a pending change and naming
   * existing directories; its init's workspace mount is the record's stack; exactly `files`
   * (and no more of the `absent` ones) in the workspace; writes, a checkpoint and a restore
   * work; an init restart keeps the files; no stale volume of it is left.
   */
  async function expectUsable(id: string, files: Record<string, string>, absent: string[] = []): Promise<void> {
    const info = await fx.rt.inspect(id);
    expect(info.state).to.equal('running');
    const rec = record(id);
    expect(rec.marking, 'marking').to.equal(undefined);
    expect(rec.remount, 'remount').to.equal(undefined);
    const store = fx.rt.volumeStore().dir;
    const upper = join(store, 'vols', rec.vol!, 'u');
    expect(existsSync(upper), `upper ${upper}`).to.equal(true);
    for (const l of rec.layers) {
      expect(existsSync(join(store, 'layers', l, 'u')), `layer ${l}`).to.equal(true);
      expect(existsSync(join(store, 'layers', `${l}.json`)), `layer meta ${l}`).to.equal(true);
    }
    const mounted = overlayAt(readFileSync(`/proc/${info.pid}/mountinfo`, 'utf8'), '/work');
    expect(mounted).to.deep.equal({
      upper,
      lowers: rec.layers.length
        ? [...rec.layers].reverse().map((l) => join(store, 'layers', l, 'u'))
        : [join(fx.stateDir, 'procbox', 'empty')],
    });
    expect(readdirSync(vols()).filter((n) => n.startsWith(`${id}~`))).to.deep.equal([rec.vol]);
    const check = async () => {
      for (const [f, text] of Object.entries(files))
        expect((await fx.rt.readFile(id, `/work/${f}`)).toString(), f).to.equal(text);
      for (const f of absent) expect((await sh(fx.rt, id, `test -e /work/${f}`)).code, `${f} is back`).to.equal(1);
    };
    await check();
    expect((await sh(fx.rt, id, 'echo after > /work/after')).code).to.equal(0);
    await fx.rt.checkpoint(id, `${id}-after`);
    expect((await sh(fx.rt, id, 'echo later > /work/later && rm /work/after')).code).to.equal(0);
    await fx.rt.restore(id, `${id}-after`);
    expect((await sh(fx.rt, id, 'cat /work/after; test -e /work/later')).out).to.equal('after\n');
    await killInit((await fx.rt.inspect(id)).pid!);
    expect((await fx.rt.inspect(id, { revive: true })).restarted).to.equal(true);
    await check();
    expect((await fx.rt.readFile(id, '/work/after')).toString()).to.equal('after\n');
  }

  /** A sandbox with a checkpoint below its upper: `one` in the checkpoint, `two` only in the upper. */
  async function sandbox(id: string): Promise<void> {
    await fx.rt.create({ id });
    expect((await sh(fx.rt, id, 'echo one > /work/one && mkdir /work/d && echo deep > /work/d/f')).code).to.equal(0);
    await fx.rt.checkpoint(id, `${id}-ck0`);
    expect((await sh(fx.rt, id, 'echo two > /work/two && rm /work/d/f')).code).to.equal(0);
  }

  for (const point of ['mark:intent', 'mark:renamed', 'mark:remounted', 'mark:recorded'] as const) {
    it(`a checkpoint's mark killed after ${point.slice(5)}: adopted with every change, checkpoints work`, async () => {
      await sandbox('m');
      await killedAt(point, 'checkpoint', 'm', 'm-ck1');
      await expectUsable('m', { one: 'one\n', two: 'two\n' }, ['d/f']);
      // The checkpoint was never acknowledged: its id is free (or, rolled forward, not recorded).
      expect((await rejects(fx.rt.restore('m', 'm-ck1'))).code).to.equal('NotFound');
    });
  }

  it('a mark killed after the rename, with the init gone too: the restarted init has the renamed upper as a layer', async () => {
    await sandbox('m');
    await killedAt('mark:renamed', 'checkpoint', 'm', 'm-ck1', { killInit: true });
    expect((await fx.rt.inspect('m')).restarted).to.equal(true);
    await expectUsable('m', { one: 'one\n', two: 'two\n' }, ['d/f']);
  });

  it('a mark interrupted after the rename while a process writes a workspace file: undone, the writer keeps its file', async () => {
    await sandbox('m');
    const layers = record('m').layers;
    // The writer holds /work/held open for writing: the remount that would finish the mark is Busy.
    const w = await sh(
      fx.rt,
      'm',
      '(exec 3>>/work/held; while :; do echo x >&3; sleep 0.05; done) >/dev/null 2>&1 & echo $!; until [ -s /work/held ]; do :; done',
    );
    expect(w.code).to.equal(0);
    await thrownAt('mark:renamed', () => fx.rt.checkpoint('m', 'm-ck1'));
    expect(logs.some((m) => m.includes('remounting a workspace'))).to.equal(true);
    expect(record('m').layers).to.deep.equal(layers);
    expect((await rejects(fx.rt.checkpoint('m', 'm-ck1'))).code).to.equal('Busy'); // as without the crash
    const n = (await fx.rt.readFile('m', '/work/held')).length;
    await eventually(
      async () => (await fx.rt.readFile('m', '/work/held')).length > n,
      10_000,
      'the writer to write on (/work/held to grow)',
    );
    // The writer and its last sleep (which inherited the descriptor) gone, marks work again.
    expect(
      (await sh(fx.rt, 'm', `kill -9 ${w.out.trim()}; while pgrep -x sleep >/dev/null; do :; done`)).code,
    ).to.equal(0);
    await expectUsable('m', { one: 'one\n', two: 'two\n' }, ['d/f']);
  });

  /** The runtime again with btrfs snapshot checkpoints (the default), for the cases of that freeze. */
  async function snapshots(): Promise<void> {
    await fx.rt.close();
    opts = {};
    await adopt();
  }

  for (const freeze of ['mark', 'snapshot'] as const) {
    for (const point of ['restore:recorded', 'restore:renamed', 'restore:remounted'] as const) {
      it(`a restore of a ${freeze} checkpoint interrupted after ${point.slice(8)}: finished by the next start`, async () => {
        if (freeze === 'snapshot') await snapshots();
        await sandbox('r');
        await thrownAt(point, () => fx.rt.restore('r', 'r-ck0'));
        await expectUsable('r', { one: 'one\n', 'd/f': 'deep\n' }, ['two']);
      });
    }
  }

  it('a snapshot checkpoint killed after its snapshot, before its record: adopted unchanged, the layer collected', async () => {
    await snapshots();
    await sandbox('s');
    const before = record('s');
    const layers = () => readdirSync(join(fx.rt.volumeStore().dir, 'layers')).filter((n) => !n.endsWith('.json'));
    const known = layers();
    await killedAt('checkpoint:snapshot', 'checkpoint', 's', 's-ck1');
    expect(record('s')).to.deep.include({ vol: before.vol, layers: before.layers, gen: before.gen });
    // The checkpoint was never acknowledged: its id is free, and its snapshot (named by nothing)
    // went at the start's gc.
    expect((await rejects(fx.rt.restore('s', 's-ck1'))).code).to.equal('NotFound');
    expect(layers()).to.have.members(known);
    await expectUsable('s', { one: 'one\n', two: 'two\n' }, ['d/f']);
  });

  for (const point of ['compact:merged', 'compact:recorded'] as const) {
    it(`a compaction interrupted after ${point.slice(8)}: the stack the record names is mounted`, async () => {
      await fx.rt.close();
      opts = { ...opts, maxLayers: 8 }; // the 9th layer compacts the oldest one into a merged layer
      await adopt();
      await fx.rt.create({ id: 'c' });
      for (let i = 1; i <= 8; i++) {
        expect((await sh(fx.rt, 'c', `echo ${i} > /work/f${i}`)).code).to.equal(0);
        await fx.rt.checkpoint('c', `c-ck${i}`);
      }
      expect((await sh(fx.rt, 'c', 'echo 9 > /work/f9')).code).to.equal(0);
      await thrownAt(point, () => fx.rt.checkpoint('c', 'c-ck9'));
      if (point === 'compact:recorded') expect(record('c').layers[0]).to.match(/c$/); // the merged layer
      await expectUsable('c', Object.fromEntries([1, 2, 3, 4, 5, 6, 7, 8, 9].map((i) => [`f${i}`, `${i}\n`])));
    });
  }
});
