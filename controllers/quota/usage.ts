// What a Sandbox uses of a namespace's ResourceQuota beyond its count (the quota evaluators the
// API server's quota admission and the quota controller share). A Sandbox has one limit per
// resource, so its request equals its limit: memory, requests.memory and limits.memory are all
// spec.resources.memory; pids is spec.resources.pids; ephemeral-storage (and its requests. and
// limits. forms, kube's names for a pod's writable layer) is spec.resources.disk, the workspace's
// writable layer. A field left out is charged at the node default it runs with (the procbox
// defaults, or `fluxctl serve --default-memory/--default-pids/--default-disk`). A Volume uses
// requests.storage (kube's name for PersistentVolumeClaim bytes) = its spec.size. cpu,
// requests.cpu and limits.cpu are spec.resources.cpu in cores ("500m" = 0.5); a sandbox without it
// has no cpu limit on procbox, so there is no default to charge: a quota that limits cpu refuses
// its create with kube's "must specify requests.cpu". Pure functions.
import { parseCpu, parseMemory } from '../../apis/quantity.js';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { DEFAULT_LIMITS, type DefaultLimits } from '../../native/procbox/procbox.js';
import type { QuotaEvaluator } from '../../runtime/apiserver/admission/quota.js';
import type { KubeObject } from '../../runtime/meta/types.js';

export const MEMORY_NAMES = ['memory', 'requests.memory', 'limits.memory'];
export const PIDS_NAMES = ['pids'];
export const CPU_NAMES = ['cpu', 'requests.cpu', 'limits.cpu'];
export const STORAGE_NAMES = ['ephemeral-storage', 'requests.ephemeral-storage', 'limits.ephemeral-storage'];
/** A Volume's size, as kube names the bytes of PersistentVolumeClaims. */
export const VOLUME_STORAGE = 'requests.storage';

/** The defaults a Sandbox without spec.resources is charged at. */
export type QuotaDefaults = Pick<DefaultLimits, 'memoryBytes' | 'pids' | 'diskBytes'>;

let processDefaults: QuotaDefaults = { ...DEFAULT_LIMITS };

/**
 * Sets the defaults of this process's sandboxes (fluxctl serve's --default-* flags), once at start
 * before the API server and the controllers: the admission and the controller then charge alike.
 */
export function setQuotaDefaults(d: Partial<QuotaDefaults> | undefined): void {
  processDefaults = {
    ...DEFAULT_LIMITS,
    ...Object.fromEntries(Object.entries(d ?? {}).filter(([, v]) => v !== undefined)),
  } as QuotaDefaults;
}

function quantity(q: number | string | undefined, dflt: number): number {
  if (q === undefined) return dflt;
  try {
    return parseMemory(q);
  } catch {
    return dflt; // admission refuses a malformed quantity; an old stored one is charged the default
  }
}

/** The sums one Sandbox uses. */
export function sandboxUsage(obj: KubeObject, d: QuotaDefaults = processDefaults): Record<string, number> {
  const r = (obj as Sandbox).spec?.resources ?? {};
  const mem = quantity(r.memory, d.memoryBytes);
  const disk = quantity(r.disk, d.diskBytes);
  const out: Record<string, number> = {};
  for (const n of MEMORY_NAMES) out[n] = mem;
  out.pids = r.pids ?? d.pids;
  for (const n of STORAGE_NAMES) out[n] = disk;
  if (r.cpu !== undefined) {
    let cores = 0;
    try {
      cores = parseCpu(r.cpu) / 1000;
    } catch {
      cores = 0; // admission refuses a malformed quantity
    }
    for (const n of CPU_NAMES) out[n] = cores;
  }
  return out;
}

/** What one Volume uses: `requests.storage` (kube's name for PVC bytes) = spec.size. */
export function volumeUsage(obj: KubeObject): Record<string, number> {
  return { [VOLUME_STORAGE]: quantity((obj as { spec?: { size?: number | string } }).spec?.size, 0) };
}

/** The evaluators by `<plural>.<group>` (QuotaAdmission's and the controller's). */
export function quotaEvaluators(): Record<string, QuotaEvaluator> {
  return {
    'sandboxes.fluxvm.dev': {
      names: [...MEMORY_NAMES, ...PIDS_NAMES, ...STORAGE_NAMES, ...CPU_NAMES],
      usage: (o) => sandboxUsage(o),
      unspecified: (o) => ((o as Sandbox).spec?.resources?.cpu === undefined ? CPU_NAMES : []),
    },
    'volumes.fluxvm.dev': { names: [VOLUME_STORAGE], usage: volumeUsage },
  };
}
