// Workspace behaviour of procbox sandboxes: persistence between execs, background
// processes, fork isolation, checkpoint/restore, O(changed) diffs and drift.
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import { diffManifests } from '../../../native/workspace/diff.js';
import { RuntimeError } from '../../../native/runtime.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

describe('procbox workspace', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
  });
  after(async () => fx?.cleanup());

  it('files written by one exec are seen by the next and by the files API', async () => {
    await fx.rt.create({ id: 'p1' });
    await sh(fx.rt, 'p1', 'mkdir -p /work/src && echo hello > /work/src/a.txt');
    expect((await sh(fx.rt, 'p1', 'cat /work/src/a.txt')).out).to.equal('hello\n');
    expect((await fx.rt.readFile('p1', '/work/src/a.txt')).toString()).to.equal('hello\n');
    await fx.rt.writeFile('p1', '/work/new/deep/b.txt', Buffer.from('from host'), { mkdirs: true, mode: 0o600 });
    const r = await sh(
      fx.rt,
      'p1',
      'cat /work/new/deep/b.txt; stat -c "%U %a" /work/new/deep/b.txt /work/new; echo more >> /work/new/deep/b.txt',
    );
    expect(r.out).to.equal('from host' + 'root 600\nroot 755\n');
    const st = await fx.rt.stat('p1', '/work/new/deep/b.txt');
    expect(st).to.include({ type: 'file', size: 14, mode: 0o600 });
    expect((await fx.rt.listFiles('p1', '/work')).map((e) => e.name)).to.deep.equal(['new', 'src']);
    await fx.rt.deleteFile('p1', '/work/new', { recursive: true });
    expect((await sh(fx.rt, 'p1', 'ls /work')).out).to.equal('src\n');
  });

  it('a background process started by one exec is still running at the next', async () => {
    const t0 = Date.now();
    // Its stdout stays the exec's pipe: exec must still return at once.
    const r = await sh(fx.rt, 'p1', 'sleep 300 & echo $! > /tmp/bg.pid; echo started');
    expect(r.out).to.equal('started\n');
    expect(Date.now() - t0).to.be.lessThan(2000);
    const r2 = await sh(
      fx.rt,
      'p1',
      'kill -0 $(cat /tmp/bg.pid) && echo alive; cat /proc/$(cat /tmp/bg.pid)/cmdline | tr "\\0" " "',
    );
    expect(r2.out).to.equal('alive\nsleep 300 ');
  });

  it('timeout kills the process group; output caps count dropped bytes; streaming exec works', async () => {
    const r = await fx.rt.exec('p1', { argv: ['sh', '-c', 'sleep 100 & sleep 100'], timeoutMs: 300 });
    expect(r.timedOut).to.equal(true);
    expect(r.exitCode).to.equal(137);
    expect((await sh(fx.rt, 'p1', 'ps -eo args | grep -c "^sleep 100"')).out.trim()).to.equal('0');
    const big = await fx.rt.exec('p1', {
      argv: ['sh', '-c', 'head -c 100000 /dev/zero; head -c 10 /dev/zero >&2'],
      maxOutputBytes: 1000,
    });
    expect(big.stdout.length).to.equal(1000);
    expect(big.stdoutDropped).to.equal(99000);
    expect(big.stderrDropped).to.equal(0);
    expect(big.truncated).to.equal(true);
    const s = await fx.rt.execStream('p1', { argv: ['sh', '-c', 'read x; echo "got $x"; echo err >&2; exit 3'] });
    const chunks: Buffer[] = [];
    s.stdout.on('data', (b: Buffer) => chunks.push(b));
    s.stdin.end('line\n');
    const exit = await s.exit;
    expect(exit).to.deep.equal({ exitCode: 3, signal: undefined, timedOut: false });
    expect(Buffer.concat(chunks).toString()).to.equal('got line\n');
    expect((await rejects(fx.rt.exec('p1', { argv: ['true'], cwd: '/work/missing' }))).code).to.equal('NotFound');
    const nx = await fx.rt.exec('p1', { argv: ['no-such-command'] });
    expect(nx.exitCode).to.equal(127);
    expect(nx.stderr.toString()).to.match(/no-such-command/);
  });

  it('fork into 32 children: each sees the parent at fork time, writes never cross', async () => {
    await fx.rt.create({ id: 'fp' });
    await sh(fx.rt, 'fp', 'echo base > /work/shared.txt; mkdir /work/d; echo keep > /work/d/k');
    const kids = Array.from({ length: 32 }, (_, i) => `fk${i}`);
    const t0 = performance.now();
    const res = await fx.rt.fork('fp', kids);
    const ms = performance.now() - t0;
    console.log(`      fork 32: ${ms.toFixed(1)} ms (${(ms / 32).toFixed(2)} ms per child)`);
    expect(res.children.map((c) => c.state)).to.deep.equal(kids.map(() => 'running'));
    await sh(fx.rt, 'fp', 'echo parent-after > /work/shared.txt');
    for (const k of kids) {
      const r = await sh(
        fx.rt,
        k,
        `cat /work/shared.txt /work/d/k; ls /work; echo ${k} > /work/shared.txt; echo x > /work/${k}.only`,
      );
      expect(r.out, k).to.equal('base\nkeep\nd\nshared.txt\n');
    }
    for (const k of kids) {
      const r = await sh(fx.rt, k, 'cat /work/shared.txt; ls /work');
      expect(r.out).to.equal(`${k}\nd\n${k}.only\nshared.txt\n`);
    }
    expect((await sh(fx.rt, 'fp', 'cat /work/shared.txt; ls /work')).out).to.equal('parent-after\nd\nshared.txt\n');
    for (const k of kids) await fx.rt.destroy(k);
  });

  it('checkpoint then restore puts the workspace back exactly (hashes compared)', async () => {
    await fx.rt.create({ id: 'ck' });
    await sh(
      fx.rt,
      'ck',
      'mkdir -p /work/a/b; for i in 1 2 3 4 5; do echo $i > /work/a/f$i; done; head -c 100000 /dev/urandom > /work/a/b/bin; echo keep > /work/keep',
    );
    const before = await fx.rt.manifest('ck', ['/work']);
    const info = await fx.rt.checkpoint('ck', 'ck-1');
    expect(info).to.include({ id: 'ck-1', sandboxId: 'ck', kind: 'disk' });
    expect(info.sizeBytes).to.be.greaterThan(100000);
    await sh(fx.rt, 'ck', 'rm -rf /work/a/b; echo changed > /work/a/f1; echo new > /work/new; rm /work/keep');
    expect((await fx.rt.manifest('ck', ['/work'])).files).to.not.deep.equal(before.files);
    await fx.rt.restore('ck', 'ck-1');
    expect((await fx.rt.manifest('ck', ['/work'])).files).to.deep.equal(before.files);
    // Restore again after more changes, and a new sandbox from the checkpoint.
    await sh(fx.rt, 'ck', 'echo again > /work/a/f2');
    await fx.rt.restore('ck', 'ck-1');
    expect((await fx.rt.manifest('ck', ['/work'])).files).to.deep.equal(before.files);
    await fx.rt.create({ id: 'ck-copy', source: { checkpointId: 'ck-1' } });
    const copy = await fx.rt.manifest('ck-copy', ['/work']);
    expect(copy.files).to.deep.equal(before.files);
    await fx.rt.destroy('ck-copy');
    // A sandbox copied from a running sandbox gets its current files, then diverges.
    await sh(fx.rt, 'ck', 'echo live > /work/live');
    await fx.rt.create({ id: 'ck-clone', source: { sandboxId: 'ck' } });
    expect((await sh(fx.rt, 'ck-clone', 'cat /work/live; echo clone > /work/live')).out).to.equal('live\n');
    expect((await sh(fx.rt, 'ck', 'cat /work/live')).out).to.equal('live\n');
    await fx.rt.destroy('ck-clone');
    expect((await fx.rt.checkpoint('ck', 'ck-1')).sandboxId).to.equal('ck'); // idempotent by id
    await fx.rt.deleteCheckpoint('ck-1');
    const missing = await fx.rt.restore('ck', 'ck-1').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((missing as RuntimeError).code).to.equal('NotFound');
  });

  it('diff of a fork lists exactly the adds, modifies and deletes (spaces, non-UTF-8), by changesSince and by manifests; parent drift is seen', async () => {
    await fx.rt.create({ id: 'dp' });
    await sh(
      fx.rt,
      'dp',
      `cd /work && mkdir -p src gone && echo 1 > src/keep.c && echo 2 > src/mod.c && echo 3 > "name with spaces.txt" && ` +
        `echo 4 > "$(printf 'bad\\377name')" && echo 5 > gone/a && echo 6 > gone/b && echo same > same.txt`,
    );
    const { parentMark, children } = await fx.rt.fork('dp', ['dc']);
    expect(children[0]!.id).to.equal('dc');
    const base = await fx.rt.manifest('dc', ['/work']);
    await sh(
      fx.rt,
      'dc',
      `cd /work && echo new > "new file.txt" && echo changed > src/mod.c && echo changed >> "name with spaces.txt" && ` +
        `rm "$(printf 'bad\\377name')" && rm -rf gone && echo x > "$(printf 'new\\376')" && echo same > same.txt && ` +
        `mkdir -p empty/dir && touch src/keep.c`,
    );
    const expected = {
      added: ['/work/new file.txt', '/work/new\\xfe'],
      modified: ['/work/name with spaces.txt', '/work/src/mod.c'],
      deleted: ['/work/bad\\xffname', '/work/gone/a', '/work/gone/b'],
    };
    const d = await fx.rt.changesSince('dc', parentMark);
    expect({ added: d.added, modified: d.modified, deleted: d.deleted }).to.deep.equal(expected);
    const after = await fx.rt.manifest('dc', ['/work']);
    const md = diffManifests(base, after);
    expect({ added: md.added, modified: md.modified, deleted: md.deleted }).to.deep.equal(expected);
    // Narrowed paths.
    const narrow = await fx.rt.changesSince('dc', parentMark, ['/work/src']);
    expect(narrow).to.deep.include({ added: [], modified: ['/work/src/mod.c'], deleted: [] });
    // Nothing changed in the parent yet; then drift.
    expect((await fx.rt.changesSince('dp', parentMark)).modified).to.deep.equal([]);
    await sh(fx.rt, 'dp', 'echo drift >> /work/src/keep.c; rm /work/same.txt');
    const drift = await fx.rt.changesSince('dp', parentMark);
    expect(drift).to.deep.include({ added: [], modified: ['/work/src/keep.c'], deleted: ['/work/same.txt'] });
    // A directory removed and recreated (opaque in the upper) hides the old contents.
    await sh(fx.rt, 'dc', 'rm -rf /work/src && mkdir /work/src && echo fresh > /work/src/new.c');
    const d2 = await fx.rt.changesSince('dc', parentMark, ['/work/src']);
    expect(d2).to.deep.include({
      added: ['/work/src/new.c'],
      modified: [],
      deleted: ['/work/src/keep.c', '/work/src/mod.c'],
    });
  });

  it('manifest: workspace only, limits at their edges', async () => {
    await sh(fx.rt, 'p1', 'mkdir -p /work/m && for i in 1 2 3 4 5; do echo $i > /work/m/f$i; done');
    const all = await fx.rt.manifest('p1', ['/']);
    expect(all.paths).to.deep.equal(['/work']);
    expect(all.files['/work/m/f1']).to.match(/^sha256:[0-9a-f]{64}$/);
    const sixtyFour = Array.from({ length: 64 }, () => '/work/m');
    expect(Object.keys((await fx.rt.manifest('p1', sixtyFour)).files)).to.have.length(5);
    expect((await rejects(fx.rt.manifest('p1', [...sixtyFour, '/work/m']))).code).to.equal('LimitExceeded');
    expect(Object.keys((await fx.rt.manifest('p1', ['/work/m'], { maxFiles: 5 })).files)).to.have.length(5);
    expect((await rejects(fx.rt.manifest('p1', ['/work/m'], { maxFiles: 4 }))).code).to.equal('LimitExceeded');
    for (const bad of ['/proc', '/tmp', '/work/../etc', 'work'])
      expect((await rejects(fx.rt.manifest('p1', [bad]))).code, bad).to.equal('InvalidPath');
  });

  it('mark refuses (Busy) while a process writes a workspace file; diffs still work over several marks', async () => {
    await fx.rt.create({ id: 'mk' });
    await sh(fx.rt, 'mk', 'echo a > /work/a');
    const m1 = await fx.rt.mark('mk');
    await sh(fx.rt, 'mk', 'echo b > /work/b');
    await fx.rt.mark('mk');
    await sh(fx.rt, 'mk', 'rm /work/a; echo c > /work/c');
    const d = await fx.rt.changesSince('mk', m1);
    expect(d).to.deep.include({ added: ['/work/b', '/work/c'], modified: [], deleted: ['/work/a'] });
    // The background shell opens the log after `sh -c` has returned: wait until it has.
    await sh(fx.rt, 'mk', 'sleep 60 >> /work/log 2>&1 & while [ ! -e /work/log ]; do sleep 0.01; done');
    const err = await fx.rt.mark('mk').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).to.be.instanceOf(RuntimeError);
    expect((err as RuntimeError).code).to.equal('Busy');
    expect((await sh(fx.rt, 'mk', 'ls /work; echo ok > /work/ok && cat /work/ok')).out).to.equal('b\nc\nlog\nok\n');
  });

  it('compacts a deep stack without changing the workspace; the latest marks stay valid', async () => {
    const fx2 = await makeRuntime({ maxLayers: 4 });
    try {
      const rt = fx2.rt;
      await rt.create({ id: 'cp' });
      let last;
      for (let i = 0; i < 7; i++) {
        await sh(rt, 'cp', `echo ${i} > /work/f${i}; rm -f /work/f${i - 2}; mkdir -p /work/d${i}`);
        last = await rt.mark('cp');
      }
      await sh(rt, 'cp', 'echo late > /work/late');
      expect((await sh(rt, 'cp', 'ls /work | tr "\\n" " "')).out).to.equal('d0 d1 d2 d3 d4 d5 d6 f5 f6 late ');
      expect(await rt.changesSince('cp', last!)).to.deep.include({ added: ['/work/late'], deleted: [] });
    } finally {
      await fx2.cleanup();
    }
  });
});
