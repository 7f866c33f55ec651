// The node's own runtime for embedded mode (`fluxctl serve`): procbox always, and the QEMU
// microVM backend beside it when QEMU is installed, behind one RuntimeRouter so a Sandbox's
// spec.runtime picks the backend (native/router.ts).
//
// Layout under <state-dir>/runtime: procbox keeps <state-dir>/runtime/procbox (its own
// subdirectory), vm <state-dir>/runtime/vm. The vm directory is created only when QEMU exists
// (VmRuntime.start), so a host without QEMU serves procbox as before and a `runtime: vm`
// Sandbox there fails with RuntimeUnavailable. Any --state-dir length works: the VM backend
// keeps QEMU's unix sockets in a short per-runtime directory and links them from the state dir.
import path from 'node:path';
import { ProcboxRuntime, type ProcboxOptions } from '../../native/procbox/procbox.js';
import { RuntimeRouter } from '../../native/router.js';
import { withIdle, type IdleRuntime } from '../../native/idle.js';
import { qemuInstalled } from '../../native/vm/qemu.js';
import { VmRuntime } from '../../native/vm/vm.js';
import type { Logger } from '../../runtime/controller/index.js';
import { instrumentOperations, type Metrics } from '../../runtime/metrics/metrics.js';
import type { Runtime } from '../../native/runtime.js';
import { DEFAULT_WARM_POOL } from './warm-pool.js';

export interface LocalRuntimeOptions {
  /** Leave the vm backend out even when QEMU is installed. */
  noVm?: boolean;
  /** Limits of sandboxes without spec.resources, disk quota, warm pool (--default-*, --no-disk-quota, --warm-pool). */
  sandboxDefaults?: SandboxDefaults;
  /** The host egress proxy (cmd/fluxctl/egress.ts): network mode allowList of procbox and vm sandboxes leads to it. */
  egress?: ProcboxOptions['egress'];
  /** Times create, exec, fork, checkpoint and restore per backend (fluxvm_runtime_operation_duration_seconds). */
  metrics?: Metrics;
}

const TIMED_OPERATIONS = ['create', 'exec', 'fork', 'checkpoint', 'restore'] as const;

export type SandboxDefaults = Pick<ProcboxOptions, 'defaultLimits' | 'diskQuota' | 'warmPool'>;

/** Builds (does not start) the router; never throws for a missing QEMU (vm is just absent). */
export function localRuntime(stateDir: string, log: Logger, o: LocalRuntimeOptions = {}): RuntimeRouter & IdleRuntime {
  const dir = path.join(stateDir, 'runtime');
  const pbLog = log.child?.({ component: 'procbox' }) ?? log;
  const vmLog = log.child?.({ component: 'vm' }) ?? log;
  const procbox = new ProcboxRuntime({
    stateDir: dir,
    warmPool: DEFAULT_WARM_POOL, // unless sandboxDefaults says (--warm-pool)
    ...o.sandboxDefaults,
    egress: o.egress,
    log: (m, f) => pbLog.error(m, f),
  });
  const vm =
    !o.noVm && qemuInstalled()
      ? new VmRuntime({ stateDir: path.join(dir, 'vm'), egress: o.egress, log: (m) => vmLog.info(m) })
      : undefined;
  if (!vm && !o.noVm) log.info('qemu-system-x86_64 / qemu-img not found: the vm runtime is not available on this node');
  const timed = (rt: Runtime | undefined, backend: string) =>
    rt && o.metrics ? instrumentOperations(rt, backend, TIMED_OPERATIONS, o.metrics) : rt;
  // Idle standby and wake-on-use (native/idle.ts) around the router.
  return withIdle(
    new RuntimeRouter({
      backends: { procbox: timed(procbox, 'procbox'), vm: timed(vm, 'vm') },
      defaultBackend: 'procbox',
      log: (m, f) => log.error(m, f),
    }),
  );
}
