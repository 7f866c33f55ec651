import { expect } from 'chai';
import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RuntimeError } from '../../../native/runtime.js';
import { SYNC_WRITE_MAX } from '../../../native/workspace/atomic.js';
import { createStaging, readStagedBase, type StagedBlob } from '../../../native/workspace/staging.js';
import type { Manifest } from '../../../native/workspace/types.js';

const sha = (b: Buffer | string) => 'sha256:' + createHash('sha256').update(b).digest('hex');

describe('workspace/staging', () => {
  let tmp: string;
  beforeEach(() => {
    tmp = mkdtempSync(join(tmpdir(), 'ws-stage-'));
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  /** File contents as the runtime's readFile would hand them over (the name only labels the call). */
  function file(_name: string, bytes: number | string): Buffer {
    return typeof bytes === 'number' ? Buffer.alloc(bytes, 0x78) : Buffer.from(bytes);
  }

  it('lays out <dir>/meta.json, base.json and blobs/NNNNNN with 0700 dirs and 0600 files', async () => {
    const dir = join(tmp, 'changesets/cs-1');
    const st = await createStaging(dir);
    const r0 = (await st.stageData(file('a', 'hello'), { sandboxPath: '/work/a' })) as StagedBlob;
    const r1 = (await st.stageData(file('b', ''), { sandboxPath: '/work/b' })) as StagedBlob;
    expect(r0).to.deep.equal({ blob: '000000', size: 5, sha256: sha('hello') });
    expect(r1).to.deep.equal({ blob: '000001', size: 0, sha256: sha('') });
    const base: Manifest = {
      mode: 'sha256',
      paths: ['/work'],
      files: { '/work/x': sha('x') },
      takenAt: '2026-01-01T00:00:00.000Z',
    };
    await st.writeBase(base);
    await st.writeMeta({ state: 'pending', staged: [{ path: '/work/a', ...r0 }] });
    expect(readdirSync(dir).sort()).to.deep.equal(['base.json', 'blobs', 'meta.json']);
    expect(readdirSync(join(dir, 'blobs')).sort()).to.deep.equal(['000000', '000001']);
    expect(readFileSync(join(dir, 'blobs/000000'), 'utf8')).to.equal('hello');
    for (const d of [dir, join(dir, 'blobs')]) expect(statSync(d).mode & 0o777).to.equal(0o700);
    for (const f of ['meta.json', 'base.json', 'blobs/000000', 'blobs/000001'])
      expect(statSync(join(dir, f)).mode & 0o777).to.equal(0o600);
    expect(await st.readBase()).to.deep.equal(base);
    expect(await st.readMeta()).to.deep.equal({ state: 'pending', staged: [{ path: '/work/a', ...r0 }] });
  });

  it('per-file cap: at the cap passes, one byte more is unstaged with the reason', async () => {
    const st = await createStaging(join(tmp, 'cs'), { maxFileBytes: 100, maxTotalBytes: 1000 });
    expect(await st.stageData(file('at', 100), { sandboxPath: '/work/at' })).to.have.property('blob', '000000');
    const over = await st.stageData(file('over', 101), { sandboxPath: '/work/over' });
    expect(over)
      .to.have.property('unstaged')
      .that.matches(/\/work\/over: larger than the 100-byte per-file cap/);
    expect(readdirSync(join(tmp, 'cs/blobs'))).to.deep.equal(['000000']);
    expect(st.totalBytes).to.equal(100);
  });

  it('per-changeset cap: reaching the total passes, one byte more is unstaged', async () => {
    const st = await createStaging(join(tmp, 'cs'), { maxFileBytes: 100, maxTotalBytes: 250 });
    for (const n of ['a', 'b']) expect(await st.stageData(file(n, 100))).to.have.property('blob');
    expect(await st.stageData(file('c', 50))).to.deep.include({ blob: '000002', size: 50 });
    expect(st.totalBytes).to.equal(250);
    const over = await st.stageData(file('d', 1), { sandboxPath: '/work/d' });
    expect(over)
      .to.have.property('unstaged')
      .that.matches(/\/work\/d: would exceed the 250-byte per-changeset cap/);
    // An empty file still fits.
    expect(await st.stageData(file('e', 0))).to.deep.include({ blob: '000003', size: 0 });
  });

  it('stageData: caps, numbering and layout', async () => {
    const st = await createStaging(join(tmp, 'cs'), { maxFileBytes: 100, maxTotalBytes: 150 });
    expect(await st.stageData(file('a', 50))).to.deep.include({ blob: '000000' });
    expect(await st.stageData(Buffer.alloc(100, 1), { sandboxPath: '/work/d' })).to.deep.equal({
      blob: '000001',
      size: 100,
      sha256: sha(Buffer.alloc(100, 1)),
    });
    expect(await st.stageData(Buffer.alloc(1), { sandboxPath: '/work/e' }))
      .to.have.property('unstaged')
      .that.matches(/\/work\/e: would exceed/);
    expect(readdirSync(join(tmp, 'cs/blobs')).sort()).to.deep.equal(['000000', '000001']);
    expect(statSync(join(tmp, 'cs/blobs/000001')).mode & 0o777).to.equal(0o600);
    const st2 = await createStaging(join(tmp, 'cs2'), { maxFileBytes: 100 });
    expect(await st2.stageData(Buffer.alloc(101)))
      .to.have.property('unstaged')
      .that.matches(/per-file cap/);
  });

  it('stageDataMany: caps checked file by file at their edges, blobs in order, durable layout', async () => {
    const st = await createStaging(join(tmp, 'cs'), { maxFileBytes: 100, maxTotalBytes: 250 });
    const rs = await st.stageDataMany([
      { data: Buffer.alloc(100, 1), sandboxPath: '/work/at-cap' },
      { data: Buffer.alloc(101, 2), sandboxPath: '/work/over-file-cap' },
      { data: Buffer.alloc(100, 3), sandboxPath: '/work/b' },
      { data: Buffer.alloc(51, 4), sandboxPath: '/work/over-total' },
      { data: Buffer.alloc(50, 5), sandboxPath: '/work/fills-total' },
    ]);
    expect(rs[0]).to.deep.equal({ blob: '000000', size: 100, sha256: sha(Buffer.alloc(100, 1)) });
    expect(rs[1])
      .to.have.property('unstaged')
      .that.matches(/over-file-cap: larger than the 100-byte per-file cap/);
    expect(rs[2]).to.deep.include({ blob: '000001', size: 100 });
    expect(rs[3])
      .to.have.property('unstaged')
      .that.matches(/over-total: would exceed the 250-byte/);
    expect(rs[4]).to.deep.include({ blob: '000002', size: 50 });
    expect(st.totalBytes).to.equal(250);
    expect(readdirSync(join(tmp, 'cs/blobs')).sort()).to.deep.equal(['000000', '000001', '000002']);
    expect(readFileSync(join(tmp, 'cs/blobs/000002'))).to.deep.equal(Buffer.alloc(50, 5));
    expect(statSync(join(tmp, 'cs/blobs/000001')).mode & 0o777).to.equal(0o600);
    expect(await st.stageDataMany([])).to.deep.equal([]);
  });

  it('serializes calls that are not awaited one by one', async () => {
    const st = await createStaging(join(tmp, 'cs'), { maxTotalBytes: 10 * 4 });
    const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => st.stageData(file(`f${i}`, 10))));
    expect(rs.map((r) => ('blob' in r ? r.blob : 'unstaged'))).to.deep.equal([
      '000000',
      '000001',
      '000002',
      '000003',
      'unstaged',
      'unstaged',
    ]);
  });

  it('reopening continues numbering and counts staged bytes; dropBlobs and remove are idempotent', async () => {
    const dir = join(tmp, 'cs');
    const st = await createStaging(dir, { maxTotalBytes: 30 });
    await st.stageData(file('a', 10));
    writeFileSync(join(dir, 'blobs/.000001.tmp'), 'crash leftover');
    const again = await createStaging(dir, { maxTotalBytes: 30 });
    expect(again.totalBytes).to.equal(10);
    expect(await again.stageData(file('b', 20))).to.deep.include({ blob: '000001' });
    expect(await again.stageData(file('c', 1))).to.have.property('unstaged');
    await again.writeMeta({ ok: true });
    await again.dropBlobs();
    await again.dropBlobs();
    expect(readdirSync(join(dir, 'blobs'))).to.deep.equal([]);
    expect(existsSync(join(dir, 'meta.json'))).to.equal(true);
    await again.remove();
    await again.remove();
    expect(existsSync(dir)).to.equal(false);
  });

  it('readStagedBase: base.json at and one byte past the synchronous-read size, NotFound, Internal, no symlink', async () => {
    const dir = join(tmp, 'cs');
    const st = await createStaging(dir);
    for (const size of [SYNC_WRITE_MAX, SYNC_WRITE_MAX + 1]) {
      const base = { mode: 'sha256', paths: ['/work'], files: {}, takenAt: '' } as Manifest;
      const pad = size - Buffer.byteLength(JSON.stringify(base));
      base.takenAt = 'é'.repeat(pad >> 1) + 'x'.repeat(pad & 1); // two bytes each: multi-byte text across the edge
      await st.writeBase(base);
      expect(statSync(join(dir, 'base.json')).size).to.equal(size);
      expect(await readStagedBase(dir)).to.deep.equal(base);
      expect(await st.readBase()).to.deep.equal(base);
    }
    expect(await readStagedBase(join(tmp, 'none')).catch((e: RuntimeError) => e.code)).to.equal('NotFound');
    writeFileSync(join(dir, 'base.json'), '{"trunc');
    expect(await readStagedBase(dir).catch((e: RuntimeError) => e.code)).to.equal('Internal');
    rmSync(join(dir, 'base.json'));
    writeFileSync(join(tmp, 'elsewhere.json'), JSON.stringify({ mode: 'sha256', paths: [], files: {}, takenAt: '' }));
    symlinkSync(join(tmp, 'elsewhere.json'), join(dir, 'base.json'));
    expect(await readStagedBase(dir).catch((e: NodeJS.ErrnoException) => e.code)).to.equal('ELOOP');
  });

  it('readMeta: NotFound when absent, Internal when corrupt', async () => {
    const st = await createStaging(join(tmp, 'cs'));
    expect(await st.readMeta().catch((e: RuntimeError) => e.code)).to.equal('NotFound');
    writeFileSync(join(tmp, 'cs/meta.json'), '{"trunc');
    expect(await st.readMeta().catch((e: RuntimeError) => e.code)).to.equal('Internal');
  });
});
