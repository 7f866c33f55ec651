// Background jobs on procbox (native/jobs.ts, native/procbox/jobs.ts, jobsup.c), on real
// sandboxes: separate byte-exact spools, stdin to end of file, one signal to the whole tree
// (a setsid'd grandchild included), drain past the cap with the real exit status, the timeout,
// the long poll woken by output and by its abort signal, a job that outlives a kill -9 of the
// server, the exec allow-list, and a job that attacks its own spools.
import { expect } from 'chai';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { MAX_JOB_STDIN_WRITE, type JobInfo, type JobReadResult } from '../../../native/jobs.js';
import { ProcboxRuntime } from '../../../native/procbox/procbox.js';
import { defaultHelperPath } from '../../../native/procbox/core.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { gone, makeRuntime, rejects, skipReason, type Fixture } from './fixture.js';

const REPO = join(import.meta.dirname, '../../..');
const CHILD = join(import.meta.dirname, 'jobs-child.ts');

describe('procbox background jobs', function () {
  this.timeout(90_000);
  let fx: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    await fx.rt.create({ id: 'jb', resources: { memoryBytes: 256 << 20, pids: 128 } });
  });
  after(async () => {
    await fx?.cleanup();
  });

  /** Reads a whole stream of a job until its end (long polls), byte for byte. */
  async function readAll(
    id: string,
    job: string,
    stream: 'stdout' | 'stderr',
  ): Promise<{ data: Buffer; last: JobReadResult }> {
    const parts: Buffer[] = [];
    let offset = 0;
    for (let i = 0; i < 2000; i++) {
      const r = await fx.rt.readJob(id, job, { stream, offset, maxBytes: 1 << 20, waitMs: 5000 });
      parts.push(r.data);
      offset = r.nextOffset;
      if (r.eof) return { data: Buffer.concat(parts), last: r };
    }
    throw new Error(`job ${job}: no end of ${stream}`);
  }

  /** The job's own v2 cgroup (host path: its record says which) and the host pids in it. */
  function jobCg(id: string, job: string): string {
    const m = readFileSync(join(fx.stateDir, 'procbox', 'sandboxes', id, 'jobs', job, 'meta.json'), 'utf8');
    return (JSON.parse(m) as { cgroup: string }).cgroup;
  }
  function cgPids(cg: string): number[] {
    return readFileSync(join(cg, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
  }

  async function ended(id: string, job: string, ms = 20_000): Promise<JobInfo> {
    return eventually(
      async () => {
        const j = await fx.rt.job(id, job);
        return j.state !== 'running' && j;
      },
      ms,
      `job ${job} to end`,
    );
  }

  it('keeps stdout and stderr apart, byte-exact (invalid UTF-8, NUL, escapes, CR)', async () => {
    const out = Buffer.from([0xff, 0xfe, 0x00, 0x1b, 0x5b, 0x33, 0x31, 0x6d, 0x41, 0x0d, 0x0a, 0xc3, 0x28]);
    const err = Buffer.from([0x80, 0x01, 0x42, 0x07, 0x00, 0xe2, 0x82]);
    const oct = (b: Buffer) => [...b].map((x) => '\\' + x.toString(8).padStart(3, '0')).join('');
    await fx.rt.startJob('jb', {
      id: 'bytes',
      argv: ['sh', '-c', `printf '${oct(out)}'; printf '${oct(err)}' >&2; exit 4`],
    });
    const o = await readAll('jb', 'bytes', 'stdout');
    const e = await readAll('jb', 'bytes', 'stderr');
    expect(o.data.equals(out), o.data.toString('hex')).to.equal(true);
    expect(e.data.equals(err), e.data.toString('hex')).to.equal(true);
    const j = await ended('jb', 'bytes');
    expect(j).to.include({
      state: 'exited',
      exitCode: 4,
      stdoutBytes: out.length,
      stderrBytes: err.length,
      droppedBytes: 0,
      engine: 'supervisor',
    });
    // A repeated start with the same id gives the existing job and runs nothing again.
    const again = await fx.rt.startJob('jb', { id: 'bytes', argv: ['sh', '-c', 'echo second'] });
    expect(again).to.include({ state: 'exited', exitCode: 4 });
    expect((await fx.rt.listJobs('jb')).map((x) => x.id)).to.include('bytes');
  });

  it('feeds stdin and sends end-of-file; writes after it or after the end are Conflict; 48 KiB is the edge', async () => {
    await fx.rt.startJob('jb', { id: 'cat', argv: ['sh', '-c', 'wc -c; echo done >&2'], stdin: true });
    expect((await fx.rt.job('jb', 'cat')).stdinOpen).to.equal(true);
    await fx.rt.writeJobStdin('jb', 'cat', Buffer.alloc(MAX_JOB_STDIN_WRITE, 0x61));
    expect((await rejects(fx.rt.writeJobStdin('jb', 'cat', Buffer.alloc(MAX_JOB_STDIN_WRITE + 1)))).code).to.equal(
      'InvalidArgument',
    );
    await fx.rt.writeJobStdin('jb', 'cat', Buffer.from('xyz'), { close: true });
    const o = await readAll('jb', 'cat', 'stdout');
    expect(o.data.toString().trim()).to.equal(String(MAX_JOB_STDIN_WRITE + 3));
    const j = await ended('jb', 'cat');
    expect(j).to.include({ state: 'exited', exitCode: 0, stdinOpen: false });
    expect((await rejects(fx.rt.writeJobStdin('jb', 'cat', Buffer.from('late')))).code).to.equal('Conflict');
    // A job started without stdin has none.
    await fx.rt.startJob('jb', { id: 'nostdin', argv: ['cat'] });
    expect((await ended('jb', 'nostdin')).exitCode).to.equal(0); // /dev/null: end of file at once
    expect((await rejects(fx.rt.writeJobStdin('jb', 'nostdin', Buffer.from('x')))).code).to.equal('Conflict');
  });

  it('signals the whole tree with one kill, a setsid grandchild included; the state is killed', async () => {
    // Every process traps USR1 and says so: the grandchild left the job's session and group.
    const gc = `setsid sh -c 'trap "echo gc-usr1 >&2; exit 0" USR1; echo gc $$ >&2; sleep 1000 & wait' &`;
    const script = `${gc} trap 'echo top-usr1 >&2' USR1; sleep 1000 & echo up; while :; do wait; done`;
    await fx.rt.startJob('jb', { id: 'tree', argv: ['sh', '-c', script] });
    await eventually(
      async () =>
        (await fx.rt.readJob('jb', 'tree', { stream: 'stderr', offset: 0, maxBytes: 4096 })).data.includes('gc '),
      10_000,
      'the grandchild to start',
    );
    const cg = jobCg('jb', 'tree');
    // sh, sleep, the setsid'd sh, its sleep: the grandchild says "gc" before it starts its sleep,
    // and the top sh starts its own sleep beside it, so wait for all four.
    const pids = await eventually(
      () => {
        const p = cgPids(cg);
        return p.length >= 4 ? p : undefined;
      },
      10_000,
      'the four processes of the tree in the job cgroup',
    );
    await fx.rt.killJob('jb', 'tree', 'USR1');
    // Both handlers run after the one kill, each when its own shell gets the CPU: wait for the two lines, in
    // either order (the grandchild's alone once passed while the top shell had not run its trap yet).
    const said = (line: string) => async () =>
      (await fx.rt.readJob('jb', 'tree', { stream: 'stderr', offset: 0, maxBytes: 4096 })).data.includes(line);
    await eventually(said('gc-usr1'), 10_000, 'the setsid grandchild to get USR1');
    await eventually(said('top-usr1'), 10_000, 'the top shell to get USR1');
    await fx.rt.killJob('jb', 'tree'); // SIGTERM
    const j = await ended('jb', 'tree');
    expect(j).to.include({ state: 'killed', signal: 'SIGTERM' });
    await eventually(() => pids.every(gone), 10_000, 'every process of the tree to be gone');
    // The supervisor removes the cgroup as its last step, after it has written the job's end: wait for it.
    await eventually(() => !existsSync(cg), 10_000, 'the job cgroup to be removed');
    expect((await rejects(fx.rt.killJob('jb', 'tree', 'NOPE'))).code).to.equal('InvalidArgument');
  });

  it('drains past the cap (at the cap: all kept; one past: one dropped) and keeps the real exit status', async () => {
    const cap = 100_000;
    await fx.rt.startJob('jb', {
      id: 'cap',
      maxOutputBytes: cap,
      argv: [
        'sh',
        '-c',
        `head -c ${cap + 1} /dev/zero; head -c ${cap} /dev/zero >&2; head -c 3000000 /dev/urandom; exit 7`,
      ],
    });
    const j = await ended('jb', 'cap');
    expect(j).to.include({
      state: 'exited',
      exitCode: 7,
      stdoutBytes: cap,
      stderrBytes: cap,
      droppedBytes: 1 + 3_000_000,
    });
    expect((await readAll('jb', 'cap', 'stdout')).data.length).to.equal(cap);
    expect(
      await rejects(fx.rt.startJob('jb', { id: 'cap2', maxOutputBytes: 256 * 1024 * 1024 + 1, argv: ['true'] })),
    ).to.have.property('code', 'InvalidArgument');
  });

  it('times out: the whole tree is killed (a setsid escapee too), state timed_out', async () => {
    const t0 = Date.now();
    await fx.rt.startJob('jb', {
      id: 'slow',
      timeoutMs: 1500,
      argv: ['sh', '-c', 'setsid sleep 1000 > /dev/null 2>&1 & echo up; sleep 1000'],
    });
    await fx.rt.readJob('jb', 'slow', { stream: 'stdout', offset: 0, maxBytes: 100, waitMs: 5000 });
    // "up" is printed before sh starts its foreground sleep: wait for the third process.
    const pids = await eventually(
      () => {
        const p = cgPids(jobCg('jb', 'slow'));
        return p.length >= 3 ? p : undefined;
      },
      5000,
      'the three processes of the job (sh, the setsid escapee, sleep)',
    );
    const j = await ended('jb', 'slow');
    expect(j).to.include({ state: 'timed_out', signal: 'SIGKILL' });
    expect(Date.now() - t0).to.be.below(10_000);
    await eventually(() => pids.every(gone), 10_000, 'every process of the job, the escapee too, to be gone');
  });

  it('a long poll returns as soon as output arrives, and at once when its signal aborts', async () => {
    await fx.rt.startJob('jb', { id: 'poll', argv: ['sh', '-c', 'read x; echo got-$x; read y'], stdin: true });
    const t0 = Date.now();
    const pending = fx.rt.readJob('jb', 'poll', { stream: 'stdout', offset: 0, maxBytes: 100, waitMs: 20_000 });
    // A fixed wait on purpose: the read must be parked in its long poll (no event says so) before output comes.
    await new Promise((r) => setTimeout(r, 300));
    const tw = Date.now();
    await fx.rt.writeJobStdin('jb', 'poll', Buffer.from('a\n'));
    const r = await pending;
    expect(r.data.toString()).to.equal('got-a\n');
    expect(Date.now() - tw).to.be.below(2000);
    expect(Date.now() - t0).to.be.at.least(250);
    // Nothing more comes: an abort ends the wait.
    const ac = new AbortController();
    const t1 = Date.now();
    setTimeout(() => ac.abort(), 200);
    const r2 = await fx.rt.readJob('jb', 'poll', {
      stream: 'stdout',
      offset: r.nextOffset,
      maxBytes: 100,
      waitMs: 20_000,
      signal: ac.signal,
    });
    expect(r2.data.length).to.equal(0);
    expect(r2.eof).to.equal(false);
    expect(Date.now() - t1).to.be.below(3000);
    await fx.rt.writeJobStdin('jb', 'poll', Buffer.alloc(0), { close: true });
    expect((await ended('jb', 'poll')).exitCode).to.equal(1); // read y met end of file
  });

  it('outlives a kill -9 of the server: a new runtime lists it, reads it, feeds it, it finishes', async () => {
    await fx.rt.close(); // the child process opens the same state directory
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        CHILD,
        fx.stateDir,
        'jb',
        'survivor',
        JSON.stringify(['sh', '-c', 'echo before; read x; echo after-$x; exit 3']),
      ],
      {
        cwd: REPO,
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    await eventually(
      () => out.includes('started') || child.exitCode !== null,
      60_000,
      'the child server to start the job',
    );
    expect(out, err).to.include('started');
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    fx.rt = new ProcboxRuntime({ stateDir: fx.stateDir });
    await fx.rt.start();
    const listed = (await fx.rt.listJobs('jb')).find((j) => j.id === 'survivor');
    expect(listed?.state).to.equal('running');
    const first = await fx.rt.readJob('jb', 'survivor', { stream: 'stdout', offset: 0, maxBytes: 100, waitMs: 5000 });
    expect(first.data.toString()).to.equal('before\n');
    await fx.rt.writeJobStdin('jb', 'survivor', Buffer.from('z\n'), { close: true });
    const j = await ended('jb', 'survivor');
    expect(j).to.include({ state: 'exited', exitCode: 3 });
    expect((await readAll('jb', 'survivor', 'stdout')).data.toString()).to.equal('before\nafter-z\n');
  });

  it('a helper that inherited 200 descriptors: neither the supervisor nor the job holds any of them', async () => {
    // The server's parents left 200 descriptors open across exec (not close-on-exec), all on a
    // marker file, and the helper inherits them (a wrapper opens them and execs it). The old
    // supervisor closed at most 64 of them.
    const marker = join(fx.stateDir, 'inherited-marker');
    writeFileSync(marker, 'x');
    const wrapper = join(fx.stateDir, 'helper-with-fds');
    writeFileSync(
      wrapper,
      `#!/bin/bash\nfor i in $(seq 10 209); do eval "exec $i<${marker}"; done\nexec ${defaultHelperPath()} "$@"\n`,
      { mode: 0o755 },
    );
    await fx.rt.close(); // a runtime with the wrapper as its helper, on the same state directory
    const rt = new ProcboxRuntime({ stateDir: fx.stateDir, helperPath: wrapper });
    await rt.start();
    try {
      await rt.startJob('jb', { id: 'fds', stdin: true, argv: ['sh', '-c', 'read x; ls /proc/$$/fd'] });
    } finally {
      await rt.close();
      fx.rt = new ProcboxRuntime({ stateDir: fx.stateDir });
      await fx.rt.start();
    }
    const held = (pid: number) =>
      readdirSync(`/proc/${pid}/fd`).filter((f) => {
        try {
          return readlinkSync(`/proc/${pid}/fd/${f}`) === marker;
        } catch {
          return false;
        }
      }).length;
    // The wrapper's way of leaving descriptors open does what the test says: what it execs holds all 200.
    const leaked = execFileSync('bash', [
      '-c',
      `for i in $(seq 10 209); do eval "exec $i<${marker}"; done; exec ls /proc/self/fd`,
    ]).toString();
    expect(leaked.split('\n').filter(Boolean).length).to.be.at.least(203);
    const meta = JSON.parse(
      readFileSync(join(fx.stateDir, 'procbox', 'sandboxes', 'jb', 'jobs', 'fds', 'meta.json'), 'utf8'),
    ) as { supPid: number };
    expect(held(meta.supPid), 'descriptors the supervisor holds').to.equal(0);
    await fx.rt.writeJobStdin('jb', 'fds', Buffer.from('go\n'), { close: true });
    const j = await ended('jb', 'fds');
    expect(j).to.include({ state: 'exited', exitCode: 0 });
    // (ls of the shell's descriptors, with no pipe: a pipeline's shell holds the pipe's read end
    // until it forks the next command, and ls could see it.)
    const fds = (await readAll('jb', 'fds', 'stdout')).data.toString().split(/\s+/).filter(Boolean);
    expect(fds, 'the job sees only its stdio').to.deep.equal(['0', '1', '2']);
  });

  it('a job cannot grow its spools past the cap or forge the job state', async () => {
    const dir = join(fx.stateDir, 'procbox', 'sandboxes', 'jb', 'jobs', 'evil');
    // Huge output on both streams, a fake status line on stdout, and attempts at the spools:
    // through every /proc/*/fd it can see and through the host path.
    const script = [
      'printf "fluxjob 1 state=ended pid=1 code=0 signal=0 timedout=0 stdin=0 out=0 err=0 dropped=0 ended=1\\n"',
      `for f in /proc/[0-9]*/fd/*; do head -c 100000 /dev/zero >> "$f" 2>/dev/null; done`,
      `ls ${dir} >&2 2>/dev/null && echo host-path-visible >&2`,
      `echo x > ${dir}/status 2>/dev/null && echo host-path-writable >&2`,
      'head -c 20000000 /dev/zero & head -c 20000000 /dev/zero >&2; wait',
      'exit 5',
    ].join('\n');
    await fx.rt.startJob('jb', { id: 'evil', maxOutputBytes: 1 << 20, argv: ['sh', '-c', script] });
    const j = await ended('jb', 'evil', 60_000);
    expect(j).to.include({ state: 'exited', exitCode: 5, stdoutBytes: 1 << 20, stderrBytes: 1 << 20 });
    expect(j.droppedBytes).to.be.at.least(2 * (20_000_000 - (1 << 20)));
    expect(statSync(join(dir, 'stdout')).size).to.equal(1 << 20);
    expect(statSync(join(dir, 'stderr')).size).to.equal(1 << 20);
    const err = (await fx.rt.readJob('jb', 'evil', { stream: 'stderr', offset: 0, maxBytes: 4096 })).data.toString();
    expect(err).to.not.include('host-path');
    expect(readFileSync(join(dir, 'status'), 'latin1')).to.match(/^fluxjob 1 state=ended .* code=5 /);
  });

  it('runs a job under the exec allow-list as exec does: a refused program ends 126 with the reason on stderr', async function () {
    if (!fx.rt.capabilities().confinement?.execAllowlist)
      return skipWith(this, 'no exec allow-list on this host (Landlock and the mount API)');
    await fx.rt.create({ id: 'jl', confinement: { execAllow: ['cat'] } });
    await fx.rt.startJob('jl', { id: 'ls', argv: ['ls', '/'] });
    const j = await ended('jl', 'ls');
    expect(j).to.include({ state: 'exited', exitCode: 126 });
    expect((await readAll('jl', 'ls', 'stderr')).data.toString()).to.match(/^procbox: exec ls: /);
    expect((await readAll('jl', 'ls', 'stdout')).data.length).to.equal(0);
    // A shell in the job cannot start it either; an allowed program runs.
    await fx.rt.startJob('jl', { id: 'sh-ls', argv: ['sh', '-c', 'ls /; echo rc=$?'] });
    await ended('jl', 'sh-ls');
    expect((await readAll('jl', 'sh-ls', 'stdout')).data.toString()).to.equal('rc=126\n');
    await fx.rt.startJob('jl', { id: 'cat', argv: ['cat'], stdin: true });
    await fx.rt.writeJobStdin('jl', 'cat', Buffer.from('ok'), { close: true });
    await ended('jl', 'cat');
    expect((await readAll('jl', 'cat', 'stdout')).data.toString()).to.equal('ok');
    // The job's Landlock rules are the exec's too (read rules: '/' cannot be listed, so the glob stays).
    await fx.rt.create({ id: 'jr', confinement: { readPaths: [] } });
    await fx.rt.startJob('jr', { id: 'glob', argv: ['sh', '-c', 'echo /*'] });
    await ended('jr', 'glob');
    expect((await readAll('jr', 'glob', 'stdout')).data.toString()).to.equal('/*\n');
  });

  it('answers NotFound for an unknown job or sandbox and InvalidArgument for a bad id', async () => {
    expect((await rejects(fx.rt.job('jb', 'nope'))).code).to.equal('NotFound');
    expect((await rejects(fx.rt.listJobs('no-such-sandbox'))).code).to.equal('NotFound');
    expect((await rejects(fx.rt.startJob('jb', { id: '../x', argv: ['true'] }))).code).to.equal('InvalidArgument');
  });
});
