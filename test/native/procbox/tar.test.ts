// The tar streams of the procbox files API (fileops.c tar-out / tar-in through fileops.ts):
// a tree with modes, spaces, a long name and a symlink goes out and comes back identical;
// hostile archives (.., absolute, a symlink then a file through it, a symlink the sandbox
// planted, hard links, devices, FIFOs, setuid bits, too many entries, a cut archive) are
// refused with nothing written, in the workspace or outside it.
import { expect } from 'chai';
import { existsSync } from 'node:fs';
import { Readable } from 'node:stream';
import { noSpaceError } from '../../../controllers/sandbox/request.js';
import { RuntimeError } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { archive, tarEntry as entry } from '../../tar-entries.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

async function collect(r: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of r) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** Every entry below dir as "type mode size path -> link" lines plus file hashes (in the sandbox). */
const TREE = (dir: string) =>
  `cd ${dir} && find . -mindepth 1 -printf '%y %m %s %p -> %l\\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum`;

describe('procbox tar streams (fluxctl cp)', function () {
  this.timeout(60_000);
  let fx: Fixture;
  const id = 'tar';

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id });
  });
  after(async () => fx?.cleanup());

  it('round trip: modes, spaces, a long name, a symlink and nested dirs come back identical', async () => {
    const long = 'n'.repeat(150);
    const r = await sh(
      fx.rt,
      id,
      `set -e; mkdir -p '/work/src/sub dir/deep'; printf 'run\\n' > /work/src/run.sh; chmod 0755 /work/src/run.sh;
       printf 'secret' > '/work/src/sub dir/key'; chmod 0600 '/work/src/sub dir/key'; head -c 300000 /dev/urandom > '/work/src/sub dir/deep/blob';
       chmod 0640 '/work/src/sub dir/deep/blob'; echo long > /work/src/${long}; ln -s '../run.sh' '/work/src/sub dir/link'; chmod 0750 '/work/src/sub dir'`,
    );
    expect(r.code, r.err).to.equal(0);
    const tar = await collect(await fx.rt.readTar!(id, '/work/src'));
    expect(tar.length % 512).to.equal(0);
    // Entries are named relative to the directory's parent: strip "src/" by extracting into /work/copy's parent name.
    const sum = await fx.rt.writeTar!(id, '/work/out', Readable.from([tar]));
    expect(sum).to.include({ files: 4, symlinks: 1, dirs: 3 });
    const a = await sh(fx.rt, id, TREE('/work/src'));
    const b = await sh(fx.rt, id, TREE('/work/out/src'));
    expect(b.out).to.equal(a.out);
    expect(a.out).to.include('l 777 9 ./sub dir/link -> ../run.sh');
    expect(a.out).to.include('f 755 4 ./run.sh');
    expect(a.out).to.include('d 750');
    // Owned by the sandbox's root, as every file the files API writes.
    const own = await sh(fx.rt, id, `stat -c '%u %g' /work/out/src/run.sh /work/out/src`);
    expect(own.out).to.equal('0 0\n0 0\n');
    // A single file goes out as one entry named by its last component.
    const one = await collect(await fx.rt.readTar!(id, '/work/src/run.sh'));
    expect(one.subarray(0, 6).toString()).to.equal('run.sh');
    expect(one.length).to.equal(512 + 512 + 1024);
  });

  it('tar-out refuses what the files API refuses: missing, a symlink out of the workspace', async () => {
    expect((await rejects(fx.rt.readTar!(id, '/work/nope'))).code).to.equal('NotFound');
    expect((await sh(fx.rt, id, 'ln -sfn /etc /work/out-link')).code).to.equal(0);
    expect((await rejects(fx.rt.readTar!(id, '/work/out-link'))).code).to.equal('InvalidPath');
    expect((await rejects(fx.rt.readTar!(id, '/etc'))).code).to.equal('InvalidPath');
  });

  describe('hostile archives: refused, nothing written', () => {
    before(async () => {
      const r = await sh(
        fx.rt,
        id,
        'set -e; mkdir -p /work/t; echo keep > /work/t/keep; ln -sfn /etc /work/t/planted; ln -sfn /tmp /work/t/tmplink',
      );
      expect(r.code, r.err).to.equal(0);
    });
    const cases: [string, () => Buffer, RegExp][] = [
      [
        'a ../ name',
        () =>
          archive(
            entry('ok.txt', '0', { data: Buffer.from('ok') }),
            entry('../escape.txt', '0', { data: Buffer.from('x') }),
          ),
        /'\.\.' in an archive path/,
      ],
      [
        'a nested ../ name',
        () => archive(entry('a/../../escape.txt', '0', { data: Buffer.from('x') })),
        /'\.\.' in an archive path/,
      ],
      [
        'an absolute name',
        () => archive(entry('/etc/fluxvm-tar-escape', '0', { data: Buffer.from('x') })),
        /absolute path in the archive/,
      ],
      [
        'a symlink, then a file through it',
        () => archive(entry('l', '2', { link: '/etc' }), entry('l/fluxvm-tar-escape', '0', { data: Buffer.from('x') })),
        /through a symlink/,
      ],
      [
        'a relative symlink, then a dir through it',
        () => archive(entry('up', '2', { link: '../..' }), entry('up/d/', '5', { mode: 0o755 })),
        /through a symlink/,
      ],
      [
        'a path through the symlink the sandbox planted',
        () => archive(entry('planted/fluxvm-tar-escape', '0', { data: Buffer.from('x') })),
        /through a symlink/,
      ],
      ['a hard link', () => archive(entry('h', '1', { link: 'keep' })), /hard link in the archive/],
      ['a device', () => archive(entry('dev', '3', { mode: 0o666 })), /device file/],
      ['a FIFO', () => archive(entry('fifo', '6')), /FIFO in the archive/],
      ['a cut archive', () => entry('big', '0', { data: Buffer.alloc(100), size: 4096 }), /truncated/],
      ['not a tar', () => Buffer.alloc(2048, 0x41), /not a tar archive/],
      // A record whose length (after skipped newlines) ends before its key: the parser's memchr
      // once ran off the heap from there.
      [
        'a pax record that ends before its key',
        () =>
          archive(
            entry('././@PaxHeader', 'x', { data: Buffer.from('\n\n\n\n1 ') }),
            entry('ok.txt', '0', { data: Buffer.from('ok') }),
          ),
        /bad pax header/,
      ],
      [
        'a pax record with a sign',
        () =>
          archive(
            entry('././@PaxHeader', 'x', { data: Buffer.from('+12 path=xy\n') }),
            entry('ok.txt', '0', { data: Buffer.from('ok') }),
          ),
        /bad pax header/,
      ],
    ];
    for (const [what, make, msg] of cases) {
      it(`${what}`, async () => {
        const before = await sh(fx.rt, id, TREE('/work/t'));
        const e = await rejects(fx.rt.writeTar!(id, '/work/t', Readable.from([make()])));
        expect(e.code, e.message).to.equal('InvalidArgument');
        expect(e.message).to.match(msg);
        const after = await sh(fx.rt, id, TREE('/work/t'));
        expect(after.out, 'the target changed').to.equal(before.out);
        expect(after.out).to.not.include('.fluxvm-tar-');
        expect(existsSync('/etc/fluxvm-tar-escape'), 'written on the host').to.equal(false);
        expect((await sh(fx.rt, id, 'ls -a /tmp /work')).out).to.not.include('escape');
      });
    }

    it('a refused archive into a new directory leaves no directory behind', async () => {
      await rejects(
        fx.rt.writeTar!(
          id,
          '/work/fresh',
          Readable.from([archive(entry('a', '0', { data: Buffer.from('a') }), entry('../x', '0'))]),
        ),
      );
      expect((await rejects(fx.rt.stat(id, '/work/fresh'))).code).to.equal('NotFound');
    });

    it('setuid and setgid bits are dropped, the sticky bit and the rest kept', async () => {
      await fx.rt.writeTar!(
        id,
        '/work/modes',
        Readable.from([
          archive(
            entry('suid', '0', { data: Buffer.from('#!/bin/sh\n'), mode: 0o6755 }),
            entry('sticky/', '5', { mode: 0o1777 }),
          ),
        ]),
      );
      expect((await fx.rt.stat(id, '/work/modes/suid')).mode).to.equal(0o755);
      expect((await fx.rt.stat(id, '/work/modes/sticky')).mode).to.equal(0o1777);
    });

    it('the entry limit: at the limit extracts, one past it is LimitExceeded and writes nothing', async () => {
      const files = (n: number) =>
        archive(...Array.from({ length: n }, (_, i) => entry(`f${i}`, '0', { data: Buffer.from(String(i)) })));
      const ok = await fx.rt.writeTar!(id, '/work/lim-ok', Readable.from([files(5)]), { maxEntries: 5 });
      expect(ok.entries).to.equal(5);
      const e = await rejects(fx.rt.writeTar!(id, '/work/lim-bad', Readable.from([files(6)]), { maxEntries: 5 }));
      expect(e.code).to.equal('LimitExceeded');
      expect(e.message).to.match(/more than 5 entries/);
      expect((await rejects(fx.rt.stat(id, '/work/lim-bad'))).code).to.equal('NotFound');
    });

    it('an archive merges into an existing tree: files replaced, symlinks replaced (not followed), dirs merged', async () => {
      expect(
        (
          await sh(
            fx.rt,
            id,
            'set -e; mkdir -p /work/m/d; echo old > /work/m/d/a; echo stay > /work/m/d/b; ln -sfn /etc/passwd /work/m/p',
          )
        ).code,
      ).to.equal(0);
      await fx.rt.writeTar!(
        id,
        '/work/m',
        Readable.from([
          archive(
            entry('./d/', '5', { mode: 0o700 }),
            entry('./d/a', '0', { data: Buffer.from('new\n') }),
            entry('./p', '0', { data: Buffer.from('plain\n') }),
          ),
        ]),
      );
      expect(
        (
          await sh(
            fx.rt,
            id,
            'cat /work/m/d/a /work/m/d/b /work/m/p; stat -c %a /work/m/d; test -L /work/m/p || echo notlink',
          )
        ).out,
      ).to.equal('new\nstay\nplain\n700\nnotlink\n');
      expect(existsSync('/etc/passwd')).to.equal(true);
    });
  });

  it('the disk quota applies: an archive larger than the quota is EDQUOT (a 507 through the API) and leaves nothing', async function () {
    const q = await makeRuntime({ defaultLimits: { diskBytes: 16 * 1024 * 1024 } });
    try {
      skipWith(this, q.rt.volumeStore().quota ? undefined : `no disk quota here: ${q.rt.volumeStore().reason}`);
      await q.rt.create({ id: 'q' });
      const big = archive(
        entry('small', '0', { data: Buffer.from('s') }),
        entry('big', '0', { data: Buffer.alloc(32 << 20, 1) }),
      );
      const e = await rejects(q.rt.writeTar!('q', '/work/in', Readable.from([big])));
      expect(e.message).to.match(/Disk quota exceeded/);
      expect(noSpaceError(e)?.code).to.equal(507);
      expect((await rejects(q.rt.stat('q', '/work/in'))).code).to.equal('NotFound');
      // The space came back: a small archive fits.
      expect(
        (
          await q.rt.writeTar!(
            'q',
            '/work/in',
            Readable.from([archive(entry('small', '0', { data: Buffer.from('s') }))]),
          )
        ).files,
      ).to.equal(1);
    } finally {
      await q.cleanup();
    }
  });

  it('the target must be a directory; a stream that fails midway is an error and writes nothing', async () => {
    expect((await rejects(fx.rt.writeTar!(id, '/work/src/run.sh', Readable.from([archive()])))).code).to.equal(
      'NotADirectory',
    );
    const broken = new Readable({
      read() {
        this.push(entry('x', '0', { data: Buffer.alloc(10) }).subarray(0, 512));
        this.destroy(new Error('client went away'));
      },
    });
    const e = await fx.rt.writeTar!(id, '/work/cut', broken).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(e).to.be.instanceOf(RuntimeError);
    expect((await rejects(fx.rt.stat(id, '/work/cut'))).code).to.equal('NotFound');
  });
});
