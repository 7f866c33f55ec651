// File operations against a racing sandbox: a process inside the sandbox (and one left running in a
// speculation copy) swaps a directory with a symlink to a host canary directory in a tight
// loop (renameat2 RENAME_EXCHANGE) while the host reads, lists, stats, writes, deletes, walks,
// diffs, stages and applies through the real APIs. The canary is never read (its secret never
// shows in any returned byte, blob, manifest hash, diff or record), never written, chowned or
// emptied. Also: reads aimed at FIFOs and devices are refused at once, and a workspace tree
// deeper than PATH_MAX can be deleted and its sandbox destroyed.
import { expect } from 'chai';
import { createHash, randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { applyToSandbox } from '../../../controllers/changeset/apply.js';
import { speculate } from '../../../controllers/changeset/speculate.js';
import { RuntimeError, type WorkspaceMark } from '../../../native/runtime.js';
import { skipWith } from '../../skip.js';
import { archive, tarEntry } from '../../tar-entries.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

/** How long each race runs (ms); RACE_MS raises it for a longer soak. */
const RACE_MS = Number(process.env.RACE_MS ?? 3000);

// x86_64 renameat2 = 316; RENAME_EXCHANGE = 2; AT_FDCWD = -100. Stops by itself after argv[3] s.
const RACER = `import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
end = time.time() + float(sys.argv[3])
while time.time() < end:
    for _ in range(2000):
        libc.syscall(316, -100, a, -100, b, 2)
`;

interface Snap {
  [name: string]: { type: string; mode: number; uid: number; gid: number; mtimeMs: number; content?: string };
}

/** Everything about the canary tree that an attack could change. */
function snapshot(dir: string, rel = '', out: Snap = {}): Snap {
  const st = lstatSync(join(dir, rel));
  out[rel || '.'] = {
    type: st.isDirectory() ? 'dir' : st.isFile() ? 'file' : 'other',
    mode: st.mode,
    uid: st.uid,
    gid: st.gid,
    mtimeMs: st.mtimeMs,
    ...(st.isFile() ? { content: readFileSync(join(dir, rel), 'utf8') } : {}),
  };
  if (st.isDirectory()) for (const n of readdirSync(join(dir, rel)).sort()) snapshot(dir, rel ? `${rel}/${n}` : n, out);
  return out;
}

describe('procbox file operations against a racing sandbox', function () {
  this.timeout(180_000);
  let fx: Fixture;
  let canary: string;
  let secret: string;
  let secretSha: string;
  let initial: Snap;
  const id = 'race';

  before(async function () {
    skipWith(this, skipReason());
    if (process.arch !== 'x64')
      skipWith(this, `the racer calls renameat2 by its x86_64 syscall number; this host is ${process.arch}`);
    if (!existsSync('/usr/bin/python3'))
      skipWith(this, 'the racer needs /usr/bin/python3 (procbox mounts host /usr into the sandbox)');
    fx = await makeRuntime();
    canary = mkdtempSync(join(tmpdir(), 'fluxvm-canary-'));
    secret = `CANARY-SECRET-${randomBytes(16).toString('hex')}`;
    secretSha = 'sha256:' + createHash('sha256').update(`${secret}\n`).digest('hex');
    writeFileSync(join(canary, 'secret.txt'), `${secret}\n`, { mode: 0o644 });
    writeFileSync(join(canary, 'victim'), `${secret}\n`, { mode: 0o644 });
    writeFileSync(join(canary, 'canary-only.txt'), `${secret}\n`, { mode: 0o600 });
    mkdirSync(join(canary, 'sub'));
    writeFileSync(join(canary, 'sub', 'inner.txt'), `${secret}\n`);
    initial = snapshot(canary);
    await fx.rt.create({ id });
    await fx.rt.writeFile(id, '/work/.racer.py', Buffer.from(RACER));
  });

  after(async () => {
    await fx?.cleanup();
    if (canary) rmSync(canary, { recursive: true, force: true });
  });

  /** Puts a decoy directory and a symlink to the canary at `dir`/d and `dir`/l. */
  async function arm(sbx: string, dir: string): Promise<void> {
    const r = await sh(
      fx.rt,
      sbx,
      `set -e; mkdir -p ${dir}/d/sub; echo decoy > ${dir}/d/secret.txt; echo decoy > ${dir}/d/victim; echo decoy > ${dir}/d/sub/inner.txt; ln -sfn ${canary} ${dir}/l`,
    );
    expect(r.code, r.err).to.equal(0);
  }
  const racer = (dir: string, secs: number) =>
    `nohup python3 /work/.racer.py ${dir}/d ${dir}/l ${secs} >/dev/null 2>&1 &`;

  /** A host-side call under attack: a RuntimeError is an acceptable answer, anything else is not. */
  async function attempt<T>(f: () => Promise<T>): Promise<T | RuntimeError> {
    try {
      return await f();
    } catch (e) {
      expect(e, String(e)).to.be.instanceOf(RuntimeError);
      return e as RuntimeError;
    }
  }

  function noSecret(what: string, x: unknown): void {
    const text = Buffer.isBuffer(x) ? x.toString('latin1') : JSON.stringify(x);
    expect(text, `${what} carried the canary's bytes`).to.not.include(secret);
    expect(text, `${what} carried the canary's hash`).to.not.include(secretSha);
    expect(text, `${what} listed a canary-only name`).to.not.include('canary-only');
  }

  function canaryIntact(): void {
    expect(snapshot(canary)).to.deep.equal(initial);
  }

  it('reads, lists, stats, writes, deletes, manifests and diffs never reach the canary', async () => {
    // The pair is made after the mark: overlayfs (no redirect_dir) refuses to exchange a
    // directory of a lower layer (EXDEV), so the racer works on the upper layer.
    const mark: WorkspaceMark = await fx.rt.mark(id);
    await arm(id, '/work/r');
    const start = await sh(fx.rt, id, racer('/work/r', Math.ceil(RACE_MS / 1000) + 30));
    expect(start.code).to.equal(0);
    const seen = new Set<string>();
    const counts = { reads: 0, readOk: 0, lists: 0, writes: 0, deletes: 0, manifests: 0, diffs: 0 };
    const t0 = Date.now();
    for (let i = 0; Date.now() - t0 < RACE_MS; i++) {
      const st = await attempt(() => fx.rt.stat(id, '/work/r/d'));
      if (!(st instanceof RuntimeError)) seen.add(st.type);
      const data = await attempt(() => fx.rt.readFile(id, '/work/r/d/secret.txt'));
      counts.reads++;
      if (Buffer.isBuffer(data)) {
        counts.readOk++;
        noSecret('readFile', data);
      }
      noSecret('readFile of a canary-only name', await attempt(() => fx.rt.readFile(id, '/work/r/d/canary-only.txt')));
      noSecret('listFiles', await attempt(() => fx.rt.listFiles(id, '/work/r/d')));
      noSecret('stat', await attempt(() => fx.rt.stat(id, '/work/r/d/canary-only.txt')));
      counts.lists++;
      await attempt(() =>
        fx.rt.writeFile(id, '/work/r/d/victim', Buffer.from('host decoy'), { mkdirs: true, mode: 0o600 }),
      );
      await attempt(() => fx.rt.writeFile(id, `/work/r/d/host-${i}.txt`, Buffer.from('host write')));
      counts.writes += 2;
      await attempt(() => fx.rt.deleteFile(id, '/work/r/d/victim'));
      await attempt(() => fx.rt.deleteFile(id, '/work/r/d/sub', { recursive: true }));
      await attempt(() => fx.rt.writeFile(id, '/work/r/d/sub/inner.txt', Buffer.from('decoy'), { mkdirs: true }));
      counts.deletes += 2;
      if (i % 4 === 0) {
        noSecret('manifest', await attempt(() => fx.rt.manifest(id, ['/work/r'])));
        noSecret('manifest of the start path', await attempt(() => fx.rt.manifest(id, ['/work/r/d'])));
        noSecret('changesSince', await attempt(() => fx.rt.changesSince(id, mark)));
        counts.manifests += 2;
        counts.diffs++;
      }
      canaryIntact();
    }
    console.log(`      race: ${JSON.stringify(counts)}, saw /work/r/d as ${[...seen].join(' and ')}`);
    // The race really ran: the host saw both sides of the swap.
    expect([...seen].sort()).to.deep.equal(['dir', 'symlink']);
    expect(counts.readOk, 'some reads landed while /work/r/d was the directory').to.be.greaterThan(0);
    canaryIntact();
    expect(readdirSync(canary).sort()).to.deep.equal(['canary-only.txt', 'secret.txt', 'sub', 'victim']);
    expect((await sh(fx.rt, id, 'echo alive')).out).to.equal('alive\n');
  });

  it('tar streams (fluxctl cp) while the racer swaps: no canary byte archived, nothing extracted into it', async () => {
    await arm(id, '/work/t');
    expect((await sh(fx.rt, id, racer('/work/t', Math.ceil(RACE_MS / 1000) + 30))).code).to.equal(0);
    // An archive that writes into d/ (and d/sub/) on every round, the way a cp into the tree would.
    const tarOf = (i: number) =>
      archive(
        tarEntry('d/', '5', { mode: 0o755 }),
        tarEntry(`d/host-${i}.txt`, '0', { data: Buffer.from('host') }),
        tarEntry('d/victim', '0', { data: Buffer.from('host decoy') }),
        tarEntry('d/sub/inner.txt', '0', { data: Buffer.from('decoy') }),
      );
    const counts = { out: 0, outOk: 0, in: 0, inOk: 0 };
    const t0 = Date.now();
    for (let i = 0; Date.now() - t0 < RACE_MS; i++) {
      for (const p of ['/work/t', '/work/t/d']) {
        const got = await attempt(async () => {
          const chunks: Buffer[] = [];
          for await (const c of await fx.rt.readTar!(id, p)) chunks.push(c as Buffer);
          return Buffer.concat(chunks);
        });
        counts.out++;
        if (Buffer.isBuffer(got)) counts.outOk++;
        noSecret(`readTar ${p}`, got);
      }
      const put = await attempt(() => fx.rt.writeTar!(id, '/work/t', Readable.from([tarOf(i)])));
      counts.in++;
      if (!(put instanceof RuntimeError)) counts.inOk++;
      canaryIntact();
    }
    console.log(`      tar race: ${JSON.stringify(counts)}`);
    expect(counts.outOk, 'some archives were made while racing').to.be.greaterThan(0);
    canaryIntact();
    expect(readdirSync(canary).sort()).to.deep.equal(['canary-only.txt', 'secret.txt', 'sub', 'victim']);
  });

  it('speculation with a racer left running in the copy: no canary byte in blobs, diff or record; apply never writes into it', async () => {
    const t0 = Date.now();
    let rounds = 0;
    let applied = 0;
    while (rounds < 2 || Date.now() - t0 < RACE_MS) {
      const dir = mkdtempSync(join(tmpdir(), 'race-cs-'));
      const child = `race-spec-${rounds}`;
      const at = `/work/s${rounds}`; // fresh per round: the pair must be in the copy's upper layer
      try {
        const { status, meta } = await speculate(fx.rt, child, {
          uid: `uid-${rounds}`,
          namespace: 'default',
          name: `cs-${rounds}`,
          sandbox: { name: id, uid: id, runtime: 'procbox' },
          // The copy's racer outlives the command: it swaps while the copy is scanned and staged.
          command: [
            'sh',
            '-c',
            `mkdir -p ${at}/d/sub; echo decoy > ${at}/d/secret.txt; echo decoy > ${at}/d/sub/inner.txt; ln -s ${canary} ${at}/l; ` +
              `${racer(at, 30)} for i in $(seq 1 60); do echo "$i" > ${at}/d/secret.txt; echo "$i" > ${at}/d/f$i; done; sleep 0.3`,
          ],
          paths: ['/work'],
          timeoutSeconds: 30,
          dir,
        });
        noSecret('speculation status', status);
        noSecret('speculation meta', meta);
        for (const n of readdirSync(join(dir, 'blobs'))) noSecret(`blob ${n}`, readFileSync(join(dir, 'blobs', n)));
        for (const n of ['meta.json', 'base.json']) noSecret(n, readFileSync(join(dir, n)));
        expect(
          (status.changes?.added?.length ?? 0) + (status.changes?.modified?.length ?? 0),
          'the command changed files',
        ).to.be.greaterThan(0);
        canaryIntact();
        // The real sandbox races during the apply (started after the fork: a process started
        // before a remount can no longer write the workspace).
        await arm(id, at);
        expect((await sh(fx.rt, id, racer(at, 10))).code).to.equal(0);
        const r = await attempt(() => applyToSandbox(fx.rt, meta, dir));
        if (!(r instanceof RuntimeError)) applied++;
        canaryIntact();
      } finally {
        await fx.rt.destroy(child).catch(() => undefined);
        rmSync(dir, { recursive: true, force: true });
      }
      rounds++;
    }
    console.log(`      speculation race: ${rounds} rounds, ${applied} applies completed`);
    canaryIntact();
    expect((await sh(fx.rt, id, 'echo alive')).out).to.equal('alive\n');
  });

  it('reads aimed at a FIFO, a device node or /dev/zero are refused at once; the runtime stays responsive', async () => {
    const marker = `marker-${randomBytes(6).toString('hex')}`;
    const r = await sh(
      fx.rt,
      id,
      `mkfifo /work/fifo && ln -s /dev/zero /work/zero-abs && ln -s ../dev/zero /work/zero-rel && ln -s fifo /work/fifo-link && touch /work/${marker}`,
    );
    expect(r.code, r.err).to.equal(0);
    // A character device in the workspace (the sandbox cannot mknod; a hostile layer could hold
    // one): made on the host in the upper layer (from the overlay's options in the init's
    // mountinfo), where the marker landed.
    const pid = (await fx.rt.inspect(id)).pid!;
    const ov = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
      .split('\n')
      .find((l) => l.includes(' /work ') && l.includes('upperdir='));
    const upper = /upperdir=([^,\s]+)/.exec(ov ?? '')?.[1];
    expect(upper, 'the workspace overlay and its upper layer').to.be.a('string');
    const found = execFileSync('find', [upper!, '-maxdepth', '1', '-name', marker]).toString().trim();
    expect(found, 'the marker in the upper layer').to.not.equal('');
    execFileSync('mknod', [join(found, '..', 'devzero'), 'c', '1', '5']);
    for (const [path, codes] of [
      ['/work/fifo', ['InvalidArgument']],
      ['/work/fifo-link', ['InvalidArgument']],
      ['/work/devzero', ['InvalidArgument']],
      ['/work/zero-abs', ['InvalidPath']],
      ['/work/zero-rel', ['InvalidPath']],
    ] as const) {
      const t0 = performance.now();
      const err = await rejects(fx.rt.readFile(id, path));
      const ms = performance.now() - t0;
      expect(codes as readonly string[], `${path}: ${err.message}`).to.include(err.code);
      expect(ms, `${path} answered in ${ms.toFixed(0)} ms`).to.be.below(2000);
    }
    expect((await fx.rt.stat(id, '/work/devzero')).type).to.equal('other');
    // A regular file swapped with a FIFO while the host reads it: a check-then-open by name
    // would block forever on the FIFO; every read answers at once (the file, or a refusal).
    expect((await sh(fx.rt, id, 'mkdir -p /work/ff && echo file > /work/ff/d && mkfifo /work/ff/l')).code).to.equal(0);
    expect((await sh(fx.rt, id, racer('/work/ff', Math.ceil(RACE_MS / 1000) + 10))).code).to.equal(0);
    const kinds = new Set<string>();
    let slowest = 0;
    // At least 2 s of reads, and on until both answers were seen (a loaded host swaps slowly),
    // within the racer's life (RACE_MS + 10 s).
    const swapping = Math.ceil(RACE_MS / 1000) * 1000 + 8000;
    for (const t1 = Date.now(); Date.now() - t1 < 2000 || (kinds.size < 2 && Date.now() - t1 < swapping);) {
      const t0 = performance.now();
      const got = await Promise.race([
        attempt(() => fx.rt.readFile(id, '/work/ff/d')),
        new Promise<'hung'>((res) => setTimeout(() => res('hung'), 3000).unref()),
      ]);
      slowest = Math.max(slowest, performance.now() - t0);
      expect(got, 'a read of a file swapped with a FIFO hung').to.not.equal('hung');
      kinds.add(got instanceof RuntimeError ? got.code : 'data');
    }
    expect([...kinds].sort(), `answers seen (slowest ${slowest.toFixed(0)} ms)`).to.deep.equal([
      'InvalidArgument',
      'data',
    ]);
    // The manifest walk skips them (regular files only) and does not block on the FIFO.
    const m = await fx.rt.manifest(id, ['/work']);
    expect(Object.keys(m.files)).to.not.include.members(['/work/fifo', '/work/devzero']);
    expect((await sh(fx.rt, id, 'echo alive')).out).to.equal('alive\n');
    await fx.rt.writeFile(id, '/work/plain.txt', Buffer.from('plain'));
    expect((await fx.rt.readFile(id, '/work/plain.txt')).toString()).to.equal('plain');
  });

  it('a tree deeper than PATH_MAX: the files API deletes it and destroy removes the sandbox', async () => {
    const deep = 'deep-sbx';
    await fx.rt.create({ id: deep });
    const mk = (top: string) =>
      `import os\nos.makedirs('${top}')\nos.chdir('${top}')\nfor i in range(400):\n    os.mkdir('d' * 40)\n    os.chdir('d' * 40)\nopen('leaf.txt', 'w').write('leaf')\nprint(len('${top}') + 400 * 41)\n`;
    for (const top of ['/work/deep1', '/work/deep2']) {
      const r = await fx.rt.exec(deep, { argv: ['python3', '-c', mk(top)], timeoutMs: 60_000 });
      expect(r.exitCode, r.stderr.toString()).to.equal(0);
      expect(Number(r.stdout.toString())).to.be.greaterThan(4096 * 3); // PATH_MAX is 4096
    }
    await fx.rt.deleteFile(deep, '/work/deep1', { recursive: true });
    expect((await fx.rt.listFiles(deep, '/work')).map((e) => e.name)).to.deep.equal(['deep2']);
    await fx.rt.destroy(deep);
    expect((await fx.rt.list()).map((s) => s.id)).to.not.include(deep);
    expect(execFileSync('find', [fx.stateDir, '-name', 'leaf.txt']).toString()).to.equal('');
  });
});
