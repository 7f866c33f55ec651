// Background jobs started from the sandbox's standby exec helper (native/procbox/jobs.ts,
// exec.c, jobsup.c): the standby joined the sandbox before the job was asked for, so its host
// paths (job directory, job cgroup) are resolved below the host's root, its supervisor is forked
// back in the host's pid namespace, and the command goes into the job's own cgroup. Each case
// checks the job took the standby (it relayed the report and exited 0), then that the job is
// confined exactly as an exec of the same sandbox and as a job spawned without a standby.
import { expect } from 'chai';
import { existsSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { JobInfo } from '../../../native/jobs.js';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import type { Standby } from '../../../native/procbox/exec.js';
import { spawnerOf } from '../../../native/procbox/standby.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../support/wait.js';
import { makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

const core = (fx: Fixture) => (fx.rt as unknown as { pb: ProcboxCore }).pb;

/** What a command sees of its confinement, printed the same way by an exec and by a job. */
const PROBE = [
  'ls / >/dev/null 2>&1; echo "list root: $?"',
  'cat /etc/hostname >/dev/null 2>&1; echo "read etc: $?"',
  'touch /work/probe-$$ 2>/dev/null; echo "write workspace: $?"',
  'touch /tmp/probe-$$ 2>/dev/null; echo "write tmp: $?"',
  'unshare -r true 2>/dev/null; echo "unshare: $?"',
  'grep -E "^(Uid|CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status',
  'for n in ipc mnt net pid user uts cgroup; do echo "$n $(readlink /proc/self/ns/$n)"; done',
  'grep -v "^0::" /proc/self/cgroup',
].join('; ');

describe('procbox background jobs from a standby helper', function () {
  this.timeout(90_000);
  let fx: Fixture;
  let plain: Fixture;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime();
    plain = await makeRuntime({ jobsFromStandby: false });
  });
  after(async () => {
    await fx?.cleanup();
    await plain?.cleanup();
  });

  async function standbyOf(f: Fixture, id: string): Promise<Standby> {
    const pb = core(f);
    // Its pid known (the spawner has answered): takeStandby checks the process is still there.
    return eventually(
      () => (pb.standbys.get(id)?.child.pid ? pb.standbys.get(id) : undefined),
      10_000,
      `the standby of ${id}`,
    );
  }

  /** Starts a job that must take the sandbox's waiting standby: the standby relays the report and exits 0. */
  async function startFromStandby(id: string, job: string, argv: string[], stdin = false): Promise<void> {
    const s = await standbyOf(fx, id);
    await fx.rt.startJob(id, { id: job, argv, stdin });
    expect(core(fx).standbys.get(id), 'the standby was taken').to.not.equal(s);
    await eventually(() => s.state.exited, 5000, 'the standby to exit after relaying the report');
    expect(
      s.child.exitCode,
      `the standby ran the job (status ${JSON.stringify(s.state.status)}, signal ${s.child.signalCode}, error ${s.state.error?.message})`,
    ).to.equal(0);
  }

  async function ended(f: Fixture, id: string, job: string): Promise<JobInfo> {
    return eventually(
      async () => {
        const j = await f.rt.job(id, job);
        return j.state !== 'running' && j;
      },
      20_000,
      `job ${job} to end`,
    );
  }

  async function stdoutOf(f: Fixture, id: string, job: string): Promise<string> {
    const r = await f.rt.readJob(id, job, { stream: 'stdout', offset: 0, maxBytes: 1 << 20 });
    return r.data.toString();
  }

  function meta(f: Fixture, id: string, job: string): { supPid: number; pid: number; cgroup?: string } {
    return JSON.parse(readFileSync(join(f.stateDir, 'procbox', 'sandboxes', id, 'jobs', job, 'meta.json'), 'utf8'));
  }

  it('confines the job as an exec of the sandbox and as a job spawned without a standby (paths, read-only workspace, capabilities, seccomp, namespaces, cgroups)', async () => {
    const confinement = { readPaths: [], readonlyWorkspace: true };
    await fx.rt.create({ id: 'sc', confinement, resources: { memoryBytes: 256 << 20, pids: 128 } });
    await plain.rt.create({ id: 'sc', confinement, resources: { memoryBytes: 256 << 20, pids: 128 } });
    await startFromStandby('sc', 'probe', ['sh', '-c', PROBE]);
    const j = await ended(fx, 'sc', 'probe');
    expect(j).to.include({ state: 'exited', exitCode: 0 });
    const job = await stdoutOf(fx, 'sc', 'probe');
    const exec = await sh(fx.rt, 'sc', PROBE);
    expect(exec.code).to.equal(0);
    expect(job, 'the job sees what an exec of the sandbox sees').to.equal(exec.out);
    // Refused where the confinement says so (readPaths: [] keeps '/' unlistable; the workspace is read-only).
    expect(job).to.match(/^list root: [1-9]\d*\nread etc: 0\nwrite workspace: 1\nwrite tmp: 0\nunshare: [1-9]/);
    expect(job).to.match(/^NoNewPrivs:\t1$/m);
    expect(job).to.match(/^Seccomp:\t2$/m);
    // A job spawned from this process (no standby) in a sandbox with the same confinement sees the same, but its own
    // namespaces.
    await plain.rt.startJob('sc', { id: 'probe', argv: ['sh', '-c', PROBE] });
    await ended(plain, 'sc', 'probe');
    const spawned = await stdoutOf(plain, 'sc', 'probe');
    const withoutNs = (s: string) => s.replace(/^(ipc|mnt|net|pid|user|uts|cgroup) .*$/gm, '$1');
    expect(withoutNs(job)).to.equal(withoutNs(spawned));
  });

  it("puts the command in the job's own cgroup below the sandbox's and the supervisor in the host's pid namespace", async () => {
    await fx.rt.create({ id: 'cg', resources: { memoryBytes: 256 << 20, pids: 128 } });
    await startFromStandby('cg', 'wait', ['cat'], true);
    const m = meta(fx, 'cg', 'wait');
    const init = (await fx.rt.inspect('cg')).pid!;
    expect(m.cgroup, 'the job has a v2 cgroup').to.be.a('string');
    expect(m.cgroup!).to.match(new RegExp(`/fluxvm/${fx.rt.hostKey('cg')}/job-s[0-9a-f]{12}$`));
    const procs = readFileSync(join(m.cgroup!, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
    expect(procs, "the command is in the job's cgroup").to.deep.equal([m.pid]);
    // v1 controllers (memory, pids, ...): the command is in the sandbox's, as an exec's command.
    const v1 = (pid: number) =>
      readFileSync(`/proc/${pid}/cgroup`, 'utf8')
        .split('\n')
        .filter((l) => l && !l.startsWith('0::'))
        .sort();
    const execV1 = (await sh(fx.rt, 'cg', 'echo $$; cat /proc/self/cgroup')).out;
    expect(v1(m.pid).length, 'v1 lines').to.equal(
      execV1.split('\n').filter((l) => /^\d+:/.test(l) && !l.startsWith('0::')).length,
    );
    for (const line of v1(m.pid)) if (/:(memory|pids):/.test(line)) expect(line).to.contain(fx.rt.hostKey('cg'));
    // Namespaces: the command is the sandbox's in every one; the supervisor is in the host's pid namespace (the
    // sandbox cannot see or signal it), as when it is spawned for the job.
    for (const n of ['pid', 'mnt', 'net', 'user', 'ipc', 'uts', 'cgroup'])
      expect(readlinkSync(`/proc/${m.pid}/ns/${n}`), n).to.equal(readlinkSync(`/proc/${init}/ns/${n}`));
    expect(readlinkSync(`/proc/${m.supPid}/ns/pid`)).to.equal(readlinkSync('/proc/self/ns/pid'));
    expect(readlinkSync(`/proc/${m.supPid}/ns/pid_for_children`)).to.equal(readlinkSync(`/proc/${init}/ns/pid`));
    expect((await sh(fx.rt, 'cg', 'ls /proc | grep -c "^[0-9]"')).out.trim(), 'processes the sandbox sees').to.match(
      /^[1-9]\d*$/,
    );
    expect((await sh(fx.rt, 'cg', `kill -0 ${m.supPid} 2>/dev/null; echo $?`)).out).to.equal('1\n');
    // The supervisor holds no descriptor of the host's root or of the server (0-2 are /dev/null).
    for (const fd of ['0', '1', '2']) expect(readlinkSync(`/proc/${m.supPid}/fd/${fd}`)).to.equal('/dev/null');
    await fx.rt.writeJobStdin('cg', 'wait', Buffer.from('in'), { close: true });
    expect(await ended(fx, 'cg', 'wait')).to.include({ state: 'exited', exitCode: 0 });
    expect(await stdoutOf(fx, 'cg', 'wait')).to.equal('in');
  });

  it('a start takes the job cgroup made ahead for its sandbox and leaves the next one ready; destroy removes it', async () => {
    await fx.rt.create({ id: 'sp', resources: { memoryBytes: 256 << 20, pids: 128 } });
    await startFromStandby('sp', 'one', ['true']);
    const first = meta(fx, 'sp', 'one').cgroup!;
    const sbxCg = dirname(first);
    expect(sbxCg.endsWith(`/fluxvm/${fx.rt.hostKey('sp')}`)).to.equal(true);
    const spares = () => readdirSync(sbxCg).filter((n) => /^job-s[0-9a-f]{12}$/.test(n));
    const ready = await eventually(
      () => spares().find((n) => join(sbxCg, n) !== first),
      5000,
      'a job cgroup made ahead after the first start',
    );
    await startFromStandby('sp', 'two', ['sh', '-c', 'echo two']);
    expect(meta(fx, 'sp', 'two').cgroup, 'the second job runs in the cgroup made ahead').to.equal(join(sbxCg, ready));
    // Its output is read once it ended: a read while `echo` has not run yet is rightly empty.
    expect(await ended(fx, 'sp', 'two')).to.include({ state: 'exited', exitCode: 0 });
    expect(await stdoutOf(fx, 'sp', 'two')).to.equal('two\n');
    await eventually(() => spares().some((n) => n !== ready && join(sbxCg, n) !== first), 5000, 'the next one made');
    await fx.rt.destroy('sp');
    expect(existsSync(sbxCg), "the sandbox's cgroup and its spare are gone").to.equal(false);
  });

  it("resolves the job's host paths in the host's root: a look-alike job directory the sandbox made in its own /tmp is never used", async () => {
    await fx.rt.create({ id: 'lk', resources: { memoryBytes: 256 << 20, pids: 128 } });
    const hostDir = join(fx.stateDir, 'procbox', 'sandboxes', 'lk', 'jobs', 'look');
    expect(hostDir.startsWith('/tmp/'), 'the state directory is below /tmp, which the sandbox has its own of').to.equal(
      true,
    );
    const made = await sh(fx.rt, 'lk', `mkdir -p ${hostDir} && chmod 777 ${hostDir} && echo made`);
    expect(made.out).to.equal('made\n');
    await startFromStandby('lk', 'look', ['echo', 'spooled']);
    await ended(fx, 'lk', 'look');
    expect(await stdoutOf(fx, 'lk', 'look')).to.equal('spooled\n');
    expect(readFileSync(join(hostDir, 'stdout'), 'utf8')).to.equal('spooled\n');
    expect((await sh(fx.rt, 'lk', `ls -A ${hostDir}; echo end`)).out, "nothing in the sandbox's look-alike").to.equal(
      'end\n',
    );
  });

  it('outlives the spawner that started its standby, is killed as a tree, and the next job gets a fresh standby', async () => {
    await fx.rt.create({ id: 'sv', resources: { memoryBytes: 256 << 20, pids: 128 } });
    await startFromStandby('sv', 'tree', ['sh', '-c', 'sleep 600 & sleep 600; echo never']);
    const m = meta(fx, 'sv', 'tree');
    spawnerOf(core(fx))!.stop(); // what a server's exit does to it
    expect((await fx.rt.job('sv', 'tree')).state).to.equal('running');
    await fx.rt.killJob('sv', 'tree', 'SIGKILL');
    const j = await ended(fx, 'sv', 'tree');
    expect(j.state).to.equal('killed');
    await eventually(
      () => !readFileSafe(join(m.cgroup ?? '/nonexistent', 'cgroup.procs')),
      5000,
      'the job cgroup gone',
    );
    // A new spawner, a new standby: the next job takes it.
    await startFromStandby('sv', 'again', ['echo', 'ok']);
    await ended(fx, 'sv', 'again');
    expect(await stdoutOf(fx, 'sv', 'again')).to.equal('ok\n');
  });
});

function readFileSafe(p: string): string | undefined {
  try {
    return readFileSync(p, 'utf8');
  } catch {
    return undefined;
  }
}
