// The exec allow-list and the read-only workspace at the runtime (SandboxConfig.confinement, which Sandbox
// spec.confinement and an AgentSession's policy both become): the exec allow-list holds against
// the dynamic loader, self-written ELF files, memfds and scripts, while the shell, true and the
// allowed programs (git with its helpers, python3 with its extension modules) keep working; a
// read-only workspace is read-only for metadata too. Each attack below succeeded before the
// exec view / the read-only mount (checked by running this file against the helper without them).
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

const LDSO = '/lib64/ld-linux-x86-64.so.2';

/** The attacks (docs/decisions/0010) that need no interpreter: each leaves /work/victim in place. */
export const LOADER_ATTACKS: Array<[string, string]> = [
  ['the loader runs rm', `${LDSO} /bin/rm -f /work/victim`],
  ['the loader runs rm from sh -c', `sh -c '${LDSO} /bin/rm -f /work/victim'`],
  ['git alias through the loader', `cd /work && git -c alias.x='!${LDSO} /bin/rm -f /work/victim' x`],
  ['git alias running rm', `cd /work && git -c alias.x='!rm -f /work/victim' x`],
  ['a script calling an unlisted program', `printf 'rm -f /work/victim\\n' > /tmp/s.sh; sh /tmp/s.sh`],
];

describe('procbox exec view: the allow-list holds against the loader; a read-only workspace holds for metadata', function () {
  this.timeout(120_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    if (process.arch !== 'x64') skipWith(this, `the loader path ${LDSO} is x86-64's (this is ${process.arch})`);
    fx = await makeRuntime({ warmPool: 1 });
    if (!fx.rt.capabilities().confinement?.execAllowlist) {
      await fx.cleanup();
      skipWith(this, 'the kernel cannot enforce an exec allow-list here (no Landlock)');
    }
    await fx.rt.create({ id: 'git', confinement: { execAllow: ['git'] } });
    await fx.rt.create({ id: 'py', confinement: { execAllow: ['python3'] } });
  });
  after(async () => {
    await fx?.cleanup();
  });

  async function victimThere(id: string): Promise<boolean> {
    return (await fx.rt.listFiles(id, '/work')).some((e) => e.name === 'victim');
  }

  it('the shell, true and git with its helpers keep working (init, add, commit, log, status)', async () => {
    const r = await sh(
      fx.rt,
      'git',
      'true && cd /work && git init -q r && cd r && git config user.email a@b && git config user.name a && echo x > f && git add f && git commit -qm first && git log --format=%s && git status --porcelain && echo done',
    );
    expect(r.code, r.err).to.equal(0);
    expect(r.out).to.equal('first\ndone\n');
  });

  for (const [what, cmd] of LOADER_ATTACKS) {
    it(`refused: ${what}`, async () => {
      await fx.rt.writeFile('git', '/work/victim', Buffer.from('v'));
      const r = await sh(fx.rt, 'git', cmd);
      expect(await victimThere('git'), `${r.out} ${r.err}`).to.equal(true);
      expect(r.err).to.match(/failed to map segment|Permission denied/);
    });
  }

  it('refused: the loader running python3 when only git is listed', async () => {
    const r = await sh(fx.rt, 'git', `${LDSO} /usr/bin/python3 -c 'print(42)'`);
    expect(r.out).to.equal('');
    expect(r.err).to.match(/failed to map segment/);
  });

  it('refused: an ELF written into the workspace, run directly and through the loader', async () => {
    await fx.rt.writeFile('git', '/work/rm', readFileSync('/bin/rm'), { mode: 0o755 });
    await fx.rt.writeFile('git', '/work/victim', Buffer.from('v'));
    const r = await sh(
      fx.rt,
      'git',
      `/work/rm -f /work/victim; echo "rc=$?"; ${LDSO} /work/rm -f /work/victim; echo "rc=$?"`,
    );
    expect(r.out).to.equal('rc=126\nrc=127\n');
    expect(r.err).to.match(/\/work\/rm: Permission denied/);
    expect(r.err).to.match(/\/work\/rm: error while loading shared libraries: .*failed to map segment/);
    expect(await victimThere('git')).to.equal(true);
  });

  for (const dir of ['/work', '/tmp', '/dev/shm']) {
    it(`refused: a copy of rm the sandbox writes into ${dir} (python3 allowed), directly and through the loader`, async () => {
      await fx.rt.writeFile('py', '/work/victim', Buffer.from('v'));
      const r = await sh(
        fx.rt,
        'py',
        `python3 -c "import shutil, os; shutil.copy('/bin/rm', '${dir}/myrm'); os.chmod('${dir}/myrm', 0o755)" && ${dir}/myrm -f /work/victim; echo "rc=$?"; ${LDSO} ${dir}/myrm -f /work/victim; echo "rc=$?"`,
      );
      expect(r.out, r.err).to.equal('rc=126\nrc=127\n');
      expect(r.err).to.match(/failed to map segment/);
      expect(await victimThere('py')).to.equal(true);
    });
  }

  it('refused: memfd_create (fexecve and the loader on /proc/self/fd/N), and an O_TMPFILE in /tmp through both', async () => {
    const memfd = await fx.rt.exec('py', { argv: ['python3', '-c', "import os; os.memfd_create('x')"] });
    expect(memfd.exitCode).to.equal(1);
    expect(memfd.stderr.toString()).to.match(/PermissionError: \[Errno 1\] Operation not permitted/);
    // An anonymous file on the noexec /tmp: execve refuses it, the loader cannot map it.
    const py = [
      'import os, subprocess',
      "fd = os.open('/tmp', os.O_TMPFILE | os.O_RDWR, 0o755)",
      "os.write(fd, open('/bin/echo', 'rb').read())",
      `r = subprocess.run(['${LDSO}', '/proc/self/fd/%d' % fd, 'mapped'], pass_fds=[fd], capture_output=True, text=True)`,
      "print('loader', r.returncode, r.stdout.strip())",
      'try:',
      "    os.execve(fd, ['echo', 'executed'], {})",
      'except OSError as e:',
      "    print('fexecve', e.errno)",
    ].join('\n');
    const r = await fx.rt.exec('py', { argv: ['python3', '-c', py] });
    expect(r.stdout.toString(), r.stderr.toString()).to.equal('loader 127 \nfexecve 13\n');
  });

  it('refused: a script with the shebang of an unlisted program or of the loader; sh reading it runs only allowed programs', async () => {
    await fx.rt.writeFile('git', '/work/victim', Buffer.from('v'));
    await fx.rt.writeFile(
      'git',
      '/work/p.py',
      Buffer.from('#!/usr/bin/python3\nimport os; os.remove("/work/victim")\n'),
      { mode: 0o755 },
    );
    await fx.rt.writeFile('git', '/work/l.sh', Buffer.from(`#!${LDSO} /bin/rm\n`), { mode: 0o755 });
    const r = await sh(
      fx.rt,
      'git',
      '/work/p.py; echo "rc=$?"; /work/l.sh -f /work/victim; echo "rc=$?"; printf "rm -f /work/victim\\n" > /work/s.sh; sh /work/s.sh; echo "rc=$?"',
    );
    expect(r.out).to.equal('rc=126\nrc=126\nrc=126\n');
    expect(await victimThere('git')).to.equal(true);
  });

  it('python3 when listed: runs with its extension modules (ssl, ctypes, sqlite3), also through the loader', async () => {
    const r = await sh(
      fx.rt,
      'py',
      `python3 -c "import ssl, ctypes, sqlite3, json, hashlib; print(hashlib.sha256(b'').hexdigest()[:8])" && ${LDSO} /usr/bin/python3 -c 'print(7)'`,
    );
    expect(r.out, r.err).to.equal('e3b0c442\n7\n');
  });

  it('a server command (du, the clone) runs in a full view; the sandbox still cannot', async () => {
    const du = await fx.rt.exec('git', {
      argv: ['sh', '-c', 'du -sk /work >/dev/null && ls / >/dev/null && echo ok'],
      serverCommand: true,
    });
    expect(du.stdout.toString(), du.stderr.toString()).to.equal('ok\n');
    const after = await sh(fx.rt, 'git', `${LDSO} /bin/ls /`);
    expect(after.err).to.match(/failed to map segment/);
  });

  it('forks (speculation copies) and a sandbox from a warm init have the same view', async () => {
    await fx.rt.fork('git', ['git-copy']);
    await fx.rt.writeFile('git-copy', '/work/victim', Buffer.from('v'));
    const r = await sh(fx.rt, 'git-copy', `${LDSO} /bin/rm -f /work/victim; git --version >/dev/null && echo git-ok`);
    expect(r.out).to.equal('git-ok\n');
    expect(await victimThere('git-copy')).to.equal(true);
    // The pool holds one warm init (warmPool 1): this create takes it and gets the view at attach.
    await fx.rt.create({ id: 'warm', confinement: { execAllow: [] } });
    const w = await sh(fx.rt, 'warm', `true && ${LDSO} /bin/ls /; echo "rc=$?"`);
    expect(w.out).to.equal('rc=127\n');
  });

  it('an init without the view (started by an older helper, then adopted) gets it at its first allow-listed command', async function () {
    const info = await fx.rt.create({ id: 'old', confinement: { execAllow: ['git'] } });
    // What such an init looks like: its mounts without noexec (here /tmp, from the host: python3
    // joins the init's mount namespace and clears noexec with mount_setattr; nothing can be
    // executed in that namespace, so no mount(8) there).
    const clear = [
      'import ctypes, os, struct, sys',
      'libc = ctypes.CDLL(None, use_errno=True)',
      "fd = os.open('/proc/%s/ns/mnt' % sys.argv[1], os.O_RDONLY)",
      'assert libc.setns(fd, 0x20000) == 0, os.strerror(ctypes.get_errno())',
      "attr = struct.pack('QQQQ', 0, 0x8, 0, 0)",
      "assert libc.syscall(442, -100, b'/tmp', 0, attr, len(attr)) == 0, os.strerror(ctypes.get_errno())",
    ].join('\n');
    try {
      execFileSync('python3', ['-c', clear, String(info.pid)], { stdio: 'pipe' });
    } catch (e) {
      return skipWith(this, `cannot clear noexec on the init's /tmp: ${(e as Error).message}`);
    }
    const tmpOpts = () =>
      readFileSync(`/proc/${info.pid}/mountinfo`, 'utf8')
        .split('\n')
        .find((l) => l.split(' ')[4] === '/tmp')
        ?.split(' ')[5];
    expect(tmpOpts()).to.not.match(/noexec/);
    await fx.rt.writeFile('old', '/work/victim', Buffer.from('v'));
    const r = await sh(fx.rt, 'old', `git --version >/dev/null && echo git-ok; ${LDSO} /bin/rm -f /work/victim`);
    expect(tmpOpts()).to.match(/noexec/);
    expect(r.out).to.equal('git-ok\n');
    expect(r.err).to.match(/failed to map segment/);
    expect(await victimThere('old')).to.equal(true);
  });

  it('a value with a line break cannot reach the helper config', async () => {
    const e = await rejects(fx.rt.create({ id: 'nl', confinement: { execAllow: ['git\nlower /etc'] } }));
    expect(e.code).to.equal('InvalidArgument');
  });

  describe('read-only workspace: contents and metadata', () => {
    before(async () => {
      await fx.rt.create({ id: 'src' });
      await fx.rt.writeFile('src', '/work/f', Buffer.from('data'), { mode: 0o644 });
      await fx.rt.writeFile('src', '/work/d/g', Buffer.from('g'), { mkdirs: true });
      await fx.rt.create({
        id: 'ro',
        source: { sandboxId: 'src' },
        confinement: { readonlyWorkspace: true, writePaths: ['/work/out/**'] },
      });
    });

    const META: Array<[string, string]> = [
      ['chmod', 'chmod 777 /work/f'],
      ['touch -d (times)', 'touch -d 2000-01-01 /work/f'],
      ['chown', 'chown 1000:1000 /work/f'],
      ['setxattr', `python3 -c "import os; os.setxattr('/work/f', 'user.x', b'1')"`],
      ['rename', 'mv /work/f /work/f2'],
      ['hard link', 'ln /work/f /work/f3'],
      ['symlink', 'ln -s f /work/f4'],
      ['mkdir', 'mkdir /work/newdir'],
      ['rmdir / unlink', 'rm -rf /work/d'],
      ['truncate', 'truncate -s 0 /work/f'],
      ['write', 'echo x >> /work/f'],
    ];
    for (const [what, cmd] of META) {
      it(`refused: ${what}`, async () => {
        const before = await fx.rt.stat('ro', '/work/f');
        const r = await sh(fx.rt, 'ro', cmd);
        expect(r.code, r.out + r.err).to.not.equal(0);
        expect(r.err).to.match(/Read-only file system|Permission denied/);
        expect(await fx.rt.stat('ro', '/work/f')).to.deep.equal(before);
        expect((await fx.rt.listFiles('ro', '/work')).map((e) => e.name).sort()).to.deep.equal(['d', 'f', 'out']);
        expect((await fx.rt.listFiles('ro', '/work/d')).map((e) => e.name)).to.deep.equal(['g']);
      });
    }

    it('a writePath below it (made at start) stays writable: contents, mode, times, xattrs; /tmp too', async () => {
      const r = await sh(
        fx.rt,
        'ro',
        `echo x > /work/out/n && chmod 600 /work/out/n && touch -d 2000-01-01 /work/out/n && mkdir /work/out/sub && mv /work/out/n /work/out/sub/m && python3 -c "import os; os.setxattr('/work/out/sub/m', 'user.x', b'1')" && echo y > /tmp/t && cat /work/out/sub/m`,
      );
      expect(r.out, r.err).to.equal('x\n');
      expect((await fx.rt.stat('ro', '/work/out/sub/m')).mode & 0o777).to.equal(0o600);
    });

    it('after a mark (fork, checkpoint) the new workspace mount is read-only too, its writePath writable', async () => {
      await fx.rt.fork('ro', ['ro-copy']);
      for (const id of ['ro', 'ro-copy']) {
        const r = await sh(
          fx.rt,
          id,
          'chmod 777 /work/f; touch -d 2000-01-01 /work/f; echo z > /work/out/z && cat /work/out/z',
        );
        expect(r.out, r.err).to.equal('z\n');
        expect(r.err).to.match(/chmod: changing permissions of '\/work\/f': Read-only file system/);
        expect((await fx.rt.stat(id, '/work/f')).mode & 0o777).to.equal(0o644);
      }
    });

    it('a mark waits for nobody writing below the writePath: Busy while a file there is open for writing', async () => {
      const hold = fx.rt.exec('ro', { argv: ['sh', '-c', 'exec 3>/work/out/held; sleep 3'], timeoutMs: 10_000 });
      await eventually(
        async () => (await fx.rt.listFiles('ro', '/work/out')).some((e) => e.name === 'held'),
        5000,
        'the writer to hold /work/out/held',
      );
      const e = await rejects(fx.rt.fork('ro', ['ro-busy']));
      expect(e.code).to.equal('Busy');
      await hold;
    });
  });
});
