import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { HashPool, manifest, startHashWorker } from '../../../native/workspace/manifest.js';
import { decodePath } from '../../../native/workspace/paths.js';

const WORKERS = { workerThreshold: { files: 0, bytes: 0 }, workerFallback: false }; // force the worker pool
const IN_THREAD = { workers: 0 };
const repo = new URL('../../../', import.meta.url).pathname;

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    if (err instanceof RuntimeError) return err.code;
    throw err;
  }
  return undefined;
}

function sha(data: Buffer | string): string {
  return 'sha256:' + createHash('sha256').update(data).digest('hex');
}

describe('workspace/manifest', function () {
  // Worker threads under tsx and child processes take a few hundred ms each on a busy host.
  this.timeout(60_000);
  let root: string;
  let outside: string;
  let server: Server;
  const nonUtf8 = Buffer.from('caf\xe9.txt', 'latin1');

  before(async () => {
    root = mkdtempSync(join(tmpdir(), 'ws-man-'));
    outside = mkdtempSync(join(tmpdir(), 'ws-man-out-'));
    writeFileSync(join(outside, 'not-listed'), 'outside');
    mkdirSync(join(root, 'dir with spaces/deeper'), { recursive: true });
    mkdirSync(join(root, 'empty'));
    writeFileSync(join(root, 'a.txt'), 'alpha');
    writeFileSync(join(root, 'dir with spaces/b c.txt'), 'bravo charlie');
    writeFileSync(join(root, 'dir with spaces/deeper/d'), '');
    writeFileSync(join(root, 'back\\slash'), 'bs');
    writeFileSync(join(root, 'caf\\xe9.txt'), 'looks like an escape but is text');
    writeFileSync(Buffer.concat([Buffer.from(root + '/'), nonUtf8]), 'latin-1 name');
    writeFileSync(join(root, 'mode640'), 'm');
    chmodSync(join(root, 'mode640'), 0o640);
    symlinkSync('a.txt', join(root, 'link-to-file'));
    symlinkSync(outside, join(root, 'link-to-dir'));
    execFileSync('mkfifo', [join(root, 'fifo')]);
    execFileSync('mknod', [join(root, 'chardev'), 'c', '1', '3']);
    server = createServer();
    await new Promise<void>((r) => server.listen(join(root, 'sock'), r));
  });
  after(async () => {
    await new Promise((r) => server.close(r));
    rmSync(root, { recursive: true, force: true });
    rmSync(outside, { recursive: true, force: true });
  });

  function expected(prefix: string): Record<string, string> {
    return {
      [`${prefix}/a.txt`]: sha('alpha'),
      [`${prefix}/back\\\\slash`]: sha('bs'),
      [`${prefix}/caf\\\\xe9.txt`]: sha('looks like an escape but is text'),
      [`${prefix}/caf\\xe9.txt`]: sha('latin-1 name'),
      [`${prefix}/dir with spaces/b c.txt`]: sha('bravo charlie'),
      [`${prefix}/dir with spaces/deeper/d`]: sha(''),
      [`${prefix}/mode640`]: sha('m'),
    };
  }

  for (const [mode, opts] of [
    ['in-thread', IN_THREAD],
    ['worker threads', WORKERS],
  ] as const) {
    it(`lists exactly the regular files, with sha256 and modes (${mode})`, async () => {
      const m = await manifest([root], opts);
      expect(m.mode).to.equal('sha256');
      expect(m.paths).to.deep.equal([root]);
      expect(m.files).to.deep.equal(expected(root));
      // Keys come out in UTF-8 byte order.
      const keys = Object.keys(m.files);
      expect(keys).to.deep.equal([...keys].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))));
      expect(m.modes![`${root}/mode640`]).to.equal(0o640);
      expect(m.modes![`${root}/a.txt`]).to.equal(0o644);
      expect(Date.parse(m.takenAt)).to.be.a('number').and.not.NaN;
    });
  }

  it('agrees with find -type f | sha256sum, and keys decode to the real bytes', async () => {
    const m = await manifest([root], IN_THREAD);
    const out = execFileSync('sh', ['-c', 'find "$1" -xdev -type f -print0 | xargs -0 sha256sum -z', 'sh', root]);
    const fromTool = new Map<string, string>();
    for (const rec of out.toString('latin1').split('\0').filter(Boolean)) {
      fromTool.set(rec.slice(66), rec.slice(0, 64)); // "<hex>  <name>", name kept as latin1 bytes
    }
    expect(fromTool.size).to.equal(Object.keys(m.files).length);
    for (const [key, fp] of Object.entries(m.files)) {
      const bytes = decodePath(key);
      expect(sha(readFileSync(bytes))).to.equal(fp);
      expect(fromTool.get(bytes.toString('latin1'))).to.equal(fp.slice(7));
    }
  });

  it('maps sandbox paths through mapPath and dedupes overlapping starting paths', async () => {
    const mapPath = (p: string) => p.replace(/^\/work/, root);
    const m = await manifest(['/work/dir with spaces', '/work', '/work/'], { mapPath, ...IN_THREAD });
    expect(m.paths).to.deep.equal(['/work', '/work/dir with spaces']);
    expect(m.files).to.deep.equal(expected('/work'));
  });

  it('does not descend into a mount point', async function () {
    const mnt = join(root, 'empty');
    const r = spawnSync('mount', ['-t', 'tmpfs', 'tmpfs', mnt]);
    if (r.status !== 0) {
      console.log(
        `      skipped: cannot mount a tmpfs here (${r.stderr.toString().trim() || `mount exit ${r.status}`})`,
      );
      return this.skip();
    }
    try {
      writeFileSync(join(mnt, 'on-tmpfs'), 'other fs');
      const m = await manifest([root], IN_THREAD);
      expect(m.files).to.deep.equal(expected(root));
      // Starting at the mount point itself walks that filesystem.
      const inner = await manifest([mnt], IN_THREAD);
      expect(Object.keys(inner.files)).to.deep.equal([`${mnt}/on-tmpfs`]);
    } finally {
      execFileSync('umount', [mnt]);
    }
  });

  it('a long-lived pool serves concurrent calls, then rejects once closed', async () => {
    const pool = await HashPool.start(2);
    expect(pool).to.not.equal(null);
    try {
      const [a, b] = await Promise.all([
        manifest([root], { pool: pool! }),
        manifest([join(root, 'dir with spaces')], { pool: pool! }),
      ]);
      expect(a.files).to.deep.equal(expected(root));
      expect(Object.keys(b.files)).to.have.length(2);
    } finally {
      await pool!.close();
      await pool!.close();
    }
    expect(await codeOf(manifest([root], { pool: pool! }))).to.equal('Internal');
  });

  describe('walk failures fail the whole call', () => {
    for (const [mode, opts] of [
      ['in-thread', IN_THREAD],
      ['worker threads', WORKERS],
    ] as const) {
      it(`a file removed between listing and hashing (${mode})`, async () => {
        const dir = mkdtempSync(join(tmpdir(), 'ws-rm-'));
        try {
          for (let i = 0; i < 5; i++) writeFileSync(join(dir, `f${i}`), `${i}`);
          const p = manifest([dir], { ...opts, afterWalk: () => unlinkSync(join(dir, 'f3')) });
          const err = await p.catch((e: unknown) => e);
          expect(err).to.be.instanceOf(RuntimeError);
          expect((err as RuntimeError).code).to.equal('InvalidArgument');
          expect((err as RuntimeError).message).to.include(`${dir}/f3`);
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
      });
    }
    it('a file replaced by a symlink between listing and hashing', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'ws-swap-'));
      try {
        writeFileSync(join(dir, 'f'), 'x');
        const afterWalk = () => {
          unlinkSync(join(dir, 'f'));
          symlinkSync('/etc/hostname', join(dir, 'f'));
        };
        expect(await codeOf(manifest([dir], { ...IN_THREAD, afterWalk }))).to.equal('InvalidArgument');
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
    it('a starting path that is missing, a file, or a symlink', async () => {
      expect(await codeOf(manifest([join(root, 'nope')]))).to.equal('InvalidArgument');
      expect(await codeOf(manifest([join(root, 'a.txt')]))).to.equal('InvalidArgument');
      expect(await codeOf(manifest([join(root, 'link-to-dir')]))).to.equal('InvalidArgument');
    });
    it('invalid paths are refused before any walk', async () => {
      expect(await codeOf(manifest(['relative']))).to.equal('InvalidPath');
      expect(await codeOf(manifest([root + '/../etc']))).to.equal('InvalidPath');
      expect(await codeOf(manifest(Array.from({ length: 65 }, () => root)))).to.equal('LimitExceeded');
      expect(await codeOf(manifest(Array.from({ length: 64 }, () => root)))).to.equal(undefined);
    });
  });

  describe('limits', () => {
    it('file count: N passes, N+1 fails', async () => {
      const n = Object.keys(expected(root)).length;
      const ok = await manifest([root], { limits: { maxFiles: n } });
      expect(Object.keys(ok.files)).to.have.length(n);
      expect(await codeOf(manifest([root], { limits: { maxFiles: n - 1 } }))).to.equal('LimitExceeded');
    });
    it('listing bytes (key bytes + fingerprint bytes): exact passes, one less fails', async () => {
      const m = await manifest([root], IN_THREAD);
      const size = Object.entries(m.files).reduce((s, [k, v]) => s + Buffer.byteLength(k) + v.length, 0);
      await manifest([root], { ...IN_THREAD, limits: { maxListingBytes: size } });
      expect(await codeOf(manifest([root], { ...IN_THREAD, limits: { maxListingBytes: size - 1 } }))).to.equal(
        'LimitExceeded',
      );
    });
  });

  describe('without CAP_DAC_OVERRIDE (root cannot read everything)', () => {
    // As root every read is granted, so EACCES is provoked in a child process whose
    // capability bounding set lacks dac_override and dac_read_search (setpriv): root
    // then obeys file permission bits like any user.
    let dir: string;
    let script: string;
    before(function () {
      if (spawnSync('setpriv', ['--version']).status !== 0) {
        console.log('      skipped: setpriv (util-linux) is not installed, so root cannot drop dac_override here');
        return this.skip();
      }
      dir = mkdtempSync(join(tmpdir(), 'ws-unread-'));
      mkdirSync(join(dir, 'tree/sub'), { recursive: true });
      writeFileSync(join(dir, 'tree/readable'), 'r');
      writeFileSync(join(dir, 'tree/secret'), 's');
      chmodSync(join(dir, 'tree/secret'), 0o000);
      writeFileSync(join(dir, 'tree/sub/x'), 'x');
      script = join(dir, 'run.mts');
      writeFileSync(
        script,
        `import { manifest } from ${JSON.stringify(repo + 'native/workspace/manifest.ts')};
const [root, workers] = process.argv.slice(2);
const opts = workers === '1' ? { workerThreshold: { files: 0, bytes: 0 }, workerFallback: false } : { workers: 0 };
try { const m = await manifest([root], opts); console.log(JSON.stringify({ files: m.files, modes: m.modes })); }
catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }`,
      );
    });
    after(() => dir && rmSync(dir, { recursive: true, force: true }));
    function runDropped(target: string, workers: boolean): Record<string, unknown> {
      const out = execFileSync(
        'setpriv',
        [
          '--bounding-set=-dac_override,-dac_read_search',
          process.execPath,
          '--import',
          'tsx',
          script,
          target,
          workers ? '1' : '0',
        ],
        { cwd: repo, encoding: 'utf8' },
      );
      return JSON.parse(out.trim().split('\n').pop()!);
    }
    for (const workers of [false, true]) {
      it(`a chmod 000 file is fingerprinted unreadable (${workers ? 'worker threads' : 'in-thread'})`, () => {
        const r = runDropped(join(dir, 'tree'), workers) as {
          files: Record<string, string>;
          modes: Record<string, number>;
        };
        expect(r.files).to.deep.equal({
          [join(dir, 'tree/readable')]: sha('r'),
          [join(dir, 'tree/secret')]: 'unreadable',
          [join(dir, 'tree/sub/x')]: sha('x'),
        });
        expect(r.modes[join(dir, 'tree/secret')]).to.equal(0);
      });
    }
    it('an unreadable directory fails the whole call', () => {
      chmodSync(join(dir, 'tree/sub'), 0o000);
      try {
        const r = runDropped(join(dir, 'tree'), false) as { code: string; message: string };
        expect(r.code).to.equal('InvalidArgument');
        expect(r.message).to.include('sub');
      } finally {
        chmodSync(join(dir, 'tree/sub'), 0o755);
      }
    });
  });

  describe('hash worker script', () => {
    it('starts under tsx and hashes', async () => {
      const w = startHashWorker();
      try {
        const results = await new Promise((resolve, reject) => {
          w.on('error', reject);
          w.on('message', (m: { ready?: boolean; results?: unknown }) => {
            if (m.ready) w.postMessage({ id: 1, paths: [Buffer.from(join(root, 'a.txt'))] });
            else resolve(m.results);
          });
        });
        expect(results).to.deep.equal([{ fp: sha('alpha'), mode: 0o644 }]);
      } finally {
        await w.terminate();
      }
    });

    it('starts when compiled to .js by tsc (production layout)', async function () {
      this.timeout(60_000);
      const out = mkdtempSync(join(tmpdir(), 'ws-tsc-'));
      try {
        execFileSync(
          process.execPath,
          [
            join(repo, 'node_modules/typescript/bin/tsc'),
            '--outDir',
            out,
            '--rootDir',
            repo,
            '--module',
            'nodenext',
            '--moduleResolution',
            'nodenext',
            '--target',
            'es2022',
            '--skipLibCheck',
            '--types',
            'node',
            join(repo, 'native/workspace/manifest.ts'),
            join(repo, 'native/workspace/hash-worker.ts'),
          ],
          { cwd: repo },
        );
        writeFileSync(join(out, 'package.json'), '{"type":"module"}');
        const check = join(out, 'check.mjs');
        writeFileSync(
          check,
          `import { Worker } from 'node:worker_threads';
import { manifest, startHashWorker } from './native/workspace/manifest.js';
const w = startHashWorker();
const direct = await new Promise((resolve, reject) => {
  w.on('error', reject);
  w.on('message', (m) => (m.ready ? w.postMessage({ id: 1, paths: [Buffer.from(process.argv[2] + '/a.txt')] }) : resolve(m.results)));
});
await w.terminate();
const viaPool = await manifest([process.argv[2]], { workerThreshold: { files: 0, bytes: 0 }, workerFallback: false });
console.log(JSON.stringify({ direct, files: viaPool.files }));`,
        );
        // Plain node, no tsx anywhere: what production runs.
        const r = JSON.parse(
          execFileSync(process.execPath, [check, root], {
            cwd: out,
            encoding: 'utf8',
            env: { PATH: process.env.PATH },
          }),
        );
        expect(r.direct).to.deep.equal([{ fp: sha('alpha'), mode: 0o644 }]);
        expect(r.files).to.deep.equal(expected(root));
      } finally {
        rmSync(out, { recursive: true, force: true });
      }
    });
  });
});

describe('workspace/buildManifest (listing from a guest walk)', () => {
  const fp = 'sha256:' + '0'.repeat(64);
  it('encodes raw names, sorts, and enforces the same limits', async () => {
    const { buildManifest } = await import('../../../native/workspace/manifest.js');
    const m = buildManifest(
      ['/work/'],
      [
        { path: Buffer.from('/work/z'), fingerprint: fp, mode: 0o644 },
        { path: Buffer.concat([Buffer.from('/work/caf'), Buffer.from([0xe9])]), fingerprint: 'unreadable', mode: 0 },
        { path: '/work/a b', fingerprint: fp },
      ],
    );
    expect(Object.keys(m.files)).to.deep.equal(['/work/a b', '/work/caf\\xe9', '/work/z']);
    expect(m.paths).to.deep.equal(['/work']);
    expect(m.modes).to.deep.equal({ '/work/z': 0o644, '/work/caf\\xe9': 0 });
    const two = [
      { path: '/work/a', fingerprint: fp },
      { path: '/work/b', fingerprint: fp },
    ];
    expect(Object.keys(buildManifest(['/work'], two, { limits: { maxFiles: 2 } }).files)).to.have.length(2);
    expect(() => buildManifest(['/work'], two, { limits: { maxFiles: 1 } }))
      .to.throw(RuntimeError)
      .with.property('code', 'LimitExceeded');
    expect(() => buildManifest(['/work'], [{ path: '/etc/x', fingerprint: fp }]))
      .to.throw(RuntimeError)
      .with.property('code', 'Internal');
    expect(() => buildManifest(['/work'], [{ path: '/work/x', fingerprint: 'md5:00' }]))
      .to.throw(RuntimeError)
      .with.property('code', 'Internal');
  });
});
