// Background jobs on vm (native/vm/jobs.ts, agent/jobs.c). First the real guest agent as a host
// process (--stdio, spools in a temporary --jobs-dir): separate byte-exact streams, stdin to end
// of file, one signal to the whole tree (a setsid'd grandchild included), drain past the cap
// with the real exit status, the timeout, the long poll woken by output and by its abort, and
// a guest whose job replies lie (out-of-range fields, more bytes than asked). Then a real VM:
// a job keeps running across a restart of the runtime and is read, fed and finished by the new one.
import { expect } from 'chai';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import type { JobInfo } from '../../../native/jobs.js';
import { RuntimeError } from '../../../native/runtime.js';
import { AgentClient, AgentProtocolError } from '../../../native/vm/agent-client.js';
import * as vmJobs from '../../../native/vm/jobs.js';
import { qemuInstalled } from '../../../native/vm/qemu.js';
import { VmRuntime } from '../../../native/vm/vm.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';

const ROOT = new URL('../../../', import.meta.url).pathname;
const AGENT = join(ROOT, 'native/vm/build/fluxvm-agent');

async function rejects(p: Promise<unknown>): Promise<RuntimeError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).to.be.instanceOf(RuntimeError);
  return e as RuntimeError;
}

function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
    const st = spawnSync('cat', [`/proc/${pid}/stat`], { encoding: 'utf8' }).stdout;
    return /\) [ZX] /.test(st);
  } catch {
    return true;
  }
}

describe('native/vm background jobs: the guest agent as a host process', function () {
  this.timeout(60_000);
  let dir: string;
  let proc: ChildProcess;
  let host: vmJobs.VmJobHost;

  before(function () {
    const r = spawnSync('make', ['-s', '-C', join(ROOT, 'native/vm'), 'build/fluxvm-agent'], { encoding: 'utf8' });
    skipWith(this, r.status === 0 ? undefined : `cannot build the guest agent: ${r.stderr}`);
    dir = mkdtempSync(join(tmpdir(), 'fluxvm-jobs-'));
    proc = spawn(AGENT, ['--stdio', '--jobs-dir', join(dir, 'spools')], { stdio: ['pipe', 'pipe', 'pipe'] });
    proc.stderr!.resume();
    const client = new AgentClient(proc.stdout!, proc.stdin!);
    host = { agentFor: async () => client, vmDir: () => join(dir, 'vm') };
  });
  after(() => {
    proc?.kill('SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  async function readAll(job: string, stream: 'stdout' | 'stderr'): Promise<Buffer> {
    const parts: Buffer[] = [];
    let offset = 0;
    for (let i = 0; i < 1000; i++) {
      const r = await vmJobs.readJob(host, 's', job, { stream, offset, maxBytes: 1 << 20, waitMs: 5000 });
      parts.push(r.data);
      offset = r.nextOffset;
      if (r.eof) return Buffer.concat(parts);
    }
    throw new Error(`no end of ${stream}`);
  }
  const ended = (job: string) =>
    eventually(
      async () => {
        const j = await vmJobs.job(host, 's', job);
        return j.state !== 'running' && j;
      },
      20_000,
      `job ${job} to end`,
    ) as Promise<JobInfo>;

  it('keeps stdout and stderr apart, byte-exact, with the exit code', async () => {
    const out = Buffer.from([0xff, 0xfe, 0x00, 0x1b, 0x5b, 0x33, 0x31, 0x6d, 0x41, 0x0d, 0x0a, 0xc3, 0x28]);
    const err = Buffer.from([0x80, 0x01, 0x42, 0x07, 0x00, 0xe2, 0x82]);
    const oct = (b: Buffer) => [...b].map((x) => '\\' + x.toString(8).padStart(3, '0')).join('');
    await vmJobs.startJob(host, 's', {
      id: 'bytes',
      argv: ['sh', '-c', `printf '${oct(out)}'; printf '${oct(err)}' >&2; exit 4`],
    });
    expect((await readAll('bytes', 'stdout')).equals(out)).to.equal(true);
    expect((await readAll('bytes', 'stderr')).equals(err)).to.equal(true);
    expect(await ended('bytes')).to.include({
      state: 'exited',
      exitCode: 4,
      stdoutBytes: out.length,
      stderrBytes: err.length,
      droppedBytes: 0,
    });
    expect((await vmJobs.listJobs(host, 's')).map((j) => j.id)).to.include('bytes');
  });

  it('feeds stdin to end of file; later writes are Conflict; 48 KiB is the edge', async () => {
    await vmJobs.startJob(host, 's', { id: 'wc', argv: ['wc', '-c'], stdin: true });
    await vmJobs.writeJobStdin(host, 's', 'wc', Buffer.alloc(48 * 1024, 0x61));
    expect((await rejects(vmJobs.writeJobStdin(host, 's', 'wc', Buffer.alloc(48 * 1024 + 1)))).code).to.equal(
      'InvalidArgument',
    );
    await vmJobs.writeJobStdin(host, 's', 'wc', Buffer.from('xyz'), { close: true });
    expect((await readAll('wc', 'stdout')).toString().trim()).to.equal(String(48 * 1024 + 3));
    expect(await ended('wc')).to.include({ state: 'exited', exitCode: 0 });
    expect((await rejects(vmJobs.writeJobStdin(host, 's', 'wc', Buffer.from('late')))).code).to.equal('Conflict');
  });

  it('signals the whole tree, a setsid grandchild included, and the state is killed', async () => {
    const gc = `setsid sh -c 'trap "echo gc-usr1 >&2; exit 0" USR1; echo gc $$ >&2; sleep 1000 & wait' &`;
    await vmJobs.startJob(host, 's', {
      id: 'tree',
      argv: ['sh', '-c', `${gc} trap 'echo top-usr1 >&2' USR1; sleep 1000 & while :; do wait; done`],
    });
    const pidOf = async () =>
      /gc (\d+)/.exec(
        (await vmJobs.readJob(host, 's', 'tree', { stream: 'stderr', offset: 0, maxBytes: 4096 })).data.toString(),
      )?.[1];
    const gcPid = Number(await eventually(pidOf, 10_000, 'the grandchild to start'));
    await vmJobs.killJob(host, 's', 'tree', 'USR1');
    await eventually(
      async () =>
        (await vmJobs.readJob(host, 's', 'tree', { stream: 'stderr', offset: 0, maxBytes: 4096 })).data.includes(
          'gc-usr1',
        ),
      10_000,
      'the setsid grandchild to get USR1',
    );
    await vmJobs.killJob(host, 's', 'tree');
    expect(await ended('tree')).to.include({ state: 'killed', signal: 'SIGTERM' });
    await eventually(() => gone(gcPid), 10_000, 'the grandchild to be gone');
  });

  it('drains past the cap (at the cap all kept, one past one dropped) with the real exit code', async () => {
    const cap = 100_000;
    await vmJobs.startJob(host, 's', {
      id: 'cap',
      maxOutputBytes: cap,
      argv: [
        'sh',
        '-c',
        `head -c ${cap + 1} /dev/zero; head -c ${cap} /dev/zero >&2; head -c 3000000 /dev/zero; exit 7`,
      ],
    });
    expect(await ended('cap')).to.include({
      state: 'exited',
      exitCode: 7,
      stdoutBytes: cap,
      stderrBytes: cap,
      droppedBytes: 3_000_001,
    });
    expect((await readAll('cap', 'stdout')).length).to.equal(cap);
  });

  it('times out: the tree is killed, state timed_out', async () => {
    const t0 = Date.now();
    await vmJobs.startJob(host, 's', {
      id: 'slow',
      timeoutMs: 700,
      argv: ['sh', '-c', 'setsid sleep 1000 & echo $! >&2; sleep 1000'],
    });
    const pid = Number(
      await eventually(
        async () =>
          /(\d+)/.exec(
            (await vmJobs.readJob(host, 's', 'slow', { stream: 'stderr', offset: 0, maxBytes: 100 })).data.toString(),
          )?.[1],
        5000,
        'the escapee pid',
      ),
    );
    expect(await ended('slow')).to.include({ state: 'timed_out', signal: 'SIGKILL' });
    expect(Date.now() - t0).to.be.below(10_000);
    await eventually(() => gone(pid), 10_000, 'the setsid escapee to be gone');
  });

  it('a long poll returns as soon as output arrives and at once on abort', async () => {
    await vmJobs.startJob(host, 's', { id: 'poll', argv: ['sh', '-c', 'read x; echo got-$x; read y'], stdin: true });
    const pending = vmJobs.readJob(host, 's', 'poll', { stream: 'stdout', offset: 0, maxBytes: 100, waitMs: 20_000 });
    // A fixed wait on purpose: the read must be parked in its long poll (no event says so) before output comes.
    await new Promise((r) => setTimeout(r, 300));
    const tw = Date.now();
    await vmJobs.writeJobStdin(host, 's', 'poll', Buffer.from('a\n'));
    const r = await pending;
    expect(r.data.toString()).to.equal('got-a\n');
    expect(Date.now() - tw).to.be.below(2000);
    const ac = new AbortController();
    const t1 = Date.now();
    setTimeout(() => ac.abort(), 200);
    const r2 = await vmJobs.readJob(host, 's', 'poll', {
      stream: 'stdout',
      offset: r.nextOffset,
      maxBytes: 100,
      waitMs: 20_000,
      signal: ac.signal,
    });
    expect(r2.data.length).to.equal(0);
    expect(Date.now() - t1).to.be.below(3000);
    await vmJobs.writeJobStdin(host, 's', 'poll', Buffer.alloc(0), { close: true });
    expect((await ended('poll')).exitCode).to.equal(1);
  });
});

describe('native/vm background jobs: a guest whose job replies lie', () => {
  /** A client whose "guest" answers every request with `reply` (header fields) and `payload`. */
  function lyingGuest(reply: Record<string, unknown>, payload = Buffer.alloc(0)) {
    const toHost = new PassThrough();
    const fromHost = new PassThrough();
    let violated: AgentProtocolError | undefined;
    const client = new AgentClient(toHost, fromHost, { onViolation: (e) => (violated = e) });
    fromHost.on('data', (b: Buffer) => {
      const hl = b.readUInt32BE(4);
      const id = (JSON.parse(b.subarray(8, 8 + hl).toString()) as { id: number }).id;
      const h = Buffer.from(JSON.stringify({ id, ok: true, ...reply }));
      const pre = Buffer.alloc(8);
      pre.writeUInt32BE(4 + h.length + payload.length, 0);
      pre.writeUInt32BE(h.length, 4);
      toHost.write(Buffer.concat([pre, h, payload]));
    });
    return { client, violated: () => violated };
  }
  const good = {
    state: 'running',
    exitCode: -1,
    signal: 0,
    timedOut: false,
    stdinOpen: false,
    stdoutBytes: 10,
    stderrBytes: 0,
    droppedBytes: 0,
    endedMs: 0,
  };

  for (const [what, reply, payload] of [
    ['a negative size', { ...good, stdoutBytes: -5 }, Buffer.alloc(0)],
    ['a size past 256 MiB', { ...good, stdoutBytes: 2 ** 40 }, Buffer.alloc(0)],
    ['an unknown state', { ...good, state: 'pwned' }, Buffer.alloc(0)],
    ['more bytes than asked', good, Buffer.alloc(64)],
  ] as const) {
    it(`${what}: a protocol violation, nothing believed`, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'fluxvm-jobs-lie-'));
      try {
        const g = lyingGuest(reply, payload);
        const host = { agentFor: async () => g.client, vmDir: () => dir };
        await vmJobs.startJob(host, 's', { id: 'j', argv: ['true'] }).catch(() => undefined);
        // startJob with a lying reply already fails; a read asks for 8 bytes.
        const { mkdirSync, writeFileSync } = await import('node:fs');
        mkdirSync(join(dir, 'jobs'), { recursive: true });
        writeFileSync(
          join(dir, 'jobs', 'j.json'),
          JSON.stringify({
            id: 'j',
            argv: ['true'],
            startedAt: new Date().toISOString(),
            maxOutputBytes: 1000,
            stdin: false,
          }),
        );
        const e = await vmJobs.readJob(host, 's', 'j', { stream: 'stdout', offset: 0, maxBytes: 8 }).then(
          () => undefined,
          (err: unknown) => err,
        );
        expect(e, 'the read fails').to.be.instanceOf(AgentProtocolError);
        expect(g.violated(), 'the owner is told (the VM is failed)').to.be.instanceOf(AgentProtocolError);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }

  it('a good reply is believed only up to the cap the host set', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fluxvm-jobs-lie-'));
    try {
      const g = lyingGuest({ ...good, stdoutBytes: 5000, state: 'ended', exitCode: 0, endedMs: 1 });
      const host = { agentFor: async () => g.client, vmDir: () => dir };
      const { mkdirSync, writeFileSync } = await import('node:fs');
      mkdirSync(join(dir, 'jobs'), { recursive: true });
      writeFileSync(
        join(dir, 'jobs', 'j.json'),
        JSON.stringify({
          id: 'j',
          argv: ['true'],
          startedAt: new Date().toISOString(),
          maxOutputBytes: 1000,
          stdin: false,
        }),
      );
      expect((await vmJobs.job(host, 's', 'j')).stdoutBytes).to.equal(1000);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('native/vm background jobs in a VM (QEMU)', function () {
  this.timeout(600_000);
  let rt: VmRuntime;
  let stateDir: string;

  before(async function () {
    skipWith(this, qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)');
    stateDir = mkdtempSync(join(tmpdir(), 'fluxvm-vmjobs-'));
    rt = new VmRuntime({ stateDir });
    await rt.start();
    await rt.create({ id: 'vj' });
  });
  after(async () => {
    if (!rt) return;
    for (const s of await rt.list()) await rt.destroy(s.id).catch(() => undefined);
    await rt.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('runs a job in the guest (spools under /var/lib/fluxvm-jobs) that outlives a restart of the runtime', async () => {
    await rt.startJob('vj', {
      id: 'survivor',
      argv: ['sh', '-c', 'echo before; echo oops >&2; read x; echo after-$x; exit 3'],
      stdin: true,
    });
    const first = await rt.readJob('vj', 'survivor', { stream: 'stdout', offset: 0, maxBytes: 100, waitMs: 10_000 });
    expect(first.data.toString()).to.equal('before\n');
    const spool = await rt.exec('vj', { argv: ['cat', '/var/lib/fluxvm-jobs/survivor/stderr'] });
    expect(spool.stdout.toString()).to.equal('oops\n');
    await rt.close();
    rt = new VmRuntime({ stateDir });
    await rt.start();
    const listed = (await rt.listJobs('vj')).find((j) => j.id === 'survivor');
    expect(listed?.state).to.equal('running');
    await rt.writeJobStdin('vj', 'survivor', Buffer.from('z\n'), { close: true });
    const j = await eventually(
      async () => {
        const x = await rt.job('vj', 'survivor');
        return x.state !== 'running' && x;
      },
      20_000,
      'the job to end',
    );
    expect(j).to.include({ state: 'exited', exitCode: 3 });
    const out = await rt.readJob('vj', 'survivor', { stream: 'stdout', offset: 0, maxBytes: 100 });
    expect(out.data.toString()).to.equal('before\nafter-z\n');
    expect(out.eof).to.equal(true);
  });
});
