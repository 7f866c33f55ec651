// Idle standby of a VM sandbox (Runtime.standby/wake; the policy is native/idle.ts): the guest is
// paused with QMP `stop` (every vCPU stops; QEMU, its RAM and the agent channel stay) and continued
// with `cont`. Why not a snapshot to disk: a stopped guest wakes in one QMP round trip (the target is
// 150 ms from wake to a command's output); a memory checkpoint and restore cost seconds here and
// would give back only the guest's RAM, which a sandbox on standby still holds (cgroup-frozen
// procbox sandboxes hold theirs too).
// Order, as procbox's: the record (vm.json `standby`) reaches disk before `stop`, and stops saying
// it before `cont`, so a restart of the runtime finds a standby VM still stopped (start() keeps it
// stopped, and stops one whose record says standby but runs) and never leaves stopped a VM whose
// record says it runs (start() continues it). A VM paused by the user (Runtime.pause) is not put on
// standby, and a wake leaves a user's pause in place.
// While stopped, the agent channel holds its timeouts (AgentChannel.hold): the guest cannot answer,
// so the time is not held against it; they count again from `cont`.
import { RuntimeError } from '../runtime.js';
import type { VmHost } from './host.js';
import { fsyncPath } from './migrate.js';
import { join } from 'node:path';
import type { Vm } from './state.js';

async function saveDurably(h: VmHost, vm: Vm): Promise<void> {
  h.saveMeta(vm);
  await fsyncPath(join(vm.dir, 'vm.json'));
  await fsyncPath(vm.dir);
}

export async function standbyVm(h: VmHost, id: string): Promise<void> {
  const vm = h.vm(id);
  await h.locked(vm, async () => {
    if (vm.meta.standby) return;
    if (vm.meta.failed) throw new RuntimeError('Conflict', `sandbox ${id} failed`);
    if (vm.meta.state === 'paused') throw new RuntimeError('Conflict', `sandbox ${id} is paused`);
    const qmp = h.qmpOf(vm);
    vm.meta.standby = true;
    await saveDurably(h, vm);
    vm.agent?.hold();
    try {
      await qmp.execute('stop');
    } catch (e) {
      delete vm.meta.standby;
      h.saveMeta(vm);
      vm.agent?.release();
      throw e;
    }
  });
}

/** Continues a VM on standby; false when it was not on standby (nothing done). */
export async function wakeVm(h: VmHost, id: string): Promise<boolean> {
  const vm = h.vms.get(id);
  if (!vm) return false;
  return h.locked(
    vm,
    async () => {
      if (!vm.meta.standby) return false;
      delete vm.meta.standby;
      h.saveMeta(vm);
      // A user's pause keeps it stopped (its resume continues it).
      if (vm.meta.state !== 'paused') await h.qmpOf(vm).execute('cont');
      vm.agent?.release();
      return true;
    },
    { wait: true },
  );
}

/**
 * start(): a VM adopted from a previous process whose record says standby or running. Standby: it
 * stays stopped (stopped again if the stop never happened). Running but stopped (a crash between the
 * record and `cont`, or mid-checkpoint): continued.
 */
export async function adoptRunState(
  qmp: { execute(cmd: string): Promise<unknown> },
  meta: { standby?: boolean; state: 'running' | 'paused' },
  status: string,
): Promise<void> {
  meta.state = 'running';
  if (meta.standby && status !== 'paused') await qmp.execute('stop');
  else if (!meta.standby && status === 'paused') await qmp.execute('cont');
}
