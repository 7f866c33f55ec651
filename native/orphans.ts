// One call that releases what every runtime on this host left behind once its state directory
// is gone: procbox inits, cgroups, links, volume mounts and loop devices
// (procbox/orphans.ts), QEMU processes and VM links (vm/orphans.ts). Every `fluxctl serve` and
// node agent runs it at start; `fluxctl serve --gc-orphans` runs it alone.
import { collectProcboxOrphans } from './procbox/orphans.js';
import { collectVmOrphans } from './vm/orphans.js';

export const PROCBOX_MOUNT_BASE = '/run/fluxvm/procbox';

export interface Released {
  /** procbox runtimes (scopes) released. */
  procbox: string[];
  qemus: number[];
  vmLinks: string[];
}

/** Never throws; what fails is logged and tried again by the next call. */
export async function collectOrphans(
  log: (msg: string, fields?: Record<string, unknown>) => void = () => {},
): Promise<Released> {
  // nothing host-global is made without root
  if (process.getuid?.() !== 0) return { procbox: [], qemus: [], vmLinks: [] };
  const procbox = await collectProcboxOrphans(PROCBOX_MOUNT_BASE, log).catch(() => []);
  const vm = await collectVmOrphans(log).catch(() => ({ qemus: [], links: [] }));
  return { procbox, qemus: vm.qemus, vmLinks: vm.links };
}
