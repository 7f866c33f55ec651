// End to end: what a stopped `fluxctl serve` leaves on the host. Stopped
// with no sandbox left: no btrfs mount, no loop device, no sandbox process, no cgroup. Stopped
// with sandboxes: it says so in its log and keeps them; once its state directory is removed,
// the next start of any server (on another state directory) releases everything of it.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startFluxctl } from './harness.js';
import { kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

const MOUNT_BASE = '/run/fluxvm/procbox';
const CGROUP_ROOTS = ['memory', 'pids', 'cpu', 'freezer', 'unified', ''].map((c) =>
  path.join('/sys/fs/cgroup', c, 'fluxvm'),
);

/** The procbox scope of a serve state directory (core.ts: hash of <state-dir>/runtime/procbox). */
const scopeOf = (stateDir: string) =>
  createHash('sha256')
    .update(path.resolve(stateDir, 'runtime', 'procbox'))
    .digest('hex')
    .slice(0, 8);

/** Everything of a scope on the host: mounts, loop devices of its image, cgroups, live processes in them. */
function leftovers(stateDir: string): string[] {
  const scope = scopeOf(stateDir);
  const image = path.resolve(stateDir, 'runtime', 'procbox', 'workspaces.img');
  const out: string[] = [];
  for (const line of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    if (line.split(' ')[4] === path.join(MOUNT_BASE, scope)) out.push(`mount ${path.join(MOUNT_BASE, scope)}`);
  }
  for (const d of fs.readdirSync('/sys/block').filter((n) => n.startsWith('loop'))) {
    try {
      const b = fs.readFileSync(`/sys/block/${d}/loop/backing_file`, 'utf8').trim();
      if (b === image || b === `${image} (deleted)`) out.push(`loop /dev/${d} (${b})`);
    } catch {
      // not attached
    }
  }
  for (const r of CGROUP_ROOTS.filter((r) => fs.existsSync(r))) {
    for (const n of fs.readdirSync(r).filter((n) => n.startsWith(`${scope}.`))) {
      const procs = fs.readFileSync(path.join(r, n, 'cgroup.procs'), 'utf8').trim();
      out.push(`cgroup ${path.join(r, n)}${procs ? ` with processes ${procs.split('\n').join(',')}` : ''}`);
    }
  }
  if (fs.existsSync(path.join(MOUNT_BASE, `${scope}.owner`))) out.push(`owner record ${scope}.owner`);
  return out;
}

describe('e2e: what a stopped server leaves behind', function () {
  this.timeout(240_000);
  const dirs: string[] = [];
  const newDir = () => {
    const d = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-leaks-'));
    dirs.push(d);
    return d;
  };
  before(function () {
    skipWith(this, sandboxSkipReason());
  });
  after(() => {
    for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
  });

  it('a server stopped with no sandbox left leaves no mount, loop device, process or cgroup', async function () {
    const dir = newDir();
    const fx = await startFluxctl({ stateDir: dir });
    await makeSandbox(fx, 'brief');
    const quota = await kubectlOk(fx, ['get', 'sbx', 'brief', '-o', 'jsonpath={.status.capabilities.limits.disk}']);
    await kubectlOk(fx, ['delete', 'sbx', 'brief', '--timeout=60s']);
    await fx.stop({ keepState: true });
    if (quota !== 'true')
      console.log('      note: no btrfs volume store on this host; only processes and cgroups are checked');
    expect(leftovers(dir)).to.deep.equal([]);
  });

  it('a stop with sandboxes says so; once the state directory is removed, the next start of another server releases everything', async function () {
    const dir = newDir();
    const fx = await startFluxctl({ stateDir: dir });
    await makeSandbox(fx, 'kept');
    await makeSandbox(fx, 'kept2');
    await fx.stop({ keepState: true });
    expect(fx.stderr()).to.match(/stopping with sandboxes left running/);
    expect(
      leftovers(dir).some((l) => l.startsWith('cgroup') && l.includes('with processes')),
      leftovers(dir).join('\n'),
    ).to.equal(true);
    // The directory goes, as a test's or a probe's temporary directory does. Renamed first:
    // the inits' lifeline (their root directory deleted) would end them alone; a directory
    // moved away (or on a file system unmounted lazily) does not.
    const moved = `${dir}.moved`;
    fs.renameSync(dir, moved);
    dirs.push(moved);
    const other = await startFluxctl({ stateDir: newDir() });
    try {
      await eventually(
        () => leftovers(dir).length === 0,
        30_000,
        'the leftovers of the removed state directory to be released',
      );
    } finally {
      await other.stop();
    }
    expect(leftovers(dir)).to.deep.equal([]);
  });
});
