// Lifecycle of procbox sandboxes: idempotent create, pause/resume by the freezer, adoption
// after a restart of the runtime (live init kept, dead init restarted with the workspace),
// and destroy leaving nothing on the host.
import { expect } from 'chai';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import { detectCgroups, SandboxCgroups } from '../../../native/procbox/cgroups.js';
import { vethName } from '../../../native/procbox/network.js';
import { gone, makeRuntime, rejects, sh, skipReason, type Fixture } from './fixture.js';

const CGROUP_ROOTS = ['memory', 'pids', 'cpu', 'freezer', 'unified', ''].map((c) =>
  join('/sys/fs/cgroup', c, 'fluxvm'),
);

describe('procbox lifecycle', function () {
  this.timeout(60_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
  });
  after(async () => fx?.cleanup());

  it('create is idempotent by id and validates its input', async () => {
    const a = await fx.rt.create({ id: 'lc1' });
    const b = await fx.rt.create({ id: 'lc1' });
    expect(b.pid).to.equal(a.pid);
    expect((await rejects(fx.rt.create({ id: '../x' }))).code).to.equal('InvalidArgument');
    expect((await rejects(fx.rt.create({ id: 'bad-ws', workspacePath: '/usr' }))).code).to.equal('InvalidPath');
    expect((await rejects(fx.rt.create({ id: 'bad-net', network: { mode: 'allowList' } }))).code).to.equal(
      'Unsupported',
    );
    expect((await rejects(fx.rt.inspect('nope'))).code).to.equal('NotFound');
    expect((await rejects(fx.rt.exec('nope', { argv: ['true'] }))).code).to.equal('NotFound');
    const caps = fx.rt.capabilities();
    expect(caps).to.include({
      backend: 'procbox',
      memoryCheckpoint: false,
      diskCheckpoint: true,
      layeredWorkspace: true,
    });
    expect(await fx.rt.list()).to.have.length(1);
  });

  it('pause freezes every process; exec is refused until resume', async () => {
    await sh(fx.rt, 'lc1', 'sleep 300 >/dev/null 2>&1 &');
    await fx.rt.pause('lc1');
    expect((await fx.rt.inspect('lc1')).state).to.equal('paused');
    const key = fx.rt.hostKey('lc1');
    const fz = [`/sys/fs/cgroup/freezer/fluxvm/${key}/freezer.state`].filter(existsSync);
    if (fz.length) expect(readFileSync(fz[0]!, 'utf8').trim()).to.equal('FROZEN');
    const ev = [
      `/sys/fs/cgroup/unified/fluxvm/${key}/cgroup.events`,
      `/sys/fs/cgroup/fluxvm/${key}/cgroup.events`,
    ].filter(existsSync);
    if (ev.length) expect(readFileSync(ev[0]!, 'utf8')).to.include('frozen 1');
    expect(fz.length + ev.length, 'a freezer for the sandbox').to.be.greaterThan(0);
    expect((await rejects(fx.rt.exec('lc1', { argv: ['true'] }))).code).to.equal('Conflict');
    await fx.rt.resume('lc1');
    expect((await fx.rt.inspect('lc1')).state).to.equal('running');
    expect((await sh(fx.rt, 'lc1', 'pgrep -c sleep')).out).to.equal('1\n');
  });

  it('a new runtime adopts a live sandbox and restarts a dead one with its workspace', async () => {
    await sh(fx.rt, 'lc1', 'echo kept > /work/kept');
    await fx.rt.create({ id: 'lc2' });
    await sh(fx.rt, 'lc2', 'mkdir /work/d && echo survives > /work/d/f');
    await fx.rt.checkpoint('lc2', 'lc2-ck');
    await sh(fx.rt, 'lc2', 'echo upper-too > /work/u');
    const live = await fx.rt.inspect('lc1');
    const dead = await fx.rt.inspect('lc2');
    process.kill(dead.pid!, 'SIGKILL');
    await eventually(() => gone(dead.pid!), 10_000, `init ${dead.pid} to be gone after SIGKILL`);

    const rt2 = new ProcboxRuntime({ stateDir: fx.stateDir });
    await rt2.start();
    const a = await rt2.inspect('lc1');
    expect(a).to.include({ state: 'running', pid: live.pid });
    expect(a.restarted).to.equal(undefined);
    expect((await sh(rt2, 'lc1', 'pgrep -c sleep; cat /work/kept')).out).to.equal('1\nkept\n');
    const b = await rt2.inspect('lc2');
    expect(b.state).to.equal('running');
    expect(b.restarted).to.equal(true);
    expect(b.pid).to.not.equal(dead.pid);
    expect((await sh(rt2, 'lc2', 'cat /work/d/f /work/u')).out).to.equal('survives\nupper-too\n');
    await rt2.restore('lc2', 'lc2-ck');
    expect((await sh(rt2, 'lc2', 'ls /work')).out).to.equal('d\n');
    // Hand the sandboxes back to the fixture's runtime (it adopts them the same way).
    await rt2.close();
    fx.rt = new ProcboxRuntime({ stateDir: fx.stateDir });
    await fx.rt.start();
  });

  it('a warm pool serves create and fork; close ends the pool inits', async () => {
    const wp = await makeRuntime({ warmPool: 3 });
    const poolDir = join(wp.stateDir, 'procbox', 'pool');
    const poolPids = () => readdirSync(poolDir).length;
    try {
      expect(poolPids()).to.equal(3);
      await wp.rt.create({ id: 'wa' });
      const f = await wp.rt.fork('wa', ['wb', 'wc']);
      expect(f.children.every((c) => c.state === 'running')).to.equal(true);
      for (const id of ['wa', 'wb', 'wc'])
        expect((await sh(wp.rt, id, 'hostname; ls /work | wc -l')).out, id).to.equal('sandbox\n0\n');
      await sh(wp.rt, 'wb', 'echo only-b > /work/b');
      expect((await sh(wp.rt, 'wc', 'ls /work')).out).to.equal('');
      expect(poolPids()).to.be.at.most(3);
    } finally {
      await wp.cleanup();
    }
    expect(existsSync(poolDir)).to.equal(false);
  });

  it('removing a state directory without destroy still ends its sandboxes (init lifeline); an init holds no inotify instance (root has 128 on the host)', async () => {
    const other = await makeRuntime();
    const info = await other.rt.create({ id: 'orphan' });
    await sh(other.rt, 'orphan', 'sleep 300 >/dev/null 2>&1 &');
    const fds = readdirSync(`/proc/${info.pid}/fd`).map((fd) => {
      try {
        return readlinkSync(`/proc/${info.pid}/fd/${fd}`);
      } catch {
        return '';
      }
    });
    expect(
      fds.filter((l) => l.includes('inotify')),
      'inotify instances held by the init',
    ).to.deep.equal([]);
    rmSync(other.stateDir, { recursive: true, force: true });
    // The init checks its directory every second.
    await eventually(() => gone(info.pid!), 10_000, `the orphan init ${info.pid} to exit once its directory is gone`);
    await new SandboxCgroups(detectCgroups(), other.rt.hostKey('orphan')).destroy(); // the empty cgroups stay: drop them
  });

  it('destroy leaves no process, mount, cgroup, veth, rule or directory', async () => {
    const info = await fx.rt.create({
      id: 'lc3',
      network: { mode: 'open' },
      resources: { memoryBytes: 128 << 20, pids: 100, cpuMillis: 500 },
    });
    await sh(fx.rt, 'lc3', 'sleep 300 >/dev/null 2>&1 & echo x > /work/x');
    await fx.rt.fork('lc3', ['lc3-child']);
    const kids = readFileSync(`/sys/fs/cgroup/pids/fluxvm/${fx.rt.hostKey('lc3')}/cgroup.procs`, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map(Number);
    expect(kids.length).to.be.greaterThan(1);
    for (const id of ['lc3-child', 'lc3', 'lc1', 'lc2']) await fx.rt.destroy(id);
    await fx.rt.deleteCheckpoint('lc2-ck');
    await fx.rt.destroy('lc3'); // again: idempotent
    for (const p of [info.pid!, ...kids]) expect(gone(p), `pid ${p}`).to.equal(true);
    expect(readFileSync('/proc/self/mounts', 'utf8')).to.not.include(fx.stateDir);
    for (const root of CGROUP_ROOTS) {
      if (!existsSync(root)) continue;
      expect(
        readdirSync(root).filter((n) => n.startsWith(fx.rt.hostKey('lc'))),
        root,
      ).to.deep.equal([]);
    }
    const links = execFileSync('ip', ['-o', 'link']).toString();
    for (const id of ['lc3', 'lc3-child']) expect(links).to.not.include(vethName(fx.rt.hostKey(id)));
    const rules =
      execFileSync('iptables', ['-S']).toString() + execFileSync('iptables', ['-t', 'nat', '-S']).toString();
    expect(rules).to.not.include(`fluxvm:${fx.rt.hostKey('lc3')}`);
    expect(rules).to.not.include(`fluxvm:${fx.rt.hostKey('lc3-child')}`);
    const base = join(fx.stateDir, 'procbox');
    expect(readdirSync(join(base, 'sandboxes'))).to.deep.equal([]);
    expect(readdirSync(join(base, 'layers'))).to.deep.equal([]);
    expect(readdirSync(join(base, 'checkpoints'))).to.deep.equal([]);
    expect(await fx.rt.list()).to.deep.equal([]);
  });
});
