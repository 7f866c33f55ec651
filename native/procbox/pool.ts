// The warm pool (option warmPool, default 0): inits started ahead of time, without a
// workspace, in <root>/pool/<n>/. Taking one costs a rename of its root directory (the inotify
// lifeline follows the inode), the cgroup joins and an overlay attach: the clone, the
// namespaces and the ~20 mounts of the root are already done. Only sandboxes with the pool's
// workspace path (/work) use it. Deleting the pool directory ends every pool init. The pool's
// state (its inits, the running fill, the refill timer) is in the core.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, renameSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { SandboxCgroups } from './cgroups.js';
import { etcDir, initConfig, tmpfsLines } from './config.js';
import { procStart, type PoolInit, type ProcboxCore } from './core.js';
import { poolStandby } from './standby.js';
import type { SandboxRecord } from './state.js';

/** Delay between taking warm inits and starting their replacements. */
const REFILL_DELAY_MS = 100;

export function poolDir(pb: ProcboxCore): string {
  return join(pb.root, 'pool');
}

/**
 * Refills the pool a little later: right after a take, the new sandbox's first steps (its
 * caller marking it Ready, a first exec) should not compete with starting inits.
 */
export function refillSoon(pb: ProcboxCore): void {
  if (pb.refillTimer || pb.closed) return;
  pb.refillTimer = setTimeout(() => {
    pb.refillTimer = undefined;
    void refill(pb).catch((e) => pb.logFailure('procbox: refilling the warm pool failed', undefined, e));
  }, REFILL_DELAY_MS);
  pb.refillTimer.unref();
}

/** Starts pool inits up to warmPool. Safe to call often; one fill runs at a time. */
export function refill(pb: ProcboxCore): Promise<void> {
  if (pb.warmPool <= 0 || pb.closed || pb.filling) return pb.filling ?? Promise.resolve();
  const need = pb.warmPool - pb.pool.length;
  if (need <= 0) return Promise.resolve();
  pb.filling = (async () => {
    const entries = Array.from({ length: need }, () => {
      const name = `w${randomBytes(6).toString('hex')}`;
      return { dir: join(poolDir(pb), name), cgroupKey: `${pb.scope}.pool-${name}` };
    });
    const files = entries.map(({ dir, cgroupKey }) => {
      mkdirSync(join(dir, 'root'), { recursive: true });
      // Born in the cgroups it will keep as a sandbox, those of the default limits (the only
      // sandboxes that take pool inits): moving a running task into a v1 cgroup waits for an RCU
      // grace period, and it would be a synchronous write on the event loop at take time.
      const cg = new SandboxCgroups(pb.cg, cgroupKey, pb.effectiveLimits({}));
      cg.create(pb.effectiveLimits({}));
      const lines = [
        `pool 1`,
        `root ${join(dir, 'root')}`,
        `etc ${etcDir(pb, 'sandbox')}`,
        `ws /work`,
        `hostname sandbox`,
        ...tmpfsLines(pb.effectiveLimits({})),
        `uidmap 0 ${pb.uidBase} 65536`,
        `gidmap 0 ${pb.uidBase} 65536`,
        ...cg.procsFiles().map((f) => `cgroup ${f}`),
      ];
      writeFileSync(join(dir, 'init.conf'), lines.join('\n') + '\n');
      return join(dir, 'init.conf');
    });
    const res = await pb.fileops.run(['init', ...files]);
    const lines = res.stdout.split('\n').filter(Boolean);
    entries.forEach((e, i) => {
      const line = lines[i] ?? '';
      if (!line.startsWith('ok ')) return void dropPoolInit(pb, e);
      const pid = Number(line.slice(3));
      const pidStart = procStart(pid);
      // The first command's helper too: it is spawned here, off the path of a create or fork.
      pb.pool.push({ ...e, pid, pidStart, standby: poolStandby(pb, pid, pidStart, e.cgroupKey) });
    });
  })().finally(() => {
    pb.filling = undefined;
  });
  return pb.filling;
}

/** Ends a pool init that is not used: its directory (the lifeline) and its cgroup. */
export function dropPoolInit(
  pb: ProcboxCore,
  e: { dir: string; cgroupKey: string; standby?: PoolInit['standby'] },
): void {
  e.standby?.child.kill('SIGKILL');
  rmSync(e.dir, { recursive: true, force: true });
  void new SandboxCgroups(pb.cg, e.cgroupKey).destroy().catch(() => undefined);
}

/** Removes the cgroups of pool inits not in the pool (a previous run's, or after close). */
export async function dropPoolCgroups(pb: ProcboxCore): Promise<void> {
  const parent = pb.cg.v2 ? join(pb.cg.v2, 'fluxvm') : pb.cg.v1.freezer ? join(pb.cg.v1.freezer, 'fluxvm') : undefined;
  if (!parent || !existsSync(parent)) return;
  // Sandboxes made from pool inits keep those cgroups.
  const keep = new Set([...pb.pool.map((e) => e.cgroupKey), ...[...pb.records.values()].map((r) => r.cgroupKey)]);
  const stale = readdirSync(parent).filter((n) => n.startsWith(`${pb.scope}.pool-`) && !keep.has(n));
  await Promise.all(stale.map((n) => new SandboxCgroups(pb.cg, n).destroy().catch(() => undefined)));
}

/**
 * Removes the empty cgroups of this state directory (`<scope>.*`, every hierarchy) that no
 * sandbox or pool init uses: those of sandboxes whose init ended without a destroy (state
 * directory removed: lifeline) or of a run that crashed. A populated cgroup is left alone
 * (rmdir fails with EBUSY).
 */
export function dropEmptyCgroups(pb: ProcboxCore): void {
  const keep = new Set([
    ...pb.pool.map((e) => e.cgroupKey),
    ...[...pb.records.values()].map((r) => r.cgroupKey ?? pb.hostKey(r.id)),
  ]);
  const mounts = new Set([...Object.values(pb.cg.v1), pb.cg.v2].filter((m): m is string => !!m));
  for (const m of mounts) {
    const parent = join(m, 'fluxvm');
    let names: string[];
    try {
      names = readdirSync(parent);
    } catch {
      continue;
    }
    for (const n of names) {
      if (!n.startsWith(`${pb.scope}.`) || keep.has(n)) continue;
      try {
        rmdirSync(join(parent, n));
      } catch {
        // populated (or not a cgroup): not ours to end here
      }
    }
  }
}

/**
 * Gives pool inits to the records that can use one (they keep the init's cgroup, see
 * `cgroupKey`); creates the cgroups of the others; returns the records still to launch.
 */
export async function launchWarm(pb: ProcboxCore, recs: SandboxRecord[]): Promise<SandboxRecord[]> {
  const cold: SandboxRecord[] = [];
  const warm: ({ rec: SandboxRecord } & PoolInit)[] = [];
  for (const rec of recs) {
    let e = pb.pool.shift();
    while (e && !(e.pidStart && procStart(e.pid) === e.pidStart)) {
      dropPoolInit(pb, e);
      e = pb.pool.shift();
    }
    // A pool init's tmpfs mounts are sized for the default memory limit.
    if (
      !e ||
      rec.network.mode === 'allowList' ||
      rec.workspacePath !== '/work' ||
      rec.hostname !== 'sandbox' ||
      rec.volumes?.length || // bound before pivot_root (binds.c): a warm init has its root already
      pb.limitsOf(rec)?.tmpfsBytes !== pb.effectiveLimits({}).tmpfsBytes
    ) {
      if (e) pb.pool.unshift(e);
      pb.cgroups(rec.id).create(pb.limitsOf(rec)!);
      cold.push(rec);
      continue;
    }
    const root = join(pb.sbxDir(rec.id), 'root');
    rmSync(root, { recursive: true, force: true });
    renameSync(join(e.dir, 'root'), root);
    const own = rec.cgroupKey;
    rec.cgroupKey = e.cgroupKey;
    try {
      // The init was born in the cgroups of the default limits (refill): a sandbox with exactly
      // those needs no cgroup write at all. Each mkdir and limit write is a synchronous syscall
      // on the event loop (about 0.3 ms together here, 4 ms when a refill holds the kernel's
      // cgroup lock), on the path of the create.
      const limits = pb.limitsOf(rec)!;
      if (!isDeepStrictEqual(limits, pb.effectiveLimits({}))) {
        // Only v1 hierarchies the init was not born in still need a move of the running init.
        const cg = pb.cgroups(rec.id);
        cg.create(limits);
        const born = new Set(new SandboxCgroups(pb.cg, e.cgroupKey, pb.effectiveLimits({})).execTargets().v1Procs);
        for (const f of cg.execTargets().v1Procs) if (!born.has(f)) writeFileSync(f, String(e.pid));
      }
    } catch {
      try {
        process.kill(e.pid, 'SIGKILL');
      } catch {
        // gone
      }
      dropPoolInit(pb, e);
      rec.cgroupKey = own;
      pb.cgroups(rec.id).create(pb.limitsOf(rec)!);
      cold.push(rec);
      continue;
    }
    warm.push({ rec, ...e });
  }
  if (warm.length) {
    // One helper per core, as in launch: an overlay mount is milliseconds of kernel time.
    const n = Math.min(availableParallelism(), Math.ceil(warm.length / 8));
    const chunks = Array.from({ length: n }, (_, k) => warm.filter((_, i) => i % n === k));
    const answers = await Promise.all(
      chunks.map((c) => pb.fileops.run(['attach', ...c.flatMap((w) => [String(w.pid), initConfig(pb, w.rec)])])),
    );
    const lines = warm.map((_, i) => answers[i % n]!.stdout.split('\n').filter(Boolean)[Math.floor(i / n)]);
    warm.forEach((w, i) => {
      // Its config is all that is left in the pool directory: removed off the event loop (a
      // synchronous recursive rm is 0.5 ms here, on the path of the create); a crash before it
      // leaves a directory the next start's pool cleanup removes.
      void rm(w.dir, { recursive: true, force: true }).catch(() => undefined);
      if (lines[i] === 'ok') {
        Object.assign(w.rec, { pid: w.pid, pidStart: w.pidStart, paused: false });
        pb.save(w.rec);
        if (w.standby) pb.standbys.set(w.rec.id, w.standby); // takeStandby checks it matches
      } else {
        w.standby?.child.kill('SIGKILL');
        try {
          process.kill(w.pid, 'SIGKILL');
        } catch {
          // gone
        }
        void new SandboxCgroups(pb.cg, w.cgroupKey).destroy().catch(() => undefined);
        delete w.rec.cgroupKey;
        pb.cgroups(w.rec.id).create(pb.limitsOf(w.rec)!);
        cold.push(w.rec);
      }
    });
  }
  if (warm.length) refillSoon(pb);
  return cold;
}
