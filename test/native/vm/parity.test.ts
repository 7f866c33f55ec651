// VM parity in real guests: a terminal on a pty that resizes (agent/pty.c), the
// session's confinement applied by the guest agent in every command's child, exec and job
// (agent/confine.c: read-only mounts + Landlock), and more than one vCPU (resources.cpu ->
// -smp). One confined VM serves the terminal and confinement cases; a second one has 2 vCPUs.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ExecStream } from '../../../native/runtime.js';
import { RuntimeError } from '../../../native/runtime.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { shmPrefix } from '../../../native/vm/state.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';

async function rejects(p: Promise<unknown>): Promise<RuntimeError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e, 'a RuntimeError').to.be.instanceOf(RuntimeError);
  return e as RuntimeError;
}

describe('native/vm parity: terminal, confinement in the guest, vCPUs (QEMU)', function () {
  this.timeout(900_000);
  let rt: VmRuntime;
  let stateDir: string;
  const sh = (script: string) => rt.exec('cf', { argv: ['sh', '-c', script], timeoutMs: 60_000 });

  before(async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-parity-'));
    rt = new VmRuntime({ stateDir, warmPool: 0 });
    await rt.start();
    await rt.create({
      id: 'cf',
      confinement: { readonlyWorkspace: true, writePaths: ['/work/out'], readPaths: ['/srv/ok'] },
    });
    // The host's own file operations are not confined (the agent itself is not).
    await rt.writeFile('cf', '/work/out/.keep', Buffer.from(''), { mkdirs: true });
    await rt.writeFile('cf', '/work/keep.txt', Buffer.from('data'));
    await rt.writeFile('cf', '/srv/ok/a', Buffer.from('readable'), { mkdirs: true });
    await rt.writeFile('cf', '/srv/secret/s', Buffer.from('secret'), { mkdirs: true });
  });
  after(async () => {
    if (!rt) return;
    for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
    await rt.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('runs a command on a terminal: a pty, raw bytes both ways, a resize the command sees (stty size)', async () => {
    const s: ExecStream = await rt.execStream('cf', {
      argv: ['sh', '-c', 'tty; stty size; read x; stty size; echo got-$x'],
      tty: { rows: 24, cols: 80 },
    });
    let out = '';
    s.stdout.on('data', (d: Buffer) => (out += d.toString('latin1')));
    await eventually(() => out.includes('24 80'), 60_000, `the first stty size (output so far ${JSON.stringify(out)})`);
    expect(s.resize, 'a tty exec can be resized').to.be.a('function');
    s.resize!({ rows: 40, cols: 100 });
    s.stdin.write('hi\x01there\n'); // a control byte goes through raw (echoed by the tty as ^A)
    const exit = await s.exit;
    expect(exit.exitCode).to.equal(0);
    expect(out).to.match(/\/dev\/pts\/\d+/);
    expect(out).to.include('40 100');
    expect(out).to.include('got-hi\x01there');
    // Window sizes at the edge: 65535 passes (busybox's stty shows sizes past 30000 as 80x24, so
    // the command only has to run), 65536 is refused before anything runs.
    const big = await rt.execStream('cf', {
      argv: ['sh', '-c', 'test -t 0 && echo on-a-tty'],
      tty: { rows: 65535, cols: 65535 },
    });
    let b = '';
    big.stdout.on('data', (d: Buffer) => (b += d.toString()));
    expect((await big.exit).exitCode).to.equal(0);
    expect(b.trim()).to.equal('on-a-tty');
    expect((await rejects(rt.execStream('cf', { argv: ['true'], tty: { rows: 65536, cols: 80 } }))).code).to.equal(
      'InvalidArgument',
    );
  });

  it("a terminal command's last output arrives before its exit, 20 times in a row; a background child holding the terminal does not hold the exit", async () => {
    // Two causes lost the whole output of such a command: the agent answered the exit before the
    // kernel moved the output to the pty's master (a quiet host; exec.c PTY_DRAIN_MS), and the
    // host resolved `exit` before a reader attached after `started` had the output, when the
    // frames came in one read (a loaded host; agent-channel.ts readOut, agent-protocol.test.ts).
    for (let i = 0; i < 20; i++) {
      const s = await rt.execStream('cf', { argv: ['sh', '-c', `echo line-${i}`], tty: { rows: 24, cols: 80 } });
      let o = '';
      s.stdout.on('data', (d: Buffer) => (o += d.toString()));
      expect((await s.exit).exitCode).to.equal(0);
      expect(o.trim(), `run ${i}`).to.equal(`line-${i}`);
    }
    const t0 = Date.now();
    const bg = await rt.execStream('cf', {
      argv: ['sh', '-c', 'sleep 30 & echo bg-started'],
      tty: { rows: 24, cols: 80 },
    });
    let o = '';
    bg.stdout.on('data', (d: Buffer) => (o += d.toString()));
    expect((await bg.exit).exitCode).to.equal(0);
    expect(o).to.include('bg-started');
    expect(Date.now() - t0, 'ms to the exit (the drain is bounded at 1 s)').to.be.below(15_000);
  });

  it('keeps the workspace read-only in the guest (EROFS/EACCES), a writePath writable, and the command cannot undo it', async () => {
    const w = await sh('echo x > /work/f');
    expect(w.exitCode, 'write to the read-only workspace').to.not.equal(0);
    expect(w.stderr.toString()).to.match(/Read-only file system|Permission denied/);
    const ok = await sh('echo y > /work/out/g');
    expect(ok.exitCode, ok.stderr.toString()).to.equal(0);
    expect((await rt.readFile('cf', '/work/out/g')).toString()).to.equal('y\n');
    // Ways around it, each refused: the disk's own mount, truncate(2) (not in Landlock ABI 2),
    // remounting or unmounting, the raw block devices.
    for (const attack of [
      'echo x > /run/disk/work/f2',
      'truncate -s 0 /work/keep.txt',
      'mount -o remount,rw /work && echo x > /work/f3',
      'umount -l /work && echo x > /work/f4',
      'for d in /dev/vd?; do exec 3>>$d || exit 1; done',
      'mknod /tmp/blk b 254 0 && exec 3>>/tmp/blk',
    ]) {
      const r = await sh(attack);
      expect(r.exitCode, `${attack}: ${r.stdout.toString()}${r.stderr.toString()}`).to.not.equal(0);
    }
    expect((await rt.readFile('cf', '/work/keep.txt')).toString()).to.equal('data');
    for (const p of ['/work/f', '/work/f2', '/work/f3', '/work/f4'])
      expect((await rejects(rt.stat('cf', p))).code, p).to.equal('NotFound');
  });

  it('holds a filesystem rule (reads only below readPaths) for exec and for a job', async () => {
    const r = await sh('cat /srv/ok/a; cat /srv/secret/s');
    expect(r.stdout.toString()).to.equal('readable');
    expect(r.stderr.toString()).to.match(/Permission denied/);
    await rt.startJob!('cf', { id: 'j1', argv: ['sh', '-c', 'cat /srv/ok/a; cat /srv/secret/s; echo z > /work/j'] });
    const j = await eventually(
      async () => {
        const x = await rt.job!('cf', 'j1');
        return x.state !== 'running' && x;
      },
      60_000,
      'the job to end',
    );
    expect(j.exitCode).to.not.equal(0);
    const out = await rt.readJob!('cf', 'j1', { stream: 'stdout', offset: 0, maxBytes: 4096 });
    const err = await rt.readJob!('cf', 'j1', { stream: 'stderr', offset: 0, maxBytes: 4096 });
    expect(out.data.toString()).to.equal('readable');
    expect(err.data.toString()).to.match(/secret\/s'?: Permission denied/);
    expect(err.data.toString()).to.match(/\/work\/j: (Read-only file system|Permission denied)/);
    expect((await rejects(rt.stat('cf', '/work/j'))).code).to.equal('NotFound');
  });

  it('says what holds (pty, per-path confinement, the Landlock ABI) and refuses an exec allow-list at create', async () => {
    const c = rt.capabilities();
    expect(c.pty).to.equal(true);
    expect(c.confinement).to.deep.equal({ execAllowlist: false, paths: true });
    expect(c.landlockAbi, 'the guest kernel offers Landlock').to.be.at.least(1);
    expect(c.limits.cpu).to.equal(true);
    const e = await rejects(rt.create({ id: 'ea', confinement: { execAllow: ['ls'] } }));
    expect(e.code).to.equal('Unsupported');
    expect(e.message).to.match(/exec allow-list/);
    expect((await rt.list()).map((s) => s.id)).to.not.include('ea');
  });

  it('gives a VM 2 vCPUs for resources.cpu 2000m (nproc 2) and refuses more than the host has', async () => {
    const one = await rt.ensureTemplate(); // booted for 'cf'
    await rt.create({ id: 'smp', resources: { cpuMillis: 1500 } });
    const n = await rt.exec('smp', { argv: ['nproc'] });
    expect(n.stdout.toString().trim()).to.equal('2');
    const two = await rt.ensureTemplate(undefined, 2);
    // Each booted with its RAM in /dev/shm (template.ts), copied out once QEMU was done.
    const mine = readdirSync(existsSync('/dev/shm') ? '/dev/shm' : tmpdir()).filter((f) =>
      f.startsWith(shmPrefix(stateDir)),
    );
    expect(mine, 'RAM files two template boots left in /dev/shm').to.deep.equal([]);
    for (const t of [one, two]) expect(statSync(t.ram).size, t.ram).to.be.above(0);
    console.log(
      `      template cold boot (TCG): 1 vCPU ${Math.round(one.bootMs)} ms, 2 vCPUs ${Math.round(two.bootMs)} ms`,
    );
    const cores = availableParallelism();
    const e = await rejects(rt.create({ id: 'big', resources: { cpuMillis: cores * 1000 + 1 } }));
    expect(e.code).to.equal('InvalidArgument');
    expect(e.message).to.match(/resources\.cpu/);
    expect((await rt.list()).map((s) => s.id)).to.not.include('big');
  });
});
