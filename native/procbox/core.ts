// procbox's shared state: one ProcboxCore per runtime holds the options, the sandbox records,
// the per-sandbox locks, the warm pool's state and the volume store, and answers the small
// questions every part asks (where a sandbox's directories are, which cgroups it has, whether
// its init lives). The operations are in the modules around it (each a set of functions taking
// the core): config.ts (what an init is given), pool.ts (warm inits), inits.ts (starting and
// ending inits), commands.ts (exec), marks.ts (layers, marks, changesSince), checkpoint.ts,
// fork.ts (create and fork); procbox.ts is the Runtime over them. Internal to native/procbox:
// its members are public only so those modules can use them.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join, resolve as resolvePath } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  RuntimeError,
  type Capabilities,
  type HttpRule,
  type SandboxConfig,
  type SandboxInfo,
  type SandboxLimits,
} from '../runtime.js';
import { parseAllowList, withHttpRules } from '../egress/policy.js';
import { detectCgroups, enforced, SandboxCgroups, type CgroupLayout } from './cgroups.js';
import { FileOps } from './fileops.js';
import { subnetAddresses, type EgressHook } from './network.js';
import { readJson, writeJsonAtomic, type CheckpointRecord, type LayerMeta, type SandboxRecord } from './state.js';
import type { VolumeStore } from './quota.js';
import type { VolumeSizer } from './volsize.js';
import type { Standby } from './exec.js';

/**
 * Limits of a sandbox whose config names none (each overridable per sandbox through
 * `resources`, and per runtime through the `defaultLimits` option / `fluxctl serve` flags).
 * The tmpfs mounts (/tmp, /dev/shm) are each bounded by half the memory limit, and their
 * pages are charged to the sandbox's memory cgroup.
 */
export const DEFAULT_LIMITS = {
  memoryBytes: 2 * 1024 ** 3,
  pids: 1024,
  cpuWeight: 100,
  diskBytes: 10 * 1024 ** 3,
} as const;

export type DefaultLimits = { memoryBytes: number; pids: number; cpuWeight: number; diskBytes: number };

export interface ProcboxOptions {
  /** Root of all state; procbox uses `<stateDir>/procbox`. */
  stateDir: string;
  /**
   * Told about failures of background and recovery work that no caller sees (adopting,
   * restarting or tearing down a sandbox at start, refilling the warm pool). Default: none.
   */
  log?: (msg: string, fields?: Record<string, unknown>) => void;
  /** The C helper; default native/procbox/build/procbox of this checkout. */
  helperPath?: string;
  /** Host uid/gid that root inside every sandbox maps to (count 65536). Default 100000. */
  uidBase?: number;
  /** Compact when a stack has more frozen layers than this. Default 32. */
  maxLayers?: number;
  /**
   * How a disk checkpoint freezes the workspace on btrfs volumes: 'snapshot' (default) or 'mark'
   * (the upper renamed into a layer and the workspace remounted; always used off btrfs). 'mark'
   * for tests of a mark's crash safety and A/B benches only.
   */
  checkpointFreeze?: 'snapshot' | 'mark';
  /** Inits kept started ahead of time for fast create/fork (see "warm pool"). Default 0. */
  warmPool?: number;
  /** Limits of sandboxes whose config names none; default DEFAULT_LIMITS. */
  defaultLimits?: Partial<DefaultLimits>;
  /** Kernel-enforced workspace disk quota (btrfs volume store, quota.ts). Default true. */
  diskQuota?: boolean;
  /** Where volume stores are mounted (one per runtime). Default /run/fluxvm/procbox. */
  volumeMountDir?: string;
  /** Size of a new volume store image (fully allocated, grown on demand). Default and minimum 256 MiB. */
  volumeImageBytes?: number;
  /** The host egress proxy; without it network mode allowList is Unsupported. */
  egress?: EgressHook;
  /**
   * Jobs start from the sandbox's standby exec helper when it has one (jobs.ts). Default true; false spawns a helper
   * per job from this process (benchmarks compare the two).
   */
  jobsFromStandby?: boolean;
  /**
   * Tests only: called at each step of a multi-step change on disk (FaultPoint), so a test can
   * kill the process there and check that the next start() finishes or undoes the change.
   */
  faultHook?: (point: FaultPoint) => void;
}

/**
 * The steps of the changes a crash can interrupt (README "Crash safety"): after the step named,
 * before the next. mark: intent recorded, upper renamed into a layer, workspace remounted,
 * record lists the layer (its LayerMeta not yet written). restore: record names the
 * checkpoint's stack, old upper renamed away, workspace remounted (old upper not yet removed).
 * compact: merged layer written, record names it (workspace not yet remounted).
 */
export type FaultPoint =
  | 'mark:intent'
  | 'mark:renamed'
  | 'mark:remounted'
  | 'mark:recorded'
  | 'restore:recorded'
  | 'restore:renamed'
  | 'restore:remounted'
  | 'compact:merged'
  | 'compact:recorded'
  | 'checkpoint:snapshot';

/** A warm init: its directory (holding `root`), pid, and the cgroup it was born in. */
export interface PoolInit {
  dir: string;
  pid: number;
  pidStart?: string;
  cgroupKey: string;
  /** The standby exec helper of the sandbox it becomes, spawned with it (standby.ts). */
  standby?: Standby;
}

export const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function defaultHelperPath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [
    join(here, 'build', 'procbox'),
    join(here, '..', '..', '..', 'native', 'procbox', 'build', 'procbox'),
  ]) {
    if (existsSync(p)) return p;
  }
  return join(here, 'build', 'procbox');
}

export function nowIso(): string {
  return new Date().toISOString();
}

/** Start time of a live process (a zombie counts as dead), or undefined. */
export function procStart(pid: number): string | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return f[0] === 'Z' || f[0] === 'X' ? undefined : f[19];
  } catch {
    return undefined;
  }
}

export function run(
  cmd: string,
  args: string[],
  input?: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    if (input !== undefined) {
      p.stdin!.on('error', () => undefined); // an early exit shows in the answer
      p.stdin!.end(input);
    }
    let stdout = '';
    let stderr = '';
    p.stdout!.on('data', (b) => (stdout += b));
    p.stderr!.on('data', (b) => (stderr += b));
    p.on('error', reject);
    p.on('close', (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}

/** A sandbox's qgroup number: random among 2^40, so unique in a volume store (never reused). */
export function newQgroup(): number {
  return randomBytes(5).readUIntBE(0, 5) + 1;
}

export class ProcboxCore {
  readonly root: string;
  readonly helper: string;
  /** Short hash of the state directory (see hostKey). */
  readonly scope: string;
  readonly uidBase: number;
  readonly log: (msg: string, fields?: Record<string, unknown>) => void;
  readonly maxLayers: number;
  /**
   * The layers of each checkpoint record (file name -> layers), read once: a record is never
   * rewritten under its name (checkpoint.ts writes it once; deleteCheckpoint drops the entry),
   * so gc reads only records it has not seen instead of every one each time.
   */
  readonly ckLayers = new Map<string, string[]>();
  /**
   * A layer's size from its LayerMeta (written once when the layer is frozen, never changed),
   * kept here after the first read: a checkpoint's size sums its whole stack, and reading each
   * layer's file again cost 0.3-0.5 ms per point at 15-20 layers. gc forgets removed layers.
   */
  layerSize(l: string): number {
    let n = this.layerSizes.get(l);
    if (n === undefined) {
      const meta = this.layerMeta(l);
      if (!meta) return 0; // not written yet (or gone): not remembered
      n = meta.sizeBytes;
      this.layerSizes.set(l, n);
    }
    return n;
  }
  private readonly layerSizes = new Map<string, number>();

  /** A layer's LayerMeta: the one not written yet (unwrittenMetas), else its file. */
  layerMeta(l: string): LayerMeta | undefined {
    return this.unwrittenMetas.get(l) ?? readJson<LayerMeta>(`${this.layerVol(l)}.json`);
  }
  /**
   * LayerMetas of snapshot layers whose file is written after the point's step has started
   * (checkpoint.ts: the deferred checkpoint's sync writes it, off the step's path): until then
   * layerMeta() reads them here. gc forgets removed layers; a process that dies first leaves
   * the file missing, which start() rewrites from a scan (recover.ts repairLayerMetas).
   */
  readonly unwrittenMetas = new Map<string, LayerMeta>();

  /** Layers being made (a checkpoint's snapshot before its record is written): gc keeps them. */
  readonly pendingLayers = new Set<string>();
  /** ProcboxOptions.checkpointFreeze (a bench may switch it between checkpoints). */
  checkpointFreeze: 'snapshot' | 'mark';
  /** Entries in each sandbox's upper at its last snapshot checkpoint (checkpoint.ts: a big upper is marked instead). */
  readonly upperEntries = new Map<string, number>();
  readonly cg: CgroupLayout;
  readonly records = new Map<string, SandboxRecord>();
  /**
   * Sandboxes whose inits are being started (bringUp): recorded already, no init yet. A revive, an inspect or a
   * destroy waits for it (a restart or teardown there would take the cgroups the start is using); settles with it,
   * never rejects.
   */
  readonly launching = new Map<string, Promise<void>>();
  readonly locks = new Map<string, Promise<unknown>>();
  landlockAbi = 0;
  /** The kernel has what the exec view needs (procbox probe: open_tree, move_mount, mount_setattr, openat2). */
  execView = false;
  started = false;
  /** Every host-side operation on sandbox files goes through these helpers (fileops.ts). */
  readonly fileops: FileOps;
  readonly warmPool: number;
  pool: PoolInit[] = [];
  filling: Promise<void> | undefined;
  refillTimer: NodeJS.Timeout | undefined;
  /** Standby exec helpers by sandbox id, and the ids one is being spawned for (standby.ts). */
  readonly standbys = new Map<string, Standby>();
  readonly standbyPending = new Set<string>();
  /** Commands running per sandbox id: no standby is spawned while one runs (standby.ts). */
  readonly execsRunning = new Map<string, number>();
  /** ProcboxOptions.jobsFromStandby. */
  readonly jobsFromStandby: boolean;
  /** Set by close() (until the next start()): the warm pool is not refilled. */
  closed = false;
  readonly defaults: DefaultLimits;
  readonly volOpts: { enabled: boolean; mountBase: string; imageBytes?: number };
  readonly egress?: EgressHook;
  /** ProcboxOptions.faultHook (tests only). */
  readonly fault: (point: FaultPoint) => void;
  vs: VolumeStore = { dir: '', quota: false, reason: 'not started' };
  /** Grows and shrinks the btrfs volume store (volsize.ts); none without one. */
  sizer: VolumeSizer | undefined;
  /** etc dir -> the sandbox CA PEMs last written into its bundle (config.ts syncTrust). */
  readonly trustWritten = new Map<string, string>();

  constructor(opts: ProcboxOptions) {
    this.root = join(opts.stateDir, 'procbox');
    this.scope = createHash('sha256').update(resolvePath(this.root)).digest('hex').slice(0, 8);
    this.helper = opts.helperPath ?? defaultHelperPath();
    this.fileops = new FileOps(this.helper);
    this.uidBase = opts.uidBase ?? 100000;
    this.log = opts.log ?? (() => {});
    this.maxLayers = opts.maxLayers ?? 32;
    this.checkpointFreeze = opts.checkpointFreeze ?? 'snapshot';
    this.warmPool = opts.warmPool ?? 0;
    this.cg = detectCgroups();
    this.defaults = {
      ...DEFAULT_LIMITS,
      ...Object.fromEntries(Object.entries(opts.defaultLimits ?? {}).filter(([, v]) => v !== undefined)),
    };
    for (const [k, v] of Object.entries(this.defaults)) {
      if (!Number.isSafeInteger(v) || v <= 0)
        throw new RuntimeError('InvalidArgument', `default limit ${k} must be a positive integer, got ${v}`);
    }
    this.volOpts = {
      enabled: opts.diskQuota ?? true,
      mountBase: opts.volumeMountDir ?? '/run/fluxvm/procbox',
      imageBytes: opts.volumeImageBytes,
    };
    this.egress = opts.egress;
    this.jobsFromStandby = opts.jobsFromStandby ?? true;
    this.fault = opts.faultHook ?? (() => {});
  }

  // ---------------------------------------------------------------- paths and records

  sbxDir(id: string): string {
    return join(this.root, 'sandboxes', id);
  }
  // State of before the volume store (records without `vol`: upper and work-<gen> in the
  // sandbox directory, layers directly in <root>/layers) is adopted as it is: such a sandbox
  // keeps its upper until its next mark or restore, which moves it to a volume.
  legacyLayer(l: string): string {
    return join(this.root, 'layers', l);
  }
  /** The volume a frozen layer is (a renamed writable-layer volume); `<it>.json` is its LayerMeta. */
  layerVol(l: string): string {
    const v = join(this.vs.dir, 'layers', l);
    return !existsSync(v) && existsSync(this.legacyLayer(l)) ? this.legacyLayer(l) : v;
  }
  /** The layer's files (an overlay lower). */
  layerDir(l: string): string {
    const v = this.layerVol(l);
    return v === this.legacyLayer(l) ? v : join(v, 'u');
  }
  /** The volume of the writable layer (records with `vol` only). */
  volDir(rec: SandboxRecord): string {
    return join(this.vs.dir, 'vols', rec.vol ?? `${rec.id}~none`);
  }
  upperDir(rec: SandboxRecord): string {
    return rec.vol ? join(this.volDir(rec), 'u') : join(this.sbxDir(rec.id), 'upper');
  }
  workDir(rec: SandboxRecord): string {
    return rec.vol ? join(this.volDir(rec), `w-${rec.gen}`) : join(this.sbxDir(rec.id), `work-${rec.gen}`);
  }
  newVol(id: string): string {
    return `${id}~${Date.now().toString(36)}${randomBytes(3).toString('hex')}`; // '~' is not in ids
  }
  /** The limits a record runs with (records of before limits had their resources only). */
  limitsOf(rec: SandboxRecord | undefined): SandboxLimits | undefined {
    return rec ? (rec.limits ?? rec.resources) : undefined;
  }
  /** Resources over the defaults; the disk quota only where the volume store enforces one. */
  effectiveLimits(res: NonNullable<SandboxConfig['resources']>): SandboxLimits {
    const pick = (v: number | undefined, d: number) => (v === undefined ? d : v);
    for (const [k, v] of Object.entries(res)) {
      if (v !== undefined && (!Number.isSafeInteger(v) || v <= 0))
        throw new RuntimeError('InvalidArgument', `resources.${k} must be a positive integer, got ${v}`);
    }
    const memoryBytes = pick(res.memoryBytes, this.defaults.memoryBytes);
    return {
      memoryBytes,
      pids: pick(res.pids, this.defaults.pids),
      cpuWeight: pick(res.cpuWeight, this.defaults.cpuWeight),
      ...(res.cpuMillis ? { cpuMillis: res.cpuMillis } : {}),
      ...(this.vs.quota ? { diskBytes: pick(res.diskBytes, this.defaults.diskBytes) } : {}),
      // /tmp and /dev/shm get half each: together they can hold the memory limit, no more.
      tmpfsBytes: Math.max(1 << 20, Math.floor(memoryBytes / 2)),
    };
  }
  ckptFile(c: string): string {
    return join(this.root, 'checkpoints', `${c}.json`);
  }
  /** Writes the record (tmp + rename); `durable` adds the fsync, for a step a crash must not lose. */
  save(rec: SandboxRecord, durable = false): void {
    writeJsonAtomic(join(this.sbxDir(rec.id), 'sandbox.json'), rec, durable);
    this.records.set(rec.id, rec);
  }
  rec(id: string): SandboxRecord {
    const r = this.records.get(id);
    if (!r) throw new RuntimeError('NotFound', `sandbox ${id} not found`);
    return r;
  }
  /** The cgroups a sandbox uses (by its limits); every possible one for an unknown id. */
  cgroups(id: string): SandboxCgroups {
    const rec = this.records.get(id);
    return new SandboxCgroups(this.cg, rec?.cgroupKey ?? this.hostKey(id), this.limitsOf(rec));
  }
  /** Every cgroup the sandbox may have (limits unknown or changed): for cleanup. */
  allCgroups(id: string): SandboxCgroups {
    return new SandboxCgroups(this.cg, this.records.get(id)?.cgroupKey ?? this.hostKey(id));
  }

  /** Name of a sandbox in host-global places (ProcboxRuntime.hostKey). */
  hostKey(id: string): string {
    return `${this.scope}.${id}`;
  }

  /** Serializes operations on one key (a sandbox id); others run concurrently. */
  locked<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.locks.set(key, tail);
    void tail.then(() => {
      if (this.locks.get(key) === tail) this.locks.delete(key);
    });
    return next;
  }

  alive(rec: SandboxRecord): boolean {
    return !!rec.pid && !!rec.pidStart && procStart(rec.pid) === rec.pidStart;
  }

  info(rec: SandboxRecord): SandboxInfo {
    const alive = this.alive(rec);
    return {
      id: rec.id,
      state: !alive ? 'stopped' : rec.paused ? 'paused' : 'running',
      pid: alive ? rec.pid : undefined,
      workspacePath: rec.workspacePath,
      createdAt: rec.createdAt,
      address: rec.network.address,
      restarted: rec.restarted || undefined,
      lastOomKillAt: rec.lastOomKillAt,
      limits: this.enforcedLimits(rec),
      ...(rec.forkMark ? { forkMark: rec.forkMark } : {}),
      ...(rec.standby && alive ? { standby: true } : {}),
    };
  }

  /** The record's limits this host enforces (a limit without its cgroup controller is left out). */
  enforcedLimits(rec: SandboxRecord): SandboxLimits {
    const e = enforced(this.cg);
    const l = this.limitsOf(rec) ?? {};
    const out: SandboxLimits = {};
    if (e.memory && l.memoryBytes) out.memoryBytes = l.memoryBytes;
    if (e.pids && l.pids) out.pids = l.pids;
    if (e.cpu && l.cpuWeight) out.cpuWeight = l.cpuWeight;
    if (e.cpu && l.cpuMillis) out.cpuMillis = l.cpuMillis;
    if (l.diskBytes) out.diskBytes = l.diskBytes;
    if (l.tmpfsBytes) out.tmpfsBytes = l.tmpfsBytes;
    return out;
  }

  capabilities(): Capabilities {
    const e = enforced(this.cg);
    return {
      backend: 'procbox',
      isolation: `namespaces${this.landlockAbi ? '+landlock' : ''}+seccomp`,
      exec: true,
      streamingExec: true,
      pty: true,
      files: true,
      diskCheckpoint: true,
      memoryCheckpoint: false,
      fork: true,
      pause: e.freezer,
      layeredWorkspace: true,
      networkModes: this.egress ? ['none', 'allowList', 'open'] : ['none', 'open'],
      limits: { memory: e.memory, pids: e.pids, cpu: e.cpu, cgroup: this.cg.kind, disk: this.vs.quota },
      landlockAbi: this.landlockAbi || undefined,
      seccomp: true,
      // Landlock ABI 1 has the execute right and per-path write rules (native/procbox/README.md "Confinement");
      // the allow-list holds against the loader only with the exec view's noexec mounts, and a
      // read-only workspace is read-only for metadata only as a read-only mount (both: mount_setattr).
      confinement: {
        execAllowlist: this.landlockAbi >= 1 && this.execView,
        paths: this.landlockAbi >= 1 && this.execView,
      },
    };
  }

  logFailure(msg: string, id: string | undefined, e: unknown): void {
    this.log(msg, { ...(id ? { id } : {}), error: e instanceof Error ? e.message : String(e) });
  }

  ensureStarted(): void {
    if (!this.started) throw new RuntimeError('Internal', 'procbox runtime: call start() first');
  }

  /** allowList: the host end of the sandbox's link (its resolver and proxy address). */
  linkHost(rec: SandboxRecord): string | undefined {
    return rec.network.mode === 'allowList' && rec.network.index !== undefined
      ? subnetAddresses(rec.network.index).host
      : undefined;
  }

  /** Tells the egress proxy what to enforce for this sandbox's link. */
  attachEgress(rec: SandboxRecord): void {
    if (rec.network.mode === 'allowList' && rec.network.address)
      this.egress?.attach(rec.network.address, rec.id, rec.network.allow ?? [], rec.network.watch, rec.network.http);
  }

  checkAllow(allow: string[], http?: HttpRule[]): void {
    try {
      withHttpRules(parseAllowList(allow), http);
    } catch (e) {
      throw new RuntimeError('InvalidArgument', `network.allow: ${(e as Error).message}`);
    }
  }

  /**
   * Moves to a fresh overlay work directory (each mount needs its own; the helper creates it)
   * and drops old ones of the current volume.
   */
  bumpWork(rec: SandboxRecord): void {
    if (!rec.vol) {
      const dir = this.sbxDir(rec.id);
      rec.gen += 1;
      for (const n of readdirSync(dir))
        if (n.startsWith('work-') && n !== `work-${rec.gen - 1}`)
          rmSync(join(dir, n), { recursive: true, force: true });
      return;
    }
    const dir = this.volDir(rec);
    rec.gen += 1;
    let names: string[] = [];
    try {
      names = readdirSync(dir);
    } catch {
      return; // a volume the helper has yet to create
    }
    for (const n of names) {
      if (n.startsWith('w-') && n !== `w-${rec.gen}` && n !== `w-${rec.gen - 1}`)
        rmSync(join(dir, n), { recursive: true, force: true });
    }
  }

  /** The directories holding frozen layers: the volume store's, and the legacy one of before it. */
  layerRoots(): string[] {
    return [...new Set([join(this.vs.dir, 'layers'), join(this.root, 'layers')])];
  }

  /** Removes layers no sandbox or checkpoint references. */
  async gc(): Promise<void> {
    const used = new Set<string>();
    for (const r of this.records.values()) for (const l of r.layers) used.add(l);
    for (const l of this.pendingLayers) used.add(l);
    const ckdir = join(this.root, 'checkpoints');
    const seen = new Set<string>();
    for (const f of readdirSync(ckdir)) {
      if (!f.endsWith('.json')) continue;
      seen.add(f);
      let layers = this.ckLayers.get(f);
      if (!layers) {
        layers = readJson<CheckpointRecord>(join(ckdir, f))?.layers ?? [];
        this.ckLayers.set(f, layers);
      }
      for (const l of layers) used.add(l);
    }
    for (const f of this.ckLayers.keys()) if (!seen.has(f)) this.ckLayers.delete(f);
    let freed = false;
    for (const ldir of this.layerRoots()) {
      for (const n of readdirSync(ldir)) {
        const id = n.endsWith('.json') ? n.slice(0, -5) : n;
        if (!used.has(id)) {
          this.layerSizes.delete(id);
          this.unwrittenMetas.delete(id);
          await this.fileops.rmtree(join(ldir, n));
          freed = true;
        }
      }
    }
    if (freed) this.sizer?.released(); // the host gets the space back (volsize.ts)
  }
}
