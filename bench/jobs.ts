// Background jobs on procbox: job start -> first output byte at the runtime, i.e.
// startJob of `echo x` until readJob (long poll) returns the byte, over N runs, A/B in the same
// run: A starts each job from the sandbox's standby exec helper (the default), B spawns a helper
// per job from this process (jobsFromStandby: false); the two alternate (order swapped every
// run), each in its own runtime and sandbox, and each run first waits (bounded) until the
// sandbox's standby is ready, as an agent's next command comes later than its preparation.
// C is A without the job cgroup made ahead (spareJobCgroups off: the mkdir on the start's path).
// Beside them the floor of a buffered exec of the same command (standby helper) in A's sandbox.
// Measured at the Runtime, not through the HTTP API (the client-side number of the target adds
// the API layer on top). Also the stream throughput of a job writing to stdout
// (`head -c 256M /dev/zero`, read back with readJob in 4 MiB reads from the start to its end: the
// supervisor's spool write plus the reader's long polls), the median of 3.
//   npx tsx bench/jobs.ts [--runs N]       (needs root: namespaces, cgroups)
import { mkdtempSync, readlinkSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ProcboxCore } from '../native/procbox/core.js';
import type { Standby } from '../native/procbox/exec.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { spareJobCgroups } from '../native/procbox/jobs.js';
import { SpawnedHelper } from '../native/procbox/spawner.js';
import { arg, median, percentile, section } from './lib.js';

const runs = arg('runs', 50);
const arms = [
  [true, true],
  [false, true],
  [true, false],
].map(([jobsFromStandby, spare]) => {
  const stateDir = mkdtempSync(join(tmpdir(), 'bench-jobs-'));
  return {
    stateDir,
    spare: spare!,
    rt: new ProcboxRuntime({ stateDir, jobsFromStandby }),
    first: [] as number[],
    start: [] as number[],
    standbys: [] as Standby[],
  };
});
const [A, B, C] = arms as [(typeof arms)[0], (typeof arms)[0], (typeof arms)[0]];
const rt = A.rt;
const core = (r: ProcboxRuntime) => (r as unknown as { pb: ProcboxCore }).pb;
/**
 * Until the sandbox's standby helper is ready, at most 2 s: its pid known, its sockets connected, and it has joined
 * the sandbox (exec.c joins the cgroups, then the namespaces, the mount namespace last, and then waits for the
 * request). Its pid alone is not enough: a start that comes while the standby still migrates into the sandbox's v1
 * cgroups (an RCU grace period each) waits for that too, which an agent's next command, coming later, does not.
 */
async function standbyReady(r: ProcboxRuntime): Promise<void> {
  const init = (await r.inspect('b')).pid!;
  const mnt = (pid: number) => {
    try {
      return readlinkSync(`/proc/${pid}/ns/mnt`);
    } catch {
      return undefined;
    }
  };
  const ready = () => {
    const c = core(r).standbys.get('b')?.child;
    return !!c?.pid && (!(c instanceof SpawnedHelper) || c.connected) && mnt(c.pid) === mnt(init);
  };
  for (let i = 0; i < 400 && !ready(); i++) await new Promise((ok) => setTimeout(ok, 5));
}
const load0 = loadavg()[0]!;
try {
  for (const a of arms) {
    await a.rt.start();
    await a.rt.create({ id: 'b', resources: { memoryBytes: 256 << 20, pids: 256 } });
    await a.rt.exec('b', { argv: ['true'] }); // warm
  }
  const exec: number[] = [];
  for (let i = 0; i < runs; i++) {
    for (const a of [
      [A, B, C],
      [C, A, B],
      [B, C, A],
    ][i % 3]!) {
      // Every arm's standby, not only this one's: a standby joining its cgroups holds the kernel's cgroup
      // threadgroup lock, which every fork and clone on the host waits for, so another arm's preparation
      // would be timed as this arm's start.
      for (const o of arms) await standbyReady(o.rt);
      const sb = core(a.rt).standbys.get('b');
      spareJobCgroups.enabled = a.spare;
      const t0 = performance.now();
      await a.rt.startJob('b', { id: `j${i}`, argv: ['sh', '-c', 'echo x'] });
      const t1 = performance.now();
      const r = await a.rt.readJob('b', `j${i}`, { stream: 'stdout', offset: 0, maxBytes: 16, waitMs: 5000 });
      const t2 = performance.now();
      if (r.data.toString() !== 'x\n') throw new Error(`job j${i}: got ${JSON.stringify(r.data.toString())}`);
      if (sb) a.standbys.push(sb);
      a.start.push(t1 - t0);
      a.first.push(t2 - t0);
    }
    await standbyReady(rt);
    const t3 = performance.now();
    await rt.exec('b', { argv: ['sh', '-c', 'echo x'] });
    exec.push(performance.now() - t3);
  }
  const MiB = 1 << 20;
  const total = 256 * MiB;
  spareJobCgroups.enabled = true;
  const rates: number[] = [];
  for (let k = 0; k < 3; k++) {
    const id = `tp${k}`;
    const t0 = performance.now();
    await rt.startJob('b', { id, argv: ['head', '-c', String(total), '/dev/zero'], maxOutputBytes: total });
    let offset = 0;
    for (;;) {
      const r = await rt.readJob('b', id, { stream: 'stdout', offset, maxBytes: 4 * MiB, waitMs: 5000 });
      offset = r.nextOffset;
      if (r.eof) break;
    }
    const s = (performance.now() - t0) / 1000;
    if (offset !== total) throw new Error(`job ${id}: read ${offset} bytes, not ${total}`);
    rates.push(total / MiB / s);
  }
  const f = (x: number) => x.toFixed(1);
  // A standby that ran a job relayed its report and exited 0; one not taken was killed (or is still waiting).
  const ran = (a: typeof A) => a.standbys.filter((sb) => sb.state.exited && sb.child.exitCode === 0).length;
  const load1 = loadavg()[0]!;
  const row = (what: string, xs: number[]) =>
    `| ${what} | ${f(median(xs))} | ${f(percentile(xs, 95))} | ${f(percentile(xs, 99))} |`;
  section('jobs (procbox)', [
    `${runs} runs per arm, A, B and C in rotated order, one sandbox each, \`sh -c 'echo x'\`; ms; load ${load0.toFixed(1)} -> ${load1.toFixed(1)}.`,
    '',
    '| measure | p50 | p95 | p99 |',
    '|---|---|---|---|',
    row('A: job start -> first output byte, from the standby helper (startJob + readJob long poll)', A.first),
    row('A: of which startJob', A.start),
    row('B: job start -> first output byte, a helper spawned per job', B.first),
    row('B: of which startJob', B.start),
    row('C: as A, the job cgroup made on the start (no spare)', C.first),
    row('C: of which startJob', C.start),
    row('floor: buffered exec of the same command (standby helper)', exec),
    '',
    `Jobs that ran in a standby helper: A ${ran(A)} of ${runs}, B ${ran(B)} of ${runs}, C ${ran(C)} of ${runs}.`,
    '',
    `B/A at p50: ${(median(B.first) / median(A.first)).toFixed(2)}x (target: A <= 10 ms p50).`,
    '',
    `Stream throughput, a job writing 256 MiB to stdout read back to its end (startJob + readJob, 4 MiB reads), median of 3: **${f(median(rates))} MiB/s** (runs: ${rates.map(f).join(', ')}; target >= 200).`,
  ]);
} finally {
  for (const a of arms) {
    for (const sb of await a.rt.list()) await a.rt.destroy(sb.id);
    await a.rt.close();
    rmSync(a.stateDir, { recursive: true, force: true });
  }
}
