// Starting and ending sandbox inits: one helper run starts the inits of a create or a fork
// (warm ones first, pool.ts), a dead init is restarted on its workspace, and a teardown takes
// everything of a sandbox away (a crash midway is finished by the next start()).
import { mkdirSync, readdirSync, renameSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { RuntimeError } from '../runtime.js';
import { configText } from './config.js';
import { procStart, type ProcboxCore } from './core.js';
import { allocateIndex, setupNetwork, teardownNetwork } from './network.js';
import { launchWarm } from './pool.js';
import { dropStandby, prepareStandby } from './standby.js';
import { DESTROYING_RECORD, type SandboxRecord } from './state.js';

/** Starts inits for `recs` in one helper run; sets pid and saves each. */
export async function launch(pb: ProcboxCore, all: SandboxRecord[]): Promise<void> {
  if (all.length === 0) return;
  const recs = await launchWarm(pb, all);
  if (recs.length === 0) return;
  const configs = recs.map((r) => {
    mkdirSync(join(pb.sbxDir(r.id), 'root'), { recursive: true });
    return configText(pb, r);
  });
  // One helper per core (each sets its inits up concurrently): an init costs a few ms of
  // kernel time (clone, ~20 mounts). The configs go over stdin: no file per init.
  const n = Math.min(availableParallelism(), Math.ceil(recs.length / 8));
  const chunks = Array.from({ length: n }, (_, k) => recs.map((_, i) => i).filter((i) => i % n === k));
  const answers = await Promise.all(
    chunks.map((idx) => pb.fileops.run(['init', '-'], idx.map((i) => configs[i]! + '\0').join(''))),
  );
  const errors: string[] = [];
  chunks.forEach((idx, k) => {
    const res = answers[k]!;
    const lines = res.stdout.split('\n').filter(Boolean);
    idx.forEach((i, j) => {
      const r = recs[i]!;
      const line = lines[j] ?? `err ${res.stderr.trim() || `no answer (the helper exited ${res.code})`}`;
      if (line.startsWith('ok ')) {
        r.pid = Number(line.slice(3));
        r.pidStart = procStart(r.pid);
        r.paused = false;
        delete r.standby; // a new init in new cgroups runs
        pb.save(r);
      } else errors.push(`${r.id}: ${line.slice(4)}`);
    });
  });
  if (errors.length) throw new RuntimeError('Internal', `procbox init failed: ${errors.join('; ')}`);
}

/**
 * Starts a new init for a sandbox whose init is gone, on its workspace as it is (`restarted`). Under the sandbox's
 * lock.
 */
export async function restart(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  dropStandby(pb, rec.id); // joined to the init that is gone
  await pb
    .allCgroups(rec.id)
    .destroy()
    .catch(() => undefined);
  if (rec.network.mode !== 'none') await teardownNetwork(pb.hostKey(rec.id));
  pb.bumpWork(rec);
  await launch(pb, [rec]);
  rec.network = await setupNetwork(pb.hostKey(rec.id), rec.pid!, rec.network, pb.egress);
  pb.attachEgress(rec);
  rec.restarted = true;
  pb.save(rec);
  // A freeze hold outlives the init it froze (start() drops the holds of a dead process first).
  if (rec.frozen) await pb.cgroups(rec.id).setFrozen(true);
}

/**
 * Brings a dead init back first (workspace intact); a live one is left alone. One whose start is under way (a
 * sibling's batched fork, bringUp) is waited for, not restarted: it has no init yet, and a restart would destroy the
 * cgroups that start is putting it in. A start that failed removed the record (pb.rec then says NotFound).
 */
export async function revive(pb: ProcboxCore, rec: SandboxRecord): Promise<void> {
  const starting = pb.launching.get(rec.id);
  if (starting) {
    await starting;
    rec = pb.rec(rec.id);
  }
  if (!pb.alive(rec)) await pb.locked(rec.id, () => (pb.alive(rec) ? Promise.resolve() : restart(pb, rec)));
}

/** Creates directories, cgroups, inits and networks for new records; undoes all on error. */
export async function bringUp(pb: ProcboxCore, recs: SandboxRecord[]): Promise<void> {
  const done = bringUpNow(pb, recs);
  const settled = done.then(
    () => undefined,
    () => undefined,
  );
  for (const rec of recs) pb.launching.set(rec.id, settled);
  try {
    await done;
  } finally {
    for (const rec of recs) if (pb.launching.get(rec.id) === settled) pb.launching.delete(rec.id);
  }
}

async function bringUpNow(pb: ProcboxCore, recs: SandboxRecord[]): Promise<void> {
  const used = new Set(
    [...pb.records.values()].map((r) => r.network.index).filter((i): i is number => i !== undefined),
  );
  for (const rec of recs) {
    mkdirSync(pb.sbxDir(rec.id), { recursive: true });
    if (rec.network.mode !== 'none') {
      // Recorded before the veth exists, so a crash leaves what to tear down.
      rec.network.index = allocateIndex(used);
      used.add(rec.network.index);
      pb.save(rec);
    } else {
      pb.records.set(rec.id, rec); // written by launch, once the init runs
    }
  }
  try {
    await launch(pb, recs); // creates the cgroups
    // Networks of a fork's children are set up 4 at a time (each is a few processes).
    const open = recs.filter((r) => r.network.mode !== 'none');
    for (let i = 0; i < open.length; i += 4) {
      await Promise.all(
        open.slice(i, i + 4).map(async (rec) => {
          rec.network = await setupNetwork(pb.hostKey(rec.id), rec.pid!, rec.network, pb.egress);
          pb.save(rec);
          pb.attachEgress(rec);
        }),
      );
    }
  } catch (err) {
    for (const rec of recs) await teardown(pb, rec.id).catch(() => undefined);
    throw err;
  }
  for (const rec of recs) prepareStandby(pb, rec.id); // their first command's helper
}

/** Everything of a sandbox goes: processes, cgroups, network, directory, record. */
export async function teardown(pb: ProcboxCore, id: string): Promise<void> {
  const rec = pb.records.get(id);
  dropStandby(pb, id);
  if (rec && !rec.destroying) {
    rec.destroying = true; // a crash from here on: start() finishes the teardown
    try {
      pb.save(rec);
    } catch (e) {
      // A full disk must not keep a delete from giving its space back: the record is renamed
      // instead (no new blocks), which start() reads as a teardown to finish.
      if ((e as NodeJS.ErrnoException).code !== 'ENOSPC' && (e as NodeJS.ErrnoException).code !== 'EDQUOT') throw e;
      renameSync(join(pb.sbxDir(id), 'sandbox.json'), join(pb.sbxDir(id), DESTROYING_RECORD));
    }
  }
  await pb.allCgroups(id).destroy(); // every hierarchy, used or not

  if (rec?.pid && pb.alive(rec)) {
    try {
      process.kill(rec.pid, 'SIGKILL'); // no cgroups on this host: the init takes its pid ns down
    } catch {
      // gone
    }
    for (let i = 0; i < 200 && pb.alive(rec); i++) await new Promise((r) => setTimeout(r, 5));
  }
  if (rec?.network.mode === 'allowList' && rec.network.address) pb.egress?.detach(rec.network.address);
  if (!rec || rec.network.mode !== 'none') await teardownNetwork(pb.hostKey(id));
  await pb.fileops.rmtree(pb.sbxDir(id)); // fd-based: trees deeper than PATH_MAX too
  if (rec?.vol) {
    try {
      const vols = join(pb.vs.dir, 'vols');
      for (const n of readdirSync(vols)) if (n.startsWith(`${id}~`)) await pb.fileops.rmtree(join(vols, n));
      pb.sizer?.released(); // the host gets the space back (volsize.ts)
    } catch (e) {
      // The volume store can be unusable (its loop image's disk filled up: btrfs answers EIO
      // until it is mounted again). The sandbox is gone all the same (processes, cgroups,
      // network, record): its volume, which nothing refers to any more, is removed by the next
      // start (sweepVolumes), so a delete never hangs on it.
      pb.logFailure(
        'procbox: the workspace volume of a deleted sandbox could not be removed now; the next start removes it',
        id,
        e,
      );
    }
  }
  pb.records.delete(id);
  pb.upperEntries.delete(id); // the snapshot switch's count (checkpoint.ts): nothing left to count
}

/**
 * At start, before any sandbox runs: removes the volumes (`vols/<id>~...`) of sandboxes that
 * have no record, left by a teardown that could not remove them (see teardown) or by a create
 * a crash cut short. A failure is logged; the next start tries again.
 */
export async function sweepVolumes(pb: ProcboxCore): Promise<void> {
  const vols = join(pb.vs.dir, 'vols');
  let names: string[];
  try {
    names = readdirSync(vols);
  } catch (e) {
    return pb.logFailure('procbox: listing the workspace volumes failed', undefined, e);
  }
  for (const n of names) {
    const owner = n.slice(0, n.indexOf('~'));
    if (n.includes('~') && !pb.records.has(owner)) {
      await pb.fileops
        .rmtree(join(vols, n))
        .catch((e) => pb.logFailure('procbox: removing the volume of a deleted sandbox failed', owner, e));
    }
  }
}
