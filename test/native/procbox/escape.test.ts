// The escape suite: every attempt to reach the host from inside a procbox sandbox
// fails, and the host's state shows it (files, processes, cgroup counters).
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import { existsSync, readFileSync, symlinkSync } from 'node:fs';
import { RuntimeError } from '../../../native/runtime.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

describe('procbox escape suite', function () {
  this.timeout(60_000);
  let fx: Fixture;
  const id = 'esc';

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id, resources: { memoryBytes: 64 << 20, pids: 64 } });
  });
  after(async () => fx?.cleanup());

  it('cannot read the host /etc/shadow or /root', async () => {
    const r = await sh(fx.rt, id, 'cat /etc/shadow; ls /root; ls /home /var /run 2>&1; cat /etc/passwd');
    expect(r.out).to.not.include(readFileSync('/etc/shadow', 'utf8').split('\n')[0]);
    expect(r.err).to.match(/\/etc\/shadow: No such file/);
    expect(r.err).to.match(/\/root.*No such file/);
    expect(r.out + r.err).to.match(/\/home.*No such file/);
    expect(r.out).to.include('root:x:0:0:root:/tmp:/bin/sh'); // the generated /etc
  });

  it('cannot write to /usr or outside the workspace and temp dirs', async () => {
    const tag = `procbox-escape-${process.pid}`;
    const r = await sh(
      fx.rt,
      id,
      `for p in /usr/${tag} /${tag} /etc/${tag} /dev/${tag} /bin/${tag}; do (echo x > $p) 2>/dev/null && echo "WROTE $p"; done; ` +
        `echo ok > /work/w && echo ok > /tmp/t && echo ok > /dev/shm/s && echo ok > /dev/null && echo allowed`,
    );
    expect(r.out).to.not.include('WROTE');
    expect(r.out).to.include('allowed');
    for (const p of [`/usr/${tag}`, `/${tag}`, `/etc/${tag}`, `/bin/${tag}`]) expect(existsSync(p), p).to.equal(false);
  });

  it('Landlock refuses writes even where a mount would allow them', async () => {
    // /proc/self/comm is writable by its owner; Landlock allows only workspace/tmp/shm/dev.
    const r = await sh(
      fx.rt,
      id,
      'echo evil > /proc/self/comm && echo WROTE; cat /proc/self/status | grep -E "^(Seccomp|NoNewPrivs|CapEff)"',
    );
    expect(r.out).to.not.include('WROTE');
    expect(r.out).to.match(/NoNewPrivs:\s+1/);
    expect(r.out).to.match(/Seccomp:\s+2/);
    // No CAP_SYS_ADMIN (21), CAP_NET_ADMIN (12), CAP_SYS_PTRACE (19), CAP_SYS_MODULE (16).
    const eff = BigInt('0x' + /CapEff:\s+([0-9a-f]+)/.exec(r.out)![1]);
    for (const cap of [12n, 16n, 19n, 21n]) expect(eff & (1n << cap)).to.equal(0n);
  });

  it('cannot see or signal a host process', async () => {
    const r = await sh(
      fx.rt,
      id,
      `kill -0 ${process.pid} 2>&1; echo rc=$?; ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/1/cmdline | tr '\\0' ' '`,
    );
    expect(r.out).to.match(/rc=1/);
    const n = Number(/^(\d+)$/m.exec(r.out)![1]);
    expect(n).to.be.lessThan(10); // init, sh, ls, grep, wc: nothing of the host
    const r2 = await sh(fx.rt, id, `kill -9 1; echo rc=$?`);
    expect(
      r2.out,
      'SIGKILL to the sandbox init from inside is dropped by the kernel (pid namespace init without a handler): kill succeeds, init lives',
    ).to.match(/^rc=0$/m);
    expect((await fx.rt.inspect(id)).state).to.equal('running');
  });

  it('cannot ptrace', async () => {
    const r = await sh(
      fx.rt,
      id,
      `strace -f true 2>&1; echo rc=$?; perl -e '$r = syscall(101, 0, 0, 0, 0); print "ptrace=$r err=", $!+0, "\\n"'`,
    );
    expect(r.out).to.match(/rc=[1-9]/);
    expect(r.out).to.match(/ptrace=-1 err=1\b/); // EPERM
  });

  it('cannot mount, unshare or setns', async () => {
    const r = await sh(
      fx.rt,
      id,
      `mkdir -p /tmp/m; mount -t tmpfs x /tmp/m 2>&1; echo mount=$?; unshare -U true 2>&1; echo unshareU=$?; ` +
        `unshare -m true 2>&1; echo unshareM=$?; nsenter -t 1 -m true 2>&1; echo nsenter=$?; grep -c tmp/m /proc/mounts`,
    );
    expect(r.out).to.match(/mount=[1-9]/);
    expect(r.out).to.match(/unshareU=[1-9]/);
    expect(r.out).to.match(/unshareM=[1-9]/);
    expect(r.out).to.match(/nsenter=[1-9]/);
    expect(r.out.trim().split('\n').pop()).to.equal('0');
  });

  // A restore remounts the workspace from inside the sandbox's mount namespace, as root (the
  // fileops helper enters it, fileops-run.c remount_here). If the sandbox could move /work away
  // and put a symlink there, the new stack would land where the symlink points. It cannot: the
  // sandbox's / is read-only (rename, rmdir and symlink there give EROFS; /work is a mount point
  // besides, EBUSY) and the sandbox may not mount. Tried before and during a restore; the restore
  // puts the checkpoint's content at /work.
  it('cannot move, remove or replace /work, before or while a restore remounts it', async () => {
    const tries =
      'mv /work /w2 2>/dev/null && echo MOVED; rmdir /work 2>/dev/null && echo RMDIR; ' +
      'ln -s / /work 2>/dev/null && echo LINKED; [ -L /work ] && echo SYMLINK; ' +
      'mount --bind /tmp /work 2>/dev/null && echo BOUND';
    const first = await sh(fx.rt, id, `echo before > /work/race; ${tries}; mv /work /w2; echo mv=$?`);
    expect(first.out).to.not.match(/MOVED|RMDIR|LINKED|SYMLINK|BOUND/);
    expect(first.out).to.include('mv=1');
    expect(first.err).to.match(/Read-only file system|busy/i);
    await fx.rt.checkpoint(id, 'ck-esc-race');
    await sh(fx.rt, id, 'echo after > /work/race');
    // A loop of the same tries, running while the restore freezes, remounts and thaws.
    const racer = sh(fx.rt, id, `i=0; while [ $i -lt 300 ]; do ${tries}; i=$((i+1)); done; echo done`, 60_000);
    await fx.rt.restore(id, 'ck-esc-race');
    const raced = await racer;
    expect(raced.out).to.not.match(/MOVED|RMDIR|LINKED|SYMLINK|BOUND/);
    expect(raced.out.trim()).to.equal('done');
    const after = await sh(fx.rt, id, 'cat /work/race; [ -d /work ] && [ ! -L /work ] && echo dir; ls -d /w2 2>&1');
    expect(after.out).to.match(/^before\ndir\n/);
    expect(after.out).to.match(/No such file/);
    await fx.rt.deleteCheckpoint('ck-esc-race');
  });

  it('cannot load a kernel module or use bpf', async () => {
    const r = await sh(
      fx.rt,
      id,
      `perl -e 'open F, "<", "/dev/null"; $e = ""; $r = syscall(313, fileno(F), $e, 0); print "finit=$r err=", $!+0, "\\n"; ` +
        `$b = "x" x 64; $r = syscall(175, $b, 64, $e); print "init=$r err=", $!+0, "\\n"; $r = syscall(321, 0, 0, 0); print "bpf=$r err=", $!+0, "\\n"'`,
    );
    expect(r.out).to.match(/finit=-1 err=1\b/);
    expect(r.out).to.match(/init=-1 err=1\b/);
    expect(r.out).to.match(/bpf=-1 err=1\b/);
  });

  it('file operations refuse symlink and .. escapes', async () => {
    const tag = `procbox-escape-file-${process.pid}`;
    await sh(
      fx.rt,
      id,
      'ln -sfn /etc /work/abs; ln -sfn ../../../../.. /work/rel; ln -sfn /proc/1/root /work/proc; mkdir -p /work/d; ln -sfn ../../tmp /work/d/up',
    );
    const bad = [
      () => fx.rt.readFile(id, '/work/abs/passwd'),
      () => fx.rt.readFile(id, '/work/rel/etc/shadow'),
      () => fx.rt.readFile(id, '/work/../etc/passwd'),
      () => fx.rt.readFile(id, '/etc/passwd'),
      () => fx.rt.listFiles(id, '/work/proc'),
      () => fx.rt.writeFile(id, `/work/rel/tmp/${tag}`, Buffer.from('x')),
      () => fx.rt.writeFile(id, `/work/d/up/${tag}`, Buffer.from('x')),
      () => fx.rt.writeFile(id, `/work/abs/${tag}`, Buffer.from('x'), { mkdirs: true }),
      () => fx.rt.deleteFile(id, '/work/abs/hosts'),
      () => fx.rt.deleteFile(id, '/work'),
      () => fx.rt.deleteFile(id, '/'),
      () => fx.rt.readFile(id, 'work/x'),
      () => fx.rt.readFile(id, '/work/a\nb'),
    ];
    for (const f of bad) {
      const err = await f().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err, f.toString()).to.be.instanceOf(RuntimeError);
      expect((err as RuntimeError).code, f.toString()).to.be.oneOf(['InvalidPath', 'NotFound', 'NotADirectory']);
    }
    expect(existsSync(`/tmp/${tag}`)).to.equal(false);
    expect(existsSync(`/etc/${tag}`)).to.equal(false);
    // A symlink that stays inside the workspace is fine.
    await fx.rt.writeFile(id, '/work/d/real.txt', Buffer.from('inside'));
    await sh(fx.rt, id, 'ln -sfn d/real.txt /work/ok');
    expect((await fx.rt.readFile(id, '/work/ok')).toString()).to.equal('inside');
  });

  it('a fork bomb stops at the pids limit', async () => {
    const r = await sh(fx.rt, id, 'i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done', 30_000);
    expect(r.err).to.match(/Cannot fork|Resource temporarily unavailable/);
    const key = fx.rt.hostKey(id);
    const files = [
      `/sys/fs/cgroup/pids/fluxvm/${key}/pids.current`,
      `/sys/fs/cgroup/fluxvm/${key}/pids.current`,
    ].filter(existsSync);
    expect(files, 'a pids cgroup for the sandbox').to.not.be.empty;
    expect(Number(readFileSync(files[0]!, 'utf8'))).to.be.at.most(64);
    await sh(fx.rt, id, 'kill -9 -1; true');
  });

  it('allocating beyond the memory limit is killed and reported', async () => {
    const r = await fx.rt.exec(id, {
      argv: ['perl', '-e', '$x = "a" x (200 * 1024 * 1024); print length($x)'],
      timeoutMs: 30_000,
    });
    expect(r.exitCode).to.equal(137);
    expect(r.signal).to.equal('SIGKILL');
    expect(r.oomKilled).to.equal(true);
    const info = await fx.rt.inspect(id);
    expect(info.lastOomKillAt).to.be.a('string');
    expect(info.state).to.equal('running'); // the init survives
    expect((await sh(fx.rt, id, 'echo alive')).out).to.equal('alive\n');
  });
});
