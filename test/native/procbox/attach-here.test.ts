// A warm create's attach (pool.ts launchWarm -> fileops `run attach`) runs inside the long-lived
// fileops helper (fileops-run.c attach_here): no fork and exec of the helper binary on the path
// of every warm create. The helper enters the pool init's mount and UTS namespaces for it and
// must come back: it is never left serving other sandboxes' files from inside one sandbox.
import { expect } from 'chai';
import {
  chmodSync,
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { refill } from '../../../native/procbox/pool.js';
import { skipWith } from '../../skip.js';
import { eventually } from '../../runtime/controller/env.js';
import { childrenOf, makeRuntime, sh, skipReason, type Fixture } from './fixture.js';

const BUILT = fileURLToPath(new URL('../../../native/procbox/build/procbox', import.meta.url));

/** The fileops helpers of this process (children running `<exe> fileops`). */
function fileopsHelpers(exe: string): number[] {
  return childrenOf(process.pid).filter((pid) => {
    try {
      return (
        readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[1] === 'fileops' &&
        readlinkSync(`/proc/${pid}/exe`).startsWith(exe)
      );
    } catch {
      return false; // gone meanwhile
    }
  });
}

/**
 * Starts every fileops helper the runtime may use (it starts a second one only while the first
 * is busy): once the binary loses its execute bit, none may need starting.
 */
async function allHelpers(pb: ProcboxCore, dir: string, exe: string): Promise<number[]> {
  const size = (pb.fileops as unknown as { size: number }).size;
  await eventually(
    async () => {
      await Promise.all(Array.from({ length: 4 * size }, () => pb.fileops.syncfs(dir)));
      return fileopsHelpers(exe).length === size;
    },
    10_000,
    `${size} fileops helpers running`,
  );
  return fileopsHelpers(exe).sort();
}

/** Where a process is: its mount and UTS namespaces and its working directory. */
function whereIs(pid: number | 'self'): string {
  return ['ns/mnt', 'ns/uts', 'cwd'].map((l) => readlinkSync(`/proc/${pid}/${l}`)).join(' ');
}

describe('procbox warm create: the attach runs in the fileops helper itself', function () {
  this.timeout(120_000);
  let fx: Fixture;
  let pb: ProcboxCore;
  let dir: string;
  let copy: string;

  before(async function () {
    skipWith(this, skipReason());
    // A copy of the helper binary, so the test can take its execute bit away.
    dir = mkdtempSync(join(tmpdir(), 'procbox-attach-'));
    copy = join(dir, 'procbox');
    copyFileSync(BUILT, copy);
    chmodSync(copy, 0o755);
    fx = await makeRuntime({ warmPool: 1, helperPath: copy });
    pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
  });
  after(async () => {
    if (copy) chmodSync(copy, 0o755);
    await fx?.cleanup();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('takes a pool init with the helper binary no longer executable (nothing forks and execs it), then works', async () => {
    await refill(pb);
    await eventually(
      () => pb.pool.length === 1 && !!pb.pool[0]!.standby?.child.pid,
      30_000,
      'a pool init and its standby',
    );
    // The fileops helpers are running; note where they are.
    const helpers = await allHelpers(pb, dir, copy);
    const homes = helpers.map(whereIs);
    for (const h of homes)
      expect(h.split(' ').slice(0, 2).join(' ')).to.equal(whereIs('self').split(' ').slice(0, 2).join(' '));
    // From now on any exec of the binary fails (EACCES, root included: no execute bit at all).
    chmodSync(copy, 0o644);
    const info = await fx.rt.create({ id: 'attach-here', network: { mode: 'none' } });
    expect(info.state).to.equal('running');
    expect(pb.pool, 'the pool init was taken').to.have.length(0);
    // The workspace was attached (written and read back through the pool init's standby exec helper).
    const r = await sh(fx.rt, 'attach-here', 'echo attached > /work/f && cat /work/f && hostname');
    expect(r.out).to.equal('attached\nsandbox\n');
    // The same helper processes answered, and they are back where they were.
    expect(fileopsHelpers(copy).sort()).to.deep.equal(helpers);
    expect(helpers.map(whereIs), 'the fileops helpers are back in their own namespaces and directory').to.deep.equal(
      homes,
    );
    chmodSync(copy, 0o755);
  });

  it("an attach that fails inside a sandbox's namespace leaves the helper serving, back in its own", async () => {
    const helpers = await allHelpers(pb, dir, copy);
    const homes = helpers.map(whereIs);
    const missing = await pb.fileops.run(['attach', String(process.pid), join(dir, 'no-such.conf')]);
    expect(missing.code).to.equal(1);
    expect(missing.stdout).to.match(/^err open config /);
    // A well-formed config whose workspace path does not exist in the sandbox: the overlay is
    // made, the helper enters the running sandbox's mount namespace, the move fails there.
    for (const d of ['lower', 'vol/upper', 'vol/work']) mkdirSync(join(dir, d), { recursive: true });
    const cfg = join(dir, 'bad.conf');
    writeFileSync(
      cfg,
      [
        'ws /no-such-dir',
        `upper ${join(dir, 'vol/upper')}`,
        `work ${join(dir, 'vol/work')}`,
        `lower ${join(dir, 'lower')}`,
        'hostname elsewhere',
        '',
      ].join('\n'),
    );
    const init = pb.records.get('attach-here')!.pid!;
    expect(readlinkSync(`/proc/${init}/ns/mnt`), 'the sandbox has a mount namespace of its own').to.not.equal(
      readlinkSync('/proc/self/ns/mnt'),
    );
    const inside = await pb.fileops.run(['attach', String(init), cfg]);
    expect(inside.code).to.equal(1);
    expect(inside.stdout).to.match(/^err move workspace mount/);
    expect((await sh(fx.rt, 'attach-here', 'hostname')).out, 'the failed attach changed no hostname').to.equal(
      'sandbox\n',
    );
    expect(fileopsHelpers(copy).sort()).to.deep.equal(helpers);
    expect(helpers.map(whereIs)).to.deep.equal(homes);
    // It still serves: a stat through it.
    await pb.fileops.syncfs(dir);
  });

  it('a restore in place remounts the workspace from the helper itself (binary not executable), keeping the sandbox running', async () => {
    await sh(fx.rt, 'attach-here', 'echo one > /work/r');
    await fx.rt.checkpoint('attach-here', 'ck-attach-here');
    await sh(fx.rt, 'attach-here', 'echo two > /work/r && echo new > /work/extra');
    const helpers = await allHelpers(pb, dir, copy);
    const homes = helpers.map(whereIs);
    const init = pb.records.get('attach-here')!.pid;
    chmodSync(copy, 0o644);
    try {
      await fx.rt.restore('attach-here', 'ck-attach-here');
    } finally {
      chmodSync(copy, 0o755);
    }
    expect(pb.records.get('attach-here')!.pid, 'restored in place: the same init').to.equal(init);
    expect(fileopsHelpers(copy).sort()).to.deep.equal(helpers);
    expect(helpers.map(whereIs), 'the fileops helpers are back in their own namespaces and directory').to.deep.equal(
      homes,
    );
    const r = await sh(fx.rt, 'attach-here', 'cat /work/r; ls /work');
    expect(r.out).to.equal('one\nf\nr\n');
  });
});
