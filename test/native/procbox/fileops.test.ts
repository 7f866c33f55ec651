// The fileops helper (native/procbox/fileops.ts + fileops.c) on host directory trees: path
// resolution (symlinks followed only inside, in the sandbox's view), the read cap at its
// edge, writes (mode, owner, atomic), fd-based recursive deletes deeper than PATH_MAX, the
// manifest walk's rules, the layer scan, and a helper that dies or gets a broken frame.
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaultHelperPath } from '../../../native/procbox/procbox.js';
import { FileOps, FileOpError, fileOpError, type Anchor } from '../../../native/procbox/fileops.js';
import { sandboxManifest } from '../../../native/procbox/manifest.js';
import { scanLayer } from '../../../native/procbox/layers.js';
import { RuntimeError } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { skipReason } from './fixture.js';

const b = (s: string) => Buffer.from(s);
const sha = (d: string | Buffer) => 'sha256:' + createHash('sha256').update(d).digest('hex');

describe('procbox fileops helper', function () {
  this.timeout(60_000);
  let ops: FileOps;
  let tmp: string;
  let ws: string; // host directory the "sandbox" sees at /work
  let a: Anchor;

  before(function () {
    skipWith(this, skipReason());
    ops = new FileOps(defaultHelperPath());
  });
  after(() => ops?.close());
  beforeEach(() => {
    tmp = mkdtempSync(join(tmpdir(), 'fileops-'));
    ws = join(tmp, 'work');
    mkdirSync(ws);
    a = { root: ws, view: '/work' };
  });
  afterEach(() => execFileSync('rm', ['-rf', tmp])); // coreutils rm handles trees deeper than PATH_MAX

  async function code(p: Promise<unknown>): Promise<string> {
    const e = await p.then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(e, 'the call should fail').to.be.instanceOf(FileOpError);
    return fileOpError(e, 'p').code;
  }

  describe('resolution', () => {
    beforeEach(() => {
      mkdirSync(join(ws, 'd/sub'), { recursive: true });
      writeFileSync(join(ws, 'd/sub/f'), 'inside');
      writeFileSync(join(tmp, 'outside'), 'OUTSIDE');
      symlinkSync('sub', join(ws, 'd/rel'));
      symlinkSync('/work/d/sub', join(ws, 'd/abs'));
      symlinkSync('/etc', join(ws, 'etc'));
      symlinkSync('../../outside', join(ws, 'd/up'));
      symlinkSync('../..', join(ws, 'd/dotdot'));
      symlinkSync('loop2', join(ws, 'loop1'));
      symlinkSync('loop1', join(ws, 'loop2'));
    });

    it('follows symlinks that stay inside, in the sandbox view', async () => {
      expect((await ops.read(a, b('d/sub/f'), 100)).toString()).to.equal('inside');
      expect((await ops.read(a, b('d/rel/f'), 100)).toString()).to.equal('inside');
      expect((await ops.read(a, b('d/abs/f'), 100)).toString()).to.equal('inside');
      expect((await ops.list(a, b('d/abs'))).map((e) => e.name.toString())).to.deep.equal(['f']);
      // stat does not follow the last component
      expect((await ops.stat(a, b('d/rel'))).type).to.equal('l');
      expect((await ops.stat(a, b('d/rel'))).link.toString()).to.equal('sub');
      expect((await ops.stat(a, b('d/rel/f'))).type).to.equal('f');
    });

    it('refuses symlinks and .. that lead out, and symlink loops (InvalidPath)', async () => {
      for (const p of ['etc/passwd', 'd/up', 'd/dotdot/outside', 'loop1', 'etc'])
        expect(await code(ops.read(a, b(p), 100)), p).to.equal('InvalidPath');
      expect(await code(ops.list(a, b('etc')))).to.equal('InvalidPath');
      expect(await code(ops.write(a, b('etc/x'), b('x'), { owner: 0 }))).to.equal('InvalidPath');
      expect(await code(ops.write(a, b('d/dotdot/new'), b('x'), { owner: 0, mkdirs: true }))).to.equal('InvalidPath');
      expect(existsSync(join(tmp, 'new'))).to.equal(false);
      expect(existsSync('/etc/x')).to.equal(false);
    });

    it('an anchor without a view follows no symlink at all (layers)', async () => {
      const layer = { root: ws, view: '' };
      expect(await code(ops.read(layer, b('d/rel/f'), 100))).to.equal('InvalidPath');
      expect(await code(ops.read(layer, b('d/rel'), 100))).to.equal('InvalidArgument'); // the link itself: not a regular file
      expect((await ops.read(layer, b('d/sub/f'), 100)).toString()).to.equal('inside');
      const many = await ops.statMany([
        { root: ws, rel: b('d/sub/f') },
        { root: ws, rel: b('d/rel/f') },
        { root: ws, rel: b('nope') },
        { root: ws, rel: b('d/rel') },
      ]);
      expect(many.map((e) => e?.type ?? null)).to.deep.equal(['f', null, null, 'l']);
    });

    it('missing components: NotFound; a file in the middle: NotADirectory; a directory read: IsADirectory', async () => {
      expect(await code(ops.read(a, b('nope/f'), 100))).to.equal('NotFound');
      expect(await code(ops.read(a, b('d/sub/f/x'), 100))).to.equal('NotADirectory');
      expect(await code(ops.read(a, b('d'), 100))).to.equal('IsADirectory');
      expect(await code(ops.write(a, b('nope/f'), b('x'), { owner: 0 }))).to.equal('NotFound');
    });
  });

  it('the read cap at its edge: exactly the cap is read, one byte over is LimitExceeded', async () => {
    writeFileSync(join(ws, 'f'), Buffer.alloc(1000, 1));
    expect((await ops.read(a, b('f'), 1000)).length).to.equal(1000);
    expect(await code(ops.read(a, b('f'), 999))).to.equal('LimitExceeded');
    // From 256 KiB up the helper hands over its verified fd instead of piping the bytes: same cap.
    writeFileSync(join(ws, 'big'), Buffer.alloc(3 << 20, 2));
    expect((await ops.read(a, b('big'), 3 << 20)).equals(Buffer.alloc(3 << 20, 2))).to.equal(true);
    expect(await code(ops.read(a, b('big'), (3 << 20) - 1))).to.equal('LimitExceeded');
    writeFileSync(join(ws, 'edge'), Buffer.alloc(256 << 10, 3));
    expect((await ops.read(a, b('edge'), 256 << 10)).length).to.equal(256 << 10);
    expect(await code(ops.read(a, b('edge'), (256 << 10) - 1))).to.equal('LimitExceeded');
  });

  it('writes: exact mode and owner, parents made 0755 and owned, no temp file left, replaces atomically', async () => {
    await ops.write(a, b('new/deep/f'), b('hello'), { mode: 0o640, owner: 12345, mkdirs: true });
    const st = statSync(join(ws, 'new/deep/f'));
    expect([st.mode & 0o7777, st.uid, st.gid]).to.deep.equal([0o640, 12345, 12345]);
    for (const d of ['new', 'new/deep']) {
      const ds = statSync(join(ws, d));
      expect([ds.mode & 0o7777, ds.uid]).to.deep.equal([0o755, 12345]);
    }
    await ops.write(a, b('new/deep/f'), b('again'), { owner: 12345 });
    expect(readFileSync(join(ws, 'new/deep/f'), 'utf8')).to.equal('again');
    expect(statSync(join(ws, 'new/deep/f')).mode & 0o7777).to.equal(0o644);
    expect(readdirSync(join(ws, 'new/deep'))).to.deep.equal(['f']);
    mkdirSync(join(ws, 'adir'));
    expect(await code(ops.write(a, b('adir'), b('x'), { owner: 0 }))).to.equal('IsADirectory');
  });

  it('deletes: a file, an empty directory, Conflict for a full one, and recursively a tree deeper than PATH_MAX and wide', async () => {
    writeFileSync(join(ws, 'f'), 'x');
    await ops.delete(a, b('f'), false);
    expect(existsSync(join(ws, 'f'))).to.equal(false);
    mkdirSync(join(ws, 'full'));
    writeFileSync(join(ws, 'full/x'), 'x');
    expect(await code(ops.delete(a, b('full'), false))).to.equal('Conflict');
    // 300 levels of 50-byte names (15 KiB of path) plus a wide level of 2000 entries; a
    // symlink to the outside in it is removed, not followed.
    writeFileSync(join(tmp, 'keep'), 'keep');
    execFileSync('python3', [
      '-c',
      `import os\nos.chdir(${JSON.stringify(join(ws, 'full'))})\nfor i in range(2000): open('w%d' % i, 'w').close()\nos.symlink(${JSON.stringify(tmp)}, 'out')\nfor i in range(300):\n    os.mkdir('d' * 50)\n    os.chdir('d' * 50)\n    open('f', 'w').write('x')\n`,
    ]);
    await ops.delete(a, b('full'), true);
    expect(readdirSync(ws)).to.deep.equal([]);
    expect(readFileSync(join(tmp, 'keep'), 'utf8')).to.equal('keep');
    // rmtree: a host directory of the state dir, same walk; a missing one is fine.
    execFileSync('python3', [
      '-c',
      `import os\nos.makedirs(${JSON.stringify(join(tmp, 'state'))})\nos.chdir(${JSON.stringify(join(tmp, 'state'))})\nfor i in range(200):\n    os.mkdir('e' * 60)\n    os.chdir('e' * 60)\n`,
    ]);
    await ops.rmtree(join(tmp, 'state'));
    await ops.rmtree(join(tmp, 'state'));
    expect(existsSync(join(tmp, 'state'))).to.equal(false);
    expect(readFileSync(join(tmp, 'keep'), 'utf8')).to.equal('keep');
  });

  describe('the manifest walk', () => {
    const m = (paths: string[], limits?: { maxFiles?: number; maxListingBytes?: number }) =>
      sandboxManifest(ops, tmp, '/work', paths, limits);

    it('lists regular files only (no symlink, FIFO or device), with sha256 and modes; raw names are encoded', async () => {
      mkdirSync(join(ws, 'src'));
      writeFileSync(join(ws, 'src/a.txt'), 'hello\n', { mode: 0o600 });
      writeFileSync(join(ws, 'README'), '');
      writeFileSync(Buffer.from(`${ws}/bad-\xff`, 'latin1'), 'raw');
      writeFileSync(join(ws, 'back\\slash'), 'bs');
      symlinkSync('/etc/passwd', join(ws, 'link'));
      execFileSync('mkfifo', [join(ws, 'fifo')]);
      const r = await m(['/work']);
      expect(r.files).to.deep.equal({
        '/work/README': sha(''),
        '/work/back\\\\slash': sha('bs'),
        '/work/bad-\\xff': sha('raw'),
        '/work/src/a.txt': sha('hello\n'),
      });
      expect(r.modes!['/work/src/a.txt']).to.equal(0o600);
      // Agrees with sha256sum.
      const out = execFileSync('sh', ['-c', `cd ${ws} && sha256sum src/a.txt`])
        .toString()
        .split(' ')[0];
      expect(r.files['/work/src/a.txt']).to.equal(`sha256:${out}`);
      // Overlapping starting paths are deduped; a sub path is walked alone.
      expect(Object.keys((await m(['/work', '/work/src'])).files)).to.have.length(4);
      expect(Object.keys((await m(['/work/src'])).files)).to.deep.equal(['/work/src/a.txt']);
    });

    it('does not descend into another filesystem (a mount point)', async function () {
      mkdirSync(join(ws, 'mnt'));
      try {
        execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', join(ws, 'mnt')]);
      } catch (e) {
        skipWith(this, `cannot mount a tmpfs here: ${(e as Error).message}`);
      }
      try {
        writeFileSync(join(ws, 'mnt/inside'), 'x');
        writeFileSync(join(ws, 'top'), 'y');
        expect(Object.keys((await m(['/work'])).files)).to.deep.equal(['/work/top']);
      } finally {
        execFileSync('umount', [join(ws, 'mnt')]);
      }
    });

    it('limits at their edges: maxFiles N passes, N+1 fails; listing bytes exact passes, one less fails', async () => {
      for (let i = 0; i < 5; i++) writeFileSync(join(ws, `f${i}`), String(i));
      expect(Object.keys((await m(['/work'], { maxFiles: 5 })).files)).to.have.length(5);
      const e = await m(['/work'], { maxFiles: 4 }).catch((x: unknown) => x);
      expect((e as RuntimeError).code).to.equal('LimitExceeded');
      const exact = 5 * ('/work/f0'.length + 71);
      expect(Object.keys((await m(['/work'], { maxListingBytes: exact })).files)).to.have.length(5);
      const e2 = await m(['/work'], { maxListingBytes: exact - 1 }).catch((x: unknown) => x);
      expect((e2 as RuntimeError).code).to.equal('LimitExceeded');
    });

    it('a starting path that is missing or a file is InvalidArgument; a symlink out is InvalidPath', async () => {
      writeFileSync(join(ws, 'file'), 'x');
      symlinkSync('/etc', join(ws, 'etc'));
      for (const [p, want] of [
        ['/work/nope', 'InvalidArgument'],
        ['/work/file', 'InvalidArgument'],
        ['/work/etc', 'InvalidPath'],
      ] as const) {
        const e = await m([p]).catch((x: unknown) => x);
        expect(e, p).to.be.instanceOf(RuntimeError);
        expect((e as RuntimeError).code, p).to.equal(want);
      }
    });
  });

  it('syncfs (a checkpoint flushes its layers without a sync process): a directory is flushed; a missing path or a file is an error', async () => {
    writeFileSync(join(ws, 'f'), 'data');
    await ops.syncfs(ws);
    expect(await code(ops.syncfs(join(tmp, 'missing')))).to.equal('NotFound');
    expect(await code(ops.syncfs(join(ws, 'f')))).to.not.equal('NotFound');
  });

  it('scan: one record per entry of a layer (file, dir, opaque dir, whiteout, symlink, other), nothing followed', async () => {
    mkdirSync(join(ws, 'dir'));
    mkdirSync(join(ws, 'opq'));
    execFileSync('python3', [
      '-c',
      `import os; os.setxattr(${JSON.stringify(join(ws, 'opq'))}, 'trusted.overlay.opaque', b'y')`,
    ]);
    writeFileSync(join(ws, 'dir/f'), '12345');
    execFileSync('mknod', [join(ws, 'gone'), 'c', '0', '0']);
    execFileSync('mkfifo', [join(ws, 'fifo')]);
    symlinkSync('/etc', join(ws, 'l'));
    const got = (await scanLayer(ops, ws))
      .map((e) => `${e.type} ${e.rel.toString()}${e.type === 'f' ? ` ${e.size}` : ''}`)
      .sort();
    expect(got).to.deep.equal(['D opq', 'd dir', 'f dir/f 5', 'l l', 'o fifo', 'w gone']);
  });

  it('merge (compaction): whiteouts remove, opaque dirs replace, dirs merge, files linked, symlinks and FIFOs recreated, deep names work', async () => {
    const l1 = join(tmp, 'l1');
    const l2 = join(tmp, 'l2');
    for (const d of ['keep', 'gone', 'opq', 'deep']) mkdirSync(join(l1, d), { recursive: true });
    writeFileSync(join(l1, 'keep/a'), 'a1');
    writeFileSync(join(l1, 'keep/b'), 'b1');
    writeFileSync(join(l1, 'gone/x'), 'x');
    writeFileSync(join(l1, 'opq/old'), 'old');
    writeFileSync(join(l1, 'file'), 'f1', { mode: 0o640 });
    symlinkSync('/etc', join(l1, 'link'));
    execFileSync('mkfifo', [join(l1, 'fifo')]);
    execFileSync('python3', [
      '-c',
      `import os
os.chdir(${JSON.stringify(join(l1, 'deep'))})
for i in range(120):
    os.mkdir('q' * 60)
    os.chdir('q' * 60)
open('leaf', 'w').write('leaf')
`,
    ]);
    mkdirSync(join(l2, 'keep'), { recursive: true });
    mkdirSync(join(l2, 'opq'));
    execFileSync('python3', [
      '-c',
      `import os; os.setxattr(${JSON.stringify(join(l2, 'opq'))}, 'trusted.overlay.opaque', b'y')`,
    ]);
    writeFileSync(join(l2, 'opq/new'), 'new');
    writeFileSync(join(l2, 'keep/b'), 'b2');
    execFileSync('mknod', [join(l2, 'gone'), 'c', '0', '0']);
    execFileSync('mknod', [join(l2, 'file'), 'c', '0', '0']);
    const out = join(tmp, 'merged');
    await ops.merge([l1, l2], out);
    const list = execFileSync('find', ['.', '-maxdepth', '2'], { cwd: out }).toString().trim().split('\n').sort();
    expect(list).to.deep.equal([
      '.',
      './deep',
      `./deep/${'q'.repeat(60)}`,
      './fifo',
      './keep',
      './keep/a',
      './keep/b',
      './link',
      './opq',
      './opq/new',
    ]);
    expect(readFileSync(join(out, 'keep/b'), 'utf8')).to.equal('b2');
    expect(statSync(join(out, 'keep/a')).ino).to.equal(statSync(join(l1, 'keep/a')).ino); // linked, not copied
    expect(lstatSync(join(out, 'link')).isSymbolicLink()).to.equal(true);
    expect(lstatSync(join(out, 'fifo')).isFIFO()).to.equal(true);
    const leaf = execFileSync('find', ['.', '-name', 'leaf'], { cwd: join(out, 'deep') })
      .toString()
      .trim();
    expect(leaf.split('/').length).to.equal(122); // 120 levels of 61 bytes each: past PATH_MAX
    expect(await code(ops.merge([l1], out))).to.equal('Internal'); // EEXIST: never merged over
  });

  it('no descriptor is leaked by failing or succeeding calls', async () => {
    mkdirSync(join(ws, 'd'));
    // Writes go to their own directory: a walk fails by design when an entry it listed
    // vanishes before it is hashed (a write's temporary file does), so the two must not meet.
    mkdirSync(join(ws, 'w'));
    writeFileSync(join(ws, 'd/f'), 'x');
    symlinkSync('/etc', join(ws, 'out'));
    const helperFds = () =>
      execFileSync('pgrep', ['-P', String(process.pid), '-f', 'procbox fileops'])
        .toString()
        .trim()
        .split('\n')
        .map((p) => readdirSync(`/proc/${p}/fd`).length);
    await ops.read(a, b('d/f'), 10);
    const before = Math.max(...helperFds());
    for (let i = 0; i < 100; i++) {
      await Promise.all([
        ops.read(a, b('d/f'), 10),
        ops.read(a, b('d/nope'), 10).catch(() => undefined),
        ops.read(a, b('out/passwd'), 10).catch(() => undefined),
        ops.stat(a, b('d/nope/x')).catch(() => undefined),
        ops.list(a, b('d')),
        ops.statMany([
          { root: ws, rel: b('d/f') },
          { root: ws, rel: b('d/nope') },
          { root: ws, rel: b('out/x') },
        ]),
        ops.write(a, b('w/w'), b('w'), { owner: 0 }).then(() => ops.delete(a, b('w/w'), false)),
        ops.walk(a, b('d'), 10),
        ops.run(['attach', '2147483646', join(tmp, 'nope')]),
      ]);
    }
    expect(Math.max(...helperFds())).to.be.at.most(before + 1);
  });

  it('run: only the remount, attach and init subcommands; their exit status, output and input', async () => {
    // Anything else is refused before a process starts, so the op cannot run a command in a sandbox.
    for (const sub of ['exec', 'fileops', 'scan', 'probe', '']) {
      const e = await ops.run([sub, 'x']).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(e, sub).to.be.instanceOf(FileOpError);
      expect((e as FileOpError).errno, sub).to.equal('EPERM');
    }
    // stdin reaches the child: init reads NUL-separated configs from it ("-"), and a bad one is its answer.
    const init = await ops.run(['init', '-'], 'nonsense\0');
    expect(init.code).to.equal(1);
    expect(init.stdout).to.match(/^err /);
    // A remount of a process that is not there fails as the spawned helper would: exit 1, "err ..." on stdout.
    writeFileSync(join(tmp, 'config'), `ws /work\nlower ${tmp}\nupper ${join(tmp, 'u')}\nwork ${join(tmp, 'w')}\n`);
    const r = await ops.run(['remount', '2147483646', join(tmp, 'config')]);
    expect(r.code).to.equal(1);
    expect(r.stdout).to.match(/^err /);
    const bad = await ops.run(['attach', '2147483646', join(tmp, 'nope')]);
    expect(bad.code).to.equal(1);
    expect(bad.stdout).to.match(/^err /);
    try {
      await ops.run(['remount', 'a\0b']);
      expect.fail('a NUL in an argument is refused');
    } catch (e) {
      expect((e as RuntimeError).code).to.equal('InvalidArgument');
    }
  });

  it('a helper that dies fails the call in flight (Internal) and the next call starts a new one', async () => {
    writeFileSync(join(ws, 'f'), 'x');
    await ops.read(a, b('f'), 10);
    const pids = execFileSync('pgrep', ['-P', String(process.pid), '-f', 'procbox fileops'])
      .toString()
      .trim()
      .split('\n')
      .map(Number);
    expect(pids.length).to.be.greaterThan(0);
    // A write that takes a while (64 MiB) is in flight when the helper is killed.
    const inflight = ops.write(a, b('big'), Buffer.alloc(64 << 20), { owner: 0 }).catch((e: unknown) => e);
    for (const p of pids) process.kill(p, 'SIGKILL');
    const e = await inflight;
    if (e !== undefined) expect((e as RuntimeError).code).to.equal('Internal');
    expect((await ops.read(a, b('f'), 10)).toString()).to.equal('x');
  });

  it('a malformed or oversized frame ends the helper with a message; nothing is done', () => {
    const helper = defaultHelperPath();
    const huge = Buffer.alloc(4);
    huge.writeUInt32LE(0xffffffff);
    let r = spawnSync(helper, ['fileops'], { input: huge });
    expect(r.status).to.equal(1);
    expect(r.stderr.toString()).to.match(/bad frame length/);
    const short = Buffer.alloc(8);
    short.writeUInt32LE(100);
    r = spawnSync(helper, ['fileops'], { input: short });
    expect(r.status).to.equal(1);
    expect(r.stderr.toString()).to.match(/truncated frame/);
    // A well-framed request with a bad argument list is answered with EINVAL, not acted on.
    const bad = Buffer.from([9, 0, 0, 0, 1, 0, 0, 0, 5, 200, 0, 0, 0]);
    r = spawnSync(helper, ['fileops'], { input: bad });
    expect(r.status).to.equal(0);
    expect(r.stdout.readInt32LE(8)).to.equal(22); // EINVAL
    expect(lstatSync(ws).isDirectory()).to.equal(true);
  });
});
