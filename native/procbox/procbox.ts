// procbox: the Linux process sandbox backend of the native Runtime (see native/runtime.ts).
//
// Each sandbox is a long-lived init (the C helper in this folder) holding its own user, mount,
// pid, ipc, uts, net and cgroup namespaces, with the workspace an overlay stack (state.ts has
// the on-disk layout, layers.ts the stack semantics). exec joins the init's namespaces.
// The host sees a sandbox's files through /proc/<init>/root: no mount of a sandbox exists
// in the host's mount namespace, so killing the init removes every mount at once.
//
// Workspace remounts (mark, fork, checkpoint, restore): the overlay is replaced at the same
// path inside the sandbox. Processes started before keep running; their cwd and open files
// stay on the old mount, which is made read-only first (a mark while some process holds a
// workspace file open for writing fails with Busy, since its later writes would land in a
// frozen layer). New opens by path see the new mount, but a process's Landlock rule names the
// old mount, so processes started before a remount can no longer write the workspace:
// restart them (documented limitation of overlayfs + Landlock).
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chownSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmdirSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname, join, resolve as resolvePath } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  checkConfinement,
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type EgressTraffic,
  type HttpRule,
  type ResolvedExecutables,
  type ForkOptions,
  type ForkResult,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
  type SandboxLimits,
  type TarSummary,
  type WorkspaceMark,
  type WriteFileOptions,
} from '../runtime.js';
import type { Readable } from 'node:stream';
import type { Diff, Manifest, ManifestLimits } from '../workspace/types.js';
import { isUnder, normalizeSandboxPath, validateSandboxPath, validateSandboxPaths } from '../workspace/paths.js';
import { detectCgroups, enforced, SandboxCgroups, type CgroupLayout } from './cgroups.js';
import { confinementArgs, drained, parseResolved, startExec } from './exec.js';
import { changesBetween, opaqueSet, scanLayer, type StackLayer } from './layers.js';
import { sandboxManifest } from './manifest.js';
import { WorkspaceFiles } from './files.js';
import { FileOps } from './fileops.js';
import { allocateIndex, setupNetwork, subnetAddresses, teardownNetwork, type EgressHook } from './network.js';
import { parseAllowList, withHttpRules } from '../egress/policy.js';

/** The host's CA bundle; the generated /etc has one at the same path (plus the sandbox's egress CA in allowList). */
const HOST_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
const CA_ENV = ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO'];
import { readJson, writeJsonAtomic, type CheckpointRecord, type LayerMeta, type SandboxRecord } from './state.js';
import { mergeLayers } from './compact.js';
import { openVolumeStore, type VolumeStore } from './quota.js';

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
  /** Inits kept started ahead of time for fast create/fork (see "warm pool"). Default 0. */
  warmPool?: number;
  /** Limits of sandboxes whose config names none; default DEFAULT_LIMITS. */
  defaultLimits?: Partial<DefaultLimits>;
  /** Kernel-enforced workspace disk quota (btrfs volume store, quota.ts). Default true. */
  diskQuota?: boolean;
  /** Where volume stores are mounted (one per runtime). Default /run/fluxvm/procbox. */
  volumeMountDir?: string;
  /** Size of a new volume store image (sparse). Default 90% of the free space of stateDir. */
  volumeImageBytes?: number;
  /** The host egress proxy; without it network mode allowList is Unsupported. */
  egress?: EgressHook;
}

/** A warm init: its directory (holding `root`), pid, and the cgroup it was born in. */
interface PoolInit {
  dir: string;
  pid: number;
  pidStart?: string;
  cgroupKey: string;
}

/** Delay between taking warm inits and starting their replacements. */
const REFILL_DELAY_MS = 100;

const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const RESERVED = new Set(['usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'etc', 'tmp', 'proc', 'dev', 'sys']);
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export function defaultHelperPath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  for (const p of [join(here, 'build', 'procbox'), join(here, '..', '..', '..', 'native', 'procbox', 'build', 'procbox')]) {
    if (existsSync(p)) return p;
  }
  return join(here, 'build', 'procbox');
}

function nowIso(): string {
  return new Date().toISOString();
}

/** Start time of a live process (a zombie counts as dead), or undefined. */
function procStart(pid: number): string | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return f[0] === 'Z' || f[0] === 'X' ? undefined : f[19];
  } catch {
    return undefined;
  }
}

function run(cmd: string, args: string[], input?: string): Promise<{ code: number; stdout: string; stderr: string }> {
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

export class ProcboxRuntime implements Runtime {
  readonly root: string;
  readonly helper: string;
  /** Short hash of the state directory (see hostKey). */
  readonly scope: string;
  private readonly uidBase: number;
  private readonly log: (msg: string, fields?: Record<string, unknown>) => void;
  private readonly maxLayers: number;
  private readonly cg: CgroupLayout;
  private readonly records = new Map<string, SandboxRecord>();
  private readonly locks = new Map<string, Promise<unknown>>();
  private landlockAbi = 0;
  private started = false;
  /** Every host-side operation on sandbox files goes through these helpers (fileops.ts). */
  readonly fileops: FileOps;
  private readonly warmPool: number;
  private pool: PoolInit[] = [];
  private filling: Promise<void> | undefined;
  private refillTimer: NodeJS.Timeout | undefined;
  /** Set by close() (until the next start()): the warm pool is not refilled. */
  private closed = false;
  readonly defaults: DefaultLimits;
  private readonly volOpts: { enabled: boolean; mountBase: string; imageBytes?: number };
  private readonly egress?: EgressHook;
  private vs: VolumeStore = { dir: '', quota: false, reason: 'not started' };

  constructor(opts: ProcboxOptions) {
    this.root = join(opts.stateDir, 'procbox');
    this.scope = createHash('sha256').update(resolvePath(this.root)).digest('hex').slice(0, 8);
    this.helper = opts.helperPath ?? defaultHelperPath();
    this.fileops = new FileOps(this.helper);
    this.uidBase = opts.uidBase ?? 100000;
    this.log = opts.log ?? (() => {});
    this.maxLayers = opts.maxLayers ?? 32;
    this.warmPool = opts.warmPool ?? 0;
    this.cg = detectCgroups();
    this.defaults = { ...DEFAULT_LIMITS, ...Object.fromEntries(Object.entries(opts.defaultLimits ?? {}).filter(([, v]) => v !== undefined)) };
    for (const [k, v] of Object.entries(this.defaults)) {
      if (!Number.isSafeInteger(v) || v <= 0) throw new RuntimeError('InvalidArgument', `default limit ${k} must be a positive integer, got ${v}`);
    }
    this.volOpts = { enabled: opts.diskQuota ?? true, mountBase: opts.volumeMountDir ?? '/run/fluxvm/procbox', imageBytes: opts.volumeImageBytes };
    this.egress = opts.egress;
  }

  /** Where the workspace volumes live and whether their disk quota is enforced (after start). */
  volumeStore(): Readonly<VolumeStore> {
    return this.vs;
  }

  // ---------------------------------------------------------------- paths and records

  private sbxDir(id: string): string {
    return join(this.root, 'sandboxes', id);
  }
  // State of before the volume store (records without `vol`: upper and work-<gen> in the
  // sandbox directory, layers directly in <root>/layers) is adopted as it is: such a sandbox
  // keeps its upper until its next mark or restore, which moves it to a volume.
  private legacyLayer(l: string): string {
    return join(this.root, 'layers', l);
  }
  /** The volume a frozen layer is (a renamed writable-layer volume); `<it>.json` is its LayerMeta. */
  private layerVol(l: string): string {
    const v = join(this.vs.dir, 'layers', l);
    return !existsSync(v) && existsSync(this.legacyLayer(l)) ? this.legacyLayer(l) : v;
  }
  /** The layer's files (an overlay lower). */
  private layerDir(l: string): string {
    const v = this.layerVol(l);
    return v === this.legacyLayer(l) ? v : join(v, 'u');
  }
  /** The volume of the writable layer (records with `vol` only). */
  private volDir(rec: SandboxRecord): string {
    return join(this.vs.dir, 'vols', rec.vol ?? `${rec.id}~none`);
  }
  private upperDir(rec: SandboxRecord): string {
    return rec.vol ? join(this.volDir(rec), 'u') : join(this.sbxDir(rec.id), 'upper');
  }
  private workDir(rec: SandboxRecord): string {
    return rec.vol ? join(this.volDir(rec), `w-${rec.gen}`) : join(this.sbxDir(rec.id), `work-${rec.gen}`);
  }
  private newVol(id: string): string {
    return `${id}~${Date.now().toString(36)}${randomBytes(3).toString('hex')}`; // '~' is not in ids
  }
  /** The limits a record runs with (records of before limits had their resources only). */
  private limitsOf(rec: SandboxRecord | undefined): SandboxLimits | undefined {
    return rec ? (rec.limits ?? rec.resources) : undefined;
  }
  /** Resources over the defaults; the disk quota only where the volume store enforces one. */
  private effectiveLimits(res: NonNullable<SandboxConfig['resources']>): SandboxLimits {
    const pick = (v: number | undefined, d: number) => (v === undefined ? d : v);
    for (const [k, v] of Object.entries(res)) {
      if (v !== undefined && (!Number.isSafeInteger(v) || v <= 0)) throw new RuntimeError('InvalidArgument', `resources.${k} must be a positive integer, got ${v}`);
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
  private ckptFile(c: string): string {
    return join(this.root, 'checkpoints', `${c}.json`);
  }
  private save(rec: SandboxRecord): void {
    writeJsonAtomic(join(this.sbxDir(rec.id), 'sandbox.json'), rec, false);
    this.records.set(rec.id, rec);
  }
  private rec(id: string): SandboxRecord {
    const r = this.records.get(id);
    if (!r) throw new RuntimeError('NotFound', `sandbox ${id} not found`);
    return r;
  }
  /** The cgroups a sandbox uses (by its limits); every possible one for an unknown id. */
  private cgroups(id: string): SandboxCgroups {
    const rec = this.records.get(id);
    return new SandboxCgroups(this.cg, rec?.cgroupKey ?? this.hostKey(id), this.limitsOf(rec));
  }
  /** Every cgroup the sandbox may have (limits unknown or changed): for cleanup. */
  private allCgroups(id: string): SandboxCgroups {
    return new SandboxCgroups(this.cg, this.records.get(id)?.cgroupKey ?? this.hostKey(id));
  }

  /**
   * Name of a sandbox in host-global places (cgroup `fluxvm/<key>`, veth, iptables comment
   * `fluxvm:<key>`): the id prefixed with a hash of this runtime's state directory, so two
   * runtimes on one host (test runs, a second node agent) never touch each other's.
   */
  hostKey(id: string): string {
    return `${this.scope}.${id}`;
  }

  /** Serializes operations on one key (a sandbox id); others run concurrently. */
  private locked<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.locks.set(key, tail);
    void tail.then(() => {
      if (this.locks.get(key) === tail) this.locks.delete(key);
    });
    return next;
  }

  private alive(rec: SandboxRecord): boolean {
    return !!rec.pid && !!rec.pidStart && procStart(rec.pid) === rec.pidStart;
  }

  private info(rec: SandboxRecord): SandboxInfo {
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
    };
  }

  /** The record's limits this host enforces (a limit without its cgroup controller is left out). */
  private enforcedLimits(rec: SandboxRecord): SandboxLimits {
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

  // ---------------------------------------------------------------- lifecycle

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
      // Landlock ABI 1 has the execute right and per-path write rules (native/procbox/README.md "Confinement").
      confinement: { execAllowlist: this.landlockAbi >= 1, paths: this.landlockAbi >= 1 },
    };
  }

  /**
   * Loads the state directory and adopts every sandbox: a live init is kept as is, a dead one
   * is restarted with its workspace (layers + upper) intact and `restarted: true`.
   */
  async start(): Promise<void> {
    if (this.started) return;
    if (!existsSync(this.helper)) throw new RuntimeError('Internal', `procbox helper not built: ${this.helper} (run make native)`);
    for (const d of ['sandboxes', 'layers', 'checkpoints', 'etc']) mkdirSync(join(this.root, d), { recursive: true, mode: 0o700 });
    rmSync(this.poolDir(), { recursive: true, force: true }); // ends a previous run's pool inits
    mkdirSync(this.poolDir(), { recursive: true, mode: 0o700 });
    const empty = join(this.root, 'empty');
    mkdirSync(empty, { recursive: true });
    chownSync(empty, this.uidBase, this.uidBase);
    this.vs = await openVolumeStore({ root: this.root, scope: this.scope, ...this.volOpts });
    const probe = await run(this.helper, ['probe']);
    this.landlockAbi = Number(/landlock (\d+)/.exec(probe.stdout)?.[1] ?? 0);
    for (const id of readdirSync(join(this.root, 'sandboxes'))) {
      const rec = readJson<SandboxRecord>(join(this.sbxDir(id), 'sandbox.json'));
      if (!rec) {
        // A create that never finished (records of network none are first written once the
        // init runs): removing the directory ends its init (lifeline); then its cgroups.
        await this.fileops.rmtree(this.sbxDir(id));
        await new SandboxCgroups(this.cg, this.hostKey(id)).destroy().catch(() => undefined);
        continue;
      }
      this.records.set(id, rec);
    }
    await this.dropPoolCgroups();
    this.dropEmptyCgroups();
    this.closed = false;
    this.started = true;
    for (const rec of [...this.records.values()]) {
      if (rec.destroying) {
        await this.locked(rec.id, () => this.teardown(rec.id)).catch((e) => this.logFailure('procbox: finishing the teardown of a sandbox at start failed', rec.id, e));
        continue;
      }
      if (this.alive(rec)) {
        // Frozen by a freeze() of a process that is gone (a crash mid-scan or mid-apply).
        if (rec.frozen) await this.locked(rec.id, () => this.thawAll(rec)).catch((e) => this.logFailure('procbox: thawing a sandbox left frozen failed', rec.id, e));
        // Frozen with no hold on disk: a crash inside a short freeze of our own (a checkpoint's
        // mark, a restore's remount). Nothing but spec.paused keeps a sandbox frozen across a
        // start, or every later command would join a frozen cgroup and hang.
        else if (!rec.paused && this.cgroups(rec.id).frozen()) {
          await this.locked(rec.id, () => this.cgroups(rec.id).setFrozen(false)).catch((e) => this.logFailure('procbox: thawing a sandbox left frozen failed', rec.id, e));
        }
        this.attachEgress(rec);
        continue;
      }
      delete rec.frozen;
      await this.locked(rec.id, () => this.restart(rec)).catch((e) => this.logFailure('procbox: restarting a sandbox at start failed', rec.id, e));
    }
    await this.refill().catch((e) => this.logFailure('procbox: filling the warm pool failed', undefined, e));
  }

  private logFailure(msg: string, id: string | undefined, e: unknown): void {
    this.log(msg, { ...(id ? { id } : {}), error: e instanceof Error ? e.message : String(e) });
  }

  /** Waits for running operations; ends the warm pool (sandboxes keep running). */
  async close(): Promise<void> {
    this.closed = true; // no refill from here on (an operation still running may ask for one)
    await Promise.all([...this.locks.values()]);
    this.fileops.close(); // started again by the next file operation
    clearTimeout(this.refillTimer);
    this.refillTimer = undefined;
    await this.filling?.catch(() => undefined);
    this.pool = [];
    if (this.started) {
      rmSync(this.poolDir(), { recursive: true, force: true });
      await this.dropPoolCgroups();
    }
  }

  private ensureStarted(): void {
    if (!this.started) throw new RuntimeError('Internal', 'procbox runtime: call start() first');
  }

  /** The generated /etc of a hostname; with `nameserver` (allowList: the link's host end) its resolv.conf names only that. */
  private etcDir(hostname: string, nameserver?: string): string {
    const dir = join(this.root, 'etc', nameserver ? `${hostname}~${nameserver}` : hostname);
    if (existsSync(join(dir, '.complete'))) return dir;
    mkdirSync(join(dir, 'ssl', 'certs'), { recursive: true });
    writeFileSync(join(dir, 'passwd'), 'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n');
    writeFileSync(join(dir, 'group'), 'root:x:0:\nnogroup:x:65534:\n');
    writeFileSync(join(dir, 'hostname'), hostname + '\n');
    writeFileSync(join(dir, 'hosts'), `127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t${hostname}\n`);
    writeFileSync(join(dir, 'nsswitch.conf'), 'passwd: files\ngroup: files\nhosts: files dns\n');
    let resolv = '';
    try {
      resolv = readFileSync('/etc/resolv.conf', 'utf8')
        .split('\n')
        .filter((l) => /^nameserver\s/.test(l) && !/\s(127\.|::1)/.test(l))
        .join('\n');
    } catch {
      // no resolver on the host
    }
    writeFileSync(join(dir, 'resolv.conf'), (nameserver ? `nameserver ${nameserver}` : resolv) + '\n');
    // Debian's alternatives (awk, editor, ...) are symlinks below /etc into /usr: copy the
    // links (never their targets' directories) so the commands resolve inside.
    mkdirSync(join(dir, 'alternatives'), { recursive: true });
    const alts = existsSync('/etc/alternatives') ? readdirSync('/etc/alternatives') : [];
    for (const n of alts) {
      try {
        const t = readlinkSync(join('/etc/alternatives', n));
        if (/^\/(usr|bin|sbin|lib)/.test(t)) symlinkSync(t, join(dir, 'alternatives', n));
      } catch {
        // not a symlink (README), or already there
      }
    }
    if (existsSync(HOST_CA_BUNDLE)) copyFileSync(HOST_CA_BUNDLE, join(dir, 'ssl', 'certs', 'ca-certificates.crt'));
    writeFileSync(join(dir, '.complete'), '');
    return dir;
  }

  /** Writes the helper CONFIG of a sandbox to its init.conf (remount, attach read it). */
  /** allowList: the host end of the sandbox's link (its resolver and proxy address). */
  private linkHost(rec: SandboxRecord): string | undefined {
    return rec.network.mode === 'allowList' && rec.network.index !== undefined ? subnetAddresses(rec.network.index).host : undefined;
  }

  /** Tells the egress proxy what to enforce for this sandbox's link. */
  private attachEgress(rec: SandboxRecord): void {
    if (rec.network.mode === 'allowList' && rec.network.address) this.egress?.attach(rec.network.address, rec.id, rec.network.allow ?? [], rec.network.watch, rec.network.http);
  }

  /**
   * A watched copy's egress (NetworkConfig.watch): what the proxy recorded, and the link is
   * sealed from now on. Undefined for a sandbox whose link is not watched.
   */
  async egressTraffic(id: string): Promise<EgressTraffic | undefined> {
    this.ensureStarted();
    const rec = this.rec(id);
    if (rec.network.mode !== 'allowList' || !rec.network.watch || !rec.network.address) return undefined;
    return this.egress?.takeTraffic?.(rec.network.address);
  }

  /**
   * Replaces the allow-list of a running allowList sandbox; the egress proxy enforces it from
   * the next connection on (no restart). Throws InvalidArgument for a bad entry (nothing
   * changes), Unsupported for another mode. Safe to repeat.
   */
  async setNetworkAllow(id: string, allow: string[], http?: HttpRule[]): Promise<void> {
    this.ensureStarted();
    await this.locked(id, async () => {
      const rec = this.rec(id);
      if (rec.network.mode !== 'allowList') throw new RuntimeError('Unsupported', `sandbox ${id} has network mode ${rec.network.mode}, not allowList`);
      this.checkAllow(allow, http);
      rec.network.allow = [...allow];
      if (http?.length) rec.network.http = http.map((r) => ({ ...r }));
      else delete rec.network.http;
      this.save(rec);
      this.attachEgress(rec);
    });
  }

  private checkAllow(allow: string[], http?: HttpRule[]): void {
    try {
      withHttpRules(parseAllowList(allow), http);
    } catch (e) {
      throw new RuntimeError('InvalidArgument', `network.allow: ${(e as Error).message}`);
    }
  }

  private initConfig(rec: SandboxRecord): string {
    const file = join(this.sbxDir(rec.id), 'init.conf');
    writeFileSync(file, this.configText(rec));
    return file;
  }

  private configText(rec: SandboxRecord): string {
    const dir = this.sbxDir(rec.id);
    if (!rec.vol) mkdirSync(this.workDir(rec), { recursive: true }); // the helper makes a volume's, not these
    const lowers = rec.layers.length ? [...rec.layers].reverse().map((l) => this.layerDir(l)) : [join(this.root, 'empty')];
    const lines = [
      `root ${join(dir, 'root')}`,
      `etc ${this.etcDir(rec.hostname, this.linkHost(rec))}`,
      `ws ${rec.workspacePath}`,
      ...lowers.map((l) => `lower ${l}`),
      ...(rec.vol ? [`vol ${this.volDir(rec)}`] : []),
      ...(rec.vol && this.vs.quota && this.limitsOf(rec)?.diskBytes ? [`vollimit ${this.limitsOf(rec)!.diskBytes}`] : []),
      ...(rec.vol && this.vs.quota && rec.qgroup ? [`volgroup ${rec.qgroup}`] : []),
      `upper ${this.upperDir(rec)}`,
      `work ${this.workDir(rec)}`,
      ...this.tmpfsLines(this.limitsOf(rec)),
      `hostname ${rec.hostname}`,
      `uidmap 0 ${this.uidBase} 65536`,
      `gidmap 0 ${this.uidBase} 65536`,
      ...this.cgroups(rec.id).procsFiles().map((f) => `cgroup ${f}`),
    ];
    return lines.join('\n') + '\n';
  }

  /** Config lines bounding /tmp and /dev/shm: bytes = tmpfsBytes, inodes = 1 per 16 KiB of it. */
  private tmpfsLines(l: SandboxLimits | undefined): string[] {
    const bytes = l?.tmpfsBytes ?? l?.memoryBytes;
    if (!bytes) return [];
    return [`tmpsize ${bytes}`, `tmpinodes ${Math.max(1024, Math.floor(bytes / 16384))}`];
  }

  /** Starts inits for `recs` in one helper run; sets pid and saves each. */
  private async launch(all: SandboxRecord[]): Promise<void> {
    if (all.length === 0) return;
    const recs = await this.launchWarm(all);
    if (recs.length === 0) return;
    const configs = recs.map((r) => {
      mkdirSync(join(this.sbxDir(r.id), 'root'), { recursive: true });
      return this.configText(r);
    });
    // One helper per core (each sets its inits up concurrently): an init costs a few ms of
    // kernel time (clone, ~20 mounts). The configs go over stdin: no file per init.
    const n = Math.min(availableParallelism(), Math.ceil(recs.length / 8));
    const chunks = Array.from({ length: n }, (_, k) => recs.map((_, i) => i).filter((i) => i % n === k));
    const answers = await Promise.all(chunks.map((idx) => run(this.helper, ['init', '-'], idx.map((i) => configs[i]! + '\0').join(''))));
    const errors: string[] = [];
    chunks.forEach((idx, k) => {
      const res = answers[k]!;
      const lines = res.stdout.split('\n').filter(Boolean);
      idx.forEach((i, j) => {
        const r = recs[i]!;
        const line = lines[j] ?? `err ${res.stderr.trim() || 'no answer'}`;
        if (line.startsWith('ok ')) {
          r.pid = Number(line.slice(3));
          r.pidStart = procStart(r.pid);
          r.paused = false;
          this.save(r);
        } else errors.push(`${r.id}: ${line.slice(4)}`);
      });
    });
    if (errors.length) throw new RuntimeError('Internal', `procbox init failed: ${errors.join('; ')}`);
  }

  // ---------------------------------------------------------------- warm pool
  //
  // Optional (option warmPool, default 0): inits started ahead of time, without a workspace,
  // in <root>/pool/<n>/. Taking one costs a rename of its root directory (the inotify
  // lifeline follows the inode), the cgroup joins and an overlay attach: the clone, the
  // namespaces and the ~20 mounts of the root are already done. Only sandboxes with the pool's
  // workspace path (/work) use it. Deleting the pool directory ends every pool init.

  private poolDir(): string {
    return join(this.root, 'pool');
  }

  /**
   * Refills the pool a little later: right after a take, the new sandbox's first steps (its
   * caller marking it Ready, a first exec) should not compete with starting inits.
   */
  private refillSoon(): void {
    if (this.refillTimer || this.closed) return;
    this.refillTimer = setTimeout(() => {
      this.refillTimer = undefined;
      void this.refill().catch((e) => this.logFailure('procbox: refilling the warm pool failed', undefined, e));
    }, REFILL_DELAY_MS);
    this.refillTimer.unref();
  }

  /** Starts pool inits up to warmPool. Safe to call often; one fill runs at a time. */
  private refill(): Promise<void> {
    if (this.warmPool <= 0 || this.closed || this.filling) return this.filling ?? Promise.resolve();
    const need = this.warmPool - this.pool.length;
    if (need <= 0) return Promise.resolve();
    this.filling = (async () => {
      const entries = Array.from({ length: need }, () => {
        const name = `w${randomBytes(6).toString('hex')}`;
        return { dir: join(this.poolDir(), name), cgroupKey: `${this.scope}.pool-${name}` };
      });
      const files = entries.map(({ dir, cgroupKey }) => {
        mkdirSync(join(dir, 'root'), { recursive: true });
        // Born in the cgroup it will keep as a sandbox: moving a running task is the slow part.
        const cg = new SandboxCgroups(this.cg, cgroupKey, {});
        cg.create({});
        const lines = [`pool 1`, `root ${join(dir, 'root')}`, `etc ${this.etcDir('sandbox')}`, `ws /work`, `hostname sandbox`, ...this.tmpfsLines(this.effectiveLimits({})), `uidmap 0 ${this.uidBase} 65536`, `gidmap 0 ${this.uidBase} 65536`, ...cg.procsFiles().map((f) => `cgroup ${f}`)];
        writeFileSync(join(dir, 'init.conf'), lines.join('\n') + '\n');
        return join(dir, 'init.conf');
      });
      const res = await run(this.helper, ['init', ...files]);
      const lines = res.stdout.split('\n').filter(Boolean);
      entries.forEach((e, i) => {
        const line = lines[i] ?? '';
        if (!line.startsWith('ok ')) return void this.dropPoolInit(e);
        const pid = Number(line.slice(3));
        this.pool.push({ ...e, pid, pidStart: procStart(pid) });
      });
    })().finally(() => {
      this.filling = undefined;
    });
    return this.filling;
  }

  /** Ends a pool init that is not used: its directory (the lifeline) and its cgroup. */
  private dropPoolInit(e: { dir: string; cgroupKey: string }): void {
    rmSync(e.dir, { recursive: true, force: true });
    void new SandboxCgroups(this.cg, e.cgroupKey).destroy().catch(() => undefined);
  }

  /** Removes the cgroups of pool inits not in the pool (a previous run's, or after close). */
  private async dropPoolCgroups(): Promise<void> {
    const parent = this.cg.v2 ? join(this.cg.v2, 'fluxvm') : this.cg.v1.freezer ? join(this.cg.v1.freezer, 'fluxvm') : undefined;
    if (!parent || !existsSync(parent)) return;
    // Sandboxes made from pool inits keep those cgroups.
    const keep = new Set([...this.pool.map((e) => e.cgroupKey), ...[...this.records.values()].map((r) => r.cgroupKey)]);
    const stale = readdirSync(parent).filter((n) => n.startsWith(`${this.scope}.pool-`) && !keep.has(n));
    await Promise.all(stale.map((n) => new SandboxCgroups(this.cg, n).destroy().catch(() => undefined)));
  }

  /**
   * Removes the empty cgroups of this state directory (`<scope>.*`, every hierarchy) that no
   * sandbox or pool init uses: those of sandboxes whose init ended without a destroy (state
   * directory removed: lifeline) or of a run that crashed. A populated cgroup is left alone
   * (rmdir fails with EBUSY).
   */
  private dropEmptyCgroups(): void {
    const keep = new Set([...this.pool.map((e) => e.cgroupKey), ...[...this.records.values()].map((r) => r.cgroupKey ?? this.hostKey(r.id))]);
    const mounts = new Set([...Object.values(this.cg.v1), this.cg.v2].filter((m): m is string => !!m));
    for (const m of mounts) {
      const parent = join(m, 'fluxvm');
      let names: string[];
      try {
        names = readdirSync(parent);
      } catch {
        continue;
      }
      for (const n of names) {
        if (!n.startsWith(`${this.scope}.`) || keep.has(n)) continue;
        try {
          rmdirSync(join(parent, n));
        } catch {
          // populated (or not a cgroup): not ours to end here
        }
      }
    }
  }

  /**
   * Gives pool inits to the records that can use one (they keep the init's cgroup, see
   * `cgroupKey`); creates the cgroups of the others; returns the records still to launch.
   */
  private async launchWarm(recs: SandboxRecord[]): Promise<SandboxRecord[]> {
    const cold: SandboxRecord[] = [];
    const warm: ({ rec: SandboxRecord } & PoolInit)[] = [];
    for (const rec of recs) {
      let e = this.pool.shift();
      while (e && !(e.pidStart && procStart(e.pid) === e.pidStart)) {
        this.dropPoolInit(e);
        e = this.pool.shift();
      }
      // A pool init's tmpfs mounts are sized for the default memory limit.
      if (!e || rec.network.mode === 'allowList' || rec.workspacePath !== '/work' || rec.hostname !== 'sandbox' || this.limitsOf(rec)?.tmpfsBytes !== this.effectiveLimits({}).tmpfsBytes) {
        if (e) this.pool.unshift(e);
        this.cgroups(rec.id).create(this.limitsOf(rec)!);
        cold.push(rec);
        continue;
      }
      const root = join(this.sbxDir(rec.id), 'root');
      rmSync(root, { recursive: true, force: true });
      renameSync(join(e.dir, 'root'), root);
      const own = rec.cgroupKey;
      rec.cgroupKey = e.cgroupKey;
      try {
        // Only v1 hierarchies with a limit still need a move of the running init.
        const cg = this.cgroups(rec.id);
        cg.create(this.limitsOf(rec)!);
        for (const f of cg.execTargets().v1Procs) writeFileSync(f, String(e.pid));
      } catch {
        try {
          process.kill(e.pid, 'SIGKILL');
        } catch {
          // gone
        }
        this.dropPoolInit(e);
        rec.cgroupKey = own;
        this.cgroups(rec.id).create(this.limitsOf(rec)!);
        cold.push(rec);
        continue;
      }
      warm.push({ rec, ...e });
    }
    if (warm.length) {
      // One helper per core, as in launch: an overlay mount is milliseconds of kernel time.
      const n = Math.min(availableParallelism(), Math.ceil(warm.length / 8));
      const chunks = Array.from({ length: n }, (_, k) => warm.filter((_, i) => i % n === k));
      const answers = await Promise.all(chunks.map((c) => run(this.helper, ['attach', ...c.flatMap((w) => [String(w.pid), this.initConfig(w.rec)])])));
      const lines = warm.map((_, i) => answers[i % n]!.stdout.split('\n').filter(Boolean)[Math.floor(i / n)]);
      warm.forEach((w, i) => {
        rmSync(w.dir, { recursive: true, force: true });
        if (lines[i] === 'ok') {
          Object.assign(w.rec, { pid: w.pid, pidStart: w.pidStart, paused: false });
          this.save(w.rec);
        } else {
          try {
            process.kill(w.pid, 'SIGKILL');
          } catch {
            // gone
          }
          void new SandboxCgroups(this.cg, w.cgroupKey).destroy().catch(() => undefined);
          delete w.rec.cgroupKey;
          this.cgroups(w.rec.id).create(this.limitsOf(w.rec)!);
          cold.push(w.rec);
        }
      });
    }
    if (warm.length) this.refillSoon();
    return cold;
  }

  private async restart(rec: SandboxRecord): Promise<void> {
    await this.allCgroups(rec.id).destroy().catch(() => undefined);
    if (rec.network.mode !== 'none') await teardownNetwork(this.hostKey(rec.id));
    this.bumpWork(rec);
    await this.launch([rec]);
    rec.network = await setupNetwork(this.hostKey(rec.id), rec.pid!, rec.network, this.egress);
    this.attachEgress(rec);
    rec.restarted = true;
    this.save(rec);
    // A freeze hold outlives the init it froze (start() drops the holds of a dead process first).
    if (rec.frozen) await this.cgroups(rec.id).setFrozen(true);
  }

  /**
   * Moves to a fresh overlay work directory (each mount needs its own; the helper creates it)
   * and drops old ones of the current volume.
   */
  private bumpWork(rec: SandboxRecord): void {
    if (!rec.vol) {
      const dir = this.sbxDir(rec.id);
      rec.gen += 1;
      for (const n of readdirSync(dir)) if (n.startsWith('work-') && n !== `work-${rec.gen - 1}`) rmSync(join(dir, n), { recursive: true, force: true });
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
      if (n.startsWith('w-') && n !== `w-${rec.gen}` && n !== `w-${rec.gen - 1}`) rmSync(join(dir, n), { recursive: true, force: true });
    }
  }

  async create(cfg: SandboxConfig): Promise<SandboxInfo> {
    this.ensureStarted();
    if (!cfg || typeof cfg.id !== 'string' || !ID_RE.test(cfg.id)) {
      throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(cfg?.id)}: letters, digits, . _ - (max 128)`);
    }
    return this.locked(cfg.id, async () => {
      const existing = this.records.get(cfg.id);
      if (existing) return this.info(existing);
      let layers: string[] = [];
      const src = cfg.source;
      if (src && 'checkpointId' in src) {
        const ck = readJson<CheckpointRecord>(this.ckptFile(src.checkpointId));
        if (!ck) throw new RuntimeError('NotFound', `checkpoint ${src.checkpointId} not found`);
        layers = ck.layers;
      } else if (src && 'sandboxId' in src) {
        if (src.sandboxId === cfg.id) throw new RuntimeError('InvalidArgument', 'a sandbox cannot be its own source');
        this.rec(src.sandboxId);
        // The source stays locked until the copy is recorded: its layers cannot be freed.
        return this.locked(src.sandboxId, async () => {
          const { token, layers: from } = await this.markLocked(this.rec(src.sandboxId));
          const rec = this.newRecord(cfg, from);
          rec.forkMark = token;
          await this.bringUp([rec]);
          return this.info(this.rec(rec.id));
        });
      }
      const rec = this.newRecord(cfg, layers);
      await this.bringUp([rec]);
      return this.info(this.rec(rec.id));
    });
  }

  private newRecord(cfg: SandboxConfig, layers: string[]): SandboxRecord {
    const ws = normalizeSandboxPath(cfg.workspacePath ?? '/work');
    validateSandboxPath(cfg.workspacePath ?? '/work');
    const first = ws.split('/')[1];
    if (ws === '/' || !first || RESERVED.has(first)) throw new RuntimeError('InvalidPath', `workspace path ${ws} collides with a system directory`);
    const mode = cfg.network?.mode ?? 'none';
    if (mode === 'allowList' && !this.egress) throw new RuntimeError('Unsupported', 'network mode allowList needs the host egress proxy, which this runtime was not given');
    if (mode !== 'none' && mode !== 'open' && mode !== 'allowList') throw new RuntimeError('Unsupported', `network mode ${mode} is not supported by procbox`);
    if (mode === 'allowList') this.checkAllow(cfg.network?.allow ?? [], cfg.network?.http);
    const hostname = cfg.hostname ?? 'sandbox';
    if (!/^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$/.test(hostname)) throw new RuntimeError('InvalidArgument', `invalid hostname ${hostname}`);
    const confinement = checkConfinement(this.capabilities(), cfg.confinement);
    return {
      id: cfg.id,
      workspacePath: ws,
      createdAt: nowIso(),
      hostname,
      env: { ...(cfg.env ?? {}) },
      ...(confinement ? { confinement } : {}),
      resources: { ...(cfg.resources ?? {}) },
      limits: this.effectiveLimits(cfg.resources ?? {}),
      vol: this.newVol(cfg.id),
      ...(this.vs.quota ? { qgroup: newQgroup() } : {}),
      network:
        mode === 'allowList'
          ? { mode, allow: [...(cfg.network?.allow ?? [])], ...(cfg.network?.http?.length ? { http: cfg.network.http.map((r) => ({ ...r })) } : {}), ...(cfg.network?.watch ? { watch: cfg.network.watch } : {}) }
          : { mode },
      layers: [...layers],
      gen: 0,
    };
  }

  /** Creates directories, cgroups, inits and networks for new records; undoes all on error. */
  private async bringUp(recs: SandboxRecord[]): Promise<void> {
    const used = new Set([...this.records.values()].map((r) => r.network.index).filter((i): i is number => i !== undefined));
    for (const rec of recs) {
      mkdirSync(this.sbxDir(rec.id), { recursive: true });
      if (rec.network.mode !== 'none') {
        // Recorded before the veth exists, so a crash leaves what to tear down.
        rec.network.index = allocateIndex(used);
        used.add(rec.network.index);
        this.save(rec);
      } else {
        this.records.set(rec.id, rec); // written by launch, once the init runs
      }
    }
    try {
      await this.launch(recs); // creates the cgroups
      // Networks of a fork's children are set up 4 at a time (each is a few processes).
      const open = recs.filter((r) => r.network.mode !== 'none');
      for (let i = 0; i < open.length; i += 4) {
        await Promise.all(
          open.slice(i, i + 4).map(async (rec) => {
            rec.network = await setupNetwork(this.hostKey(rec.id), rec.pid!, rec.network, this.egress);
            this.save(rec);
            this.attachEgress(rec);
          }),
        );
      }
    } catch (err) {
      for (const rec of recs) await this.teardown(rec.id).catch(() => undefined);
      throw err;
    }
  }

  async inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo> {
    this.ensureStarted();
    const rec = this.rec(id);
    if (opts?.revive && !this.alive(rec)) await this.locked(id, () => (this.alive(rec) ? Promise.resolve() : this.restart(rec)));
    return this.info(this.rec(id));
  }

  async list(): Promise<SandboxInfo[]> {
    this.ensureStarted();
    return [...this.records.values()].map((r) => this.info(r));
  }

  async destroy(id: string): Promise<void> {
    this.ensureStarted();
    if (!ID_RE.test(id)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(id)}`);
    await this.locked(id, async () => {
      await this.teardown(id);
      await this.gc();
    });
  }

  /** Everything of a sandbox goes: processes, cgroups, network, directory, record. */
  private async teardown(id: string): Promise<void> {
    const rec = this.records.get(id);
    if (rec && !rec.destroying) {
      rec.destroying = true; // a crash from here on: start() finishes the teardown
      this.save(rec);
    }
    await this.allCgroups(id).destroy(); // every hierarchy, used or not

    if (rec?.pid && this.alive(rec)) {
      try {
        process.kill(rec.pid, 'SIGKILL'); // no cgroups on this host: the init takes its pid ns down
      } catch {
        // gone
      }
      for (let i = 0; i < 200 && this.alive(rec); i++) await new Promise((r) => setTimeout(r, 5));
    }
    if (rec?.network.mode === 'allowList' && rec.network.address) this.egress?.detach(rec.network.address);
    if (!rec || rec.network.mode !== 'none') await teardownNetwork(this.hostKey(id));
    await this.fileops.rmtree(this.sbxDir(id)); // fd-based: trees deeper than PATH_MAX too
    if (rec?.vol) {
      const vols = join(this.vs.dir, 'vols');
      for (const n of readdirSync(vols)) if (n.startsWith(`${id}~`)) await this.fileops.rmtree(join(vols, n));
    }
    this.records.delete(id);
  }

  /** Removes layers no sandbox or checkpoint references. */
  private async gc(): Promise<void> {
    const used = new Set<string>();
    for (const r of this.records.values()) for (const l of r.layers) used.add(l);
    const ckdir = join(this.root, 'checkpoints');
    for (const f of readdirSync(ckdir)) {
      if (!f.endsWith('.json')) continue;
      const ck = readJson<CheckpointRecord>(join(ckdir, f));
      for (const l of ck?.layers ?? []) used.add(l);
    }
    for (const ldir of new Set([join(this.vs.dir, 'layers'), join(this.root, 'layers')])) {
      for (const n of readdirSync(ldir)) {
        const id = n.endsWith('.json') ? n.slice(0, -5) : n;
        if (!used.has(id)) await this.fileops.rmtree(join(ldir, n));
      }
    }
  }

  async pause(id: string): Promise<void> {
    this.ensureStarted();
    await this.locked(id, async () => {
      const rec = this.rec(id);
      if (!this.alive(rec)) throw new RuntimeError('Conflict', `sandbox ${id} is not running`);
      await this.cgroups(id).setFrozen(true);
      rec.paused = true;
      this.save(rec);
    });
  }

  async resume(id: string): Promise<void> {
    this.ensureStarted();
    await this.locked(id, async () => {
      const rec = this.rec(id);
      if (!rec.frozen) await this.cgroups(id).setFrozen(false); // a freeze hold keeps it frozen
      rec.paused = false;
      this.save(rec);
    });
  }

  /**
   * Freezes every process of the sandbox until thaw (see Runtime.freeze). The hold is on disk
   * before the freeze, so a crash while frozen is thawed by the next start(). A stopped
   * sandbox has no process to freeze: the hold is only counted.
   */
  async freeze(id: string): Promise<void> {
    this.ensureStarted();
    await this.locked(id, async () => {
      const rec = this.rec(id);
      rec.frozen = (rec.frozen ?? 0) + 1;
      this.save(rec);
      if (this.alive(rec) && !rec.paused && rec.frozen === 1) await this.cgroups(id).setFrozen(true);
    });
  }

  async thaw(id: string): Promise<void> {
    this.ensureStarted();
    await this.locked(id, async () => {
      const rec = this.records.get(id);
      if (!rec || !rec.frozen) return;
      rec.frozen -= 1;
      if (rec.frozen === 0) await this.thawAll(rec);
      else this.save(rec);
    });
  }

  /** Drops every freeze hold; thaws unless paused. Under the sandbox's lock. */
  private async thawAll(rec: SandboxRecord): Promise<void> {
    delete rec.frozen;
    if (this.alive(rec) && !rec.paused) await this.cgroups(rec.id).setFrozen(false);
    this.save(rec);
  }

  /** The parent's limits as resources, so a fork child gets the same ones (not today's defaults). */
  private limitOverrides(parent: SandboxRecord): NonNullable<SandboxConfig['resources']> {
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

  // ---------------------------------------------------------------- exec

  private async runnable(id: string): Promise<SandboxRecord> {
    const rec = this.rec(id);
    if (rec.paused) throw new RuntimeError('Conflict', `sandbox ${id} is paused`);
    if (!this.alive(rec)) await this.locked(id, () => (this.alive(rec) ? Promise.resolve() : this.restart(rec)));
    await this.syncTrust(rec);
    return rec;
  }

  /** etc dir -> the sandbox CA PEMs last written into its bundle (rewritten when the proxy re-mints). */
  private readonly trustWritten = new Map<string, string>();

  /**
   * allowList: waits for the proxy to answer on the link (EgressHook.ready). With TLS
   * interception: the generated /etc's CA bundle is the host bundle plus
   * the sandbox's egress CAs (native/egress/ca.ts), rewritten (tmp + rename, fsync not needed:
   * it is re-derived from memory at every exec) when they changed: a new CA after a serve
   * restart or a re-mint. Before every exec, so a command never starts with a stale bundle.
   */
  private async syncTrust(rec: SandboxRecord): Promise<void> {
    const host = this.linkHost(rec);
    if (!host || !this.egress) return;
    if (this.egress.ready && rec.network.address) {
      await this.egress.ready(rec.network.address).catch((e) => {
        throw new RuntimeError('Internal', `the egress proxy cannot listen on ${host}: ${(e as Error).message}`);
      });
    }
    if (!this.egress.trust) return;
    const pem = await this.egress.trust(rec.id);
    const dir = this.etcDir(rec.hostname, host);
    const key = `${dir}\0${rec.id}`;
    if (this.trustWritten.get(dir) === key + pem) return;
    const base = existsSync(HOST_CA_BUNDLE) ? readFileSync(HOST_CA_BUNDLE, 'utf8') : '';
    const file = join(dir, 'ssl', 'certs', 'ca-certificates.crt');
    // Write and rename run without an await between them: concurrent commands never interleave here.
    writeFileSync(file + '.tmp', (base && !base.endsWith('\n') ? base + '\n' : base) + pem, { mode: 0o644 });
    renameSync(file + '.tmp', file);
    this.trustWritten.set(dir, key + pem);
  }

  /** allowList: the proxy settings (clients that ignore them are intercepted transparently). */
  private proxyEnv(rec: SandboxRecord): Record<string, string> {
    const host = this.linkHost(rec);
    if (!host || !this.egress) return {};
    const url = `http://${host}:${this.egress.port}`;
    // The bundle of the generated /etc holds the sandbox's egress CA (syncTrust): every
    // usual client's variable names it (Node, Python requests, curl, git, OpenSSL).
    const ca = this.egress.trust ? Object.fromEntries(CA_ENV.map((k) => [k, HOST_CA_BUNDLE])) : {};
    return { HTTP_PROXY: url, HTTPS_PROXY: url, http_proxy: url, https_proxy: url, NO_PROXY: 'localhost,127.0.0.1', no_proxy: 'localhost,127.0.0.1', ...ca };
  }

  private execSpec(rec: SandboxRecord, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>) {
    if (!Array.isArray(req.argv) || req.argv.length === 0 || req.argv.some((a) => typeof a !== 'string' || a.includes('\0'))) {
      throw new RuntimeError('InvalidArgument', 'argv must be a non-empty list of strings without NUL');
    }
    const cwd = req.cwd ?? rec.workspacePath;
    validateSandboxPath(cwd);
    const env: Record<string, string> = {
      PATH: DEFAULT_PATH,
      HOME: '/tmp',
      LANG: 'C.UTF-8',
      TERM: 'xterm',
      HOSTNAME: rec.hostname,
      ...this.proxyEnv(rec),
      ...rec.env,
      ...(req.env ?? {}),
    };
    for (const [k, v] of Object.entries(env)) {
      if (!k || k.includes('=') || k.includes('\0') || String(v).includes('\0')) throw new RuntimeError('InvalidArgument', `invalid env ${k}`);
    }
    const targets = this.cgroups(rec.id).execTargets();
    return {
      helper: this.helper,
      pid: rec.pid!,
      workspacePath: rec.workspacePath,
      cwd,
      cgroupProcs: targets.v1Procs,
      cgroupDir: targets.v2Dir,
      argv: req.argv,
      ...(req.tty ? { tty: req.tty } : {}),
      env,
      confinement: confinementArgs(rec.confinement, { serverCommand: req.serverCommand }),
    };
  }

  async resolveExecutables(id: string): Promise<ResolvedExecutables> {
    this.ensureStarted();
    const rec = await this.runnable(id);
    if (!rec.confinement?.execAllow) return { programs: [], missing: [], implied: [] };
    const spec = { ...this.execSpec(rec, { argv: ['true'] }), confinement: [...confinementArgs(rec.confinement), '--resolve-only'] };
    const { child, exit } = startExec(spec);
    let out = '';
    child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr!.resume();
    child.stdin!.end();
    const done = exit(10_000);
    await drained(child.stdout!, done);
    const r = await done;
    if (r.exitCode !== 0) throw new RuntimeError('Internal', `resolving the exec allow-list of ${id}: ${r.error ?? `exit ${r.exitCode}`}`);
    return parseResolved(out);
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    this.ensureStarted();
    const rec = await this.runnable(id);
    const spec = this.execSpec(rec, req);
    const cg = this.cgroups(id);
    const oomBefore = cg.oomKills();
    const t0 = performance.now();
    const max = req.maxOutputBytes ?? Infinity;
    const { child, exit } = startExec(spec);
    const out = { stdout: [] as Buffer[], stderr: [] as Buffer[], n: { stdout: 0, stderr: 0 }, dropped: { stdout: 0, stderr: 0 } };
    for (const s of ['stdout', 'stderr'] as const) {
      child[s]!.on('data', (b: Buffer) => {
        const room = Math.max(0, max - out.n[s]);
        if (room >= b.length) {
          out[s].push(b);
          out.n[s] += b.length;
        } else {
          if (room > 0) out[s].push(b.subarray(0, room));
          out.n[s] += room;
          out.dropped[s] += b.length - room;
        }
      });
    }
    child.stdin!.on('error', () => undefined); // the command may not read its stdin
    child.stdin!.end(req.stdin ?? undefined);
    const done = exit(req.timeoutMs);
    await Promise.all([drained(child.stdout!, done), drained(child.stderr!, done)]);
    const r = await done;
    const oom = cg.oomKills() > oomBefore;
    if (oom) {
      rec.lastOomKillAt = nowIso();
      this.save(rec);
    }
    const stderr = Buffer.concat(out.stderr);
    return {
      exitCode: r.exitCode,
      signal: r.signal,
      stdout: Buffer.concat(out.stdout),
      stderr: r.error ? Buffer.concat([stderr, Buffer.from(`procbox: ${r.error}\n`)]) : stderr,
      stdoutDropped: out.dropped.stdout,
      stderrDropped: out.dropped.stderr,
      truncated: out.dropped.stdout + out.dropped.stderr > 0,
      timedOut: r.timedOut,
      oomKilled: oom || undefined,
      durationMs: performance.now() - t0,
    };
  }

  async execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    this.ensureStarted();
    const rec = await this.runnable(id);
    const { child, exit, kill, resize } = startExec(this.execSpec(rec, req));
    const done = exit(req.timeoutMs);
    const all = Promise.all([drained(child.stdout!, done), drained(child.stderr!, done)]).then(() => done);
    return {
      stdin: child.stdin!,
      stdout: child.stdout!,
      stderr: child.stderr!,
      exit: all.then((r) => ({ exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut })),
      kill,
      ...(req.tty ? { resize } : {}),
    };
  }

  // ---------------------------------------------------------------- files (files.ts)

  /** The Files API of a sandbox; brings a dead init back first (workspace intact). */
  private async files(id: string): Promise<WorkspaceFiles> {
    const rec = this.rec(id);
    if (!this.alive(rec)) await this.locked(id, () => (this.alive(rec) ? Promise.resolve() : this.restart(rec)));
    return new WorkspaceFiles(this.fileops, `/proc/${rec.pid}/root`, rec.workspacePath, this.uidBase);
  }

  async listFiles(id: string, path: string): Promise<FileEntry[]> {
    return (await this.files(id)).list(path);
  }

  async stat(id: string, path: string): Promise<FileEntry> {
    return (await this.files(id)).stat(path);
  }

  async readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    return (await this.files(id)).read(path, opts);
  }

  async writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    await (await this.files(id)).write(path, data, opts);
  }

  async readTar(id: string, path: string): Promise<Readable> {
    return (await this.files(id)).tarOut(path);
  }

  async writeTar(id: string, path: string, tar: Readable, opts?: { maxEntries?: number }): Promise<TarSummary> {
    return (await this.files(id)).tarIn(path, tar, opts);
  }

  /** Refuses '/', one-component paths and the workspace root itself. */
  async deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void> {
    validateSandboxPath(path);
    if (normalizeSandboxPath(path).split('/').filter(Boolean).length < 2) throw new RuntimeError('InvalidPath', `refusing to delete ${path}`);
    await (await this.files(id)).delete(path, opts);
  }

  /**
   * Manifests cover the workspace only (like the Files API): a path below it is walked as
   * given, an ancestor of it (e.g. '/') means the whole workspace (the walk would stop at the
   * workspace mount point anyway), anything else (/proc, /tmp, ...) is InvalidPath.
   */
  async manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
    validateSandboxPaths(paths, limits);
    const rec = this.rec(id);
    const roots = new Set<string>();
    for (const p of paths.map(normalizeSandboxPath)) {
      if (isUnder(p, rec.workspacePath)) roots.add(p);
      else if (isUnder(rec.workspacePath, p)) roots.add(rec.workspacePath);
      else throw new RuntimeError('InvalidPath', `path ${p} is outside the workspace ${rec.workspacePath}`);
    }
    await this.files(id);
    return sandboxManifest(this.fileops, `/proc/${this.rec(id).pid}/root`, rec.workspacePath, [...roots], limits);
  }

  // ---------------------------------------------------------------- layers

  /**
   * Freezes the sandbox's upper into a new layer and remounts the workspace on top of it.
   * Must run under the sandbox's lock. Throws Busy when a process holds a workspace file open
   * for writing (nothing changes then).
   */
  private async markLocked(rec: SandboxRecord): Promise<{ token: string; layers: string[] }> {
    const lid = `l${Date.now().toString(36)}${randomBytes(5).toString('hex')}`;
    const alive = this.alive(rec);
    const cg = this.cgroups(rec.id);
    const frozenBefore = rec.paused || !!rec.frozen;
    if (alive && !frozenBefore) await cg.setFrozen(true);
    try {
      // The whole volume (upper and work, one btrfs subvolume with its quota) becomes the layer
      // (a record of before volumes: its upper directory, into the old layers directory).
      const oldVol = rec.vol;
      const oldDir = rec.vol ? this.volDir(rec) : this.upperDir(rec);
      const layerAt = rec.vol ? join(this.vs.dir, 'layers', lid) : this.legacyLayer(lid);
      renameSync(oldDir, layerAt);
      rec.vol = this.newVol(rec.id); // created by the helper (remount, or the next init)
      const prev = rec.layers;
      rec.layers = [...prev, lid];
      const gen = rec.gen;
      this.bumpWork(rec);
      if (alive) {
        const r = await run(this.helper, ['remount', String(rec.pid), this.initConfig(rec)]);
        if (r.code !== 0) {
          // Put everything back as it was.
          rmSync(this.volDir(rec), { recursive: true, force: true });
          rec.vol = oldVol;
          renameSync(layerAt, oldDir);
          rec.layers = prev;
          rec.gen = gen;
          this.initConfig(rec);
          const msg = r.stdout.trim().replace(/^(busy|err) /, '');
          if (r.code === 3) throw new RuntimeError('Busy', `sandbox ${rec.id}: a process holds a workspace file open for writing (${msg})`);
          throw new RuntimeError('Internal', `remount workspace: ${msg || r.stderr.trim()}`);
        }
      }
      this.save(rec);
    } finally {
      if (alive && !frozenBefore) await cg.setFrozen(false);
    }
    // Scanned once frozen: the old mount is read-only now, so the listing is final.
    const entries = await scanLayer(this.fileops, this.layerDir(lid));
    const size = entries.filter((e) => e.type === 'f').reduce((a, e) => a + e.size, 0);
    const meta: LayerMeta = { id: lid, sizeBytes: size, opaque: [...opaqueSet(entries)], createdAt: nowIso() };
    // No fsync: the layer's files are not synced either, except by checkpoint, whose
    // `sync -f` of the filesystem covers this file too.
    writeJsonAtomic(`${this.layerVol(lid)}.json`, meta, false);
    if (rec.layers.length > this.maxLayers) await this.compact(rec);
    return { token: lid, layers: [...rec.layers] };
  }

  /**
   * Merges every layer but the newest 8 into one (hard links: no file data is copied; frozen
   * layers are never written, so sharing inodes is safe). Marks naming the newest merged layer
   * stay valid through an alias; older marks in the merged range then fail with Conflict.
   */
  private async compact(rec: SandboxRecord): Promise<void> {
    const keep = 8;
    const merge = rec.layers.slice(0, rec.layers.length - keep);
    const lid = `l${Date.now().toString(36)}${randomBytes(5).toString('hex')}c`;
    mkdirSync(this.layerVol(lid));
    await mergeLayers(this.fileops, merge.map((l) => this.layerDir(l)), this.layerDir(lid));
    const entries = await scanLayer(this.fileops, this.layerDir(lid));
    const size = entries.filter((e) => e.type === 'f').reduce((a, e) => a + e.size, 0);
    writeJsonAtomic(`${this.layerVol(lid)}.json`, { id: lid, sizeBytes: size, opaque: [], createdAt: nowIso() } satisfies LayerMeta);
    rec.aliases = { ...(rec.aliases ?? {}), [merge[merge.length - 1]!]: lid };
    rec.layers = [lid, ...rec.layers.slice(merge.length)];
    this.bumpWork(rec);
    if (this.alive(rec)) {
      const r = await run(this.helper, ['remount', String(rec.pid), this.initConfig(rec)]);
      if (r.code !== 0) throw new RuntimeError('Internal', `remount after compaction: ${r.stdout.trim()}`);
    }
    this.save(rec);
    await this.gc();
  }

  private stackLayer(l: string): StackLayer {
    const meta = readJson<LayerMeta>(`${this.layerVol(l)}.json`);
    return { dir: this.layerDir(l), opaque: new Set(meta?.opaque ?? []) };
  }

  async mark(id: string): Promise<WorkspaceMark> {
    this.ensureStarted();
    return this.locked(id, async () => ({ sandboxId: id, token: (await this.markLocked(this.rec(id))).token }));
  }

  async changesSince(id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff> {
    this.ensureStarted();
    if (paths) validateSandboxPaths(paths);
    const rec = this.rec(id);
    const token = rec.aliases?.[mark.token] ?? mark.token;
    const idx = rec.layers.indexOf(token);
    if (idx < 0) throw new RuntimeError('Conflict', `mark ${mark.token} is not in the history of sandbox ${id} (restored or compacted)`);
    const base = rec.layers.slice(0, idx + 1).reverse().map((l) => this.stackLayer(l));
    const newer = [];
    const upper = this.upperDir(rec);
    const upEntries = await scanLayer(this.fileops, upper);
    newer.push({ layer: { dir: upper, opaque: opaqueSet(upEntries) }, entries: upEntries });
    for (const l of rec.layers.slice(idx + 1).reverse()) {
      const sl = this.stackLayer(l);
      newer.push({ layer: sl, entries: await scanLayer(this.fileops, sl.dir) });
    }
    const filters = paths?.map(normalizeSandboxPath);
    const filter = (p: string) => !filters || filters.some((f) => isUnder(p, f));
    return changesBetween(this.fileops, base, newer, rec.workspacePath, filter);
  }

  async checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo> {
    this.ensureStarted();
    if (opts?.memory) throw new RuntimeError('Unsupported', 'procbox has no memory checkpoints (CRIU does not work on this kernel)');
    if (!ID_RE.test(checkpointId)) throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
    return this.locked(id, async () => {
      const existing = readJson<CheckpointRecord>(this.ckptFile(checkpointId));
      if (existing) {
        if (existing.sandboxId !== id) throw new RuntimeError('Conflict', `checkpoint ${checkpointId} belongs to sandbox ${existing.sandboxId}`);
        return ckInfo(existing);
      }
      const { token, layers } = await this.markLocked(this.rec(id));
      // A checkpoint is a promise about the disk: flush the filesystem holding the layers
      // (mark alone leaves the writeback to the kernel).
      await run('sync', ['-f', this.layerDir(token)]);
      const size = layers.reduce((a, l) => a + (readJson<LayerMeta>(`${this.layerVol(l)}.json`)?.sizeBytes ?? 0), 0);
      const ck: CheckpointRecord = { id: checkpointId, sandboxId: id, layers, takenAt: nowIso(), sizeBytes: size };
      writeJsonAtomic(this.ckptFile(checkpointId), ck);
      return ckInfo(ck);
    });
  }

  /**
   * Puts the workspace back to the checkpoint: its layers plus a fresh empty upper. Running
   * processes survive (see the header for what they see); the discarded upper is deleted.
   */
  async restore(id: string, checkpointId: string): Promise<void> {
    this.ensureStarted();
    await this.locked(id, async () => {
      const rec = this.rec(id);
      const ck = readJson<CheckpointRecord>(this.ckptFile(checkpointId));
      if (!ck) throw new RuntimeError('NotFound', `checkpoint ${checkpointId} not found`);
      const trash = rec.vol ? join(this.vs.dir, 'vols', `${id}~discard-${Date.now()}`) : join(this.sbxDir(id), `discard-${Date.now()}`);
      const cur = rec.vol ? this.volDir(rec) : this.upperDir(rec);
      if (existsSync(cur)) renameSync(cur, trash);
      rec.vol = this.newVol(id); // created by the helper (remount, or the next init)
      rec.layers = [...ck.layers];
      this.bumpWork(rec);
      this.save(rec);
      if (this.alive(rec)) {
        const cg = this.cgroups(id);
        const held = rec.paused || !!rec.frozen;
        if (!held) await cg.setFrozen(true);
        try {
          const r = await run(this.helper, ['remount', String(rec.pid), this.initConfig(rec), 'discard']);
          if (r.code !== 0) throw new RuntimeError('Internal', `remount workspace: ${r.stdout.trim() || r.stderr.trim()}`);
        } finally {
          if (!held) await cg.setFrozen(false);
        }
      }
      await this.fileops.rmtree(trash);
      await this.gc();
    });
  }

  async deleteCheckpoint(checkpointId: string): Promise<void> {
    this.ensureStarted();
    if (!ID_RE.test(checkpointId)) throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
    rmSync(this.ckptFile(checkpointId), { force: true });
    await this.gc();
  }

  async fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    this.ensureStarted();
    for (const c of childIds) {
      if (!ID_RE.test(c)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(c)}`);
      if (c === parentId) throw new RuntimeError('InvalidArgument', 'a fork child cannot have the parent id');
    }
    if (new Set(childIds).size !== childIds.length) throw new RuntimeError('InvalidArgument', 'duplicate child ids');
    const parent = this.rec(parentId);
    // The parent stays locked until the children are recorded: its layers cannot be freed.
    const token = await this.locked(parentId, async () => {
      const { token, layers } = await this.markLocked(parent);
      const fresh = childIds.filter((c) => !this.records.has(c));
      const recs = fresh.map((c) =>
        this.newRecord(
          { id: c, workspacePath: parent.workspacePath, network: opts?.network ?? { mode: parent.network.mode, allow: parent.network.allow, ...(parent.network.http ? { http: parent.network.http } : {}) }, resources: { ...parent.resources, ...this.limitOverrides(parent) }, env: parent.env, hostname: parent.hostname, confinement: parent.confinement },
          layers,
        ),
      );
      for (const r of recs) r.forkMark = token;
      await this.bringUp(recs);
      return token;
    });
    return { children: childIds.map((c) => this.info(this.rec(c))), parentMark: { sandboxId: parentId, token } };
  }
}

/** A sandbox's qgroup number: random among 2^40, so unique in a volume store (never reused). */
function newQgroup(): number {
  return randomBytes(5).readUIntBE(0, 5) + 1;
}

function ckInfo(ck: CheckpointRecord): CheckpointInfo {
  return { id: ck.id, sandboxId: ck.sandboxId, kind: 'disk', sizeBytes: ck.sizeBytes, takenAt: ck.takenAt };
}
