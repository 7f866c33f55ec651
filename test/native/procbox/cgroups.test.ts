// Cgroup layouts: detection from /proc/mounts (table), and the v1-only code path (freezer,
// kill by pid) exercised on this host's real v1 hierarchies by hiding the v2 one.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { detectCgroups, enforced, SandboxCgroups } from '../../../native/procbox/cgroups.js';
import { skipReason } from './fixture.js';

const V1 = ['memory', 'pids', 'cpu,cpuacct', 'freezer']
  .map((c) => `cgroup /sys/fs/cgroup/${c.split(',')[0]} cgroup rw,nosuid,nodev,noexec,relatime,${c} 0 0`)
  .join('\n');
const V2 = 'cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0';
const HYBRID = `${V1}\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0`;

describe('procbox cgroups', function () {
  this.timeout(30_000);

  it('detects v1, v2, hybrid and none from /proc/mounts', () => {
    const cases: [string, string, Record<string, string>, string | undefined][] = [
      [
        'v1',
        V1,
        {
          memory: '/sys/fs/cgroup/memory',
          pids: '/sys/fs/cgroup/pids',
          cpu: '/sys/fs/cgroup/cpu',
          freezer: '/sys/fs/cgroup/freezer',
        },
        undefined,
      ],
      ['v2', V2, {}, '/sys/fs/cgroup'],
      [
        'hybrid',
        HYBRID,
        {
          memory: '/sys/fs/cgroup/memory',
          pids: '/sys/fs/cgroup/pids',
          cpu: '/sys/fs/cgroup/cpu',
          freezer: '/sys/fs/cgroup/freezer',
        },
        '/sys/fs/cgroup/unified',
      ],
      ['none', 'proc /proc proc rw 0 0', {}, undefined],
    ];
    for (const [kind, mounts, v1, v2] of cases) {
      const l = detectCgroups(mounts);
      expect(l.kind, kind).to.equal(kind);
      expect(l.v1, kind).to.deep.equal(v1);
      expect(l.v2, kind).to.equal(v2);
    }
    expect(enforced({ kind: 'v1', v1: { memory: '/m', pids: '/p' }, v2Controllers: [] })).to.deep.equal({
      memory: true,
      pids: true,
      cpu: false,
      freezer: false,
    });
    expect(
      enforced({ kind: 'v2', v1: {}, v2: '/sys/fs/cgroup', v2Controllers: ['cpu', 'memory', 'pids'] }),
    ).to.deep.equal({ memory: true, pids: true, cpu: true, freezer: true });
  });

  it('v1 only: limits, freezer, kill by pid and removal on the real hierarchies', async function () {
    const why = skipReason();
    const layout = detectCgroups();
    if (why || !layout.v1.freezer || !layout.v1.pids) {
      console.log(`      skipped: ${why ?? 'no cgroup v1 freezer/pids here'}`);
      return this.skip();
    }
    const v1only = { ...layout, kind: 'v1' as const, v2: undefined, v2Controllers: [] };
    const cg = new SandboxCgroups(v1only, `cgtest-${process.pid}`, { pids: 10 });
    cg.create({ pids: 10 });
    const dirs = cg.dirs();
    expect(dirs.map((d) => d.split('/')[4])).to.deep.equal(['pids', 'freezer']);
    expect(readFileSync(join(dirs[0]!, 'pids.max'), 'utf8').trim()).to.equal('10');
    const child = spawn('sleep', ['300'], { stdio: 'ignore' });
    await new Promise((r) => child.once('spawn', r));
    for (const f of cg.procsFiles()) writeFileSync(f, String(child.pid));
    expect(cg.pids()).to.deep.equal([child.pid]);
    await cg.setFrozen(true);
    expect(readFileSync(join(dirs[1]!, 'freezer.state'), 'utf8').trim()).to.equal('FROZEN');
    expect(cg.frozen()).to.equal(true);
    const exited = new Promise((r) => child.once('exit', r));
    await cg.destroy(); // frozen: killed, thawed so the kill lands, then removed
    await exited;
    for (const d of dirs) expect(existsSync(d), d).to.equal(false);
  });
});
