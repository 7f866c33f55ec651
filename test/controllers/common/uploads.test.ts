// The upload staging (controllers/common/uploads.ts) on real files: the offsets log ignores a
// torn record; the staging bound and the free space refuse an open with 507 at their edges;
// idle uploads expire with their staging; a full disk (a real tmpfs) answers 507 and keeps
// every acknowledged byte, and the upload continues once there is room; a restart (a new store
// on the same directory) continues from the durable offset and verifies from the staged file.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { lastOffset, UploadStore } from '../../../controllers/common/uploads.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import { mountTmpfs, unmountTmpfs } from '../../fulldisk.js';
import { skipWith } from '../../skip.js';
import { within } from '../../support/pool-block.js';

const MiB = 1024 * 1024;

async function code(p: Promise<unknown>): Promise<number> {
  try {
    await p;
  } catch (e) {
    if (e instanceof StatusError) return e.code;
    throw e;
  }
  return 0;
}

/** What `write` is handed: the staged file, open; read from its offset to its end. */
async function collect(src: { fd: number }): Promise<Buffer> {
  const out: Buffer[] = [];
  const b = Buffer.alloc(MiB);
  for (let n; (n = fs.readSync(src.fd, b, 0, b.length, null)) > 0;) out.push(Buffer.from(b.subarray(0, n)));
  return Buffer.concat(out);
}

describe('upload staging', () => {
  let root: string;
  beforeEach(() => (root = fs.mkdtempSync(path.join(os.tmpdir(), 'uploads-test-'))));
  afterEach(() => fs.rmSync(root, { recursive: true, force: true }));

  it('the offsets log: the last whole valid record; a torn or damaged tail is ignored', async () => {
    const s = new UploadStore(root, { freeBytes: () => 2 ** 40, syncEveryBytes: 0 });
    const u = await s.open('own1', { path: '/work/a', size: 10 });
    await s.writeChunk('own1', u.id, 0, Buffer.from('abcd'));
    await s.writeChunk('own1', u.id, 4, Buffer.from('ef'));
    const log = path.join(root, 'own1', 'uploads', u.id, 'offsets');
    const b = fs.readFileSync(log);
    expect(lastOffset(b)?.received).to.equal(6);
    // A new store on the directory: a restart, nothing known but the logs.
    const restarted = () => new UploadStore(root, { freeBytes: () => 2 ** 40 }).get('own1', u.id);
    fs.appendFileSync(log, b.subarray(0, 10)); // a torn record
    expect((await restarted()).received).to.equal(6);
    const bad = Buffer.from(b.subarray(24, 48));
    bad[0] ^= 0xff; // a damaged last record
    fs.writeFileSync(log, Buffer.concat([b.subarray(0, 24), bad]));
    expect((await restarted()).received).to.equal(4);
  });

  it('between checkpoints a restart continues after every chunk whose bytes are staged, never past one that is not', async () => {
    const s = new UploadStore(root, { freeBytes: () => 2 ** 40, syncEveryBytes: 3 * MiB });
    const data = Buffer.alloc(6 * MiB);
    for (let i = 0; i < data.length; i += 4) data.writeUInt32LE(i, i);
    const u = await s.open('own1', { path: '/work/a', size: data.length });
    const dir = path.join(root, 'own1', 'uploads', u.id);
    for (let o = 0; o < 5 * MiB; o += MiB) await s.writeChunk('own1', u.id, o, data.subarray(o, o + MiB));
    await s.settled('own1', u.id);
    // A checkpoint at 3 MiB (durable, made in the background), then two chunk records not
    // synced; the log keeps the three at or below the checkpoint (a restart skips them).
    expect(lastOffset(fs.readFileSync(path.join(dir, 'offsets')))?.received).to.equal(3 * MiB);
    expect(fs.statSync(path.join(dir, 'chunks')).size).to.equal(5 * 32);
    const restarted = () => new UploadStore(root, { freeBytes: () => 2 ** 40 });
    expect((await restarted().get('own1', u.id)).received).to.equal(5 * MiB); // kill -9: the page cache kept them
    // A host crash that wrote the fifth chunk's record but not its bytes: back to 4 MiB.
    const fd = fs.openSync(path.join(dir, 'data'), 'r+');
    fs.writeSync(fd, Buffer.alloc(4096), 0, 4096, 4 * MiB + 100);
    const s2 = restarted();
    expect((await s2.get('own1', u.id)).received).to.equal(4 * MiB);
    // ... and the fourth's bytes too: back to the checkpoint, never past it.
    fs.writeSync(fd, Buffer.alloc(1, 0xff), 0, 1, 3 * MiB);
    fs.closeSync(fd);
    expect((await restarted().get('own1', u.id)).received).to.equal(3 * MiB);
    // The store that saw 4 MiB continues there; complete hashes the staged file (no running hash).
    await s2.writeChunk('own1', u.id, 4 * MiB, data.subarray(4 * MiB));
    // Bytes past the size in the staged file (a write a crash cut short, retried elsewhere) are
    // not handed on: the file given to `write` ends at the upload's size.
    fs.appendFileSync(path.join(dir, 'data'), Buffer.alloc(100, 9));
    let written: Buffer | undefined;
    const done = await s2.complete('own1', u.id, async (r) => void (written = await collect(r)));
    expect(written!.length).to.equal(data.length);
    expect(written!.subarray(4 * MiB).equals(data.subarray(4 * MiB))).to.equal(true);
    expect(done.writtenSha256).to.equal(createHash('sha256').update(written!).digest('hex'));
  });

  it('a checkpoint syncs in the background: the next chunks are answered meanwhile; a failed one refuses the next chunk, and is retried', async () => {
    const s = new UploadStore(root, { freeBytes: () => 2 ** 40, syncEveryBytes: 2 * MiB });
    const data = Buffer.alloc(8 * MiB, 7);
    const u = await s.open('own1', { path: '/work/a', size: data.length });
    const offsets = path.join(root, 'own1', 'uploads', u.id, 'offsets');
    // fdatasync held until released (the FileHandle prototype, shared by every handle).
    const probe = await fs.promises.open(offsets, 'r');
    const proto = Object.getPrototypeOf(probe) as { datasync: () => Promise<void> };
    await probe.close();
    const real = proto.datasync;
    let release!: () => void;
    let fail: Error | undefined;
    let gate = new Promise<void>((r) => (release = r));
    let entered!: () => void;
    const inSync = new Promise<void>((r) => (entered = r));
    proto.datasync = async function (this: unknown) {
      entered();
      await gate;
      if (fail) throw fail;
      return real.call(this);
    };
    const chunk = (o: number) => s.writeChunk('own1', u.id, o, data.subarray(o, o + MiB));
    // Each held step must settle while the sync is held (test/support's bound: 'still waiting' otherwise).
    const answered = async <T>(p: Promise<T>, what: string): Promise<T> => {
      expect(await within(p, 5000), what).to.equal('done');
      return p;
    };
    try {
      await chunk(0);
      await answered(chunk(MiB), 'the chunk that starts the checkpoint'); // 2 MiB: its fdatasync is held
      await answered(inSync, 'the checkpoint of 2 MiB');
      // Answered while the sync before them is still held (the old store answered the 2 MiB
      // chunk only after its checkpoint).
      expect((await answered(chunk(2 * MiB), 'the chunk after a held sync')).received).to.equal(3 * MiB);
      expect((await answered(chunk(3 * MiB), 'the next one')).received).to.equal(4 * MiB);
      expect(fs.statSync(offsets).size).to.equal(0); // nothing claimed durable yet
      release();
      await s.settled('own1', u.id);
      expect(lastOffset(fs.readFileSync(offsets))?.received).to.equal(2 * MiB);
      // The next checkpoint (at 4 MiB) fails: the chunk after it is refused, received stays.
      fail = Object.assign(new Error('no space'), { code: 'ENOSPC' });
      gate = Promise.resolve();
      await chunk(4 * MiB); // 5 MiB: starts the checkpoint of 4 MiB + 1, which fails
      await s.settled('own1', u.id);
      expect(await code(chunk(5 * MiB))).to.equal(507);
      expect((await s.get('own1', u.id)).received).to.equal(5 * MiB);
      // Retried once the disk answers again: the chunk goes in, and its checkpoint with it.
      fail = undefined;
      expect((await chunk(5 * MiB)).received).to.equal(6 * MiB);
      await s.settled('own1', u.id);
      expect(lastOffset(fs.readFileSync(offsets))?.received).to.equal(6 * MiB);
    } finally {
      proto.datasync = real;
      release();
    }
  });

  it('the staging bound and the free space: at the edge passes, one byte past is 507 naming the bound', async () => {
    const s = new UploadStore(root, { maxStagedBytes: 100, reserveBytes: 0, freeBytes: () => 2 ** 40 });
    const a = await s.open('own1', { path: '/work/a', size: 60 });
    const err = await s.open('own2', { path: '/work/b', size: 41 }).catch((e: StatusError) => e);
    expect((err as StatusError).code).to.equal(507);
    expect((err as StatusError).message).to.match(/maxStagedBytes/);
    await s.open('own2', { path: '/work/b', size: 40 });
    await s.abort('own1', a.id);
    await s.open('own2', { path: '/work/c', size: 60 });
    const free = new UploadStore(root + '-f', { reserveBytes: 10, freeBytes: () => 110 });
    fs.mkdirSync(root + '-f');
    try {
      expect(await code(free.open('o', { path: '/work/a', size: 101 }))).to.equal(507);
      expect(await code(free.open('o', { path: '/work/a', size: 100 }))).to.equal(0);
    } finally {
      fs.rmSync(root + '-f', { recursive: true, force: true });
    }
  });

  it('idle uploads expire with their staging; finished records a TTL after they finished', async () => {
    let now = Date.parse('2026-12-01T00:00:00Z');
    const s = new UploadStore(root, { ttlMs: 3600_000, now: () => now, freeBytes: () => 2 ** 40 });
    const idle = await s.open('own1', { path: '/work/a', size: 10 });
    const busy = await s.open('own1', { path: '/work/b', size: 10 });
    now += 3000_000;
    await s.writeChunk('own1', busy.id, 0, Buffer.from('x'));
    now += 700_000; // idle: 3700 s, busy: 700 s since its chunk
    expect(await s.sweep()).to.deep.equal([idle.id]);
    expect(fs.existsSync(path.join(root, 'own1', 'uploads', idle.id))).to.equal(false);
    expect((await s.get('own1', busy.id)).received).to.equal(1);
    expect((await s.get('own1', busy.id)).expiresAt).to.equal(new Date(now - 700_000 + 3600_000).toISOString());
  });

  it('a restart continues from the durable offset and verifies the staged file; a wrong checksum writes nothing', async () => {
    const data = Buffer.alloc(3 * MiB, 7);
    data.write('head');
    const sha = createHash('sha256').update(data).digest('hex');
    const s1 = new UploadStore(root, { freeBytes: () => 2 ** 40 });
    const u = await s1.open('own1', { path: '/work/a', size: data.length, sha256: sha });
    await s1.writeChunk('own1', u.id, 0, data.subarray(0, MiB));
    const s2 = new UploadStore(root, { freeBytes: () => 2 ** 40 }); // no running hash: a new process
    expect((await s2.get('own1', u.id)).received).to.equal(MiB);
    expect(await code(s2.writeChunk('own1', u.id, 0, data.subarray(0, MiB)))).to.equal(409);
    await s2.writeChunk('own1', u.id, MiB, Readable.from([data.subarray(MiB, 2 * MiB), data.subarray(2 * MiB)]));
    let written: Buffer | undefined;
    const done = await s2.complete('own1', u.id, async (r) => void (written = await collect(r)));
    expect(done).to.include({ state: 'Complete', writtenSha256: sha });
    expect(written!.equals(data)).to.equal(true);
    // Again: the same record, nothing written.
    written = undefined;
    expect((await s2.complete('own1', u.id, async (r) => void (written = await collect(r)))).completedAt).to.equal(
      done.completedAt,
    );
    expect(written).to.equal(undefined);
    const bad = await s2.open('own1', { path: '/work/b', size: 4, sha256: 'a'.repeat(64) });
    await s2.writeChunk('own1', bad.id, 0, Buffer.from('abcd'));
    expect(await code(s2.complete('own1', bad.id, async () => void (written = Buffer.from('x'))))).to.equal(409);
    expect(written).to.equal(undefined);
    expect(fs.existsSync(path.join(root, 'own1', 'uploads', bad.id, 'data'))).to.equal(false);
  });

  describe('a full disk (a real tmpfs)', () => {
    let dir: string | undefined;
    before(function () {
      const m = mountTmpfs('8m');
      skipWith(this, m.why);
      dir = m.dir;
    });
    after(() => dir && unmountTmpfs(dir));

    it('a chunk that does not fit is 507; every acknowledged byte is kept and the upload continues once there is room', async () => {
      const s = new UploadStore(dir!, { reserveBytes: 0 });
      const u = await s.open('own1', { path: '/work/a', size: 7 * MiB });
      await s.writeChunk('own1', u.id, 0, Buffer.alloc(3 * MiB, 1));
      const filler = path.join(dir!, 'filler');
      fs.writeFileSync(filler, Buffer.alloc(4 * MiB)); // the disk now has less than 2 MiB
      const err = await s.writeChunk('own1', u.id, 3 * MiB, Buffer.alloc(3 * MiB, 2)).catch((e: StatusError) => e);
      expect((err as StatusError).code).to.equal(507);
      expect((await s.get('own1', u.id)).received).to.equal(3 * MiB);
      fs.rmSync(filler);
      await s.writeChunk('own1', u.id, 3 * MiB, Buffer.alloc(4 * MiB, 2));
      let n = 0;
      const ones = (b: Buffer, v: number) => b.every((x) => x === v);
      await s.complete('own1', u.id, async (r) => {
        const all = await collect(r);
        n = all.length;
        expect(ones(all.subarray(0, 3 * MiB), 1) && ones(all.subarray(3 * MiB), 2)).to.equal(true);
      });
      expect(n).to.equal(7 * MiB);
    });
  });
});
