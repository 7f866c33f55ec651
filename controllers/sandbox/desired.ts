// Pure helpers of the Sandbox controller: the runtime configuration a Sandbox asks for, its
// runtime instance id, its expiry, and the status it should report. No I/O; table-tested.
//
// Runtime instance id: the Sandbox's metadata.uid. It is stable for the object's lifetime,
// unique across re-creations of the same name (a deleted-and-recreated `demo` never adopts
// the old instance), valid as a runtime id (letters, digits, '-'), and known before the
// instance exists, so a reconcile that crashed after create finds the instance again.
// Checkpoints use their own uid as the runtime checkpoint id for the same reasons.
import type { Sandbox, SandboxSpec } from '../../apis/zz_generated.types.js';
import type { SandboxConfig } from '../../native/runtime.js';

/** The resolved workspace source: runtime ids, found by the reconciler from the refs. */
export type ResolvedSource = { checkpointId: string } | { sandboxId: string } | undefined;

export const DEFAULT_WORKSPACE = '/work';

/** The runtime id of a Sandbox (its uid). Throws when the object has no uid (never stored). */
export function runtimeId(obj: { metadata: { uid?: string; name?: string } }): string {
  if (!obj.metadata.uid) throw new Error(`object ${obj.metadata.name} has no uid`);
  return obj.metadata.uid;
}

const BIN: Record<string, number> = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 };
const DEC: Record<string, number> = { k: 1e3, M: 1e6, G: 1e9, T: 1e12 };

/** Bytes of a memory quantity (int = bytes; "512Mi", "1G", "1.5Gi"); undefined if absent or bad. */
export function parseMemory(q: number | string | undefined): number | undefined {
  if (q === undefined) return undefined;
  if (typeof q === 'number') return Number.isFinite(q) && q > 0 ? Math.floor(q) : undefined;
  const m = /^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q);
  if (!m) return undefined;
  const mul = m[2] ? (BIN[m[2]] ?? DEC[m[2]]!) : 1;
  return Math.floor(Number(m[1]) * mul);
}

/** Millicores of a CPU quantity (int = cores; "1.5" cores; "500m"); undefined if absent or bad. */
export function parseCpu(q: number | string | undefined): number | undefined {
  if (q === undefined) return undefined;
  if (typeof q === 'number') return q > 0 ? Math.round(q * 1000) : undefined;
  const m = /^(?:([0-9]+)m|([0-9]+(?:\.[0-9]{1,3})?))$/.exec(q);
  if (!m) return undefined;
  return m[1] !== undefined ? Number(m[1]) : Math.round(Number(m[2]) * 1000);
}

/** A host name for the sandbox from its object name (DNS label, at most 63 characters). */
export function hostnameOf(name: string): string {
  const h = name.toLowerCase().replace(/[^a-z0-9-]/g, '-').replace(/^-+/, '').slice(0, 63).replace(/-+$/, '');
  return h || 'sandbox';
}

/**
 * The SandboxConfig a Sandbox asks for, given its resolved source. Pure and deterministic:
 * the same object and source always give the same config. Fields the backend does not take
 * (confinement: procbox always applies its full confinement) are not part of it.
 */
export function desiredConfig(sbx: Sandbox, source: ResolvedSource): SandboxConfig {
  const spec: SandboxSpec = sbx.spec ?? {};
  const cfg: SandboxConfig = {
    id: runtimeId(sbx),
    workspacePath: spec.workspace?.path ?? DEFAULT_WORKSPACE,
    network: { mode: spec.network?.mode ?? 'none', ...(spec.network?.allow?.length ? { allow: [...spec.network.allow] } : {}) },
  };
  // The host name stays the backend's default ('sandbox'): procbox's warm pool of pre-started
  // inits (fast create) can only serve that one. hostnameOf() is kept for backends that
  // set it per sandbox.
  const memoryBytes = parseMemory(spec.resources?.memory);
  const cpuMillis = parseCpu(spec.resources?.cpu);
  const pids = spec.resources?.pids;
  if (memoryBytes !== undefined || cpuMillis !== undefined || pids !== undefined) {
    cfg.resources = {
      ...(memoryBytes !== undefined ? { memoryBytes } : {}),
      ...(cpuMillis !== undefined ? { cpuMillis } : {}),
      ...(pids !== undefined ? { pids } : {}),
    };
  }
  if (spec.env?.length) cfg.env = Object.fromEntries(spec.env.map((e) => [e.name, e.value ?? '']));
  if (spec.image) cfg.image = spec.image;
  if (source) cfg.source = { ...source };
  return cfg;
}

/** Milliseconds since the epoch when the sandbox expires (creation + ttlSeconds), or undefined. */
export function expiryMs(sbx: Sandbox): number | undefined {
  const ttl = sbx.spec?.ttlSeconds;
  const created = sbx.metadata.creationTimestamp;
  if (!ttl || !created) return undefined;
  return Date.parse(created) + ttl * 1000;
}
