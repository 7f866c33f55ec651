// Pure helpers of the Sandbox controller: the runtime configuration a Sandbox asks for, its
// runtime instance id, its expiry, and the status it should report. No I/O; table-tested.
//
// Runtime instance id: the Sandbox's metadata.uid. It is stable for the object's lifetime,
// unique across re-creations of the same name (a deleted-and-recreated `demo` never adopts
// the old instance), valid as a runtime id (letters, digits, '-'), and known before the
// instance exists, so a reconcile that crashed after create finds the instance again.
// Checkpoints use their own uid as the runtime checkpoint id for the same reasons.
import { parseCpu as parseCpuQuantity, parseMemory as parseMemoryQuantity } from '../../apis/quantity.js';
import type { Sandbox, SandboxSpec } from '../../apis/zz_generated.types.js';
import type { Capabilities, Confinement, SandboxConfig } from '../../native/runtime.js';

/** The resolved workspace source: runtime ids, found by the reconciler from the refs. */
export type ResolvedSource = { checkpointId: string } | { sandboxId: string } | undefined;

export const DEFAULT_WORKSPACE = '/work';

/** The runtime id of a Sandbox (its uid). Throws when the object has no uid (never stored). */
export function runtimeId(obj: { metadata: { uid?: string; name?: string } }): string {
  if (!obj.metadata.uid) throw new Error(`object ${obj.metadata.name} has no uid`);
  return obj.metadata.uid;
}

/**
 * Bytes of a memory quantity (apis/quantity.ts), undefined when absent, zero or unparsable:
 * admission refuses a bad one, and an object stored before that must not fail every pass.
 */
export function parseMemory(q: number | string | undefined): number | undefined {
  return positive(q, parseMemoryQuantity);
}

/** Millicores of a CPU quantity (apis/quantity.ts), undefined when absent, zero or unparsable. */
export function parseCpu(q: number | string | undefined): number | undefined {
  return positive(q, parseCpuQuantity);
}

function positive(q: number | string | undefined, parse: (q: number | string) => number): number | undefined {
  if (q === undefined) return undefined;
  try {
    const n = parse(q);
    return n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The per-command confinement a Sandbox asks for (spec.confinement: execAllow,
 * workspaceReadOnly, readPaths, writePaths), undefined when none. Under bestEffort, what the
 * backend with capabilities `caps` cannot enforce is left out (status.capabilities.confinement
 * says so); under strict it is kept and the runtime refuses the create (Unsupported). Pure.
 */
export function desiredConfinement(spec: SandboxSpec, caps?: Capabilities): Confinement | undefined {
  const c = spec.confinement ?? {};
  const best = c.enforcement === 'bestEffort';
  const exec = !best || caps?.confinement?.execAllowlist;
  const paths = !best || caps?.confinement?.paths;
  const out: Confinement = {
    ...(c.execAllow && exec ? { execAllow: [...c.execAllow] } : {}),
    ...(c.workspaceReadOnly && paths ? { readonlyWorkspace: true } : {}),
    ...(c.readPaths?.length && paths ? { readPaths: [...c.readPaths] } : {}),
    ...(c.writePaths?.length && paths ? { writePaths: [...c.writePaths] } : {}),
  };
  return Object.keys(out).length ? out : undefined;
}

/**
 * The SandboxConfig a Sandbox asks for, given its resolved source (and the backend's
 * capabilities, for a bestEffort confinement). Pure and deterministic: the same object,
 * source and capabilities always give the same config. spec.confinement's landlock and
 * seccomp switches are not part of it: procbox always applies its default confinement.
 */
export function desiredConfig(sbx: Sandbox, source: ResolvedSource, caps?: Capabilities): SandboxConfig {
  const spec: SandboxSpec = sbx.spec ?? {};
  const cfg: SandboxConfig = {
    id: runtimeId(sbx),
    workspacePath: spec.workspace?.path ?? DEFAULT_WORKSPACE,
    network: {
      mode: spec.network?.mode ?? 'none',
      ...(spec.network?.allow?.length ? { allow: [...spec.network.allow] } : {}),
      ...(spec.network?.http?.length
        ? {
            http: spec.network.http.map((h) => ({
              host: h.host,
              ...(h.methods ? { methods: [...h.methods] } : {}),
              ...(h.paths ? { paths: [...h.paths] } : {}),
            })),
          }
        : {}),
    },
  };
  // The host name stays the backend's default ('sandbox'): procbox's warm pool of pre-started
  // inits (fast create) can only serve that one.
  const memoryBytes = parseMemory(spec.resources?.memory);
  const cpuMillis = parseCpu(spec.resources?.cpu);
  const pids = spec.resources?.pids;
  const diskBytes = parseMemory(spec.resources?.disk);
  if (memoryBytes !== undefined || cpuMillis !== undefined || pids !== undefined || diskBytes !== undefined) {
    cfg.resources = {
      ...(memoryBytes !== undefined ? { memoryBytes } : {}),
      ...(cpuMillis !== undefined ? { cpuMillis } : {}),
      ...(pids !== undefined ? { pids } : {}),
      ...(diskBytes !== undefined ? { diskBytes } : {}),
    };
  }
  if (spec.env?.length) cfg.env = Object.fromEntries(spec.env.map((e) => [e.name, e.value ?? '']));
  if (spec.image) cfg.image = spec.image;
  // The backend (spec.runtime, default procbox): a routing runtime creates it there.
  if (spec.runtime) cfg.backend = spec.runtime;
  if (source) cfg.source = { ...source };
  const confinement = desiredConfinement(spec, caps);
  if (confinement) cfg.confinement = confinement;
  return cfg;
}

/** Milliseconds since the epoch when the sandbox expires (creation + ttlSeconds), or undefined. */
export function expiryMs(sbx: Sandbox): number | undefined {
  const ttl = sbx.spec?.ttlSeconds;
  const created = sbx.metadata.creationTimestamp;
  if (!ttl || !created) return undefined;
  return Date.parse(created) + ttl * 1000;
}
