// Per-command confinement of a procbox sandbox (readonly workspace and
// filesystem rules): SandboxConfig.confinement reaches every command as one Landlock domain,
// applied by the helper inside the sandbox. Real sandboxes; each expectation here fails
// without the corresponding Landlock rule (checked by running the file with the rule removed).
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import { makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

describe('procbox confinement: exec allow-list, read-only workspace, filesystem paths', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    if (!fx.rt.capabilities().confinement?.execAllowlist) {
      await fx.cleanup();
      skipWith(this, `the kernel has no Landlock (ABI ${fx.rt.capabilities().landlockAbi ?? 0})`);
    }
    await fx.rt.create({ id: 'py', confinement: { execAllow: ['python3'] } });
    await fx.rt.create({ id: 'ro', confinement: { readonlyWorkspace: true, writePaths: ['/work/out/**'] } });
    await fx.rt.create({ id: 'plain' });
  });
  after(async () => {
    await fx?.cleanup();
  });

  it('capabilities say the allow-list and path rules are enforced, with the Landlock ABI', () => {
    const c = fx.rt.capabilities();
    expect(c.landlockAbi).to.be.greaterThanOrEqual(1);
    expect(c.confinement).to.deep.equal({ execAllowlist: true, paths: true });
  });

  it('an allowed interpreter runs, also through sh -c', async () => {
    const r = await sh(fx.rt, 'py', 'python3 -c "print(1)"');
    expect(r.code, r.err).to.equal(0);
    expect(r.out).to.equal('1\n');
    const argv = await fx.rt.exec('py', { argv: ['python3', '-c', 'print(6*7)'] });
    expect(argv.stdout.toString()).to.equal('42\n');
  });

  it('a program not in the list is refused by the kernel (shell builtins still work)', async () => {
    const r = await sh(fx.rt, 'py', 'ls /; echo builtin-ok');
    expect(r.err).to.match(/ls: Permission denied/);
    expect(r.out).to.equal('builtin-ok\n');
    const direct = await fx.rt.exec('py', { argv: ['ls', '/'] });
    expect(direct.exitCode).to.equal(126); // found but refused, as `sh -c ls` answers
    expect(direct.stderr.toString()).to.equal('procbox: exec ls: Permission denied\n');
  });

  it('a copied binary cannot be executed, the original still can', async () => {
    const r = await sh(
      fx.rt,
      'py',
      `python3 -c "import shutil; shutil.copy('/usr/bin/python3', '/tmp/p3')" && /tmp/p3 -c 'print(2)'`,
    );
    expect(r.code).to.equal(126);
    expect(r.err).to.match(/\/tmp\/p3: Permission denied/);
    expect(r.out).to.equal('');
    // The copy is there (with its mode), on a noexec /tmp (exec view): `test -x` says so too.
    expect((await sh(fx.rt, 'py', 'test -f /tmp/p3 && ! test -x /tmp/p3 && python3 -c "print(3)"')).out).to.equal(
      '3\n',
    );
  });

  it('a script the sandbox wrote cannot be executed directly; an interpreter reads it', async () => {
    const r = await sh(
      fx.rt,
      'py',
      `printf '#!/bin/sh\\necho from-script\\n' > x.sh && python3 -c "import os; os.chmod('x.sh', 0o755)" && ./x.sh; echo "rc=$?"; sh x.sh`,
    );
    expect(r.err).to.match(/\.\/x\.sh: Permission denied/);
    expect(r.out).to.equal('rc=126\nfrom-script\n');
  });

  it('children inherit the domain: python3 cannot start what the shell may not', async () => {
    const r = await sh(fx.rt, 'py', `python3 -c "import subprocess; subprocess.run(['/usr/bin/id'])"`);
    expect(r.code).to.not.equal(0);
    expect(r.err).to.match(/PermissionError/);
  });

  it('without an allow-list everything runs (the default is unchanged)', async () => {
    const r = await sh(fx.rt, 'plain', 'cp /usr/bin/true /tmp/t && /tmp/t && ls / >/dev/null && echo ok');
    expect(r.out, r.err).to.equal('ok\n');
  });

  it('a server command (serverCommand) keeps the filesystem rules but not the allow-list', async () => {
    const r = await fx.rt.exec('py', { argv: ['du', '-sk', '/work'], serverCommand: true });
    expect(r.exitCode, r.stderr.toString()).to.equal(0);
    const w = await fx.rt.exec('ro', { argv: ['sh', '-c', 'echo x > /work/f'], serverCommand: true });
    expect(w.exitCode).to.not.equal(0);
  });

  it('resolveExecutables lists the programs found in the sandbox root, the shell and the loader', async () => {
    const r = await fx.rt.resolveExecutables('py');
    expect(r.missing).to.deep.equal([]);
    expect(r.programs.map((p) => [p.name, p.path])).to.deep.equal([['python3', '/usr/bin/python3']]);
    expect(r.programs[0]!.realPath).to.match(/^\/usr\/bin\/python3\.\d+$/);
    const implied = r.implied.map((p) => p.path);
    expect(implied).to.include('/bin/sh');
    expect(implied.some((p) => /ld-linux/.test(p))).to.equal(true, implied.join(' '));
    expect((await fx.rt.resolveExecutables('plain')).programs).to.deep.equal([]);
  });

  it('a name that resolves to nothing is reported missing and grants nothing', async () => {
    await fx.rt.create({ id: 'missing', confinement: { execAllow: ['no-such-program-xyz', '/usr/bin/env'] } });
    const r = await fx.rt.resolveExecutables('missing');
    expect(r.missing).to.deep.equal(['no-such-program-xyz']);
    expect(r.programs.map((p) => p.path)).to.deep.equal(['/usr/bin/env']);
    const run = await sh(fx.rt, 'missing', 'env true && echo env-ok; id');
    expect(run.out).to.equal('env-ok\n');
    expect(run.err).to.match(/id: Permission denied/);
  });

  it('bad allow-list entries are refused at create: wildcards and relative paths', async () => {
    expect((await rejects(fx.rt.create({ id: 'bad1', confinement: { execAllow: ['py*'] } }))).code).to.equal(
      'InvalidArgument',
    );
    expect((await rejects(fx.rt.create({ id: 'bad2', confinement: { execAllow: ['bin/python3'] } }))).code).to.equal(
      'InvalidArgument',
    );
    expect((await rejects(fx.rt.create({ id: 'bad3', confinement: { writePaths: ['../x'] } }))).code).to.equal(
      'InvalidPath',
    );
    expect((await fx.rt.list()).map((s) => s.id)).to.not.include.members(['bad1', 'bad2', 'bad3']);
  });

  it('a read-only workspace: writes below it fail, /tmp and /dev/shm stay writable', async () => {
    const r = await sh(
      fx.rt,
      'ro',
      'echo x > /work/f; echo "rc=$?"; mkdir /work/d; echo y > /tmp/f && cat /tmp/f && echo z > /dev/shm/z && cat /dev/shm/z',
    );
    expect(r.err).to.match(/cannot create \/work\/f: (Permission denied|Read-only file system)/);
    expect(r.err).to.match(/mkdir: cannot create directory '?‘?\/work\/d/);
    expect(r.out).to.equal('rc=2\ny\nz\n');
    // Only the writePath, made when the read-only workspace was mounted (bound writable on it).
    expect((await fx.rt.listFiles('ro', '/work')).map((e) => e.name)).to.deep.equal(['out']);
  });

  it('a read-only workspace: a filesystem.write path below it is writable once it exists', async () => {
    await fx.rt.writeFile('ro', '/work/out/keep', Buffer.from('k'), { mkdirs: true }); // the host's files API is not confined
    const r = await sh(fx.rt, 'ro', 'echo x > /work/out/new && cat /work/out/new && echo no > /work/other');
    expect(r.out).to.equal('x\n');
    expect(r.err).to.match(/\/work\/other: (Permission denied|Read-only file system)/);
  });

  it('a fork (speculation copy) keeps the confinement', async () => {
    await fx.rt.fork('py', ['py-copy']);
    const r = await sh(fx.rt, 'py-copy', 'python3 -c "print(5)"; ls');
    expect(r.out).to.equal('5\n');
    expect(r.err).to.match(/ls: Permission denied/);
  });

  it('filesystem.read: reads outside the system dirs, workspace, /tmp and the listed paths fail', async () => {
    await fx.rt.create({ id: 'rd', confinement: { readPaths: [] } });
    const r = await sh(
      fx.rt,
      'rd',
      'cat /etc/hostname && ls /work >/dev/null && python3 -c "print(4)" && ls / ; echo "rc=$?"',
    );
    expect(r.out).to.equal('sandbox\n4\nrc=2\n');
    expect(r.err).to.match(/ls: cannot open directory '\/': Permission denied/);
  });
});
