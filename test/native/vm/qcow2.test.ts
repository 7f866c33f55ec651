// The qcow2 overlay written without qemu-img (native/vm/qcow2.ts): byte for byte what
// `qemu-img create -f qcow2 -u -F qcow2 -b BACKING PATH SIZE` writes, at the sizes' edges (one
// 512 MiB L1 entry and one past, the 4 TiB one-cluster L1 limit and one sector past it), for
// backing names short, absolute, odd and at qemu-img's 1,023-byte limit; what it does not
// cover is left to qemu-img (the bytes compared where qemu-img is Debian 12's 7.2); any qemu-img's
// `check` finds the images clean and QEMU reads the backing through one.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createOverlay } from '../../../native/vm/qemu.js';
import { QCOW2_MAX_SIMPLE, qcow2Overlay, qcow2Size, writeQcow2Overlay } from '../../../native/vm/qcow2.js';
import { skipWith } from '../../skip.js';

function qemuImg(args: string[]): string {
  const r = spawnSync('qemu-img', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`qemu-img ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

describe('qcow2 overlay without qemu-img', function () {
  this.timeout(60_000);
  let dir: string;
  before(function () {
    if (spawnSync('qemu-img', ['--version']).status !== 0) skipWith(this, 'qemu-img is not installed');
  });
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'fluxvm-qcow2-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("writes qemu-img's bytes at every size edge and for every kind of backing name", async function () {
    // The layout written is QEMU 7.2's (Debian 12's); another version's qemu-img may write
    // another feature table. The images are checked by any qemu-img in the tests below.
    const version = /version (\d+)\.(\d+)/.exec(qemuImg(['--version']));
    if (!version || `${version[1]}.${version[2]}` !== '7.2')
      skipWith(this, `qemu-img ${version?.[1]}.${version?.[2]} is not 7.2, whose bytes are the ones written`);
    const sizes = [
      '1',
      '512',
      '1000',
      '64M',
      '512M',
      String(512 * 2 ** 20 + 1),
      '1G',
      '4G',
      String(QCOW2_MAX_SIMPLE - 512),
      '4T',
    ];
    const names = [
      'base.qcow2',
      '../../images/abc/disk.qcow2',
      '/abs/path/disk.qcow2',
      'sp ace,é\nx',
      'n'.repeat(1023),
    ];
    let n = 0;
    for (const size of sizes)
      for (const name of names) {
        const ours = join(dir, `ours-${n}.qcow2`);
        const theirs = join(dir, `theirs-${n++}.qcow2`);
        expect(await writeQcow2Overlay(ours, name, size), `${size} ${name.length}`).to.equal(true);
        qemuImg(['create', '-q', '-f', 'qcow2', '-u', '-F', 'qcow2', '-b', name, theirs, size]);
        const a = readFileSync(ours);
        const b = readFileSync(theirs);
        expect(a.length, `length at ${size}, backing of ${name.length} bytes`).to.equal(b.length);
        expect(a.equals(b), `bytes at ${size}, backing of ${name.length} bytes`).to.equal(true);
        expect(statSync(ours).mode & 0o777).to.equal(0o644); // qemu-img's 0644, whatever the umask
      }
    // No temporary file is left beside them.
    expect(readdirSync(dir).filter((f) => f.startsWith('.'))).to.deep.equal([]);
  });

  it('leaves to qemu-img what it does not cover: over 4 TiB, other size forms, no name or one over 1,023 bytes', async () => {
    expect(qcow2Size(String(QCOW2_MAX_SIMPLE))).to.equal(QCOW2_MAX_SIMPLE);
    expect(qcow2Overlay('b', QCOW2_MAX_SIMPLE)).to.not.equal(undefined);
    expect(qcow2Overlay('b', QCOW2_MAX_SIMPLE + 512)).to.equal(undefined);
    expect(qcow2Overlay('b', 0)).to.equal(undefined);
    expect(qcow2Overlay('', 1 << 30)).to.equal(undefined);
    expect(qcow2Overlay('n'.repeat(1024), 1 << 30)).to.equal(undefined);
    for (const s of ['5T', '1g', '1.5G', '4Gi', '', '-1', '1P', '99999999999999999T'])
      expect(await writeQcow2Overlay(join(dir, 'x.qcow2'), 'b', s), s).to.equal(false);
    expect(readdirSync(dir)).to.deep.equal([]);
    // createOverlay still makes them, through qemu-img.
    await createOverlay(join(dir, 'big.qcow2'), 'b.qcow2', '5T');
    expect(JSON.parse(qemuImg(['info', '-U', '--output=json', join(dir, 'big.qcow2')]))).to.deep.include({
      'virtual-size': 5 * 2 ** 40,
      'backing-filename': 'b.qcow2',
    });
  });

  it('replaces an existing file whole, and QEMU reads the backing through the overlay', async () => {
    const base = join(dir, 'base.qcow2');
    qemuImg(['create', '-q', '-f', 'qcow2', base, '64M']);
    writeFileSync(join(dir, 'data'), 'fluxvm-qcow2-marker');
    qemuImg(['dd', '-f', 'raw', '-O', 'qcow2', `if=${join(dir, 'data')}`, `of=${base}`, 'bs=512', 'count=1']);
    for (const size of ['1', '1000', '64M', '1G', '4T']) {
      const f = join(dir, `check-${size}.qcow2`);
      expect(await writeQcow2Overlay(f, 'base.qcow2', size)).to.equal(true);
      expect(JSON.parse(qemuImg(['check', '--output=json', '-U', f])), size).to.deep.include({ 'check-errors': 0 });
    }
    const ov = join(dir, 'ov.qcow2');
    writeFileSync(ov, Buffer.alloc(300_000, 0xff)); // a longer leftover at the path
    await createOverlay(ov, base, '64M', dir);
    expect(JSON.parse(qemuImg(['check', '--output=json', ov]))).to.deep.include({ 'check-errors': 0 });
    const info = JSON.parse(qemuImg(['info', '--output=json', ov])) as Record<string, unknown>;
    expect(info).to.deep.include({ 'backing-filename': 'base.qcow2', 'virtual-size': 64 * 2 ** 20 });
    const out = join(dir, 'out.raw');
    qemuImg(['dd', '-f', 'qcow2', '-O', 'raw', `if=${ov}`, `of=${out}`, 'bs=512', 'count=1']);
    expect(readFileSync(out).subarray(0, 19).toString()).to.equal('fluxvm-qcow2-marker');
  });
});
