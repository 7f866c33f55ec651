// Idle standby of a procbox sandbox (Runtime.standby/wake; the policy is native/idle.ts): every
// process of the sandbox is frozen by its cgroup freezer (v2 cgroup.freeze until cgroup.events
// says frozen 1; v1 freezer.state FROZEN) and thawed by wake. The record says `standby` on disk
// before the freeze and stops saying it before the thaw, so a restart of the runtime finds a
// standby sandbox still frozen (start() leaves it frozen) and never leaves a sandbox frozen that its
// record says is awake (start() thaws those). A frozen sandbox keeps its limits: its memory stays
// charged to its own cgroup and a frozen task takes no CPU; the pids it holds count as before.
// A sandbox paused by the user (spec.paused) is not put on standby; an init that died loses its
// standby (it restarts running, in new cgroups).
import { RuntimeError } from '../runtime.js';
import type { ProcboxCore } from './core.js';

export async function standby(pb: ProcboxCore, id: string): Promise<void> {
  pb.ensureStarted();
  await pb.locked(id, async () => {
    const rec = pb.rec(id);
    if (rec.standby) return;
    if (rec.paused) throw new RuntimeError('Conflict', `sandbox ${id} is paused`);
    if (!pb.alive(rec)) throw new RuntimeError('Conflict', `sandbox ${id} is not running`);
    rec.standby = true;
    pb.save(rec);
    try {
      await pb.cgroups(id).setFrozen(true);
    } catch (e) {
      delete rec.standby;
      pb.save(rec);
      if (!rec.frozen)
        await pb
          .cgroups(id)
          .setFrozen(false)
          .catch(() => undefined);
      throw e;
    }
  });
}

/** Thaws a sandbox on standby; false when it was not on standby (nothing done). */
export async function wake(pb: ProcboxCore, id: string): Promise<boolean> {
  pb.ensureStarted();
  return pb.locked(id, async () => {
    const rec = pb.records.get(id);
    if (!rec?.standby) return false;
    delete rec.standby;
    pb.save(rec);
    // A freeze hold or a pause keeps it frozen (their own thaw/resume lets it go).
    if (pb.alive(rec) && !rec.frozen && !rec.paused) await pb.cgroups(id).setFrozen(false);
    return true;
  });
}
