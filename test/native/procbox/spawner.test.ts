// The standby spawner (native/procbox/spawner.ts, spawner.c): a create or fork gets its
// sandboxes' standby exec helpers without one process forked from the runtime's Node process per
// sandbox (a fork of Node costs milliseconds of CPU and blocks its event loop); the helpers are
// children of the one spawner, they run commands as before, and their sockets cannot be reached
// or hijacked: a sandbox has its own network namespace (abstract names are per namespace), a
// connection without a request's token is dropped, and the spawner starts only standbys.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { readdirSync, readFileSync } from 'node:fs';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { defaultHelperPath } from '../../../native/procbox/procbox.js';
import { drained, spawnStandby, startExec } from '../../../native/procbox/exec.js';
import { SpawnedHelper, Spawner } from '../../../native/procbox/spawner.js';
import { spawnerOf, STANDBY_PACE_MS, standbyStartAt } from '../../../native/procbox/standby.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { childrenOf, makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

const core = (fx: Fixture) => (fx.rt as unknown as { pb: ProcboxCore }).pb;

describe('procbox standby spawner', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
  });
  after(async () => fx?.cleanup());

  it('a fork of 8 children gets their 8 standbys with no process forked from the runtime per child; each runs its first command', async () => {
    await fx.rt.create({ id: 'sp-parent' });
    const pb = core(fx);
    await eventually(() => pb.standbys.has('sp-parent'), 10_000, 'the parent standby');
    const before = childrenOf(process.pid);
    const kids = Array.from({ length: 8 }, (_, i) => `sp-kid${i}`);
    await fx.rt.fork('sp-parent', kids);
    await eventually(() => kids.every((k) => pb.standbys.get(k)?.child.pid), 10_000, 'a standby for each child');
    const after = childrenOf(process.pid);
    // The processes this Node process forked: the same as before the fork (fileops server, spawner).
    expect(
      after.filter((p) => !before.includes(p)),
      'processes forked from the runtime by the fork',
    ).to.deep.equal([]);
    // This process may hold other runtimes' spawners too (the files before this one in a mocha
    // worker): this runtime's is the one all 8 standbys are children of.
    const standbyPids = kids.map((k) => pb.standbys.get(k)!.child.pid!);
    const spawner = after.find(
      (p) =>
        readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0')[1] === 'spawner' &&
        standbyPids.every((s) => childrenOf(p).includes(s)),
    );
    expect(spawner, 'a spawner of this process whose children are the 8 standbys').to.be.a('number');
    for (const k of kids) {
      const pid = pb.standbys.get(k)!.child.pid!;
      expect(childrenOf(spawner!), `standby of ${k} is the spawner's child`).to.include(pid);
      const r = await sh(fx.rt, k, 'echo hi-$(hostname); cat; exit 4');
      expect(r.code).to.equal(4);
      expect(r.out).to.equal('hi-sandbox\n');
      // The standby ran it: it is gone (reaped by the spawner), a new one comes after the command.
      await eventually(() => !childrenOf(spawner!).includes(pid), 5000, `standby ${pid} of ${k} used and reaped`);
    }
    for (const k of kids) await fx.rt.destroy(k);
    await fx.rt.destroy('sp-parent');
  });

  it("a sandbox cannot reach the spawner's socket; a connection without a request's token is dropped", async () => {
    await fx.rt.create({ id: 'sp-net' });
    const s = new Spawner(defaultHelperPath());
    try {
      const name = s.address.slice(1);
      // Abstract names belong to a network namespace: from the sandbox, nothing listens there.
      const py = `import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect('\\0'+${JSON.stringify(name)}.ljust(107,'\\0'))\n print('connected')\nexcept OSError as e:\n print('refused', e.errno)`;
      const r = await fx.rt.exec('sp-net', { argv: ['python3', '-c', py] });
      expect(r.stdout.toString().trim(), r.stderr.toString()).to.equal('refused 111');
      // From the host: a made-up token and garbage are closed without being paired with anything.
      for (const hello of [
        '0123456789abcdef0123456789abcdef 0\n',
        'x'.repeat(35),
        '../../etc/passwd 9\n' + 'A'.repeat(30),
      ]) {
        const c = net.connect(s.address);
        await new Promise<void>((resolve, reject) => {
          c.on('error', reject);
          c.on('close', () => resolve());
          c.write(hello);
        });
      }
    } finally {
      s.stop();
      await fx.rt.destroy('sp-net');
    }
  });

  it('the spawner starts standbys only: a command line, a relative path or a bad option is refused and nothing runs', async () => {
    const s = new Spawner(defaultHelperPath());
    try {
      const refused = async (args: string[]) => {
        const h: SpawnedHelper = s.spawnStandby(args);
        const err = await new Promise<Error>((resolve) => h.once('error', resolve));
        expect(err.message, args.join(' ')).to.match(/not a standby request/);
        expect(h.pid).to.equal(undefined);
      };
      await refused(['exec', '1', '/work', '/', '--', 'touch', '/tmp/x']);
      await refused(['exec', '1', 'work', '-']);
      await refused(['exec', '1', '/work', '-', '--tty', '24x80']);
      await refused(['exec', '1', '/work', '-', '--cg', 'rel/cgroup.procs']);
      await refused(['fileops']);
      expect(() => s.spawnStandby(['exec', '1', '/work\tx', '-'])).to.throw(/tab, newline or NUL/);
    } finally {
      s.stop();
    }
  });
  it('a command that takes a standby before its fds have connected (right after the spawn) runs in it', async () => {
    await fx.rt.create({ id: 'sp-early' });
    const pb = core(fx);
    const rec = pb.rec('sp-early');
    const t = pb.cgroups('sp-early').execTargets();
    const spec = {
      helper: pb.helper,
      pid: rec.pid!,
      workspacePath: rec.workspacePath,
      cwd: rec.workspacePath,
      cgroupProcs: t.v1Procs,
      cgroupDir: t.v2Dir,
      argv: ['sh', '-c', 'echo out; echo err >&2; cat; exit 5'],
      env: { PATH: '/usr/bin:/bin' },
    };
    const s = new Spawner(defaultHelperPath());
    try {
      const standby = spawnStandby(spec, rec.pidStart, s);
      expect(standby.child).to.be.instanceOf(SpawnedHelper);
      expect((standby.child as SpawnedHelper).connected, 'connected in the same tick').to.equal(false);
      const run = startExec(spec, standby);
      expect(run.usedStandby).to.equal(true);
      let out = '';
      let err = '';
      run.child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
      run.child.stderr!.on('data', (b: Buffer) => (err += b.toString()));
      run.child.stdin!.end('IN');
      const done = run.exit(20_000);
      await Promise.all([drained(run.child.stdout!, done), drained(run.child.stderr!, done)]);
      const r = await done;
      expect([r.exitCode, out, err]).to.deep.equal([5, 'out\nIN', 'err\n']);
      expect(childrenOf(process.pid).filter((p) => p === standby.child.pid)).to.deep.equal([]);
    } finally {
      s.stop();
      await fx.rt.destroy('sp-early');
    }
  });
  it('a helper that exits before this process accepted its sockets still reports its status line', async () => {
    const s = new Spawner(defaultHelperPath());
    try {
      // A pid that has exited: the standby's pidfd_open fails, it writes why on fd 3 and exits 1 at once.
      const dead = await new Promise<number>((resolve) => {
        const p = spawn('true');
        p.on('exit', () => resolve(p.pid!));
      });
      const spec = {
        helper: defaultHelperPath(),
        pid: dead,
        workspacePath: '/work',
        cwd: '/work',
        cgroupProcs: [],
        argv: ['true'],
        env: {},
      };
      const standby = spawnStandby(spec, undefined, s);
      // The event loop held: the helper runs and exits (and the spawner says so) before any socket is accepted.
      for (const until = Date.now() + 1500; Date.now() < until;);
      const run = startExec(spec, standby);
      expect(run.usedStandby).to.equal(true);
      const err = await run.exit(10_000).then(
        () => new Error('resolved'),
        (e: Error) => e,
      );
      expect(err.message).to.match(/pidfd_open/);
    } finally {
      s.stop();
    }
  });
  it("a fork's standbys start one after another, STANDBY_PACE_MS apart, not all at once", async () => {
    await fx.rt.create({ id: 'sp-pace' });
    const pb = core(fx);
    await eventually(() => pb.standbys.has('sp-pace'), 10_000, 'the parent standby');
    const s = spawnerOf(pb)!;
    // The plan: eight standbys booked at one moment start STANDBY_PACE_MS apart (timers never fire
    // early; on a loaded machine they may all fire late, so the plan is what is checked, on a
    // runtime of its own).
    const other = {} as ProcboxCore;
    const now = Date.now();
    const plan = Array.from({ length: 8 }, () => standbyStartAt(other, 0, now));
    expect(plan.map((at) => at - now)).to.deep.equal([0, 1, 2, 3, 4, 5, 6, 7].map((k) => k * STANDBY_PACE_MS));
    expect(standbyStartAt(other, 100, now) - now, 'a delay longer than the queue').to.equal(100);
    // And a fork's children get their standbys through it.
    const kids = Array.from({ length: 8 }, (_, i) => `sp-pace${i}`);
    const before = s.started;
    await fx.rt.fork('sp-pace', kids);
    await eventually(() => kids.every((k) => pb.standbys.get(k)?.child.pid), 10_000, 'a standby for each child');
    expect(s.started - before).to.equal(8);
    for (const k of kids) await fx.rt.destroy(k);
    await fx.rt.destroy('sp-pace');
  });
});
