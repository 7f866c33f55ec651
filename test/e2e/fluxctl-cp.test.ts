// Files: `fluxctl cp` (the real binary) over sandboxes/tar against a real `fluxctl
// serve`. A tree with modes, spaces, a symlink and a 100 MiB file goes in and comes back
// byte-identical; a 512 MiB tree streams with the server's peak RSS growing by less than 96 MiB;
// hostile archives sent to the server are refused with nothing written; a sandbox that plants
// symlinks cannot make cp write outside the local destination.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fluxctlCommand, startFluxctl, type Fluxctl } from './harness.js';
import { ptySkipReason, runOnPty } from './pty.js';
import { exec, localTree, makeSandbox, sandboxSkipReason, skipWith, subPath } from './sandbox-helpers.js';
import { archive, tarEntry } from '../tar-entries.js';
import { eventually } from '../support/wait.js';

/** The same listing, taken inside the sandbox with find and sha256sum. */
async function sandboxTree(fx: Fluxctl, name: string, dir: string): Promise<Record<string, string>> {
  const r = await exec(
    fx,
    name,
    `cd '${dir}' && find . -mindepth 1 -printf '%y|%m|%s|%l|%P\\n' && find . -type f -exec sha256sum {} +`,
  );
  expect(r.exitCode, r.stderr).to.equal(0);
  const out: Record<string, string> = {};
  const sums: Record<string, string> = {};
  for (const line of r.stdout.trim().split('\n')) {
    const m = /^([0-9a-f]{64}) {2}\.\/(.*)$/.exec(line);
    if (m) sums[m[2]!] = m[1]!;
  }
  for (const line of r.stdout.trim().split('\n')) {
    const parts = line.split('|');
    if (parts.length < 5) continue;
    const [t, mode, size, link, ...rest] = parts;
    const rel = rest.join('|');
    out[rel] = t === 'l' ? `l -> ${link}` : t === 'd' ? `d ${mode}` : `f ${mode} ${size} ${sums[rel]}`;
  }
  return out;
}

/** Peak (VmHWM) or current (VmRSS) resident memory of a process, bytes. */
function rss(pid: number, field: 'VmHWM' | 'VmRSS' = 'VmHWM'): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) * 1024;
}

describe('fluxctl cp', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let work: string;
  const cp = (...args: string[]) => fx.fluxctl(['cp', ...args], { timeoutMs: 300_000 });

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 120_000 }); // a loaded machine starts tsx slowly
    await makeSandbox(fx, 'cpy');
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxctl-cp-'));
  });
  after(async () => {
    await fx?.stop();
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  it('a tree with modes, spaces, a symlink and a 100 MiB file goes in and comes back byte-identical', async () => {
    const src = path.join(work, 'proj');
    fs.mkdirSync(path.join(src, 'sub dir', 'deep'), { recursive: true });
    fs.writeFileSync(path.join(src, 'run.sh'), '#!/bin/sh\necho hi\n', { mode: 0o755 });
    fs.writeFileSync(path.join(src, 'sub dir', 'my key'), 'secret\n', { mode: 0o600 });
    fs.writeFileSync(path.join(src, 'sub dir', 'deep', 'notes.txt'), 'n\n', { mode: 0o640 });
    fs.chmodSync(path.join(src, 'sub dir', 'deep'), 0o750);
    fs.symlinkSync('../run.sh', path.join(src, 'sub dir', 'run-link'));
    // 100 MiB that are not all alike (a repeated 1 MiB block of random bytes, each block numbered).
    const block = Buffer.from(
      createHash('sha512')
        .update('seed')
        .digest()
        .toString('hex')
        .repeat(8192)
        .slice(0, 1 << 20),
    );
    const fd = fs.openSync(path.join(src, 'big.bin'), 'w', 0o644);
    for (let i = 0; i < 100; i++) {
      block.writeUInt32LE(i, 0);
      fs.writeSync(fd, block);
    }
    fs.closeSync(fd);
    const want = localTree(src);

    const up = await cp(src, 'cpy:/work/proj');
    expect(up.code, up.stderr).to.equal(0);
    expect(up.stdout).to.equal('4 files, 2 directories, 1 symlinks (100.0 MiB) copied to cpy:/work/proj\n');
    expect(up.stderr, 'no progress line when stderr is not a terminal').to.equal('');
    expect(await sandboxTree(fx, 'cpy', '/work/proj')).to.deep.equal(want);
    const owner = await exec(fx, 'cpy', "stat -c '%u:%g' /work/proj/run.sh '/work/proj/sub dir'");
    expect(owner.stdout).to.equal('0:0\n0:0\n');

    const back = path.join(work, 'back');
    const down = await cp('default/cpy:/work/proj', back);
    expect(down.code, down.stderr).to.equal(0);
    expect(localTree(back)).to.deep.equal(want);
    expect(
      fs.readdirSync(work).filter((n) => n.startsWith('.fluxctl-cp-')),
      'temporary directory left',
    ).to.deep.equal([]);

    // A single file both ways, renamed on the way; and into a directory with a trailing slash.
    expect((await cp(path.join(src, 'run.sh'), 'cpy:/work/one/renamed.sh')).code).to.equal(0);
    expect((await cp(path.join(src, 'run.sh'), 'cpy:/work/one/')).code).to.equal(0);
    expect((await exec(fx, 'cpy', "stat -c '%a %s %n' /work/one/renamed.sh /work/one/run.sh")).stdout).to.equal(
      '755 18 /work/one/renamed.sh\n755 18 /work/one/run.sh\n',
    );
    const f = await cp('cpy:/work/one/renamed.sh', path.join(work, 'r.sh'));
    expect(f.code, f.stderr).to.equal(0);
    expect(fs.readFileSync(path.join(work, 'r.sh'), 'utf8')).to.equal('#!/bin/sh\necho hi\n');
    expect(fs.statSync(path.join(work, 'r.sh')).mode & 0o7777).to.equal(0o755);
  });

  it('a 512 MiB tree streams through the server in bounded memory (peak RSS grows by < 96 MiB)', async () => {
    const src = path.join(work, 'gig');
    fs.mkdirSync(src);
    for (let i = 0; i < 2; i++) {
      const fd = fs.openSync(path.join(src, `part${i}`), 'w');
      fs.ftruncateSync(fd, 256 << 20); // sparse locally; 256 MiB of zeros on the wire each
      fs.closeSync(fd);
    }
    const pid = fx.child.pid!;
    const before = rss(pid);
    const base = rss(pid, 'VmRSS');
    // The current RSS is sampled too, for the report: the peak alone hides growth below an earlier peak.
    let most = base;
    const sampler = setInterval(() => (most = Math.max(most, rss(pid, 'VmRSS'))), 100);
    const mib = (n: number) => (n / 2 ** 20).toFixed(1);
    try {
      const t0 = Date.now();
      const up = await cp(src, 'cpy:/work/gig');
      expect(up.code, `${up.stderr}\nserve's log:\n${fx.logs().slice(-3000)}`).to.equal(0);
      const t1 = Date.now();
      const back = path.join(work, 'gig-back');
      const down = await cp('cpy:/work/gig', back);
      expect(down.code, down.stderr).to.equal(0);
      const t2 = Date.now();
      console.log(
        `      512 MiB in ${t1 - t0} ms, out ${t2 - t1} ms (each with a fluxctl start); server RSS ${mib(base)} MiB before, at most ${mib(most)} MiB while copying; peak ${mib(before)} -> ${mib(rss(pid))} MiB`,
      );
      expect(fs.statSync(path.join(back, 'part1')).size).to.equal(256 << 20);
    } finally {
      clearInterval(sampler);
    }
    // The bound is 96 MiB, not 64: every read from a socket or a pipe is a new Buffer outside V8's
    // heap, and V8 collects them once about 64 MiB of such memory has grown since its last
    // collection, later on a machine whose CPUs are busy (its marking runs on starved threads). A
    // stream without backpressure, or one that kept its chunks, grows by hundreds of MiB here (the
    // tree is 512 MiB, over five times the bound; 1 GiB took 50 s of the suite's time for the same check).
    expect(rss(pid) - before, 'peak RSS growth').to.be.below(96 << 20);
    expect(most - base, 'RSS growth while copying').to.be.below(96 << 20);
    await exec(fx, 'cpy', 'rm -rf /work/gig');
    fs.rmSync(path.join(work, 'gig-back'), { recursive: true, force: true });
  });

  describe('hostile archives sent to the server: 400, nothing written', () => {
    const put = (p: string, body: Buffer) =>
      fx.request('PUT', `${subPath('default', 'cpy', 'tar')}?path=${encodeURIComponent(p)}`, {
        raw: body,
        headers: { 'content-type': 'application/x-tar' },
      });
    const cases: [string, Buffer, string][] = [
      [
        '../ in a name',
        archive(
          tarEntry('ok', '0', { data: Buffer.from('ok') }),
          tarEntry('../../tmp/escape', '0', { data: Buffer.from('x') }),
        ),
        "'..' in an archive path: ../../tmp/escape",
      ],
      [
        'an absolute name',
        archive(tarEntry('/etc/fluxvm-cp-escape', '0', { data: Buffer.from('x') })),
        'absolute path in the archive: /etc/fluxvm-cp-escape',
      ],
      [
        'a symlink, then a file through it',
        archive(tarEntry('l', '2', { link: '/etc' }), tarEntry('l/fluxvm-cp-escape', '0', { data: Buffer.from('x') })),
        'archive path through a symlink: l/fluxvm-cp-escape',
      ],
    ];
    for (const [what, body, msg] of cases) {
      it(what, async () => {
        const r = await put('/work/target', body);
        expect(r.status, r.body.toString()).to.equal(400);
        expect(r.json).to.include({ kind: 'Status', status: 'Failure', reason: 'BadRequest', code: 400 });
        expect(r.json.message).to.include(msg);
        expect((await exec(fx, 'cpy', 'test -e /work/target || echo absent; ls /tmp /work')).stdout).to.not.match(
          /escape|ok\n/,
        );
        expect((await exec(fx, 'cpy', 'test -e /work/target || echo absent')).stdout).to.equal('absent\n');
        expect(fs.existsSync('/etc/fluxvm-cp-escape')).to.equal(false);
      });
    }
    it('refused with more body behind it than the server drains (64 MiB): the client gets the 400 while it uploads, then the connection is cut and the log says why', async () => {
      const body = Buffer.concat([
        archive(tarEntry('../../tmp/escape', '0', { data: Buffer.from('x') })),
        Buffer.alloc(80 << 20),
      ]);
      const r = await put('/work/target', body).catch((e: Error) => e);
      // The answer went out before the drain: the client reads it while it still uploads.
      expect(r instanceof Error ? r.message : r.status, 'the answer to a refused 80 MiB upload').to.equal(400);
      expect((r as { json: { message: string } }).json.message).to.include("'..' in an archive path");
      const line = await eventually(
        () =>
          fx
            .logs()
            .split('\n')
            // This upload's line: an earlier refused upload of this server logs the same words with its own reason.
            .find((l) => l.includes('tar upload failed; the rest of its body was not read') && l.includes("'..'")),
        15_000,
        "serve's log line for the cut connection",
      );
      expect(line).to.include("'..' in an archive path").and.include('"name":"cpy"');
    });
    it('a body that is not application/x-tar is 415', async () => {
      const r = await fx.request('PUT', `${subPath('default', 'cpy', 'tar')}?path=/work/target`, {
        raw: archive(),
        headers: { 'content-type': 'application/octet-stream' },
      });
      expect(r.status).to.equal(415);
      expect(r.json.message).to.equal(
        'tar takes a body of Content-Type application/x-tar, not "application/octet-stream"',
      );
    });
  });

  it('a sandbox that plants symlinks cannot make cp write outside the destination', async () => {
    const planted = await exec(
      fx,
      'cpy',
      'set -e; ln -sfn /etc /work/out; mkdir -p /work/out2/d; echo fine > /work/out2/d/f; ln -sfn /etc /work/out2/abs; ln -sfn ../../../.. /work/out2/d/up; ln -sfn f /work/out2/d/ok',
    );
    expect(planted.exitCode, planted.stderr).to.equal(0);
    // The source itself is a symlink out of the workspace: refused by the server.
    const r1 = await cp('cpy:/work/out', path.join(work, 'out'));
    expect(r1.code).to.equal(1);
    expect(r1.stderr).to.match(/^Error from server \(BadRequest\): .*leads out of the workspace/);
    expect(fs.existsSync(path.join(work, 'out'))).to.equal(false);
    // Symlinks inside the tree that lead out are left out (with a warning), the rest is copied.
    const dest = path.join(work, 'out2');
    const r2 = await cp('cpy:/work/out2', dest);
    expect(r2.code, r2.stderr).to.equal(0);
    expect(r2.stderr.split('\n').filter(Boolean).sort()).to.deep.equal([
      'warning: skipping symlink out2/abs -> /etc: it leads out of the copied tree',
      'warning: skipping symlink out2/d/up -> ../../../..: it leads out of the copied tree',
    ]);
    expect(localTree(dest)).to.deep.equal({
      d: 'd 755',
      'd/f': `f 644 5 ${createHash('sha256').update('fine\n').digest('hex')}`,
      'd/ok': 'l -> f',
    });
  });

  it('sandbox diff A B: a unified diff of text files, binary files and mode changes named, control characters escaped; forks counts the changes', async () => {
    await makeSandbox(fx, 'da');
    const prep = await exec(
      fx,
      'da',
      "set -e; mkdir -p /work/src; printf 'one\\ntwo\\n' > /work/src/a.txt; printf 'gone\\n' > /work/c.txt; printf 'x\\n' > /work/run.sh; printf '\\000\\001' > /work/bin; echo same > /work/same",
    );
    expect(prep.exitCode, prep.stderr).to.equal(0);
    const fork = await fx.fluxctl(['sandbox', 'fork', 'da', '-o', 'name']);
    expect(fork.code, fork.stderr).to.equal(0);
    const child = fork.stdout.trim().split('/')[1]!;
    const change = await exec(
      fx,
      child,
      "set -e; printf 'one\\nTWO\\n' > /work/src/a.txt; printf 'new \\033[31mred\\n' > /work/b.txt; rm /work/c.txt; chmod 0755 /work/run.sh; printf '\\000\\002' > /work/bin",
    );
    expect(change.exitCode, change.stderr).to.equal(0);
    const d = await fx.fluxctl(['sandbox', 'diff', 'da', child]);
    expect(d.code, d.stderr).to.equal(1);
    expect(d.stdout).to.equal(
      [
        'diff --fluxvm a/work/b.txt b/work/b.txt',
        '--- /dev/null',
        '+++ b/work/b.txt',
        '@@ -0,0 +1 @@',
        '+new ^[[31mred',
        'diff --fluxvm a/work/bin b/work/bin',
        'Binary files a/work/bin and b/work/bin differ',
        'diff --fluxvm a/work/c.txt b/work/c.txt',
        '--- a/work/c.txt',
        '+++ /dev/null',
        '@@ -1 +0,0 @@',
        '-gone',
        'diff --fluxvm a/work/run.sh b/work/run.sh',
        'old mode 0644',
        'new mode 0755',
        'diff --fluxvm a/work/src/a.txt b/work/src/a.txt',
        '--- a/work/src/a.txt',
        '+++ b/work/src/a.txt',
        '@@ -1,2 +1,2 @@',
        ' one',
        '-two',
        '+TWO',
        '',
      ].join('\n'),
    );
    const j = await fx.fluxctl(['sandbox', 'diff', 'da', child, '--path', '/work/src', '-o', 'json']);
    expect(JSON.parse(j.stdout)).to.deep.equal({ added: [], modified: ['/work/src/a.txt'], deleted: [] });
    const same = await fx.fluxctl(['sandbox', 'diff', 'da', 'da']);
    expect([same.code, same.stdout]).to.deep.equal([0, '']);
    // CHANGES are the child's since the fork, by content (the layered history's comparison; the
    // chmod-only run.sh is not counted, `sandbox diff` above shows the mode): the parent
    // changing afterwards does not count.
    const later = await exec(fx, 'da', 'echo parent-later > /work/p1; echo more > /work/same');
    expect(later.exitCode, later.stderr).to.equal(0);
    const forks = await fx.fluxctl(['sandbox', 'forks', 'da']);
    expect(forks.stdout, forks.stdout).to.match(
      new RegExp(`^NAME\\s+PHASE\\s+OWNED\\s+CHANGES\\s+AGE\\n${child}\\s+Running\\s+yes\\s+\\+1 ~2 -1\\s+\\d+s\\n$`),
    );
    const since = await fx.request('POST', `/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/${child}/changes`, {
      body: { since: 'fork' },
    });
    expect(since.json).to.deep.include({
      added: ['/work/b.txt'],
      modified: ['/work/bin', '/work/src/a.txt'],
      deleted: ['/work/c.txt'],
      since: 'fork',
    });
    const notFork = await fx.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/da/changes', {
      body: { since: 'fork' },
    });
    expect([notFork.status, notFork.json.message]).to.deep.equal([
      409,
      'Operation cannot be fulfilled on sandboxes.fluxvm.dev "da": sandbox "da" has no fork point: it was not forked, or its backend does not keep a layered history',
    ]);
    const bad = await fx.request('POST', `/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/${child}/changes`, {
      body: { since: 'yesterday' },
    });
    expect(bad.status).to.equal(400);
  });

  it('on a terminal, a progress line on stderr, redrawn in place, ending at 100%', async function () {
    skipWith(this, ptySkipReason());
    const src = path.join(work, 'progress');
    fs.mkdirSync(src);
    fs.writeFileSync(path.join(src, 'eight'), Buffer.alloc(8 << 20, 7));
    const p = runOnPty([...fluxctlCommand(), 'cp', src, 'cpy:/work/progress'], {
      env: { ...process.env, KUBECONFIG: fx.kubeconfig },
      cols: 200,
    });
    expect(await p.exit, p.text).to.equal(0);
    // \r-redrawn, erased to the end of the line, the last one complete (the pty turns \n into \r\n).
    expect(p.text).to.match(
      new RegExp(
        `\\r${src.replace(/[/.]/g, '\\$&')} -> cpy:/work/progress \\[#{24}\\] 100% 8\\.0 MiB / 8\\.0 MiB [0-9.]+ [KMG]?i?B/s\\x1b\\[K\\r\\n1 files, 0 directories, 0 symlinks \\(8\\.0 MiB\\) copied to cpy:/work/progress\\r\\n$`,
      ),
    );
  });

  it('cp between two local paths or two sandboxes is refused with what to do', async () => {
    const r = await cp('./a', './b');
    expect(r.code).to.equal(1);
    expect(r.stderr).to.equal(
      'error: one of SRC and DST must name a sandbox: SANDBOX:/path or NAMESPACE/SANDBOX:/path (copy local files with cp)\n',
    );
    const r2 = await cp('cpy:/work', 'cpy:/tmp');
    expect(r2.stderr).to.equal(
      'error: copying from one sandbox to another is not supported: copy to a local directory first\n',
    );
    const r3 = await cp(work, 'cpy:work');
    expect(r3.stderr).to.equal('error: cpy:work: the sandbox path must be absolute, e.g. cpy:/work/work\n');
  });
});
