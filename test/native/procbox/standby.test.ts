// Standby exec helpers (native/procbox/standby.ts): after a create and after each command a
// `procbox exec PID WS -` waits, joined to the sandbox's cgroups, for the next command's
// request on its stdin. The command then runs exactly as with a freshly spawned helper (argv,
// env, stdin, cwd, exit codes); a standby that died is never used, one ends with its init;
// none outlives its sandbox or the runtime; a bad request runs nothing.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { execCounts } from '../../../native/procbox/exec.js';
import { defaultHelperPath } from '../../../native/procbox/procbox.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../runtime/controller/env.js';
import { gone, makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

/** The standby helpers waiting for the init `initPid` (their command line: exec PID WS -). */
function standbys(initPid: number): number[] {
  const out: number[] = [];
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const argv = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
      if (argv[1] === 'exec' && argv[2] === String(initPid) && argv[4] === '-' && !gone(Number(d))) out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** The one standby of `initPid`, once it is there. */
async function oneStandby(initPid: number, not?: number): Promise<number> {
  let pid = 0;
  await eventually(
    () => {
      const s = standbys(initPid).filter((p) => p !== not);
      pid = s[0] ?? 0;
      return s.length === 1;
    },
    10_000,
    `one standby exec helper of init ${initPid}`,
  );
  return pid;
}

/** The exec helper (`procbox exec ...`) whose child runs `sh -c script`. */
function helperOf(script: string): number {
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const argv = readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
      if (argv[0] !== 'sh' || argv[1] !== '-c' || argv[2] !== script) continue;
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (readFileSync(`/proc/${ppid}/cmdline`, 'utf8').split('\0')[1] === 'exec') return ppid;
    } catch {
      // gone meanwhile
    }
  }
  throw new Error(`no exec helper runs sh -c ${JSON.stringify(script)}`);
}

/** The v1 cgroups (controller -> path) of a process, from /proc/PID/cgroup. */
function v1Cgroups(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of readFileSync(`/proc/${pid}/cgroup`, 'utf8').trim().split('\n')) {
    const [, ctl, path] = line.split(':');
    if (ctl) out[ctl] = path!;
  }
  return out;
}

describe('procbox standby exec helpers', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
  });
  after(async () => {
    await fx?.cleanup();
  });

  it('a created sandbox gets one, in its cgroups; the next command uses it and a new one waits', async () => {
    const info = await fx.rt.create({ id: 'sb1', resources: { memoryBytes: 128 << 20, pids: 64 } });
    const first = await oneStandby(info.pid!);
    // It is visible from its spawn on, and joins the cgroups right after (it tells nobody when):
    // it must end up in the init's memory and pids cgroups while it waits.
    const init = v1Cgroups(info.pid!);
    const joined = () =>
      ['memory', 'pids'].filter((ctl) => init[ctl] !== undefined && v1Cgroups(first)[ctl] !== init[ctl]);
    await eventually(
      () => joined().length === 0,
      10_000,
      `the standby to join the init's cgroups (not yet: ${joined().join(', ')})`,
    );
    for (const ctl of ['memory', 'pids'])
      if (init[ctl] !== undefined) expect(v1Cgroups(first)[ctl], ctl).to.equal(init[ctl]);
    // argv with an empty and a spaced argument, env, stdin, cwd and the exit code all reach the command.
    const r = await fx.rt.exec('sb1', {
      argv: ['sh', '-c', 'printf "%s|" "$FOO" "$@"; cat; pwd; exit 3', 'sh', 'a b', ''],
      env: { FOO: 'x=y' },
      stdin: Buffer.from('IN'),
      cwd: '/tmp',
    });
    expect({ code: r.exitCode, out: r.stdout.toString() }).to.deep.equal({ code: 3, out: 'x=y|a b||IN/tmp\n' });
    // The answer comes with its status line; the helper exits right after it.
    await eventually(() => gone(first), 5000, 'the standby that ran the command to exit');
    const second = await oneStandby(info.pid!, first);
    expect(second).to.not.equal(first);
    // A program that cannot start: 127 and the helper's reason, as without a standby.
    const bad = await fx.rt.exec('sb1', { argv: ['nosuchcmd'] });
    expect({ code: bad.exitCode, err: bad.stderr.toString() }).to.deep.equal({
      code: 127,
      err: 'procbox: exec nosuchcmd: No such file or directory\n',
    });
    await eventually(() => gone(second), 5000, 'the standby that ran nosuchcmd to exit');
  });

  it("while a command runs its helper holds none of the command's stdio (the output ends with the command)", async () => {
    const info = await fx.rt.inspect('sb1');
    await oneStandby(info.pid!);
    const script = 'echo started; read x; echo "got $x"';
    const s = await fx.rt.execStream('sb1', { argv: ['sh', '-c', script] });
    let out = '';
    s.stdout.on('data', (b: Buffer) => (out += b.toString()));
    s.stderr.resume();
    await eventually(() => out === 'started\n', 10_000, `the command to start (output so far ${JSON.stringify(out)})`);
    // The helper is the command's parent: usually the standby, but one taken before the runtime had
    // connected to it is replaced by a fresh helper (a race under load), and the property is the same.
    const helper = helperOf(script);
    // The command can print before its helper has read the start report and closed its copies
    // (the command may get the CPU first): wait for that, bounded. A helper that kept them
    // would fail the wait.
    const fds = () => readdirSync(`/proc/${helper}/fd`).map(Number);
    const stdio = () => fds().filter((n) => n <= 2);
    await eventually(
      () => stdio().length === 0,
      5000,
      "the helper to close its copies of the command's stdin, stdout and stderr",
    );
    expect(fds(), "the helper's status fd").to.include(3);
    s.stdin.end('in\n');
    expect(await s.exit).to.include({ exitCode: 0 });
    expect(out).to.equal('started\ngot in\n');
  });

  it('commands back to back (before the next standby is up) get their helpers from the spawner, not a fork of Node', async () => {
    const n0 = execCounts.nodeSpawns;
    const r = await Promise.all([sh(fx.rt, 'sb1', 'echo a'), sh(fx.rt, 'sb1', 'echo b')]);
    expect(r.map((x) => x.out)).to.deep.equal(['a\n', 'b\n']);
    for (let i = 0; i < 4; i++) expect(await sh(fx.rt, 'sb1', `echo ${i}`)).to.include({ code: 0, out: `${i}\n` });
    expect(execCounts.nodeSpawns - n0, 'helpers spawned by forking this process').to.equal(0);
  });

  it('a standby that died (say OOM-killed) is not used: the command spawns its helper and runs', async () => {
    const info = await fx.rt.inspect('sb1');
    const s = await oneStandby(info.pid!);
    process.kill(s, 'SIGKILL');
    await eventually(() => gone(s), 5000, 'the killed standby to be gone');
    const r = await sh(fx.rt, 'sb1', 'echo ok');
    expect(r).to.include({ code: 0, out: 'ok\n' });
    await oneStandby(info.pid!, s);
  });

  it('a standby ends with its init (it would pin the cgroups); the command runs in the restarted init', async () => {
    const before = await fx.rt.inspect('sb1');
    expect((await sh(fx.rt, 'sb1', 'echo here > /tmp/mark && echo hi > /work/kept')).code).to.equal(0);
    const old = await oneStandby(before.pid!);
    process.kill(before.pid!, 'SIGKILL');
    await eventually(() => gone(before.pid!), 5000, 'the init to be gone');
    await eventually(() => gone(old), 5000, 'the standby of the dead init to end by itself');
    const r = await sh(fx.rt, 'sb1', 'cat /work/kept; test -e /tmp/mark && echo old-tmp || echo new-tmp');
    expect(r).to.include({ code: 0, out: 'hi\nnew-tmp\n' });
    const after = await fx.rt.inspect('sb1');
    expect(after.pid).to.not.equal(before.pid);
    expect(standbys(before.pid!), 'no standby of the dead init is left').to.deep.equal([]);
    expect(gone(old)).to.equal(true);
    await oneStandby(after.pid!);
  });

  it('destroy ends the sandbox standby, close ends them all', async () => {
    const a = await fx.rt.create({ id: 'sb2' });
    const sa = await oneStandby(a.pid!);
    await fx.rt.destroy('sb2');
    expect(gone(sa)).to.equal(true);
    const b = await fx.rt.inspect('sb1');
    const sb = await oneStandby(b.pid!);
    await fx.rt.close();
    await eventually(() => gone(sb), 5000, 'the standby to end with close');
    await fx.rt.start();
  });

  it('a bad request runs nothing: the standby answers an error status and exits 2', async () => {
    const info = await fx.rt.inspect('sb1');
    const ask = (req: string) =>
      new Promise<{ code: number | null; status: string; out: string }>((resolve) => {
        const c = spawn(defaultHelperPath(), ['exec', String(info.pid), '/work', '-'], {
          env: {},
          stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
        });
        let status = '';
        let out = '';
        (c.stdio[3] as NodeJS.ReadableStream).on('data', (b: Buffer) => (status += b.toString()));
        c.stdout!.on('data', (b: Buffer) => (out += b.toString()));
        c.on('close', (code) => resolve({ code, status: status.trim(), out }));
        c.stdin!.end(req);
      });
    const body = (xs: string[]) => xs.map((x) => x + '\0').join('');
    expect(await ask('garbage\n')).to.deep.include({ code: 2, status: 'error standby: bad request header' });
    expect(await ask('')).to.deep.include({ code: 2, status: 'error standby: no request' });
    const short = body(['/work', '--', 'echo', 'ran']);
    expect(await ask(`4 0 ${short.length + 10}\n${short}`)).to.deep.include({
      code: 2,
      status: 'error standby: short request',
    });
    expect(await ask(`5 0 ${short.length}\n${short}`)).to.deep.include({
      code: 2,
      status: 'error standby: request shorter than its header says',
    });
    // Joining other cgroups is not the request's to ask: they were fixed when the standby started.
    const cg = body(['/work', '--cg', '/sys/fs/cgroup/pids/cgroup.procs', '--', 'echo', 'ran']);
    expect(await ask(`6 0 ${cg.length}\n${cg}`)).to.deep.include({
      code: 2,
      status: 'error exec: --cg is not taken by a standby request',
      out: '',
    });
    const ok = body(['/work', '--', 'echo', 'ran']);
    expect(await ask(`4 0 ${ok.length}\n${ok}`)).to.deep.equal({ code: 0, status: 'exit 0', out: 'ran\n' });
  });
});

describe('procbox standby exec helpers of warm pool inits', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime({ warmPool: 1 });
  });
  after(async () => {
    await fx?.cleanup();
  });

  it('a pool init comes with its standby; the sandbox that takes it runs its first command there, in its workspace', async () => {
    // The pool init: the init whose cgroup is this runtime's pool-<name> one.
    const scope = fx.rt.hostKey('x').split('.')[0];
    const inits = readdirSync('/proc')
      .filter((d) => /^\d+$/.test(d) && !gone(Number(d)))
      .filter((d) => {
        try {
          return (
            readFileSync(`/proc/${d}/comm`, 'utf8').trim() === 'procbox-init' &&
            readFileSync(`/proc/${d}/cgroup`, 'utf8').includes(`/fluxvm/${scope}.pool-`)
          );
        } catch {
          return false;
        }
      });
    expect(inits).to.have.length(1);
    const initPid = Number(inits[0]);
    const s = await oneStandby(initPid);
    const info = await fx.rt.create({ id: 'warm', hostname: 'sandbox', resources: { pids: 50 } });
    expect(info.pid, 'the pool init was taken').to.equal(initPid);
    const r = await sh(
      fx.rt,
      'warm',
      'echo hi > /work/f && cat /work/f && hostname && cat /sys/fs/cgroup/pids.max 2>/dev/null; true',
    );
    expect(r.code).to.equal(0);
    expect(r.out.split('\n').slice(0, 2)).to.deep.equal(['hi', 'sandbox']);
    await eventually(() => gone(s), 5000, 'the pool standby that ran the first command to exit');
    // The next standby is visible from its spawn on and joins the init's pids cgroup right after.
    const next = await oneStandby(initPid, s);
    await eventually(
      () => v1Cgroups(next).pids === v1Cgroups(initPid).pids,
      10_000,
      `the next standby to join the init's pids cgroup (is in ${v1Cgroups(next).pids})`,
    );
    expect(readFileSync(`/sys/fs/cgroup/pids${v1Cgroups(initPid).pids}/pids.max`, 'utf8').trim()).to.equal('50');
  });
});
