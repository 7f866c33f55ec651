// The VM backend against real QEMU guests (TCG on these hosts). One runtime and one golden
// template (one cold boot) for the whole file; every VM is created from the template.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { RuntimeError } from '../../../native/runtime.js';
import { ensureSocketDir, MAX_SOCKET_DIR, QEMU_SANDBOX, socketDirFor } from '../../../native/vm/qemu.js';
import { skipWith } from '../../skip.js';
import { qemuPids } from '../../support/qemu.js';
import { eventually } from '../../support/wait.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { manifest as workspaceManifest } from '../../../native/workspace/manifest.js';

const HAVE_QEMU =
  spawnSync('qemu-system-x86_64', ['--version']).status === 0 && spawnSync('qemu-img', ['--version']).status === 0;

/** Waits until the COUNTER loop's /tmp/counter in `id` is above `n`; its value. */
const counterAbove = (rt: VmRuntime, id: string, n: number): Promise<number> =>
  eventually(
    async () => {
      const v = Number((await rt.readFile(id, '/tmp/counter').catch(() => Buffer.from(''))).toString());
      return v > n ? v : undefined;
    },
    60_000,
    `the counter of ${id} above ${n}`,
  );

async function rejects(p: Promise<unknown>, code: string): Promise<void> {
  try {
    await p;
  } catch (e) {
    expect(e).to.be.instanceOf(RuntimeError);
    expect((e as RuntimeError).code, (e as Error).message).to.equal(code);
    return;
  }
  throw new Error(`expected a ${code} error`);
}

/** Running, not a zombie left for the host's init to reap. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

function filesBelow(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    out.push(p);
    if (e.isDirectory()) out.push(...filesBelow(p));
  }
  return out;
}

// A counter that updates a file atomically every 200 ms, started in the background.
const COUNTER = [
  'sh',
  '-c',
  '(i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; mv /tmp/c.tmp /tmp/counter; sleep 0.2; done) > /dev/null 2>&1 &',
];

describe('native/vm VM runtime (QEMU)', function () {
  this.timeout(120_000);
  let rt: VmRuntime;
  let stateDir: string;

  before(async function () {
    if (!HAVE_QEMU) {
      console.log('    skipped: qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
      this.skip();
    }
    this.timeout(600_000);
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmtest-'));
    rt = new VmRuntime({ stateDir });
    await rt.start();
    const t0 = Date.now();
    await rt.ensureTemplate();
    console.log(
      `    (template cold boot ${rt.timings.coldBootMs?.toFixed(0)} ms, ${Date.now() - t0} ms with the image check)`,
    );
  });

  after(async () => {
    if (!rt) return;
    for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
    await rt.close();
    for (const pid of qemuPids(stateDir)) process.kill(pid, 'SIGKILL');
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('reports its accelerator and what it supports', () => {
    const c = rt.capabilities();
    expect(c.backend).to.equal('vm');
    expect(['kvm', 'tcg']).to.include(c.accelerator);
    expect(c.isolation).to.equal(c.accelerator);
    if (!existsSync('/sys/module/kvm_intel') && !existsSync('/sys/module/kvm_amd'))
      expect(c.accelerator).to.equal('tcg');
    expect(c).to.include({ exec: true, memoryCheckpoint: true, diskCheckpoint: true, fork: true, pause: true });
  });

  describe('a VM sandbox', () => {
    before(async () => {
      await rt.create({ id: 'vm-a', env: { SANDBOX: 'a' } });
    });

    it('boots from the template and runs commands with output and exit codes', async () => {
      const info = await rt.inspect('vm-a');
      expect(info.state).to.equal('running');
      expect(qemuPids(stateDir)).to.include(info.pid);
      const r = await rt.exec('vm-a', { argv: ['sh', '-c', 'echo out-$SANDBOX; echo err >&2; pwd; exit 7'] });
      expect(r).to.include({ exitCode: 7, timedOut: false });
      expect(r.stdout.toString()).to.equal('out-a\n/work\n');
      expect(r.stderr.toString()).to.equal('err\n');
      const t = await rt.exec('vm-a', { argv: ['sleep', '20'], timeoutMs: 300 });
      expect(t.timedOut).to.equal(true);
      expect((await rt.exec('vm-a', { argv: ['hostname'] })).stdout.toString()).to.equal('vm-a\n');
      const clock = Number((await rt.exec('vm-a', { argv: ['date', '+%s'] })).stdout.toString());
      expect(clock * 1000).to.be.closeTo(Date.now(), 5000);
      expect((await rt.create({ id: 'vm-a' })).pid, 'create is idempotent').to.equal(info.pid);
    });

    it('runs QEMU under -sandbox as the unprivileged QEMU user, which reaches only its own files', async function () {
      const pid = (await rt.inspect('vm-a')).pid!;
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
      expect(cmd[cmd.indexOf('-sandbox') + 1]).to.equal(QEMU_SANDBOX);
      expect(QEMU_SANDBOX).to.equal('on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny');
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const field = (k: string) => new RegExp(`^${k}:\\s*(.*)$`, 'm').exec(status)![1]!.trim();
      expect(field('Seccomp'), 'seccomp filter mode').to.equal('2');
      expect(field('NoNewPrivs')).to.equal('1');
      expect(field('CapEff')).to.equal('0000000000000000');
      expect(
        cmd.some((a) => a.includes(stateDir)),
        'no state-directory path on the command line (QEMU runs in it, relative paths)',
      ).to.equal(false);
      skipWith(
        this,
        process.getuid?.() === 0 ? undefined : 'not root: QEMU runs as this user, there is no QEMU user to check',
      );
      const u = rt.qemuUser!;
      expect(u.uid).to.not.equal(0);
      expect(field('Uid').split(/\s+/).map(Number)).to.deep.equal([u.uid, u.uid, u.uid, u.uid]);
      expect(field('Gid').split(/\s+/).map(Number)).to.deep.equal([u.gid, u.gid, u.gid, u.gid]);
      // What that user can do from QEMU's working directory: its overlay yes; listing the
      // state, reading the VM metadata or a saved machine state no.
      const disk = JSON.parse(readFileSync(join(stateDir, 'vms', 'vm-a', 'vm.json'), 'utf8')).disk as string;
      const asQemu = (sh: string) =>
        spawnSync('setpriv', [`--reuid=${u.uid}`, `--regid=${u.gid}`, '--clear-groups', '--', 'sh', '-c', sh], {
          cwd: stateDir,
          encoding: 'utf8',
        }).status;
      expect(asQemu(`test -w ${relative(stateDir, disk)}`), 'its own overlay is writable').to.equal(0);
      expect(asQemu('ls . >/dev/null 2>&1'), 'the state directory cannot be listed').to.not.equal(0);
      expect(asQemu('ls overlays >/dev/null 2>&1'), 'overlays/ cannot be listed').to.not.equal(0);
      expect(asQemu('cat vms/vm-a/vm.json >/dev/null 2>&1'), 'VM metadata is out of reach').to.not.equal(0);
      const tpl = readdirSync(join(stateDir, 'templates'))[0]!;
      expect(asQemu(`cat templates/${tpl}/state >/dev/null 2>&1`), 'saved device state is out of reach').to.not.equal(
        0,
      );
      expect(asQemu(`test -w templates/${tpl}/disk.qcow2`), 'the template disk is read-only to QEMU').to.not.equal(0);
      expect(
        asQemu(`cat ${join(stateDir, 'vms', 'vm-a', 'vm.json')} >/dev/null 2>&1`),
        'nor by absolute path',
      ).to.not.equal(0);
    });

    it('streams a command with stdin', async () => {
      const s = await rt.execStream('vm-a', { argv: ['sh', '-c', 'read x; echo got-$x'] });
      let out = '';
      s.stdout.on('data', (d: Buffer) => (out += d.toString()));
      s.stdin.end('hi\n');
      expect((await s.exit).exitCode).to.equal(0);
      expect(out).to.equal('got-hi\n');
    });

    it('writes files that read back byte-identical, lists, stats and deletes them', async () => {
      const data = randomBytes(5 * 1024 * 1024 + 17);
      await rt.writeFile('vm-a', '/work/dir/data.bin', data, { mkdirs: true, mode: 0o600 });
      expect((await rt.readFile('vm-a', '/work/dir/data.bin')).equals(data)).to.equal(true);
      const sum = (await rt.exec('vm-a', { argv: ['sha256sum', '/work/dir/data.bin'] })).stdout
        .toString()
        .split(' ')[0];
      const { createHash } = await import('node:crypto');
      expect(sum).to.equal(createHash('sha256').update(data).digest('hex'));
      expect(await rt.stat('vm-a', '/work/dir/data.bin')).to.include({ type: 'file', size: data.length, mode: 0o600 });
      expect((await rt.listFiles('vm-a', '/work/dir')).map((e) => e.name)).to.deep.equal(['data.bin']);
      await rt.deleteFile('vm-a', '/work/dir', { recursive: true });
      await rejects(rt.stat('vm-a', '/work/dir'), 'NotFound');
      await rejects(rt.readFile('vm-a', 'work/x'), 'InvalidPath');
    });

    it('takes a manifest with the workspace rules: equal to the host walk of the same tree', async () => {
      const host = mkdtempSync(join(tmpdir(), 'fluxvm-vmtree-'));
      try {
        mkdirSync(join(host, 'src/deep'), { recursive: true });
        mkdirSync(join(host, 'empty'));
        writeFileSync(join(host, 'README'), 'hello\n');
        writeFileSync(join(host, 'src/main.py'), 'print(1)\n', { mode: 0o755 });
        writeFileSync(join(host, 'src/deep/blob'), randomBytes(100_000));
        writeFileSync(join(host, 'name with space'), '');
        symlinkSync('README', join(host, 'link'));
        for (const p of filesBelow(host)) {
          const rel = relative(host, p);
          const st = spawnSync('stat', ['-c', '%F %a', p], { encoding: 'utf8' }).stdout.trim();
          if (st.startsWith('regular'))
            await rt.writeFile('vm-a', `/work/tree/${rel}`, readFileSync(p), {
              mkdirs: true,
              mode: parseInt(st.split(' ').pop()!, 8),
            });
        }
        const g = await rt.exec('vm-a', {
          argv: [
            'sh',
            '-c',
            'cd /work/tree && mkdir -p empty && ln -s README link && mkfifo fifo && mkdir mnt && mount -t tmpfs none mnt && echo x > mnt/other-fs',
          ],
        });
        expect(g.exitCode, g.stderr.toString()).to.equal(0);
        const vm = await rt.manifest('vm-a', ['/work/tree']);
        const w = await workspaceManifest([host], { workers: 0 });
        const mapped = Object.fromEntries(Object.entries(w.files).map(([k, v]) => [k.replace(host, '/work/tree'), v]));
        expect(vm.files).to.deep.equal(mapped);
        expect(Object.keys(vm.files)).to.have.length(4);
        expect(vm.modes!['/work/tree/src/main.py']).to.equal(0o755);
        await rejects(rt.manifest('vm-a', ['/work/tree/README']), 'InvalidArgument');
        await rejects(rt.manifest('vm-a', ['/work/tree'], { maxFiles: 2 }), 'LimitExceeded');
        await rt.exec('vm-a', { argv: ['umount', '/work/tree/mnt'] });
      } finally {
        rmSync(host, { recursive: true, force: true });
      }
    });

    it('pauses and resumes: exec is refused while paused', async () => {
      await rt.pause('vm-a');
      expect((await rt.inspect('vm-a')).state).to.equal('paused');
      await rejects(rt.exec('vm-a', { argv: ['true'] }), 'Conflict');
      await rt.resume('vm-a');
      expect((await rt.exec('vm-a', { argv: ['true'] })).exitCode).to.equal(0);
    });
  });

  describe('memory checkpoint and restore', () => {
    const counter = async (id: string) => Number((await rt.readFile(id, '/tmp/counter')).toString());

    before(async () => {
      await rt.create({ id: 'vm-ck' });
      await rt.exec('vm-ck', { argv: COUNTER });
      await rt.writeFile('vm-ck', '/work/before.txt', Buffer.from('before'));
      await counterAbove(rt, 'vm-ck', 0);
    });

    it('rewinds a running counter and removes a file created after; restores twice to the same state', async () => {
      const atCheckpoint = await counter('vm-ck');
      const info = await rt.checkpoint('vm-ck', 'ck-1', { memory: true });
      expect(info).to.include({ id: 'ck-1', sandboxId: 'vm-ck', kind: 'memory' });
      expect(info.sizeBytes).to.be.greaterThan(1 << 20);
      expect(await rt.checkpoint('vm-ck', 'ck-1', { memory: true }), 'idempotent').to.deep.equal(info);

      await rt.writeFile('vm-ck', '/work/after.txt', Buffer.from('after'));
      await rt.writeFile('vm-ck', '/work/before.txt', Buffer.from('changed'));
      // The counter ticks at most 5 times a second: 50 ticks past the checkpoint leave 10 s between
      // a restore and the read that must see it rewound (a loaded host took more than 3 ticks).
      const later = await counterAbove(rt, 'vm-ck', atCheckpoint + 50);
      expect(later).to.be.greaterThan(atCheckpoint + 50);
      const pidBefore = (await rt.inspect('vm-ck')).pid;

      const states: string[] = [];
      for (let round = 0; round < 2; round++) {
        const t0 = Date.now();
        const restoring = rt.restore('vm-ck', 'ck-1');
        const during = rt.exec('vm-ck', { argv: ['sh', '-c', 'test -e /work/after.txt; echo $?'] });
        await rejects(rt.checkpoint('vm-ck', 'ck-busy', { memory: true }), 'Busy');
        await restoring;
        expect((await during).stdout.toString(), 'an exec issued during a restore runs after it').to.equal('1\n');
        const now = await counter('vm-ck');
        expect(now, `round ${round}: counter rewound (${Date.now() - t0} ms since the restore began)`).to.be.lessThan(
          later,
        );
        expect(now).to.be.at.least(atCheckpoint);
        await rejects(rt.stat('vm-ck', '/work/after.txt'), 'NotFound');
        expect((await rt.readFile('vm-ck', '/work/before.txt')).toString()).to.equal('before');
        expect(await counterAbove(rt, 'vm-ck', now), 'the counter runs again').to.be.greaterThan(now);
        const m = await rt.manifest('vm-ck', ['/work']);
        states.push(JSON.stringify(m.files));
        await rt.writeFile('vm-ck', '/work/after.txt', Buffer.from(`round ${round}`));
      }
      expect(states[0]).to.equal(states[1]);
      const info2 = await rt.inspect('vm-ck');
      expect(info2.state).to.equal('running');
      expect(info2.pid).to.not.equal(pidBefore);
      expect(qemuPids(stateDir)).to.not.include(pidBefore);
      const clock = Number((await rt.exec('vm-ck', { argv: ['date', '+%s'] })).stdout.toString());
      expect(clock * 1000, 'clock set after restore').to.be.closeTo(Date.now(), 5000);
    });

    it('leaves freed guest memory out of a memory checkpoint (the guest zeroes freed pages)', async () => {
      await rt.create({ id: 'vm-free' });
      const before = (await rt.checkpoint('vm-free', 'ck-free-0', { memory: true })).sizeBytes;
      // 32 MiB of data in the guest's RAM (tmpfs: 1 MiB of random bytes doubled 5 times), then freed.
      const r = await rt.exec('vm-free', {
        argv: [
          'sh',
          '-c',
          'cd /tmp && head -c 1m /dev/urandom > j0 && for i in 1 2 3 4 5; do cat j$((i-1)) j$((i-1)) > j$i && rm j$((i-1)); done && rm j5',
        ],
      });
      expect(r.exitCode, r.stderr.toString()).to.equal(0);
      const after = (await rt.checkpoint('vm-free', 'ck-free-1', { memory: true })).sizeBytes;
      // Without zeroing on free the freed pages keep their data and the stream grows by about 32 MiB.
      expect(after - before, `checkpoint ${before} -> ${after} bytes`).to.be.lessThan(8 << 20);
      await rt.destroy('vm-free');
      for (const ck of ['ck-free-0', 'ck-free-1']) await rt.deleteCheckpoint(ck);
    });

    it('a disk checkpoint brings back the workspace, not the processes', async () => {
      await rt.writeFile('vm-ck', '/work/disk.txt', Buffer.from('v1'));
      const info = await rt.checkpoint('vm-ck', 'ck-disk');
      expect(info.kind).to.equal('disk');
      await rt.writeFile('vm-ck', '/work/disk.txt', Buffer.from('v2'));
      await rt.restore('vm-ck', 'ck-disk');
      expect((await rt.readFile('vm-ck', '/work/disk.txt')).toString()).to.equal('v1');
      await rejects(rt.stat('vm-ck', '/tmp/counter'), 'NotFound');
      expect((await rt.exec('vm-ck', { argv: ['hostname'] })).stdout.toString()).to.equal('vm-ck\n');
    });

    it('creates a new sandbox from a memory checkpoint (once converted to a RAM file)', async () => {
      // The checkpoint is converted in the background: wait for it, so this create takes
      // the RAM-file path (the restores above may have loaded the stream).
      await eventually(() => existsSync(join(stateDir, 'checkpoints/ck-1/ram')), 30_000, 'the checkpoint converted');
      await rt.create({ id: 'vm-from-ck', source: { checkpointId: 'ck-1' } });
      expect((await rt.readFile('vm-from-ck', '/work/before.txt')).toString()).to.equal('before');
      expect(await counter('vm-from-ck')).to.be.greaterThan(0);
      expect((await rt.exec('vm-from-ck', { argv: ['hostname'] })).stdout.toString()).to.equal('vm-from-ck\n');
      await rt.destroy('vm-from-ck');
      await rejects(rt.restore('vm-ck', 'no-such-ckpt'), 'NotFound');
    });

    it('restores through the standby QEMU started after the checkpoint; a newer checkpoint, deleteCheckpoint and destroy stop it', async () => {
      const standby = async (id: string) => {
        const s = await rt.standbys.get(id);
        expect(s, `a standby QEMU for ${id}`).to.not.equal(undefined);
        expect(running(s!.entry.pid)).to.equal(true);
        expect(s!.entry.dir.startsWith(join(stateDir, 'pool') + '/')).to.equal(true);
        return s!;
      };
      await rt.create({ id: 'vm-sb' });
      await rt.writeFile('vm-sb', '/work/f', Buffer.from('one'));
      await rt.exec('vm-sb', { argv: ['sh', '-c', 'echo one > /tmp/m'] });
      await rt.checkpoint('vm-sb', 'ck-sb1', { memory: true });
      const s1 = await standby('vm-sb');
      expect(s1.checkpointId).to.equal('ck-sb1');
      // Loaded ahead and paused: the restore only continues it (no load on its path).
      expect(await s1.entry.qmp.execute('query-migrate'), 'the standby loaded the checkpoint').to.deep.include({
        status: 'completed',
      });
      expect(await s1.entry.qmp.execute('query-status'), 'and runs no guest code').to.deep.include({ running: false });
      await rt.writeFile('vm-sb', '/work/f', Buffer.from('two'));
      await rt.exec('vm-sb', { argv: ['sh', '-c', 'echo two > /tmp/m'] });

      await rt.restore('vm-sb', 'ck-sb1');
      expect(rt.timings.lastBootPhases, 'the restore took the standby').to.have.property('standby');
      expect((await rt.inspect('vm-sb')).pid, 'the standby QEMU is now the VM').to.equal(s1.entry.pid);
      expect(existsSync(s1.entry.dir), 'its pool directory is gone').to.equal(false);
      expect((await rt.readFile('vm-sb', '/work/f')).toString()).to.equal('one');
      expect(
        (await rt.exec('vm-sb', { argv: ['cat', '/tmp/m'] })).stdout.toString(),
        "the memory is the checkpoint's",
      ).to.equal('one\n');
      // The restore skipped the guest's `net` step (the machine was saved without a network): eth0 stays down.
      expect((await rt.exec('vm-sb', { argv: ['cat', '/sys/class/net/eth0/operstate'] })).stdout.toString()).to.equal(
        'down\n',
      );
      const s2 = await standby('vm-sb');
      expect(s2.entry.pid, 'a new standby for the next restore').to.not.equal(s1.entry.pid);

      await rt.checkpoint('vm-sb', 'ck-sb2', { memory: true });
      const s3 = await standby('vm-sb');
      expect(s3.checkpointId).to.equal('ck-sb2');
      expect(running(s2.entry.pid), 'the standby of the older checkpoint is stopped').to.equal(false);
      await rt.deleteCheckpoint('ck-sb2');
      expect(rt.standbys.has('vm-sb')).to.equal(false);
      expect(running(s3.entry.pid), 'deleteCheckpoint stops its standby').to.equal(false);

      await rt.restore('vm-sb', 'ck-sb1'); // no standby: a QEMU started for it
      expect(rt.timings.lastBootPhases).to.not.have.property('standby');
      expect((await rt.exec('vm-sb', { argv: ['cat', '/tmp/m'] })).stdout.toString()).to.equal('one\n');
      const s4 = await standby('vm-sb');
      await rt.destroy('vm-sb');
      expect(running(s4.entry.pid), 'destroy stops the standby').to.equal(false);
      expect(
        readdirSync(join(stateDir, 'pool')).filter(
          (d) =>
            existsSync(join(stateDir, 'pool', d, 'qemu.pid')) &&
            readFileSync(join(stateDir, 'pool', d, 'qemu.pid'), 'utf8').trim() === String(s4.entry.pid),
        ),
      ).to.deep.equal([]);
      await rt.deleteCheckpoint('ck-sb1');
    });
  });

  describe('fork', () => {
    const kids = ['kid-1', 'kid-2', 'kid-3', 'kid-4'];

    it('gives 4 children the parent files and processes, new identities and isolated writes', async () => {
      await rt.create({ id: 'vm-parent' });
      await rt.exec('vm-parent', { argv: COUNTER });
      await rt.writeFile('vm-parent', '/work/shared.txt', Buffer.from('from parent'));
      await counterAbove(rt, 'vm-parent', 0);
      const t0 = Date.now();
      const res = await rt.fork('vm-parent', kids);
      console.log(`    (fork of 4: ${Date.now() - t0} ms)`);
      expect(res.children.map((c) => c.id)).to.deep.equal(kids);
      expect(res.parentMark.sandboxId).to.equal('vm-parent');

      const ids = ['vm-parent', ...kids];
      const facts = await Promise.all(
        ids.map(async (id) => {
          const r = await rt.exec(id, {
            argv: [
              'sh',
              '-c',
              'hostname; cat /etc/machine-id; head -c 32 /dev/urandom | od -An -tx1 | tr -d " \\n"; echo; cat /tmp/counter',
            ],
          });
          const [hostname, machineId, random, count] = r.stdout.toString().trim().split('\n');
          return { id, hostname, machineId, random, count: Number(count) };
        }),
      );
      for (const k of ['hostname', 'machineId', 'random'] as const) {
        expect(new Set(facts.map((f) => f[k])).size, `${k} differs between parent and children`).to.equal(5);
      }
      for (const f of facts.slice(1)) {
        expect((await rt.readFile(f.id, '/work/shared.txt')).toString()).to.equal('from parent');
        expect(f.count).to.be.greaterThan(0);
        const again = await counterAbove(rt, f.id, f.count);
        expect(again, `${f.id}: the parent's counter process runs in the child`).to.be.greaterThan(f.count);
      }

      await rt.writeFile('kid-1', '/work/only-kid-1.txt', Buffer.from('1'));
      await rt.writeFile('kid-2', '/work/shared.txt', Buffer.from('kid-2 was here'));
      for (const id of ['vm-parent', 'kid-2', 'kid-3', 'kid-4'])
        await rejects(rt.stat(id, '/work/only-kid-1.txt'), 'NotFound');
      for (const id of ['vm-parent', 'kid-1', 'kid-3', 'kid-4'])
        expect((await rt.readFile(id, '/work/shared.txt')).toString()).to.equal('from parent');
    });
  });

  describe('restart of the runtime', () => {
    it('reports a VM whose QEMU died as stopped and revives it with its workspace', async () => {
      await rt.create({ id: 'vm-revive' });
      await rt.writeFile('vm-revive', '/work/keep.txt', Buffer.from('still here'));
      await rt.exec('vm-revive', { argv: ['sync'] });
      const pid = (await rt.inspect('vm-revive')).pid!;
      process.kill(pid, 'SIGKILL');
      await eventually(() => !running(pid), 5_000, 'the killed QEMU gone');
      expect((await rt.inspect('vm-revive')).state).to.equal('stopped');
      const info = await rt.inspect('vm-revive', { revive: true });
      expect(info).to.include({ state: 'running', restarted: true });
      expect((await rt.readFile('vm-revive', '/work/keep.txt')).toString()).to.equal('still here');
      await rt.destroy('vm-revive');
    });

    it('adopts running VMs and removes dead ones', async () => {
      await rt.create({ id: 'vm-adopt' });
      await rt.create({ id: 'vm-dead' });
      await rt.writeFile('vm-adopt', '/work/x', Buffer.from('kept'));
      const deadPid = (await rt.inspect('vm-dead')).pid!;
      await rt.close();
      process.kill(deadPid, 'SIGKILL');
      await eventually(() => !running(deadPid), 5_000, 'the killed QEMU gone');
      rt = new VmRuntime({ stateDir });
      await rt.start();
      expect((await rt.readFile('vm-adopt', '/work/x')).toString()).to.equal('kept');
      await rejects(rt.inspect('vm-dead'), 'NotFound');
      expect(existsSync(join(stateDir, 'vms', 'vm-dead'))).to.equal(false);
    });
  });

  describe('a state directory of any length', () => {
    it('runs commands in a VM and in a fork child (with a dry-run-length id) under a 150-character state directory', async () => {
      const base = mkdtempSync(join(tmpdir(), 'fluxvm-long-'));
      const long = join(base, 'd'.repeat(150 - base.length - 1));
      expect(long.length).to.equal(150);
      mkdirSync(long);
      // The templates of the main runtime are immutable files: sharing them spares a cold boot.
      symlinkSync(join(stateDir, 'templates'), join(long, 'templates'));
      const rt2 = new VmRuntime({ stateDir: long, warmPool: 0 });
      const child = `${'c'.repeat(36)}-dryrun-${randomBytes(4).toString('hex')}`;
      try {
        await rt2.start();
        await rt2.create({ id: 'vm-long' });
        expect(
          (
            await rt2.exec('vm-long', { argv: ['sh', '-c', 'echo parent > /work/p.txt; cat /work/p.txt'] })
          ).stdout.toString(),
        ).to.equal('parent\n');
        await rt2.fork('vm-long', [child]);
        const r = await rt2.exec(child, { argv: ['sh', '-c', 'cat /work/p.txt; hostname'] });
        expect(r.exitCode).to.equal(0);
        expect(r.stdout.toString()).to.equal(`parent\n${child}\n`);
        for (const id of ['vm-long', child]) {
          const link = join(long, 'vms', id, 'agent.sock');
          expect(lstatSync(link).isSymbolicLink()).to.equal(true);
          expect(dirname(readlinkSync(link))).to.equal(rt2.socketDir);
          expect(Buffer.byteLength(readlinkSync(link))).to.be.below(108);
        }
        for (const id of ['vm-long', child]) await rt2.destroy(id);
        expect(readdirSync(rt2.socketDir)).to.deep.equal([]);
        await rt2.close();
        expect(existsSync(rt2.socketDir), 'the socket directory is removed at close').to.equal(false);
      } finally {
        await rt2.close();
        for (const pid of qemuPids(long)) process.kill(pid, 'SIGKILL');
        rmSync(base, { recursive: true, force: true });
      }
    });
  });

  describe('destroy', () => {
    it('leaves no process, socket or file behind', async () => {
      const pids = (await rt.list()).map((s) => s.pid);
      expect(pids.length).to.be.greaterThan(0);
      const socketDir = rt.socketDir;
      const sockets = (await rt.list()).map((s) => readlinkSync(join(stateDir, 'vms', s.id, 'agent.sock')));
      for (const p of sockets) expect(dirname(p), 'the sockets live in the short socket directory').to.equal(socketDir);
      for (const p of sockets) expect(existsSync(p), p).to.equal(true);
      for (const s of await rt.list()) await rt.destroy(s.id);
      for (const pid of pids) expect(running(pid!), `QEMU ${pid} is gone`).to.equal(false);
      await rt.destroy('never-existed');
      for (const c of ['ck-1', 'ck-disk']) await rt.deleteCheckpoint(c);
      expect(await rt.list()).to.deep.equal([]);
      for (const p of sockets) expect(existsSync(p), `${p} is removed`).to.equal(false);
      await rt.close(); // also stops the warm QEMUs, which are not sandboxes
      expect(qemuPids(stateDir)).to.deep.equal([]);
      expect(existsSync(socketDir), 'the socket directory is removed at close').to.equal(false);
      expect(readdirSync(join(stateDir, 'pool'))).to.deep.equal([]);
      expect(readdirSync(join(stateDir, 'vms'))).to.deep.equal([]);
      expect(readdirSync(join(stateDir, 'checkpoints'))).to.deep.equal([]);
      expect(readdirSync(join(stateDir, 'disks'))).to.deep.equal([]);
      expect(readdirSync(join(stateDir, 'overlays'))).to.deep.equal([]);
      // Kept: the templates and the guest image they were built from (staged in images/).
      const leftovers = filesBelow(stateDir).filter(
        (p) => !p.includes('/templates/') && !p.includes('/images/') && !p.endsWith('/tmp'),
      );
      expect(
        leftovers.filter(
          (p) =>
            !['vms', 'checkpoints', 'disks', 'templates', 'images', 'pool', 'overlays'].includes(relative(stateDir, p)),
        ),
      ).to.deep.equal([]);
      rt = new VmRuntime({ stateDir });
      await rt.start();
    });
  });
});

describe('native/vm socket directory', () => {
  it('is short, private and the same for the same state directory, whatever its length', () => {
    const long = `/${'s'.repeat(300)}/vm`;
    expect(socketDirFor(long)).to.equal(socketDirFor(long));
    expect(socketDirFor(long)).to.not.equal(socketDirFor(`${long}2`));
    expect(socketDirFor(long).length).to.be.at.most(MAX_SOCKET_DIR);
    const base = mkdtempSync(join(tmpdir(), 'fluxvm-sockdir-'));
    try {
      const d = join(base, 'ok');
      ensureSocketDir(d);
      ensureSocketDir(d);
      expect(statSync(d).mode & 0o777).to.equal(0o700);
      const open = join(base, 'open');
      mkdirSync(open, { mode: 0o755 });
      chmodSync(open, 0o755);
      expect(() => ensureSocketDir(open)).to.throw(RuntimeError, /not a private directory/);
      symlinkSync(d, join(base, 'link'));
      expect(() => ensureSocketDir(join(base, 'link'))).to.throw(RuntimeError, /not a private directory/);
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });
});
