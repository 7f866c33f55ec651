import { expect } from 'chai';
import { spawn } from 'node:child_process';
import {
  existsSync,
  mkdtempSync,
  readFileSync,
  watch,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
  chmodSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { mkdirPrivate, removeTempFiles, SYNC_WRITE_MAX, writeFileAtomic } from '../../../native/workspace/atomic.js';
import { poolBlocked, within } from '../../support/pool-block.js';
import { whileSpying } from '../../support/spy-builtin.js';

const repo = new URL('../../../', import.meta.url).pathname;

describe('workspace/atomic', function () {
  this.timeout(30_000);
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'ws-atomic-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('writes the content with exactly the mode, replacing an old file, leaving no temp file', async () => {
    const p = join(dir, 'f');
    writeFileSync(p, 'old');
    const old = process.umask(0o077);
    try {
      await writeFileAtomic(p, 'new content', 0o644);
    } finally {
      process.umask(old);
    }
    expect(readFileSync(p, 'utf8')).to.equal('new content');
    expect(statSync(p).mode & 0o7777).to.equal(0o644);
    expect(readdirSync(dir)).to.deep.equal(['f']);
    await writeFileAtomic(p, Buffer.from('again'));
    expect(readFileSync(p, 'utf8')).to.equal('again');
    expect(statSync(p).mode & 0o7777).to.equal(0o600);
  });

  it('replaces a symlink at the destination instead of writing through it', async () => {
    const target = join(dir, 'target');
    writeFileSync(target, 'keep');
    symlinkSync(target, join(dir, 'link'));
    await writeFileAtomic(join(dir, 'link'), 'x');
    expect(readFileSync(target, 'utf8')).to.equal('keep');
    expect(statSync(join(dir, 'link')).isFile()).to.equal(true);
  });

  it('on error leaves the destination untouched and no temp file', async () => {
    const p = join(dir, 'f');
    writeFileSync(p, 'old');
    // Renaming a file over a non-empty directory fails after the temp file was written.
    const sub = join(dir, 'sub');
    await mkdirPrivate(join(sub, 'child'));
    const err = await writeFileAtomic(sub, 'x').catch((e: unknown) => e);
    expect(err).to.be.instanceOf(Error);
    expect(readdirSync(dir).sort()).to.deep.equal(['f', 'sub']);
    expect(readFileSync(p, 'utf8')).to.equal('old');
  });

  it('a process killed mid-write never leaves a partial file at the destination', async function () {
    this.timeout(30_000);
    // A child rewrites an 4 MiB file in a loop with alternating content; we SIGKILL it at
    // points where a write is in flight. After each kill the destination holds one complete version.
    const p = join(dir, 'big');
    const a = Buffer.alloc(4 << 20, 0x61);
    const b = Buffer.alloc(4 << 20, 0x62);
    writeFileSync(p, a);
    const script = join(dir, 'loop.mts');
    writeFileSync(
      script,
      `import { writeFileAtomic } from ${JSON.stringify(repo + 'native/workspace/atomic.ts')};
const p = process.argv[2];
for (let i = 0; ; i++) { await writeFileAtomic(p, Buffer.alloc(4 << 20, i % 2 ? 0x61 : 0x62)); if (i === 0) console.log('go'); }`,
    );
    // Each round kills the writer the moment a temp file appears in the directory (an fs.watch
    // event, not a fixed delay), so the kill lands while a write is in flight. Rounds go on
    // until one kill left a temp file behind (at most 10): on a loaded machine a write can
    // still finish between the event and the signal, which is fine, and then it is retried.
    let leftovers = 0;
    for (let round = 0; round < 10 && leftovers === 0; round++) {
      const child = spawn(process.execPath, ['--import', 'tsx', script, p], {
        cwd: repo,
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      await new Promise((r) => child.stdout.once('data', r));
      await new Promise<void>((resolve) => {
        const w = watch(dir, (_ev, name) => {
          if (name && /\.tmp-[0-9a-f]{12}$/.test(String(name)) && existsSync(join(dir, String(name)))) {
            child.kill('SIGKILL');
            w.close();
            resolve();
          }
        });
      });
      await new Promise((r) => child.once('exit', r));
      const got = readFileSync(p);
      expect(got.length).to.equal(4 << 20);
      expect(got.equals(a) || got.equals(b)).to.equal(true);
      leftovers = await removeTempFiles(dir);
    }
    // A kill landed mid-write (a temp file was left behind), and leftovers are only temp
    // files, which removeTempFiles cleaned.
    expect(leftovers).to.be.greaterThan(0);
    expect(readdirSync(dir).sort()).to.deep.equal(['big', 'loop.mts']);
  });

  // Small writes do their open, write, close and rename on the event loop; only the fsyncs wait
  // for libuv's thread pool (each pool call is a loop round trip, and it queues behind any other
  // file I/O of the process). Shown with every pool thread blocked.
  it('a small write without fsync lands while every pool thread is busy; a durable one waits for its fsyncs, leaving the old content until then', async () => {
    const p = join(dir, 'state.json');
    writeFileSync(p, 'old');
    const pool = await poolBlocked(dir);
    let durable: Promise<void> | undefined;
    try {
      expect(await within(writeFileAtomic(p, 'quick', 0o600, { durable: false }), 5000)).to.equal('done');
      expect(readFileSync(p, 'utf8')).to.equal('quick');
      durable = writeFileAtomic(p, 'durable');
      expect(await within(durable, 300), 'the fsync is in the pool').to.equal('still waiting');
      expect(readFileSync(p, 'utf8'), 'renamed only after the fsync').to.equal('quick');
    } finally {
      await pool.release();
    }
    await durable;
    expect(readFileSync(p, 'utf8')).to.equal('durable');
    expect(readdirSync(dir).filter((n) => n.includes('.tmp-'))).to.deep.equal([]);
  });

  it(`writes up to SYNC_WRITE_MAX (${SYNC_WRITE_MAX} bytes) on the event loop; one byte more goes through the pool`, async () => {
    const p = join(dir, 'edge');
    const pool = await poolBlocked(dir);
    let big: Promise<void> | undefined;
    try {
      const at = Buffer.alloc(SYNC_WRITE_MAX, 0x61);
      expect(await within(writeFileAtomic(p, at, 0o600, { durable: false }), 5000)).to.equal('done');
      expect(readFileSync(p).equals(at)).to.equal(true);
      // A string's size is its UTF-8 bytes: SYNC_WRITE_MAX - 1 ASCII bytes and one 2-byte character.
      big = writeFileAtomic(p, 'b'.repeat(SYNC_WRITE_MAX - 1) + 'é', 0o600, { durable: false });
      expect(await within(big, 300), 'the open of a larger write is in the pool').to.equal('still waiting');
    } finally {
      await pool.release();
    }
    await big;
    expect(readFileSync(p, 'utf8')).to.equal('b'.repeat(SYNC_WRITE_MAX - 1) + 'é');
  });

  it('fsyncs the file and its directory by default, only the file with syncDir false, nothing with durable false', async () => {
    const p = join(dir, 'f');
    const count = async (opts: Parameters<typeof writeFileAtomic>[3], size: number) => {
      let n = 0;
      await whileSpying(
        'node:fs',
        ['fsync'],
        () => n++,
        () => writeFileAtomic(p, Buffer.alloc(size, 0x63), 0o600, opts),
      );
      return n;
    };
    for (const size of [10, SYNC_WRITE_MAX + 1]) {
      // The larger write's fsync goes through a FileHandle (fs/promises), not fs.fsync: its
      // directory's fsync is the one counted.
      const file = size <= SYNC_WRITE_MAX ? 1 : 0;
      expect(await count({}, size), `default, ${size} bytes`).to.equal(file + 1);
      expect(await count({ syncDir: false }, size), `syncDir false, ${size} bytes`).to.equal(file);
      expect(await count({ durable: false }, size), `durable false, ${size} bytes`).to.equal(0);
      expect(readFileSync(p).equals(Buffer.alloc(size, 0x63))).to.equal(true);
    }
  });

  it('mkdirPrivate: 0700, recursive, idempotent, tightens an existing directory', async () => {
    const p = join(dir, 'a/b/c');
    await mkdirPrivate(p);
    await mkdirPrivate(p);
    expect(statSync(p).mode & 0o777).to.equal(0o700);
    expect(statSync(join(dir, 'a')).mode & 0o777).to.equal(0o700);
    chmodSync(p, 0o755);
    await mkdirPrivate(p);
    expect(statSync(p).mode & 0o777).to.equal(0o700);
  });
});
