// New sandboxes: create (empty, from a checkpoint, or a copy of another sandbox) and fork
// (one mark of the parent, then one init per child on the same layers).
import {
  checkConfinement,
  RuntimeError,
  type ForkOptions,
  type ForkResult,
  type SandboxConfig,
  type SandboxInfo,
} from '../runtime.js';
import { normalizeSandboxPath, validateSandboxPath } from '../workspace/paths.js';
import { ID_RE, newQgroup, nowIso, type ProcboxCore } from './core.js';
import { checkVolumes, withVolumes } from './binds.js';
import { bringUp } from './inits.js';
import { markLocked } from './marks.js';
import { readJson, type CheckpointRecord, type SandboxRecord } from './state.js';

const RESERVED = new Set(['usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'etc', 'tmp', 'proc', 'dev', 'sys']);

/**
 * Creates a sandbox: empty, from a checkpoint's layers, or a copy of another sandbox (a mark of it). Idempotent per id.
 */
export async function create(pb: ProcboxCore, cfg: SandboxConfig): Promise<SandboxInfo> {
  pb.ensureStarted();
  if (!cfg || typeof cfg.id !== 'string' || !ID_RE.test(cfg.id)) {
    throw new RuntimeError(
      'InvalidArgument',
      `invalid sandbox id ${JSON.stringify(cfg?.id)}: letters, digits, . _ - (max 128)`,
    );
  }
  return pb.locked(cfg.id, async () => {
    const existing = pb.records.get(cfg.id);
    if (existing) return pb.info(existing);
    let layers: string[] = [];
    const src = cfg.source;
    if (src && 'checkpointId' in src) {
      const ck = readJson<CheckpointRecord>(pb.ckptFile(src.checkpointId));
      if (!ck) throw new RuntimeError('NotFound', `checkpoint ${src.checkpointId} not found`);
      layers = ck.layers;
    } else if (src && 'sandboxId' in src) {
      if (src.sandboxId === cfg.id) throw new RuntimeError('InvalidArgument', 'a sandbox cannot be its own source');
      pb.rec(src.sandboxId);
      // The source stays locked until the copy is recorded: its layers cannot be freed.
      return pb.locked(src.sandboxId, async () => {
        const { token, layers: from } = await markLocked(pb, pb.rec(src.sandboxId));
        const rec = newRecord(pb, cfg, from);
        rec.forkMark = token;
        await bringUp(pb, [rec]);
        return pb.info(pb.rec(rec.id));
      });
    }
    const rec = newRecord(pb, cfg, layers);
    await bringUp(pb, [rec]);
    return pb.info(pb.rec(rec.id));
  });
}

/**
 * A new sandbox's record from its config (checked here: workspace path, network, hostname, confinement), not yet saved.
 */
function newRecord(pb: ProcboxCore, cfg: SandboxConfig, layers: string[]): SandboxRecord {
  const ws = normalizeSandboxPath(cfg.workspacePath ?? '/work');
  validateSandboxPath(cfg.workspacePath ?? '/work');
  const first = ws.split('/')[1];
  if (ws === '/' || !first || RESERVED.has(first))
    throw new RuntimeError('InvalidPath', `workspace path ${ws} collides with a system directory`);
  const mode = cfg.network?.mode ?? 'none';
  if (mode === 'allowList' && !pb.egress)
    throw new RuntimeError(
      'Unsupported',
      'network mode allowList needs the host egress proxy, which this runtime was not given',
    );
  if (mode !== 'none' && mode !== 'open' && mode !== 'allowList')
    throw new RuntimeError('Unsupported', `network mode ${mode} is not supported by procbox`);
  if (mode === 'allowList') pb.checkAllow(cfg.network?.allow ?? [], cfg.network?.http);
  const hostname = cfg.hostname ?? 'sandbox';
  if (!/^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$/.test(hostname))
    throw new RuntimeError('InvalidArgument', `invalid hostname ${hostname}`);
  const volumes = checkVolumes(cfg.volumes, ws);
  const caps = pb.capabilities();
  const confinement = withVolumes(checkConfinement(caps, cfg.confinement), volumes, pb.landlockAbi >= 1);
  return {
    id: cfg.id,
    workspacePath: ws,
    createdAt: nowIso(),
    hostname,
    env: { ...(cfg.env ?? {}) },
    ...(confinement ? { confinement } : {}),
    ...(volumes.length ? { volumes } : {}),
    resources: { ...(cfg.resources ?? {}) },
    limits: pb.effectiveLimits(cfg.resources ?? {}),
    vol: pb.newVol(cfg.id),
    ...(pb.vs.quota ? { qgroup: newQgroup() } : {}),
    network:
      mode === 'allowList'
        ? {
            mode,
            allow: [...(cfg.network?.allow ?? [])],
            ...(cfg.network?.http?.length ? { http: cfg.network.http.map((r) => ({ ...r })) } : {}),
            ...(cfg.network?.watch ? { watch: cfg.network.watch } : {}),
          }
        : { mode },
    layers: [...layers],
    gen: 0,
  };
}

/** Marks the parent and starts one child per id on its layers (children that exist are kept). */
export async function fork(
  pb: ProcboxCore,
  parentId: string,
  childIds: string[],
  opts?: ForkOptions,
): Promise<ForkResult> {
  pb.ensureStarted();
  for (const c of childIds) {
    if (!ID_RE.test(c)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(c)}`);
    if (c === parentId) throw new RuntimeError('InvalidArgument', 'a fork child cannot have the parent id');
  }
  if (new Set(childIds).size !== childIds.length) throw new RuntimeError('InvalidArgument', 'duplicate child ids');
  const parent = pb.rec(parentId);
  // The parent stays locked until the children are recorded: its layers cannot be freed.
  const token = await pb.locked(parentId, async () => {
    const { token, layers } = await markLocked(pb, parent);
    const fresh = childIds.filter((c) => !pb.records.has(c));
    const recs = fresh.map((c) =>
      newRecord(
        pb,
        {
          id: c,
          workspacePath: parent.workspacePath,
          network: opts?.network ?? {
            mode: parent.network.mode,
            allow: parent.network.allow,
            ...(parent.network.http ? { http: parent.network.http } : {}),
          },
          resources: { ...parent.resources, ...limitOverrides(parent) },
          env: parent.env,
          hostname: parent.hostname,
          confinement: parent.confinement,
          // A fork or speculation copy sees the parent's volumes read-only: it never changes them.
          ...(parent.volumes ? { volumes: parent.volumes.map((v) => ({ ...v, readOnly: true })) } : {}),
        },
        layers,
      ),
    );
    for (const r of recs) r.forkMark = token;
    await bringUp(pb, recs);
    return token;
  });
  return { children: childIds.map((c) => pb.info(pb.rec(c))), parentMark: { sandboxId: parentId, token } };
}

/** The parent's limits as resources, so a fork child gets the same ones (not today's defaults). */
function limitOverrides(parent: SandboxRecord): NonNullable<SandboxConfig['resources']> {
  const l = parent.limits;
  if (!l) return {};
  const out: NonNullable<SandboxConfig['resources']> = {};
  if (l.memoryBytes) out.memoryBytes = l.memoryBytes;
  if (l.pids) out.pids = l.pids;
  if (l.cpuWeight) out.cpuWeight = l.cpuWeight;
  if (l.cpuMillis) out.cpuMillis = l.cpuMillis;
  if (l.diskBytes) out.diskBytes = l.diskBytes;
  return out;
}
