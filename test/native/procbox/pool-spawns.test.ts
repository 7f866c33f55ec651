// The warm pool's refill (native/procbox/pool.ts) runs no child process from the runtime's Node
// process: its inits are started by the fileops helper (op init), their standby exec helpers by
// the runtime's spawner (standby.ts poolStandby), the generated /etc is written once with fs
// calls (config.ts etcDir). A fork of the Node server copies its page tables and blocks the event
// loop until the child has exec'd, and a synchronous child process blocks it for the child's
// whole life: either would land on the creates and applies the refill runs beside.
import { expect } from 'chai';
import { readdirSync, readFileSync } from 'node:fs';
import { execCounts } from '../../../native/procbox/exec.js';
import type { ProcboxCore } from '../../../native/procbox/core.js';
import { dropPoolInit, refill } from '../../../native/procbox/pool.js';
import { skipWith } from '../../skip.js';
import { whileSpying } from '../../support/spy-builtin.js';
import { eventually } from '../../runtime/controller/env.js';
import { childrenOf, gone, makeRuntime, skipReason, type Fixture } from './fixture.js';

const CP_FUNCS = ['spawn', 'spawnSync', 'exec', 'execSync', 'execFile', 'execFileSync', 'fork'] as const;

/** Counts the calls of node:child_process's functions (ESM importers too) while `fn` runs. */
async function countChildProcessCalls(fn: () => Promise<void>): Promise<Record<string, number>> {
  const calls: Record<string, number> = {};
  await whileSpying('node:child_process', CP_FUNCS, (name) => (calls[name] = (calls[name] ?? 0) + 1), fn);
  return calls;
}

describe('procbox warm pool refill: no child process of the Node server', function () {
  this.timeout(120_000);
  const N = 3;
  let fx: Fixture;
  let pb: ProcboxCore;

  before(async function () {
    skipWith(this, skipReason());
    fx = await makeRuntime({ warmPool: N });
    pb = (fx.rt as unknown as { pb: ProcboxCore }).pb;
  });
  after(async () => fx?.cleanup());

  it(`a refill of ${N} pool inits forks nothing from Node; their standbys are the spawner children`, async () => {
    await refill(pb);
    await eventually(() => pb.pool.length === N, 30_000, `the pool to hold ${N} inits (has ${pb.pool?.length})`);
    // Empty it (each init ends with its directory, the lifeline; its standby is killed): no take, so no refill timer.
    const inits = pb.pool.splice(0);
    for (const e of inits) dropPoolInit(pb, e);
    await eventually(() => inits.every((e) => gone(e.pid)), 10_000, 'the dropped pool inits to end');
    const before = childrenOf(process.pid);
    const spawns0 = execCounts.nodeSpawns;
    const calls = await countChildProcessCalls(async () => {
      await refill(pb);
      await pb.filling;
    });
    expect(pb.pool, 'the refill started every pool init').to.have.length(N);
    expect(calls, 'node:child_process calls during the refill').to.deep.equal({});
    expect(execCounts.nodeSpawns - spawns0, 'exec helpers spawned by forking Node').to.equal(0);
    expect(
      childrenOf(process.pid).filter((p) => !before.includes(p)),
      'processes forked from Node by the refill',
    ).to.deep.equal([]);
    // Each pool init's standby waits, a child of this runtime's spawner (not of Node).
    await eventually(() => pb.pool.every((e) => e.standby?.child.pid), 10_000, 'the pool standbys to start');
    const parents = pb.pool.map((e) => {
      const st = readFileSync(`/proc/${e.standby!.child.pid!}/stat`, 'utf8');
      return Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]);
    });
    expect(new Set(parents).size, 'one parent for every pool standby').to.equal(1);
    expect(parents[0]).to.not.equal(process.pid);
    expect(readFileSync(`/proc/${parents[0]}/cmdline`, 'utf8').split('\0')[1]).to.equal('spawner');
    expect(childrenOf(process.pid), 'the spawner is a child of this process').to.include(parents[0]);
  });
});
