// Large files on procbox: the streaming write (writeFileStream: a one-entry archive through the
// helper's fd-anchored tar-in, renamed into place only once every byte arrived; an open file,
// as an upload's staged file is, handed to the helper's file-in instead) and ranged reads
// (readRange: one open file for bytes, size, mtime, validator and checksum). The attack next to
// the feature: symlinks the sandbox plants at the destination or in its parent never redirect
// the write to the host, and a short or long stream leaves nothing at the path.
import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { RuntimeError } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

/** `total` deterministic bytes in `piece`-sized chunks, made as they are read (never held whole). */
function bytes(total: number, piece = 1 << 20): Readable {
  let sent = 0;
  return new Readable({
    read() {
      if (sent >= total) return void this.push(null);
      const n = Math.min(piece, total - sent);
      const b = Buffer.alloc(n);
      for (let i = 0; i < n; i += 4096) b.writeUInt32LE((sent + i) >>> 0, i);
      sent += n;
      this.push(b);
    },
  });
}

async function digest(r: Readable): Promise<string> {
  const h = createHash('sha256');
  for await (const c of r) h.update(c as Buffer);
  return h.digest('hex');
}

describe('procbox large files: streaming write and ranged reads', function () {
  this.timeout(120_000);
  let fx: Fixture;
  const id = 'largefiles';
  let victim: string;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id });
    victim = mkdtempSync(join(tmpdir(), 'largefiles-victim-'));
  });
  after(async () => {
    await fx?.cleanup();
    if (victim) rmSync(victim, { recursive: true, force: true });
  });

  it('streams 64 MiB in with the mode, atomically, and reads it back by ranges with its checksum', async () => {
    const size = 64 << 20;
    const want = await digest(bytes(size));
    await fx.rt.writeFileStream(id, '/work/in/big.bin', bytes(size), { size, mode: 0o640, mkdirs: true });
    const r = await sh(
      fx.rt,
      id,
      `stat -c '%s %a %u' /work/in/big.bin && sha256sum /work/in/big.bin && ls -A /work/in`,
    );
    expect(r.code, r.err).to.equal(0);
    expect(r.out).to.equal(`${size} 640 0\n${want}  /work/in/big.bin\nbig.bin\n`);
    const a = await fx.rt.readRange(id, '/work/in/big.bin', 0, 4 << 20, { checksum: true });
    expect(a.size).to.equal(size);
    expect(a.sha256).to.equal(want);
    expect(a.data.length).to.equal(4 << 20);
    expect(a.data.readUInt32LE(4096)).to.equal(4096);
    const b = await fx.rt.readRange(id, '/work/in/big.bin', size - 10, 4 << 20);
    expect(b.data.length).to.equal(10);
    expect(b.etag).to.equal(a.etag);
    // A change makes another validator.
    expect((await sh(fx.rt, id, 'echo x >> /work/in/big.bin')).code).to.equal(0);
    const c = await fx.rt.readRange(id, '/work/in/big.bin', 0, 16);
    expect(c.etag).to.not.equal(a.etag);
    expect(c.size).to.equal(size + 2);
  });

  it('an open file is copied in by the helper: the bytes, mode without setuid, atomically', async () => {
    const size = 48 << 20;
    const src = join(victim, '..', `largefiles-src-${process.pid}`);
    const want = createHash('sha256');
    {
      const fd = openSync(src, 'w');
      for await (const c of bytes(size)) (writeFileSync(fd, c as Buffer), want.update(c as Buffer));
      closeSync(fd);
    }
    const fd = openSync(src, 'r');
    try {
      await fx.rt.writeFileStream(id, '/work/fd/deep/big.bin', { fd }, { size, mode: 0o4750, mkdirs: true });
      const r = await sh(
        fx.rt,
        id,
        `stat -c '%s %a %u' /work/fd/deep/big.bin && sha256sum /work/fd/deep/big.bin && ls -A /work/fd/deep`,
      );
      expect(r.code, r.err).to.equal(0);
      expect(r.out).to.equal(`${size} 750 0\n${want.digest('hex')}  /work/fd/deep/big.bin\nbig.bin\n`);
    } finally {
      closeSync(fd);
      rmSync(src, { force: true });
    }
  });

  it('an open file shorter or longer than announced, or a directory at the path: nothing changes', async () => {
    expect((await sh(fx.rt, id, 'mkdir -p /work/fs/d && echo old > /work/fs/f')).code).to.equal(0);
    const src = join(victim, '..', `largefiles-short-${process.pid}`);
    writeFileSync(src, Buffer.alloc(1000, 7));
    const fd = openSync(src, 'r');
    const at = (n: number) => ({ fd: openSync(`/proc/self/fd/${fd}`, 'r'), n });
    try {
      for (const [size, code] of [
        [1001, 'InvalidArgument'],
        [999, 'InvalidArgument'],
      ] as const) {
        const f = at(size);
        try {
          expect((await rejects(fx.rt.writeFileStream(id, '/work/fs/f', { fd: f.fd }, { size }))).code).to.equal(code);
        } finally {
          closeSync(f.fd);
        }
      }
      const f = at(1000);
      try {
        expect((await rejects(fx.rt.writeFileStream(id, '/work/fs/d', { fd: f.fd }, { size: 1000 }))).code).to.equal(
          'IsADirectory',
        );
      } finally {
        closeSync(f.fd);
      }
      const r = await sh(fx.rt, id, 'cat /work/fs/f; ls -A /work/fs /work/fs/d');
      expect(r.out).to.equal('old\n/work/fs:\nd\nf\n\n/work/fs/d:\n');
    } finally {
      closeSync(fd);
      rmSync(src, { force: true });
    }
  });

  it('a pipe handed over as the open file: read and written by the helper, its length checked', async () => {
    const fifo = join(victim, '..', `largefiles-fifo-${process.pid}`);
    const src = `${fifo}.src`;
    const body = Buffer.alloc(3 * 1024 * 1024 + 7);
    for (let i = 0; i + 4 <= body.length; i += 1000) body.writeUInt32LE(i, i);
    writeFileSync(src, body);
    expect(spawnSync('mkfifo', [fifo]).status).to.equal(0);
    try {
      for (const [size, ok] of [
        [body.length, true],
        [body.length - 1, false],
      ] as const) {
        const writer = spawn('sh', ['-c', `cat "$0" > "$1"`, src, fifo], { stdio: 'ignore' });
        const closed = new Promise((r) => writer.once('close', r));
        const fd = openSync(fifo, 'r'); // returns once the writer opened its end
        try {
          const p = fx.rt.writeFileStream(id, '/work/fifo.bin', { fd }, { size });
          if (ok) await p;
          else expect((await rejects(p)).code).to.equal('InvalidArgument');
        } finally {
          closeSync(fd);
          await closed;
        }
      }
      const r = await sh(fx.rt, id, 'sha256sum < /work/fifo.bin');
      expect(r.out.split(' ')[0]).to.equal(createHash('sha256').update(body).digest('hex'));
    } finally {
      rmSync(fifo, { force: true });
      rmSync(src, { force: true });
    }
  });

  it('a race: the sandbox swaps the parent and the name for symlinks out and directories while file-in writes', async () => {
    const src = join(victim, '..', `largefiles-race-${process.pid}`);
    writeFileSync(src, Buffer.alloc(64 * 1024, 5));
    expect((await sh(fx.rt, id, 'mkdir -p /work/race/p && rm -f /work/race/stop')).code).to.equal(0);
    // Until the test says stop: p flips between a directory and a symlink to the host's victim
    // directory, and p/f between a symlink into it and a directory.
    const flipping = sh(
      fx.rt,
      id,
      `cd /work/race; n=0; while [ ! -e stop ]; do
         rm -rf p; ln -s ${victim} p; rm -f p; mkdir p; ln -s ${victim}/owned p/f; rm -f p/f; mkdir p/f; rmdir p/f
         n=$((n+1)); done; echo $n`,
      120_000,
    );
    const outcomes = new Set<string>();
    try {
      for (let i = 0; i < 40; i++) {
        const fd = openSync(src, 'r');
        try {
          await fx.rt.writeFileStream(id, '/work/race/p/f', { fd }, { size: 64 * 1024, mkdirs: true });
          outcomes.add('written');
        } catch (e) {
          expect(e).to.be.instanceOf(RuntimeError);
          outcomes.add((e as RuntimeError).code);
        } finally {
          closeSync(fd);
        }
      }
    } finally {
      await sh(fx.rt, id, 'touch /work/race/stop');
      rmSync(src, { force: true });
    }
    const flips = await flipping;
    expect(flips.code, flips.err).to.equal(0);
    expect(Number(flips.out.trim()), 'the loop ran while the writes did').to.be.above(0);
    // Whatever each write met, nothing reached the host, and every failure was a refusal.
    expect(readdirSync(victim)).to.deep.equal([]);
    expect(
      [...outcomes].every((o) => ['written', 'InvalidPath', 'IsADirectory', 'NotADirectory', 'NotFound'].includes(o)),
      [...outcomes].join(', '),
    ).to.equal(true);
  });

  it('a small file: whole from the helper, validator from its content', async () => {
    expect((await sh(fx.rt, id, 'printf hello > /work/small.txt')).code).to.equal(0);
    const a = await fx.rt.readRange(id, '/work/small.txt', 1, 3, { checksum: true });
    expect(a.data.toString()).to.equal('ell');
    expect(a.size).to.equal(5);
    expect(a.sha256).to.equal(createHash('sha256').update('hello').digest('hex'));
    expect((await sh(fx.rt, id, 'printf hellO > /work/small.txt')).code).to.equal(0);
    expect((await fx.rt.readRange(id, '/work/small.txt', 0, 5)).etag).to.not.equal(a.etag);
  });

  it('a stream shorter or longer than announced writes nothing at the path and leaves no staging', async () => {
    expect((await sh(fx.rt, id, 'mkdir -p /work/s && echo old > /work/s/f')).code).to.equal(0);
    expect((await rejects(fx.rt.writeFileStream(id, '/work/s/f', bytes(1000), { size: 1001 }))).code).to.equal(
      'InvalidArgument',
    );
    expect((await rejects(fx.rt.writeFileStream(id, '/work/s/f', bytes(1002), { size: 1001 }))).code).to.equal(
      'InvalidArgument',
    );
    const r = await sh(fx.rt, id, 'cat /work/s/f; ls -A /work/s');
    expect(r.out).to.equal('old\nf\n');
  });

  it('symlinks planted by the sandbox never redirect the write out of the workspace', async () => {
    // The targets name a host directory: followed by the host, they would write there.
    const s = await sh(
      fx.rt,
      id,
      `set -e; mkdir -p /work/atk; ln -sfn ${victim} /work/atk/dirlink; ln -sfn ${victim}/owned /work/atk/dest; ln -sfn ../../../../../../..${victim} /work/atk/uplink`,
    );
    expect(s.code, s.err).to.equal(0);
    // A symlink as a parent: refused (it leads out of the workspace), nothing written.
    expect((await rejects(fx.rt.writeFileStream(id, '/work/atk/dirlink/x', bytes(10), { size: 10 }))).code).to.equal(
      'InvalidPath',
    );
    expect(
      (await rejects(fx.rt.writeFileStream(id, '/work/atk/uplink/x', bytes(10), { size: 10, mkdirs: true }))).code,
    ).to.equal('InvalidPath');
    // A symlink at the destination: replaced by the file, not followed.
    await fx.rt.writeFileStream(id, '/work/atk/dest', bytes(10), { size: 10 });
    expect(readdirSync(victim)).to.deep.equal([]);
    expect(existsSync(join(victim, 'owned'))).to.equal(false);
    const r = await sh(fx.rt, id, 'stat -c %F /work/atk/dest');
    expect(r.out.trim()).to.equal('regular file');
    // The same through the helper's file-in (an open file, as an upload's staged file is).
    const src = join(victim, '..', `largefiles-atk-${process.pid}`);
    writeFileSync(src, 'attack!!!!');
    const fds = [0, 1, 2].map(() => openSync(src, 'r'));
    try {
      expect(
        (await rejects(fx.rt.writeFileStream(id, '/work/atk/dirlink/y', { fd: fds[0]! }, { size: 10 }))).code,
      ).to.equal('InvalidPath');
      expect(
        (await rejects(fx.rt.writeFileStream(id, '/work/atk/uplink/y', { fd: fds[1]! }, { size: 10, mkdirs: true })))
          .code,
      ).to.equal('InvalidPath');
      expect((await sh(fx.rt, id, `ln -sfn ${victim}/owned2 /work/atk/dest2`)).code).to.equal(0);
      await fx.rt.writeFileStream(id, '/work/atk/dest2', { fd: fds[2]! }, { size: 10 });
    } finally {
      fds.forEach((f) => closeSync(f));
      rmSync(src, { force: true });
    }
    expect(readdirSync(victim)).to.deep.equal([]);
    expect((await sh(fx.rt, id, 'stat -c %F /work/atk/dest2; cat /work/atk/dest2')).out).to.equal(
      'regular file\nattack!!!!',
    );
    // Reads do not follow them out either.
    expect((await rejects(fx.rt.readRange(id, '/work/atk/dirlink/x', 0, 1))).code).to.equal('InvalidPath');
  });
});
