// File watch on the vm backend: procbox's watcher (native/procbox/watch.c),
// linked into the guest agent, runs inside a real guest through a streamed exec (native/vm/watch.ts)
// and the host's file-watch registry (controllers/common/filewatch.ts) parses its lines exactly as
// for procbox: create/modify/delete/rename arrive in order, a hostile name arrives intact, a
// symlink is not followed, a missing path is 404, the session's confinement holds for the watcher.
// Without VmRuntime.watchFiles the registry answers 501 (the test fails).
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FileWatches, type Watch, type WatchEvent } from '../../../controllers/common/filewatch.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';

const CHANGES = new Set(['created', 'modified', 'deleted', 'renamed']);

describe('native/vm file watch: the watcher inside the guest (QEMU)', function () {
  this.timeout(600_000);
  let rt: VmRuntime;
  let stateDir: string;
  let watches: FileWatches;
  const sh = async (script: string) => {
    const r = await rt.exec('fw', { argv: ['sh', '-c', script], timeoutMs: 60_000 });
    expect(r.exitCode, r.stderr.toString()).to.equal(0);
  };
  const changes = (w: Watch): WatchEvent[] => w.slice(1, 100_000).filter((e) => CHANGES.has(e.event));
  const seen = (w: Watch, fn: (c: WatchEvent[]) => boolean, what: string) =>
    eventually(() => fn(changes(w)), 30_000, what).catch((e: Error) => {
      throw new Error(
        `${e.message}; the watch has ${JSON.stringify(w.slice(1, 100_000).map((x) => [x.event, x.data]))}`,
      );
    });
  const status = async (p: Promise<unknown>): Promise<number | undefined> => {
    const e = await p.then(
      () => undefined,
      (err: unknown) => err as { code?: number },
    );
    return e ? e.code : 200;
  };

  before(async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmwatch-'));
    rt = new VmRuntime({ stateDir, warmPool: 0 });
    await rt.start();
    await rt.create({ id: 'fw' });
    watches = new FileWatches(rt, { maxWatchesPerWatcher: 256 });
  });
  after(async () => {
    watches?.stopAll();
    if (!rt) return;
    for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
    await rt.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('sees create, modify, delete and rename in order, recursively (a new directory is watched)', async () => {
    await sh('mkdir -p /work/a');
    const w = await watches.open('fw', '/work/a', true);
    expect(w.watches, 'the ready line of the guest watcher').to.equal(1);
    await sh('mkdir /work/a/d');
    await seen(w, (c) => c.some((e) => e.event === 'created' && e.data.path === '/work/a/d'), 'the new directory');
    await sh('echo x > /work/a/d/f && echo y >> /work/a/d/f && mv /work/a/d/f /work/a/g && rm /work/a/g');
    await seen(w, (c) => c.some((e) => e.event === 'deleted' && e.data.path === '/work/a/g'), 'the delete');
    const c = changes(w).map((e) => [e.event, e.data.path, e.data.oldPath ?? null]);
    const idx = (ev: string, p: string) => c.findIndex((x) => x[0] === ev && x[1] === p);
    expect(idx('created', '/work/a/d/f'), JSON.stringify(c)).to.be.greaterThan(idx('created', '/work/a/d'));
    expect(idx('modified', '/work/a/d/f'), JSON.stringify(c)).to.be.greaterThan(idx('created', '/work/a/d/f'));
    const ren = c.findIndex((x) => x[0] === 'renamed' && x[1] === '/work/a/g' && x[2] === '/work/a/d/f');
    expect(ren, JSON.stringify(c)).to.be.greaterThan(idx('modified', '/work/a/d/f'));
    expect(idx('deleted', '/work/a/g'), JSON.stringify(c)).to.be.greaterThan(ren);
  });

  it("does not hold other commands' pipes: a command started before the watcher still gets EOF on stdin", async () => {
    await sh('mkdir -p /work/eof');
    const cat = await rt.execStream('fw', { argv: ['cat'], timeoutMs: 60_000 });
    let out = '';
    cat.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await watches.open('fw', '/work/eof', false);
    cat.stdin.end('bye');
    const exit = await Promise.race([cat.exit, new Promise<'hung'>((r) => setTimeout(() => r('hung'), 20_000))]);
    expect(exit, 'cat got EOF once the host closed its stdin').to.not.equal('hung');
    expect(out).to.equal('bye');
  });

  it('carries a hostile name (ESC, newline, forged lines, invalid UTF-8) intact', async () => {
    await sh('mkdir -p /work/names');
    const w = await watches.open('fw', '/work/names', false);
    await sh(`cd /work/names && : > "$(printf 'a\\033[31mb\\nC0 0 2f\\nid: 1')" && : > "$(printf 'bad\\377\\376x')"`);
    await seen(w, (c) => c.filter((e) => e.event === 'created').length >= 2, 'two created');
    const created = changes(w).filter((e) => e.event === 'created');
    expect(created).to.have.length(2);
    expect(created[0]!.data.name).to.equal('a\u001b[31mb\nC0 0 2f\nid: 1');
    expect(created[0]!.data.pathBase64).to.equal(undefined);
    expect(Buffer.from(String(created[1]!.data.pathBase64), 'base64')).to.deep.equal(
      Buffer.concat([Buffer.from('/work/names/bad'), Buffer.from([0xff, 0xfe]), Buffer.from('x')]),
    );
  });

  it('does not follow a symlink (400 for one as the path or on the way), a missing path is 404', async () => {
    await sh('mkdir -p /work/real/sub && ln -sfn /work/real /work/link');
    expect(await status(watches.open('fw', '/work/link', true)), 'a symlink as the watched path').to.equal(400);
    expect(await status(watches.open('fw', '/work/link/sub', true)), 'a symlink on the way').to.equal(400);
    expect(await status(watches.open('fw', '/work/nope', true)), 'a missing path').to.equal(404);
    // A symlink inside the watched tree gets no watch: a change behind it is not reported.
    const w = await watches.open('fw', '/work/real', true);
    expect(w.watches, 'real and real/sub').to.equal(2);
    await sh('ln -s /work/a /work/real/out && echo z > /work/a/behind && echo q > /work/real/sub/here');
    await seen(w, (c) => c.some((e) => e.data.path === '/work/real/sub/here'), 'the change in sub');
    expect(changes(w).map((e) => e.data.path)).to.not.include('/work/real/out/behind');
  });

  it('watches in a VM whose confinement limits reads (readPaths): the way to the path needs no read access', async () => {
    // The guest's Landlock rules let this VM's commands read only system directories and /work,
    // not `/`: the watcher walks to the path with O_PATH and opens only the watched directory.
    await rt.create({ id: 'fr', confinement: { readPaths: ['/work'] } });
    const run = async (script: string) => {
      const r = await rt.exec('fr', { argv: ['sh', '-c', script], timeoutMs: 60_000 });
      expect(r.exitCode, r.stderr.toString()).to.equal(0);
    };
    await run('mkdir -p /work/r');
    const denied = await rt.exec('fr', { argv: ['ls', '/'], timeoutMs: 60_000 });
    expect(denied.exitCode, 'reading / is refused in this VM').to.not.equal(0);
    const w = await watches.open('fr', '/work/r', false);
    expect(w.watches).to.equal(1);
    await run('echo x > /work/r/f');
    await seen(
      w,
      (c) => c.some((e) => e.event === 'created' && e.data.path === '/work/r/f'),
      'the create below readPaths',
    );
  });
});
