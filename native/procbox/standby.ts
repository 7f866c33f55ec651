// Standby exec helpers: one `procbox exec PID WS -` per sandbox, spawned ahead of its next
// command (after a create or fork, and after each command). It joins the sandbox's cgroups and
// namespaces while nothing waits for it, so a command pays neither the fork of the server
// (spawn blocks the event loop until the child has exec'd) nor the v1 cgroup migration (an RCU
// grace period). Single use: the request (cwd, confinement, argv, env) comes on its stdin and
// it runs exactly as a freshly spawned helper (procbox.c cmd_exec). At most MAX_STANDBY are
// kept, the most recently used sandboxes'. A standby that died, or whose sandbox's init or
// cgroups changed (restart, limits), is not used (standbyKey), and a command spawns its helper.
// An idle standby is one task of the sandbox's pids cgroup (a command's helper is one too while
// it runs); none is spawned while a command of the sandbox runs, so a helper never counts twice
// against the pids limit (the standby would take the slot the running helper's command needs).
// It is killed with the sandbox. Standbys are started by the runtime's spawner (spawner.ts: a
// fork of a small static process instead of a fork of this Node process), started at the first
// standby and ended with the runtime (dropAllStandbys); without one, Node spawns the helper.
import { SandboxCgroups } from './cgroups.js';
import { procStart, type ProcboxCore } from './core.js';
import { spawnStandby, standbyKey, type ExecSpec, type Standby } from './exec.js';
import { Spawner } from './spawner.js';

const spawners = new WeakMap<ProcboxCore, Spawner>();
/** When the runtime's next standby may start (pacing, prepareStandby). */
const nextStandby = new WeakMap<ProcboxCore, number>();
/**
 * Least time between two standby starts. Unpaced, a fork of 32 through the API became ~1.8x slower with the spawner
 * (its helpers all joining their cgroups at once); paced, it is as fast as or faster than with Node's spawns.
 */
export const STANDBY_PACE_MS = 4;

/** The runtime's spawner, started on first use (again after one ended); undefined once the runtime is closed. */
export function spawnerOf(pb: ProcboxCore): Spawner | undefined {
  if (pb.closed) return undefined;
  let s = spawners.get(pb);
  if (!s || s.dead) {
    try {
      s = new Spawner(pb.helper);
    } catch (e) {
      pb.logFailure('procbox: starting the standby spawner failed', undefined, e);
      return undefined;
    }
    spawners.set(pb, s);
  }
  return s;
}

/** Standby helpers kept at most (one per sandbox, the most recently used ones). */
export const MAX_STANDBY = 32;

/**
 * Delay between a command's end and its successor's standby: the spawn blocks the event loop
 * for a few ms, which should not land on what the caller does right after the command (a
 * checkpoint, a fork, the next command); an agent's next command comes later than this.
 */
export const AFTER_EXEC_DELAY_MS = 100;

type Target = Pick<ExecSpec, 'helper' | 'pid' | 'workspacePath' | 'cgroupProcs' | 'cgroupDir'>;

function target(pb: ProcboxCore, id: string): { spec: Target; pidStart?: string } | undefined {
  const rec = pb.records.get(id);
  if (!rec?.pid || rec.paused || rec.destroying || !pb.alive(rec)) return undefined;
  const t = pb.cgroups(id).execTargets();
  return {
    spec: {
      helper: pb.helper,
      pid: rec.pid,
      workspacePath: rec.workspacePath,
      cgroupProcs: t.v1Procs,
      cgroupDir: t.v2Dir,
    },
    pidStart: rec.pidStart,
  };
}

/**
 * Takes the sandbox's standby if it matches `spec` (same init and cgroups) and is still waiting; kills one that does
 * not.
 */
export function takeStandby(pb: ProcboxCore, id: string, spec: ExecSpec): Standby | undefined {
  const s = pb.standbys.get(id);
  if (!s) return undefined;
  pb.standbys.delete(id);
  const rec = pb.records.get(id);
  // Its exit may not have reached the event loop yet: /proc says whether it still waits.
  if (!s.state.exited && s.child.pid && procStart(s.child.pid) && rec && s.key === standbyKey(spec, rec.pidStart))
    return s;
  s.child.kill('SIGKILL');
  return undefined;
}

/**
 * When the next standby of this runtime may start (and books it): `delayMs` from `now`, and at least
 * STANDBY_PACE_MS after the one booked before it. Exported for the pacing's test.
 */
export function standbyStartAt(pb: ProcboxCore, delayMs: number, now = Date.now()): number {
  const at = Math.max(now + Math.max(0, delayMs), (nextStandby.get(pb) ?? 0) + STANDBY_PACE_MS);
  nextStandby.set(pb, at);
  return at;
}

/**
 * Spawns a standby for sandbox `id` after `delayMs` (0: on the next turn of the event loop,
 * after the caller's continuation), unless it has one, is not running, a command of it runs,
 * or the runtime is closing.
 */
export function prepareStandby(pb: ProcboxCore, id: string, delayMs = 0): void {
  if (pb.closed || pb.standbys.has(id) || pb.standbyPending.has(id) || pb.execsRunning.has(id)) return;
  pb.standbyPending.add(id);
  const spawnIt = () => {
    pb.standbyPending.delete(id);
    if (pb.closed || pb.standbys.has(id) || pb.execsRunning.has(id)) return;
    const t = target(pb, id);
    if (!t || procStart(t.spec.pid) !== t.pidStart) return;
    let s: Standby;
    try {
      s = spawnStandby(t.spec, t.pidStart, spawnerOf(pb));
    } catch (e) {
      return pb.logFailure('procbox: starting a standby exec helper failed', id, e);
    }
    pb.standbys.set(id, s);
    void s.state.gone.then(() => {
      if (pb.standbys.get(id) === s) pb.standbys.delete(id);
    });
    for (const [old, o] of pb.standbys) {
      if (pb.standbys.size <= MAX_STANDBY) break;
      pb.standbys.delete(old);
      o.child.kill('SIGKILL');
    }
  };
  // Paced: the helpers of a fork's children would otherwise all join their v1 cgroups at once, and each
  // migration holds the kernel's threadgroup lock for writing (every fork on the host waits on it).
  const at = standbyStartAt(pb, delayMs);
  const wait = at - Date.now();
  if (wait <= 0) setImmediate(spawnIt);
  else setTimeout(spawnIt, wait).unref();
}

/**
 * A command of sandbox `id` starts: its helper is the standby if one matches (takeStandby), else, with `now`, one the
 * spawner starts for it at once (a command that comes before its standby, e.g. within AFTER_EXEC_DELAY_MS of the last,
 * would otherwise fork this Node process: 3-30 ms of blocked event loop); none is spawned until the last running one
 * ends.
 */
export function execBegins(
  pb: ProcboxCore,
  id: string,
  spec: ExecSpec,
  useStandby: boolean,
  now = false,
): Standby | undefined {
  pb.execsRunning.set(id, (pb.execsRunning.get(id) ?? 0) + 1);
  if (!useStandby) return undefined;
  return takeStandby(pb, id, spec) ?? (now ? standbyNow(pb, id, spec) : undefined);
}

/** A standby for this command, started by the spawner at once; undefined without a spawner (Node spawns the helper). */
function standbyNow(pb: ProcboxCore, id: string, spec: ExecSpec): Standby | undefined {
  if (pb.closed) return undefined;
  const spawner = spawnerOf(pb);
  if (!spawner) return undefined;
  try {
    return spawnStandby(spec, pb.records.get(id)?.pidStart, spawner);
  } catch (e) {
    pb.logFailure('procbox: starting an exec helper through the spawner failed', id, e);
    return undefined;
  }
}

/** A command of sandbox `id` ended: the last one running spawns the next command's standby. */
export function execEnds(pb: ProcboxCore, id: string): void {
  const n = (pb.execsRunning.get(id) ?? 1) - 1;
  if (n > 0) return void pb.execsRunning.set(id, n);
  pb.execsRunning.delete(id);
  prepareStandby(pb, id, AFTER_EXEC_DELAY_MS);
}

/**
 * The standby of a warm pool init, spawned with it (the refill runs in the background): the
 * sandbox that takes the init takes it too. Its cgroups are those the init was born in (the
 * default limits'), the sandbox's own; the init's workspace is attached later in the same mount
 * namespace. Undefined when it cannot be spawned (the take then spawns one as for a cold init).
 */
export function poolStandby(
  pb: ProcboxCore,
  pid: number,
  pidStart: string | undefined,
  cgroupKey: string,
): Standby | undefined {
  if (!pidStart) return undefined;
  const t = new SandboxCgroups(pb.cg, cgroupKey, pb.effectiveLimits({})).execTargets();
  try {
    return spawnStandby(
      { helper: pb.helper, pid, workspacePath: '/work', cgroupProcs: t.v1Procs, cgroupDir: t.v2Dir },
      pidStart,
      spawnerOf(pb),
    );
  } catch (e) {
    pb.logFailure('procbox: starting the standby exec helper of a pool init failed', undefined, e);
    return undefined;
  }
}

/** Ends the sandbox's standby (teardown, restart). */
export function dropStandby(pb: ProcboxCore, id: string): void {
  const s = pb.standbys.get(id);
  pb.standbys.delete(id);
  s?.child.kill('SIGKILL');
}

/** Ends every standby and the spawner (close). */
export function dropAllStandbys(pb: ProcboxCore): void {
  for (const id of [...pb.standbys.keys()]) dropStandby(pb, id);
  spawners.get(pb)?.stop();
  spawners.delete(pb);
}
