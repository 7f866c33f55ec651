// The VM backend of the native Runtime: QEMU microVMs with the guest agent.
//
// Every VM starts from a golden template: one cold boot per (image, memory size, accel)
// saves the booted guest with its RAM in a file (x-ignore-shared: only device state goes to
// the stream); a new VM maps that file privately (copy-on-write) and loads the device state,
// so create costs a restore, not a boot. The workspace is an ext4 disk (virtio-blk) mounted
// at /run/disk and bound at the workspace path; each VM writes to its own qcow2 overlay.
// Checkpoints freeze the current overlay (it becomes a read-only backing file in disks/,
// the VM continues on a new overlay above it) and, for a memory checkpoint, save the whole
// machine with a migration to a file. Restore and fork start new QEMU processes from those
// files, each on a fresh overlay; after any restore the agent sets the clock and reseeds
// the guest RNG (and, for new identities, the hostname and machine-id).
//
// State directory layout (everything a restart needs is on disk):
//   templates/<key>/{ram,state,ram-bare,state-bare,disk.qcow2,template.json}
//     (ram/state: workspace disk mounted, for new VMs; *-bare: before mounting, for guests
//     that start over another disk: disk-checkpoint restore and revive)
//   vms/<id>/{vm.json,qmp.sock,agent.sock,console.log,qemu.log,qemu.pid}
//     (qmp.sock and agent.sock are symlinks to the sockets in the socket directory: unix
//     socket paths must fit in 108 bytes, and the state directory may be of any length)
//   overlays/<random>.qcow2  each VM's writable disk (a stable path: QEMU reopens it by
//                            name when it re-activates block devices after a migration)
//   pool/<random>/           warm QEMUs waiting for the template state (renamed to vms/<id>)
//   checkpoints/<id>/{checkpoint.json,mem.state[,ram,state]}
//   disks/<random>.qcow2   frozen overlays shared by checkpoints, forks and VMs (GC'd)
// Socket directory (socketDirFor: /run/fluxvm/<hash> or <tmp>/fluxvm-<hash>, mode 0700):
//   <random>.qmp, <random>.agent  the sockets of each running QEMU (new names per launch)
import { execFile } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, copyFileSync, truncateSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, chownSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  checkConfinement,
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type ForkOptions,
  type ForkResult,
  type InstanceFailure,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
  type WorkspaceMark,
  type WriteFileOptions,
} from '../runtime.js';
import type { Diff, Manifest, ManifestLimits } from '../workspace/types.js';
import { AgentClient, type AGENT_LIMITS, type AgentProtocolError } from './agent-client.js';
import { QmpClient } from './qmp.js';
import {
  createOverlay, ensureSocketDir, execFileP, giveToQemu, isOurQemu, killAndWait, launchQemu, migrateFromFile, migrateToFile, pidAlive, probeAccel,
  hostTscKhz, qcow2Backing, QEMU_USER, removeSockets, resolveQemuUser, socketDirFor, socketPaths, socketTarget,
  type Accel, type LaunchSpec, type MachineSpec, type QemuUser,
} from './qemu.js';

const TEMPLATE_VERSION = 2;
/**
 * The repository root (it holds hack/vm-image.sh): the nearest directory above this module with
 * a package.json, so it is the same whether this file runs from native/vm (tsx) or from
 * dist/native/vm (after `make build`).
 */
const REPO_ROOT = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'hack', 'vm-image.sh'))) return dir;
    const up = dirname(dir);
    if (up === dir) return resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
    dir = up;
  }
})();
const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

export interface VmRuntimeOptions {
  /** Directory owned by this backend (e.g. <state-dir>/vm). Any length. */
  stateDir: string;
  /** Where QEMU's unix sockets go (short: sun_path is 108 bytes). Default socketDirFor(stateDir). */
  socketDir?: string;
  /** A built guest image directory (hack/vm-image.sh output); built on demand when absent. */
  imageDir?: string;
  /** Build/use the image with the Debian root filesystem (python3, git): hack/vm-image.sh --rootfs. */
  rootfs?: boolean;
  /** Guest RAM in MiB unless a sandbox asks for another size. Default 256. */
  memoryMiB?: number;
  accel?: 'auto' | Accel;
  qemuBinary?: string;
  log?: (msg: string) => void;
  /**
   * QEMU processes kept started and waiting for the template's state, so a create skips
   * the process start (about 100-250 ms here). Default 1; 0 disables. Killed by close().
   */
  warmPool?: number;
  /** Overrides of the agent channel's caps and truncated-frame timeout (AGENT_LIMITS; tests). */
  agentLimits?: Partial<typeof AGENT_LIMITS>;
  /**
   * The user QEMU runs as when this process is root: a user name or `uid:gid` (default
   * `fluxvm-qemu`, created by hack/setup.sh; start() fails Internal when it does not exist).
   * `false`: QEMU runs as this process's user (what a non-root process always does).
   */
  qemuUser?: string | false;
}

/** A saved machine as a RAM file (mapped privately by its users) plus its device state. */
interface MemImage {
  ram: string;
  state: string;
}

interface PoolEntry {
  dir: string;
  disk: string;
  name: string;
  pid: number;
  qmp: QmpClient;
  templateKey: string;
}

interface ImageInfo {
  dir: string;
  hash: string;
  kernel: string;
  initrd: string;
  disk: string;
  rootfs?: string;
  diskSize: string;
}

interface TemplateInfo {
  key: string;
  dir: string;
  memMiB: number;
  disk: string;
  ram: string;
  state: string;
  ramBare: string;
  stateBare: string;
  bootMs: number;
}

interface VmMeta {
  id: string;
  createdAt: string;
  workspacePath: string;
  hostname: string;
  machineId: string;
  env: Record<string, string>;
  memMiB: number;
  templateKey: string;
  /** The overlay the VM writes to now (absolute). */
  disk: string;
  diskSeq: number;
  state: 'running' | 'paused';
  pid?: number;
  /** QEMU's -name, unique per process: how a restart recognises our QEMU. */
  qemuName?: string;
  restarted?: boolean;
  /** The guest broke the agent protocol: QEMU was stopped and the VM is never used again. */
  failed?: InstanceFailure;
}

interface CheckpointMeta {
  id: string;
  sandboxId: string;
  kind: 'disk' | 'memory';
  takenAt: string;
  sizeBytes: number;
  disk: string;
  memMiB: number;
  templateKey: string;
  workspacePath: string;
  hostname: string;
  machineId: string;
}

interface Vm {
  meta: VmMeta;
  dir: string;
  qmp?: QmpClient;
  agent?: AgentClient;
  agentConnecting?: Promise<AgentClient>;
  /** Serialises lifecycle operations (checkpoint, restore, fork, pause, destroy). */
  lock: Promise<void>;
  /** Lifecycle operations running or queued. */
  pending: number;
}

/** Measured phases of the last operations, for the benchmark. */
export interface VmTimings {
  coldBootMs?: number;
  lastCreateMs?: number;
  lastRestoreMs?: number;
  lastForkMs?: number;
  lastCheckpointMs?: number;
  /** Milliseconds per phase of the last QEMU start (launch, qmp, load, agent, identity). */
  lastBootPhases?: Record<string, number>;
  /** Milliseconds per phase of the last fork (save: parent stopped; convert; children). */
  lastForkPhases?: Record<string, number>;
}

export class VmRuntime implements Runtime {
  private readonly stateDir: string;
  /** The short directory holding the QEMU sockets; see socketDirFor. */
  readonly socketDir: string;
  private readonly accel: Accel;
  private readonly qemu: string;
  private readonly memMiB: number;
  private readonly log: (msg: string) => void;
  private readonly vms = new Map<string, Vm>();
  private readonly templates = new Map<string, Promise<TemplateInfo>>();
  private readonly inflightDisks = new Set<string>();
  private image?: ImageInfo;
  private imageBuilding?: Promise<ImageInfo>;
  private started = false;
  private pool: PoolEntry[] = [];
  private poolFilling = 0;
  private readonly conversions = new Map<string, Promise<void>>();
  private convQueue: Promise<void> = Promise.resolve();
  private readonly failureListeners: Array<(id: string, f: InstanceFailure) => void> = [];
  /** Who QEMU runs as (undefined: this process's user). Set by start(). */
  qemuUser: QemuUser | undefined;
  readonly timings: VmTimings = {};

  constructor(private readonly opts: VmRuntimeOptions) {
    this.stateDir = resolve(opts.stateDir);
    this.socketDir = resolve(opts.socketDir ?? socketDirFor(this.stateDir));
    this.accel = !opts.accel || opts.accel === 'auto' ? probeAccel() : opts.accel;
    this.qemu = opts.qemuBinary ?? 'qemu-system-x86_64';
    this.memMiB = opts.memoryMiB ?? 256;
    this.log = opts.log ?? (() => undefined);
  }

  capabilities(): Capabilities {
    return {
      backend: 'vm',
      isolation: this.accel,
      accelerator: this.accel,
      exec: true,
      streamingExec: true,
      files: true,
      diskCheckpoint: true,
      memoryCheckpoint: true,
      fork: true,
      pause: true,
      layeredWorkspace: false,
      networkModes: ['none'],
      limits: { memory: true, pids: false, cpu: false, cgroup: 'none' },
    };
  }

  // ---- lifecycle of the runtime ----

  /** Adopts VMs whose QEMU still runs and answers QMP; removes the rest. Safe to call twice. */
  async start(): Promise<void> {
    if (process.getuid?.() === 0 && this.opts.qemuUser !== false) {
      const name = this.opts.qemuUser ?? QEMU_USER;
      this.qemuUser = resolveQemuUser(name);
      if (!this.qemuUser) throw new RuntimeError('Internal', `the QEMU user ${name} does not exist (hack/setup.sh creates ${QEMU_USER}); QEMU never runs as root`);
    }
    for (const d of ['templates', 'vms', 'checkpoints', 'disks', 'tmp', 'pool', 'overlays']) mkdirSync(join(this.stateDir, d), { recursive: true });
    rmSync(join(this.stateDir, 'tmp'), { recursive: true, force: true });
    mkdirSync(join(this.stateDir, 'tmp'));
    // QEMU reaches the state directory only relatively from its working directory (this one):
    // it may pass through (never list) the directories holding its disks and RAM files, and
    // cannot enter the others (metadata, pool, temporary files).
    if (this.qemuUser) {
      chmodSync(this.stateDir, 0o711);
      for (const d of ['templates', 'checkpoints', 'disks', 'overlays']) chmodSync(join(this.stateDir, d), 0o711);
      for (const d of ['vms', 'tmp', 'pool']) chmodSync(join(this.stateDir, d), 0o700);
    }
    ensureSocketDir(this.socketDir, this.qemuUser?.gid);
    for (const name of readdirSync(join(this.stateDir, 'templates'))) {
      if (name.includes('.tmp')) rmSync(join(this.stateDir, 'templates', name), { recursive: true, force: true });
    }
    for (const name of readdirSync(join(this.stateDir, 'checkpoints'))) {
      const dir = join(this.stateDir, 'checkpoints', name);
      if (name.includes('.tmp') || !existsSync(join(dir, 'checkpoint.json'))) rmSync(dir, { recursive: true, force: true });
    }
    for (const id of readdirSync(join(this.stateDir, 'vms'))) {
      if (this.vms.has(id)) continue;
      const dir = join(this.stateDir, 'vms', id);
      let meta: VmMeta | undefined;
      try {
        meta = JSON.parse(readFileSync(join(dir, 'vm.json'), 'utf8')) as VmMeta;
      } catch {
        meta = undefined;
      }
      const pid = meta?.pid ?? readPid(dir);
      const marker = meta?.qemuName ?? dir;
      if (meta?.failed) {
        // Kept (disk and all) so inspect still says why, until the sandbox is destroyed.
        if (isOurQemu(pid, marker)) await killAndWait(pid);
        removeSockets(dir);
        this.vms.set(id, { meta: { ...meta, pid: undefined }, dir, lock: Promise.resolve(), pending: 0 });
        continue;
      }
      if (meta && isOurQemu(pid, marker)) {
        try {
          const qmp = await QmpClient.connect(socketTarget(socketPaths(dir).qmp), 3000);
          const status = await qmp.status();
          meta.state = status === 'paused' ? 'paused' : 'running';
          this.vms.set(id, { meta, dir, qmp, lock: Promise.resolve(), pending: 0 });
          this.log(`vm: adopted ${id} (pid ${pid})`);
          continue;
        } catch {
          // Not answering: clean it up below.
        }
      }
      this.log(`vm: removing ${id} (not running)`);
      if (isOurQemu(pid, marker)) await killAndWait(pid);
      removeSockets(dir);
      rmSync(dir, { recursive: true, force: true });
    }
    // Warm QEMUs of a previous process are not adopted.
    for (const name of safeReaddir(join(this.stateDir, 'pool'))) {
      const dir = join(this.stateDir, 'pool', name);
      const pid = readPid(dir);
      if (isOurQemu(pid, dir)) await killAndWait(pid);
      removeSockets(dir);
      rmSync(dir, { recursive: true, force: true });
    }
    // Sockets of QEMUs that are gone (killed with the runtime down, or a crash).
    const liveDirs = [...[...this.vms.values()].map((vm) => vm.dir), ...this.pool.map((e) => e.dir)];
    const liveSockets = new Set(liveDirs.flatMap((d) => [socketTarget(socketPaths(d).qmp), socketTarget(socketPaths(d).agent)]));
    for (const f of safeReaddir(this.socketDir)) {
      const p = join(this.socketDir, f);
      if (!liveSockets.has(p)) rmSync(p, { recursive: true, force: true });
    }
    const live = new Set([...this.vms.values()].map((vm) => vm.meta.disk));
    for (const f of safeReaddir(join(this.stateDir, 'overlays'))) {
      const p = join(this.stateDir, 'overlays', f);
      if (!live.has(p)) rmSync(p, { force: true });
    }
    this.gcDisks();
    this.started = true;
  }

  /** Disconnects from every VM and leaves them running (the next start() adopts them). */
  async close(): Promise<void> {
    this.started = false;
    await Promise.all(this.conversions.values());
    for (const vm of this.vms.values()) this.disconnect(vm);
    this.vms.clear();
    while (this.poolFilling > 0) await sleep(20);
    const pool = this.pool;
    this.pool = [];
    for (const e of pool) await this.dropPoolEntry(e);
    // Only when empty: the sockets of VMs left running stay for the next start() to adopt.
    if (safeReaddir(this.socketDir).length === 0) rmSync(this.socketDir, { recursive: true, force: true });
  }

  // ---- warm pool ----

  private async dropPoolEntry(e: PoolEntry): Promise<void> {
    e.qmp.close();
    if (isOurQemu(e.pid, e.name)) await killAndWait(e.pid);
    removeSockets(e.dir);
    rmSync(e.dir, { recursive: true, force: true });
    rmSync(e.disk, { force: true });
  }

  /** Starts QEMUs in the background until the pool is full. Never throws. */
  private fillPool(tpl: TemplateInfo): void {
    const want = this.opts.warmPool ?? 1;
    while (this.started && this.pool.length + this.poolFilling < want && tpl.memMiB === this.memMiB) {
      this.poolFilling++;
      this.startPoolEntry(tpl)
        .then((e) => {
          if (this.started) this.pool.push(e);
          else void this.dropPoolEntry(e);
        })
        .catch((err: Error) => this.log(`vm: warm pool: ${err.message}`))
        .finally(() => this.poolFilling--);
    }
  }

  private async startPoolEntry(tpl: TemplateInfo): Promise<PoolEntry> {
    const image = await this.ensureImage();
    const token = randomBytes(6).toString('hex');
    const dir = join(this.stateDir, 'pool', token);
    mkdirSync(dir, { recursive: true });
    const name = `fluxvm-${token}`;
    const disk = join(this.stateDir, 'overlays', `${randomUUID()}.qcow2`);
    let pid: number | undefined;
    try {
      await this.overlay(disk, tpl.disk, image.diskSize);
      pid = await launchQemu(this.machine(tpl.memMiB, image), {
        dir, sockDir: this.socketDir, disk, ram: { path: tpl.ram, share: false }, incoming: true, name,
      }, this.launchOpts());
      const qmp = await QmpClient.connect(socketTarget(socketPaths(dir).qmp));
      await this.prepareMigration(qmp);
      await this.ignoreShared(qmp, true);
      return { dir, disk, name, pid, qmp, templateKey: tpl.key };
    } catch (e) {
      if (isOurQemu(pid, name)) await killAndWait(pid);
      removeSockets(dir);
      rmSync(dir, { recursive: true, force: true });
      rmSync(disk, { force: true });
      throw e;
    }
  }

  private takePool(tpl: TemplateInfo): PoolEntry | undefined {
    while (this.pool.length) {
      const e = this.pool.shift()!;
      if (e.templateKey === tpl.key && isOurQemu(e.pid, e.name)) {
        this.fillPool(tpl);
        return e;
      }
      void this.dropPoolEntry(e);
    }
    this.fillPool(tpl);
    return undefined;
  }

  private disconnect(vm: Vm): void {
    vm.qmp?.close();
    vm.qmp = undefined;
    vm.agent?.close();
    vm.agent = undefined;
    vm.agentConnecting = undefined;
  }

  // ---- image and template ----

  /** How every QEMU of this runtime is started: as the QEMU user, in the state directory. */
  private launchOpts(): { user?: QemuUser; cwd: string } {
    return { ...(this.qemuUser ? { user: this.qemuUser } : {}), cwd: this.stateDir };
  }

  /** A new overlay QEMU writes (its backing recorded relative to the state directory), owned by the QEMU user. */
  private async overlay(path: string, backing: string, size: string): Promise<void> {
    await createOverlay(path, backing, size, this.stateDir);
    giveToQemu(path, this.qemuUser);
  }

  private machine(memMiB: number, image: ImageInfo): MachineSpec {
    return { qemu: this.qemu, accel: this.accel, memMiB, kernel: image.kernel, initrd: image.initrd, rootfs: image.rootfs, tscKhz: hostTscKhz() };
  }

  private async ensureImage(): Promise<ImageInfo> {
    if (this.image) return this.image;
    this.imageBuilding ??= (async () => {
      let dir = this.opts.imageDir;
      if (!dir || !existsSync(join(dir, 'image.json'))) {
        const args = [...(this.opts.rootfs ? ['--rootfs'] : []), ...(dir ? [dir] : [])];
        const out = await promisify(execFile)(join(REPO_ROOT, 'hack/vm-image.sh'), args, { maxBuffer: 1 << 20, timeout: 900_000 });
        dir = out.stdout.trim().split('\n').pop()!;
      }
      const j = JSON.parse(readFileSync(join(dir, 'image.json'), 'utf8')) as Record<string, string>;
      return {
        dir,
        hash: j.hash!,
        kernel: join(dir, j.kernel!),
        initrd: join(dir, j.initrd!),
        disk: join(dir, j.disk!),
        ...(j.rootfs ? { rootfs: join(dir, j.rootfs) } : {}),
        diskSize: j.diskSize!,
      };
    })();
    try {
      this.image = await this.imageBuilding;
    } finally {
      this.imageBuilding = undefined;
    }
    return this.image;
  }

  /** The golden template for `memMiB`, cold-booting it once (cached across restarts). */
  async ensureTemplate(memMiB = this.memMiB): Promise<TemplateInfo> {
    const image = await this.ensureImage();
    const key = createHash('sha256').update(`${TEMPLATE_VERSION}|${image.hash}|${memMiB}|${this.accel}`).digest('hex').slice(0, 16);
    let p = this.templates.get(key);
    if (!p) {
      p = this.buildTemplate(key, memMiB, image);
      this.templates.set(key, p);
      p.catch(() => this.templates.delete(key));
    }
    const tpl = await p;
    this.fillPool(tpl);
    return tpl;
  }

  private async buildTemplate(key: string, memMiB: number, image: ImageInfo): Promise<TemplateInfo> {
    const dir = join(this.stateDir, 'templates', key);
    const info = (bootMs: number): TemplateInfo => ({
      key, dir, memMiB, bootMs, disk: join(dir, 'disk.qcow2'), ram: join(dir, 'ram'), state: join(dir, 'state'),
      ramBare: join(dir, 'ram-bare'), stateBare: join(dir, 'state-bare'),
    });
    if (existsSync(join(dir, 'template.json'))) {
      const t = JSON.parse(readFileSync(join(dir, 'template.json'), 'utf8')) as { bootMs: number };
      return info(t.bootMs);
    }
    mkdirSync(join(this.stateDir, 'templates'), { recursive: true });
    const tmp = `${dir}.tmp-${process.pid}-${randomBytes(3).toString('hex')}`;
    mkdirSync(tmp);
    let pid: number | undefined;
    let qmp: QmpClient | undefined;
    try {
      if (this.qemuUser) chmodSync(tmp, 0o711);
      await this.overlay(join(tmp, 'disk.qcow2'), image.disk, image.diskSize);
      writeFileSync(join(tmp, 'ram'), '');
      giveToQemu(join(tmp, 'ram'), this.qemuUser);
      const t0 = performance.now();
      pid = await launchQemu(this.machine(memMiB, image), {
        dir: tmp, sockDir: this.socketDir, disk: join(tmp, 'disk.qcow2'), ram: { path: join(tmp, 'ram'), share: true }, incoming: false, name: `fluxvm-template-${key}`,
      }, this.launchOpts());
      qmp = await QmpClient.connect(socketTarget(socketPaths(tmp).qmp));
      const agent = await this.connectAgent(tmp, 180_000);
      const bootMs = performance.now() - t0;
      this.timings.coldBootMs = bootMs;
      this.log(`vm: template ${key} booted in ${bootMs.toFixed(0)} ms`);
      agent.close();
      await this.prepareMigration(qmp);
      await this.ignoreShared(qmp, true);
      // Save 1, bare: the device state now and a copy of the RAM file as it is now.
      await qmp.execute('stop');
      await migrateToFile(qmp, this.socketDir, join(tmp, 'state-bare'), this.qemuUser);
      await execFileP('cp', ['--sparse=always', join(tmp, 'ram'), join(tmp, 'ram-bare')]);
      // QEMU 7.2 opens a RAM file read-write even to map it privately (no rom=on before 8.2).
      giveToQemu(join(tmp, 'ram-bare'), this.qemuUser);
      // Save 2: the workspace disk mounted at /run/disk and bound at /work, so that
      // creating a VM needs no mount.
      await qmp.execute('cont');
      const a2 = await this.connectAgent(tmp, 60_000);
      await mountWorkspace(a2, '/work');
      await a2.sync();
      a2.close();
      await qmp.execute('stop');
      await migrateToFile(qmp, this.socketDir, join(tmp, 'state'), this.qemuUser);
      await qmp.execute('quit').catch(() => undefined);
      qmp.close();
      await killAndWait(pid);
      // The template disk is a read-only base from now on: no QEMU may write it.
      if (this.qemuUser) chownSync(join(tmp, 'disk.qcow2'), 0, 0);
      // The template never runs again: its RAM file and disk are now immutable bases.
      removeSockets(tmp);
      rmSync(join(tmp, 'qemu.pid'), { force: true });
      writeFileSync(join(tmp, 'template.json'), JSON.stringify({ key, memMiB, bootMs, image: image.hash, accel: this.accel }, null, 2));
      try {
        renameSync(tmp, dir);
      } catch {
        rmSync(tmp, { recursive: true, force: true }); // another process won the race
      }
      return info(bootMs);
    } catch (e) {
      qmp?.close();
      await killAndWait(pid);
      removeSockets(tmp);
      rmSync(tmp, { recursive: true, force: true });
      throw e;
    }
  }

  private async prepareMigration(qmp: QmpClient): Promise<void> {
    await qmp.execute('migrate-set-parameters', { 'max-bandwidth': 64 * 1024 * 1024 * 1024, 'downtime-limit': 100_000 });
  }

  /**
   * Two stream formats: with x-ignore-shared (device state only; RAM in a shared file:
   * templates and converted checkpoints) and without (the whole RAM: checkpoints and forks
   * of running VMs). The capability changes the stream header, so both ends must agree,
   * and a destination with it set refuses pages for its shared RAM.
   */
  private async ignoreShared(qmp: QmpClient, on: boolean): Promise<void> {
    await qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: on }] });
  }

  // ---- connections ----

  /**
   * Connects to the agent of the QEMU in `dir`. With `vm`, a protocol violation by the guest
   * fails that VM (failVm); without (a template boot, before any user code ran), it only
   * closes the connection.
   */
  private connectAgent(dir: string, timeoutMs: number, vm?: Vm): Promise<AgentClient> {
    return new Promise<AgentClient>((resolveP, rejectP) => {
      const sock = connect(socketTarget(socketPaths(dir).agent));
      sock.once('error', (e) => rejectP(new RuntimeError('Internal', `agent socket: ${e.message}`)));
      sock.once('connect', () => {
        const client = new AgentClient(sock, sock, {
          onViolation: (err) => (vm ? this.failVm(vm, err) : this.log(`vm: agent in ${dir}: ${err.message}`)),
          ...(this.opts.agentLimits ? { limits: this.opts.agentLimits } : {}),
        });
        client.hello(timeoutMs).then(
          () => resolveP(client),
          (e: Error) => {
            sock.destroy();
            rejectP(e);
          },
        );
      });
    });
  }

  /**
   * The guest broke the agent protocol: the channel is closed already; record the failure
   * (vm.json, so it survives a restart), stop QEMU (a hostile guest gets no more CPU) and
   * tell the listeners. Never throws; once per VM.
   */
  private failVm(vm: Vm, err: AgentProtocolError): void {
    if (vm.meta.failed) return;
    const failure: InstanceFailure = { reason: 'GuestProtocolError', message: err.message, at: new Date().toISOString() };
    vm.meta.failed = failure;
    this.log(`vm: ${vm.meta.id} failed: ${err.message}`);
    try {
      if (this.vms.get(vm.meta.id) === vm) this.saveMeta(vm);
    } catch (e) {
      this.log(`vm: ${vm.meta.id}: recording the failure: ${(e as Error).message}`);
    }
    void this.locked(vm, () => this.halt(vm), { wait: true }).catch((e: Error) => this.log(`vm: ${vm.meta.id}: stopping QEMU: ${e.message}`));
    for (const l of this.failureListeners) {
      try {
        l(vm.meta.id, failure);
      } catch (e) {
        this.log(`vm: failure listener: ${(e as Error).message}`);
      }
    }
  }

  onInstanceFailed(listener: (id: string, failure: InstanceFailure) => void): void {
    this.failureListeners.push(listener);
  }

  private async agentOf(vm: Vm): Promise<AgentClient> {
    if (vm.meta.failed) throw new RuntimeError('Conflict', `sandbox ${vm.meta.id} failed (${vm.meta.failed.reason}): ${vm.meta.failed.message}`);
    if (vm.meta.state === 'paused') throw new RuntimeError('Conflict', `sandbox ${vm.meta.id} is paused`);
    if (vm.agent && !vm.agent.closed) return vm.agent;
    vm.agentConnecting ??= this.connectAgent(vm.dir, 30_000, vm).then(
      (a) => {
        vm.agent = a;
        vm.agentConnecting = undefined;
        return a;
      },
      (e: Error) => {
        vm.agentConnecting = undefined;
        throw e;
      },
    );
    return vm.agentConnecting;
  }

  private vm(id: string): Vm {
    const vm = this.vms.get(id);
    if (!vm) throw new RuntimeError('NotFound', `no VM sandbox ${id}`);
    return vm;
  }

  /** The agent of a VM for a public call: waits out a checkpoint, restore or fork first. */
  private async agentFor(id: string): Promise<AgentClient> {
    const vm = this.vm(id);
    while (vm.pending > 0) await vm.lock;
    return this.agentOf(this.vm(id));
  }

  /**
   * Runs `fn` with the VM's lifecycle lock. Another lifecycle call meanwhile gets Busy unless
   * `wait`; public exec and file calls wait for it. The VM counts as busy from the moment
   * of the call (synchronously), so a call issued right after sees it.
   */
  private async locked<T>(vm: Vm, fn: () => Promise<T>, opts: { wait?: boolean } = {}): Promise<T> {
    if (vm.pending > 0 && !opts.wait) throw new RuntimeError('Busy', `sandbox ${vm.meta.id} is busy (checkpoint, restore or fork in progress)`);
    vm.pending++;
    const prev = vm.lock;
    let release!: () => void;
    vm.lock = new Promise<void>((r) => (release = r));
    try {
      await prev;
      return await fn();
    } finally {
      vm.pending--;
      release();
    }
  }


  private saveMeta(vm: Vm): void {
    const tmp = join(vm.dir, 'vm.json.tmp');
    writeFileSync(tmp, JSON.stringify(vm.meta, null, 2));
    renameSync(tmp, join(vm.dir, 'vm.json'));
  }

  // ---- starting QEMU for a VM ----

  /**
   * Starts the VM's QEMU. `from` says where its machine state comes from: the template
   * (device state over the template's RAM file, then mount the workspace disk) or a saved
   * memory stream (anonymous RAM). Sets the guest clock and reseeds its RNG.
   */
  private async boot(
    vm: Vm,
    from: { template: TemplateInfo; bare?: boolean } | { stream: string } | MemImage,
    identity: { hostname?: string; machineId?: string },
    pooled?: PoolEntry,
  ): Promise<void> {
    const image = await this.ensureImage();
    const spec: LaunchSpec = {
      dir: vm.dir,
      sockDir: this.socketDir,
      disk: vm.meta.disk,
      ram: 'template' in from
        ? { path: from.bare ? from.template.ramBare : from.template.ram, share: false }
        : 'ram' in from ? { path: from.ram, share: false } : { anonymous: true },
      incoming: true,
      name: `fluxvm-${randomBytes(6).toString('hex')}`,
    };
    if (!pooled) {
      removeSockets(vm.dir);
      rmSync(join(vm.dir, 'qemu.pid'), { force: true });
    }
    const phases: Record<string, number> = {};
    let t = performance.now();
    const lap = (name: string) => {
      const n = performance.now();
      phases[name] = Math.round((n - t) * 10) / 10;
      t = n;
    };
    if (pooled) {
      vm.meta.pid = pooled.pid;
      vm.meta.qemuName = pooled.name;
      vm.qmp = pooled.qmp;
      this.saveMeta(vm);
    } else {
      vm.meta.pid = await launchQemu(this.machine(vm.meta.memMiB, image), spec, this.launchOpts());
      vm.meta.qemuName = spec.name;
      this.saveMeta(vm);
      lap('launch');
      vm.qmp = await QmpClient.connect(socketTarget(socketPaths(vm.dir).qmp));
      await this.prepareMigration(vm.qmp);
    }
    lap('qmp');
    const stream = 'template' in from ? (from.bare ? from.template.stateBare : from.template.state) : 'ram' in from ? from.state : from.stream;
    if (!pooled) await this.ignoreShared(vm.qmp, !('stream' in from));
    // Streams are saved from a stopped guest, so the loaded guest stays paused until cont.
    await migrateFromFile(vm.qmp, this.socketDir, stream);
    await vm.qmp.execute('cont');
    lap('load');
    const agent = await this.connectAgent(vm.dir, 60_000, vm);
    vm.agent = agent;
    lap('agent');
    // Pipelined: the agent runs them in order without waiting for the host in between.
    const identityDone = agent.identity({ time: new Date(), seed: randomBytes(64), ...identity });
    if ('template' in from && from.bare) await mountWorkspace(agent, vm.meta.workspacePath);
    else if ('template' in from && vm.meta.workspacePath !== '/work') await agent.mount('/run/disk/work', vm.meta.workspacePath, { bind: true });
    await identityDone;
    lap('identity');
    this.timings.lastBootPhases = phases;
    vm.meta.state = 'running';
    this.saveMeta(vm);
  }

  /** Stops QEMU (if any) and drops the connections. */
  private async halt(vm: Vm): Promise<void> {
    const pid = vm.meta.pid;
    if (vm.qmp) await Promise.race([vm.qmp.execute('quit').catch(() => undefined), sleep(1000)]);
    this.disconnect(vm);
    if (isOurQemu(pid, vm.meta.qemuName ?? vm.dir)) await killAndWait(pid);
    removeSockets(vm.dir);
    vm.meta.pid = undefined;
  }

  private nextOverlay(vm: Vm): string {
    vm.meta.diskSeq += 1;
    return join(this.stateDir, 'overlays', `${randomUUID()}.qcow2`);
  }

  /**
   * Copies the VM's current overlay (only what the VM wrote since its last base) into
   * disks/ as an immutable base for checkpoints and forks. The VM must be stopped (QEMU
   * flushes on stop). A live external snapshot would avoid the copy, but QEMU 7.2 then
   * fails the next migration (bdrv_inactivate_all).
   */
  private freezeDisk(vm: Vm): string {
    const frozen = join(this.stateDir, 'disks', `${randomUUID()}.qcow2`);
    this.inflightDisks.add(frozen);
    copyFileSync(vm.meta.disk, frozen);
    return frozen;
  }

  /**
   * Loads a whole-machine stream into a new shared RAM file in `outDir` with a helper QEMU
   * (never started) and saves its device state beside it. Restoring from the result maps the
   * RAM file privately and loads a few KiB, instead of copying the whole stream into memory.
   */
  /**
   * `stream` may still be being written: the helper starts first and loads it once the
   * promise resolves. `disk` only gives the helper a disk of the right size (it never runs
   * the guest), so the template's disk serves.
   */
  private async convertStream(stream: string | Promise<string>, out: MemImage, memMiB: number, disk: string, nice = 0): Promise<MemImage> {
    const image = await this.ensureImage();
    const dir = join(this.stateDir, 'tmp', `conv-${randomUUID()}`);
    mkdirSync(dir, { recursive: true });
    const name = `fluxvm-conv-${randomBytes(6).toString('hex')}`;
    // In overlays/ (QEMU can reach it there, not in tmp/); removed below.
    const convDisk = join(this.stateDir, 'overlays', `conv-${randomUUID()}.qcow2`);
    let pid: number | undefined;
    let qmp: QmpClient | undefined;
    try {
      await this.overlay(convDisk, disk, image.diskSize);
      if (!existsSync(out.ram)) writeFileSync(out.ram, '');
      giveToQemu(out.ram, this.qemuUser);
      pid = await launchQemu(this.machine(memMiB, image), {
        dir, sockDir: this.socketDir, disk: convDisk, ram: { path: out.ram, share: true }, incoming: true, name,
      }, { nice, ...this.launchOpts() });
      qmp = await QmpClient.connect(socketTarget(socketPaths(dir).qmp));
      await this.prepareMigration(qmp);
      await this.ignoreShared(qmp, false);
      await migrateFromFile(qmp, this.socketDir, stream);
      await this.ignoreShared(qmp, true);
      await migrateToFile(qmp, this.socketDir, out.state, this.qemuUser);
      await qmp.execute('quit').catch(() => undefined);
      return out;
    } catch (e) {
      rmSync(out.ram, { force: true });
      rmSync(out.state, { force: true });
      throw e;
    } finally {
      qmp?.close();
      if (isOurQemu(pid, name)) await killAndWait(pid);
      removeSockets(dir);
      rmSync(dir, { recursive: true, force: true });
      rmSync(convDisk, { force: true });
    }
  }

  /** Starts a QEMU for `vm` waiting for a device-state stream over `ram` (mapped privately). */
  private async prelaunch(vm: Vm, ram: string): Promise<PoolEntry> {
    const image = await this.ensureImage();
    const name = `fluxvm-${randomBytes(6).toString('hex')}`;
    removeSockets(vm.dir);
    rmSync(join(vm.dir, 'qemu.pid'), { force: true });
    const pid = await launchQemu(this.machine(vm.meta.memMiB, image), {
      dir: vm.dir, sockDir: this.socketDir, disk: vm.meta.disk, ram: { path: ram, share: false }, incoming: true, name,
    }, this.launchOpts());
    vm.meta.pid = pid;
    vm.meta.qemuName = name;
    const qmp = await QmpClient.connect(socketTarget(socketPaths(vm.dir).qmp));
    vm.qmp = qmp;
    await this.prepareMigration(qmp);
    await this.ignoreShared(qmp, true);
    return { dir: vm.dir, disk: vm.meta.disk, name, pid, qmp, templateKey: vm.meta.templateKey };
  }

  /**
   * After a memory checkpoint: its stream becomes a RAM file + device state in the
   * background, at low CPU priority, so restores map it instead of loading the stream (a
   * dry-run restores while its command ran long enough for this). A restore before it is
   * ready loads the stream.
   */
  private convertCheckpoint(meta: CheckpointMeta): void {
    if (this.conversions.has(meta.id) || existsSync(join(this.ckptDir(meta.id), 'ram'))) return;
    const dir = this.ckptDir(meta.id);
    const work = join(this.stateDir, 'tmp', `ckconv-${randomUUID()}`);
    // Filled in tmpfs (page faults on a shared ext4 mapping cost a block allocation each),
    // then copied sparsely next to the checkpoint. One conversion at a time.
    const shm = shmFile('ckpt');
    const p = this.convQueue
      .then(async () => {
        if (!existsSync(join(dir, 'checkpoint.json'))) return false; // deleted while queued
        mkdirSync(work, { recursive: true });
        await this.convertStream(join(dir, 'mem.state'), { ram: shm, state: join(work, 'state') }, meta.memMiB, meta.disk, 10);
        return true;
      })
      .then(async (converted) => {
        if (!converted) return;
        await execFileP('nice', ['-n', '10', 'cp', '--sparse=always', shm, join(work, 'ram')]);
        if (!existsSync(join(dir, 'checkpoint.json'))) return; // deleted meanwhile
        // state before ram: memorySource() takes the converted form once `ram` exists. The
        // stream stays (a restore may be reading it right now).
        renameSync(join(work, 'state'), join(dir, 'state'));
        giveToQemu(join(work, 'ram'), this.qemuUser); // mapped privately by restores (opened read-write by QEMU 7.2)
        renameSync(join(work, 'ram'), join(dir, 'ram'));
      })
      .catch((e: Error) => this.log(`vm: checkpoint ${meta.id} stays a plain stream: ${e.message}`))
      .finally(() => {
        rmSync(work, { recursive: true, force: true });
        rmSync(shm, { force: true });
        this.conversions.delete(meta.id);
      });
    this.conversions.set(meta.id, p);
    this.convQueue = p;
  }

  /** Where a memory checkpoint's machine comes from: the converted form when it is ready. */
  private memorySource(checkpointId: string): MemImage | { stream: string } {
    const dir = this.ckptDir(checkpointId);
    if (existsSync(join(dir, 'ram'))) return { ram: join(dir, 'ram'), state: join(dir, 'state') };
    return { stream: join(dir, 'mem.state') };
  }

  // ---- Runtime: sandboxes ----

  async create(cfg: SandboxConfig): Promise<SandboxInfo> {
    this.requireStarted();
    if (!cfg || typeof cfg.id !== 'string' || !ID_RE.test(cfg.id)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(cfg?.id)}`);
    const existing = this.vms.get(cfg.id);
    if (existing) return this.info(existing);
    if (cfg.network && cfg.network.mode !== 'none') throw new RuntimeError('Unsupported', 'VM sandboxes have no network yet (network.mode must be none)');
    checkConfinement(this.capabilities(), cfg.confinement); // the guest agent applies none: Unsupported when any is asked
    const workspacePath = cfg.workspacePath ?? '/work';
    if (!workspacePath.startsWith('/') || workspacePath === '/' || workspacePath.split('/').includes('..')) {
      throw new RuntimeError('InvalidPath', `invalid workspace path ${workspacePath}`);
    }
    if (cfg.source && 'sandboxId' in cfg.source) {
      await this.fork(cfg.source.sandboxId, [cfg.id]);
      return this.info(this.vm(cfg.id));
    }
    const memMiB = cfg.resources?.memoryBytes ? Math.max(128, Math.ceil(cfg.resources.memoryBytes / (1 << 20))) : this.memMiB;
    const dir = this.vmDir(cfg.id);
    const t0 = performance.now();
    const ckpt = cfg.source && 'checkpointId' in cfg.source ? this.checkpointMeta(cfg.source.checkpointId) : undefined;
    const tpl = await this.ensureTemplate(ckpt?.memMiB ?? memMiB);
    removeSockets(dir);
    rmSync(dir, { recursive: true, force: true });
    // A warm QEMU's directory becomes the VM's (its sockets and open files move with it).
    const pooled = ckpt ? undefined : this.takePool(tpl);
    if (pooled) renameSync(pooled.dir, dir);
    else mkdirSync(dir, { recursive: true });
    const vm: Vm = {
      dir,
      lock: Promise.resolve(),
      pending: 0,
      meta: {
        id: cfg.id,
        createdAt: new Date().toISOString(),
        workspacePath: ckpt?.workspacePath ?? workspacePath,
        hostname: cfg.hostname ?? hostnameFor(cfg.id),
        machineId: randomBytes(16).toString('hex'),
        env: cfg.env ?? {},
        memMiB: ckpt?.memMiB ?? memMiB,
        templateKey: tpl.key,
        disk: '',
        diskSeq: 0,
        state: 'running',
      },
    };
    vm.meta.disk = pooled ? pooled.disk : this.nextOverlay(vm);
    this.vms.set(cfg.id, vm);
    try {
      await this.locked(vm, async () => {
        if (!pooled) await this.overlay(vm.meta.disk, ckpt ? ckpt.disk : tpl.disk, (await this.ensureImage()).diskSize);
        this.saveMeta(vm);
        const identity = { hostname: vm.meta.hostname, machineId: vm.meta.machineId };
        if (ckpt?.kind === 'memory') await this.boot(vm, this.memorySource(ckpt.id), identity);
        else await this.boot(vm, { template: tpl, bare: ckpt !== undefined }, identity, pooled);
      });
    } catch (e) {
      await this.destroy(cfg.id).catch(() => undefined);
      throw e;
    }
    this.timings.lastCreateMs = performance.now() - t0;
    return this.info(vm);
  }

  async inspect(id: string, opts: { revive?: boolean } = {}): Promise<SandboxInfo> {
    const vm = this.vm(id);
    if (opts.revive && !vm.meta.failed && !pidAlive(vm.meta.pid) && vm.pending === 0) {
      await this.locked(vm, async () => {
        // Processes are lost; the disk (workspace) is intact: boot it from the template.
        await this.halt(vm);
        const tpl = await this.ensureTemplate(vm.meta.memMiB);
        await this.boot(vm, { template: tpl, bare: true }, { hostname: vm.meta.hostname, machineId: vm.meta.machineId });
        vm.meta.restarted = true;
        this.saveMeta(vm);
      });
    }
    return this.info(vm);
  }

  async list(): Promise<SandboxInfo[]> {
    return [...this.vms.values()].map((vm) => this.info(vm)).sort((a, b) => a.id.localeCompare(b.id));
  }

  private info(vm: Vm): SandboxInfo {
    const alive = pidAlive(vm.meta.pid);
    return {
      id: vm.meta.id,
      state: alive ? vm.meta.state : 'stopped',
      ...(alive ? { pid: vm.meta.pid } : {}),
      workspacePath: vm.meta.workspacePath,
      createdAt: vm.meta.createdAt,
      ...(vm.meta.restarted ? { restarted: true } : {}),
      ...(vm.meta.failed ? { failed: vm.meta.failed } : {}),
    };
  }

  /** Stops QEMU and removes every file of the VM; frozen disks nobody uses are deleted. */
  async destroy(id: string): Promise<void> {
    const vm = this.vms.get(id);
    const dir = this.vmDir(id);
    if (!vm) {
      if (existsSync(dir)) {
        const pid = readPid(dir);
        let marker = dir;
        try {
          marker = (JSON.parse(readFileSync(join(dir, 'vm.json'), 'utf8')) as VmMeta).qemuName ?? dir;
        } catch {
          // no metadata: only a QEMU naming the directory is ours
        }
        if (isOurQemu(pid, marker)) await killAndWait(pid);
        try {
          const disk = (JSON.parse(readFileSync(join(dir, 'vm.json'), 'utf8')) as VmMeta).disk;
          if (disk) rmSync(disk, { force: true });
        } catch {
          // nothing recorded
        }
        removeSockets(dir);
        rmSync(dir, { recursive: true, force: true });
        this.gcDisks();
      }
      return;
    }
    await this.locked(vm, async () => {
      await this.halt(vm); // removes the sockets too
      rmSync(dir, { recursive: true, force: true });
      if (vm.meta.disk) rmSync(vm.meta.disk, { force: true });
      this.vms.delete(id);
    }, { wait: true });
    this.gcDisks();
  }

  async pause(id: string): Promise<void> {
    const vm = this.vm(id);
    await this.locked(vm, async () => {
      if (vm.meta.state === 'paused') return;
      await this.qmpOf(vm).execute('stop');
      vm.meta.state = 'paused';
      this.saveMeta(vm);
    });
  }

  async resume(id: string): Promise<void> {
    const vm = this.vm(id);
    await this.locked(vm, async () => {
      if (vm.meta.state === 'running') return;
      await this.qmpOf(vm).execute('cont');
      vm.meta.state = 'running';
      this.saveMeta(vm);
    });
  }

  private qmpOf(vm: Vm): QmpClient {
    if (!vm.qmp || !pidAlive(vm.meta.pid)) throw new RuntimeError('Conflict', `sandbox ${vm.meta.id} is not running`);
    return vm.qmp;
  }

  // ---- Runtime: exec and files ----

  private execReq<T extends Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>>(vm: Vm, req: T): T {
    return { ...req, cwd: req.cwd ?? vm.meta.workspacePath, env: { ...vm.meta.env, ...(req.env ?? {}) } };
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    const agent = await this.agentFor(id);
    return agent.exec(this.execReq(this.vm(id), req));
  }

  async execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    // capabilities().pty is false: the guest agent has no pty operation.
    if (req.tty) throw new RuntimeError('Unsupported', 'interactive terminals (tty) are not supported on runtime vm: the guest agent has no pty operation');
    const agent = await this.agentFor(id);
    return agent.execStream({ ...this.execReq(this.vm(id), req), stdin: true });
  }

  async listFiles(id: string, path: string): Promise<FileEntry[]> {
    return (await this.agentFor(id)).listFiles(path);
  }

  async stat(id: string, path: string): Promise<FileEntry> {
    return (await this.agentFor(id)).stat(path);
  }

  async readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    return (await this.agentFor(id)).readFile(path, opts);
  }

  async writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    return (await this.agentFor(id)).writeFile(path, data, opts);
  }

  async deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void> {
    return (await this.agentFor(id)).deleteFile(path, opts);
  }

  async manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
    return (await this.agentFor(id)).manifest(paths, limits);
  }

  /** The raw agent connection of a VM (benchmarks and tests). */
  async agent(id: string): Promise<AgentClient> {
    return this.agentFor(id);
  }

  // ---- Runtime: checkpoints, restore, fork ----

  async checkpoint(id: string, checkpointId: string, opts: { memory?: boolean } = {}): Promise<CheckpointInfo> {
    if (typeof checkpointId !== 'string' || !ID_RE.test(checkpointId)) throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
    const existing = this.tryCheckpointMeta(checkpointId);
    if (existing) {
      if (existing.sandboxId !== id) throw new RuntimeError('Conflict', `checkpoint ${checkpointId} belongs to sandbox ${existing.sandboxId}`);
      return ckptInfo(existing);
    }
    const vm = this.vm(id);
    const memory = opts.memory ?? false;
    return this.locked(vm, async () => {
      const t0 = performance.now();
      const dir = this.ckptDir(checkpointId);
      const tmp = `${dir}.tmp`;
      rmSync(tmp, { recursive: true, force: true });
      mkdirSync(tmp, { recursive: true });
      const qmp = this.qmpOf(vm);
      const wasRunning = vm.meta.state === 'running';
      if (!memory && wasRunning) await (await this.agentOf(vm)).sync();
      if (wasRunning) await qmp.execute('stop');
      let frozen: string | undefined;
      try {
        frozen = this.freezeDisk(vm);
        if (memory) {
          await this.ignoreShared(qmp, false);
          await migrateToFile(qmp, this.socketDir, join(tmp, 'mem.state'), this.qemuUser);
        }
      } finally {
        if (wasRunning) await qmp.execute('cont');
      }
      const meta: CheckpointMeta = {
        id: checkpointId,
        sandboxId: id,
        kind: memory ? 'memory' : 'disk',
        takenAt: new Date().toISOString(),
        sizeBytes: fileSize(frozen) + (memory ? fileSize(join(tmp, 'mem.state')) : 0),
        disk: frozen,
        memMiB: vm.meta.memMiB,
        templateKey: vm.meta.templateKey,
        workspacePath: vm.meta.workspacePath,
        hostname: vm.meta.hostname,
        machineId: vm.meta.machineId,
      };
      writeFileSync(join(tmp, 'checkpoint.json'), JSON.stringify(meta, null, 2), { mode: 0o600 });
      if (this.qemuUser) chmodSync(tmp, 0o711); // a converted RAM file lands here for QEMU to map
      renameSync(tmp, dir);
      this.inflightDisks.delete(frozen);
      this.timings.lastCheckpointMs = performance.now() - t0;
      if (memory) this.convertCheckpoint(meta);
      return ckptInfo(meta);
    });
  }

  /**
   * Puts the VM back to the checkpoint: a new QEMU (same id, directory and socket links)
   * from the checkpoint's memory stream, or for a disk checkpoint a fresh guest from the
   * template over the checkpoint's disk. The checkpoint itself is never written.
   */
  async restore(id: string, checkpointId: string): Promise<void> {
    const vm = this.vm(id);
    const ckpt = this.checkpointMeta(checkpointId);
    if (ckpt.memMiB !== vm.meta.memMiB && ckpt.kind === 'memory') throw new RuntimeError('InvalidArgument', 'checkpoint has another memory size');
    await this.locked(vm, async () => {
      const t0 = performance.now();
      await this.halt(vm);
      const old = vm.meta.disk;
      vm.meta.disk = this.nextOverlay(vm);
      await this.overlay(vm.meta.disk, ckpt.disk, (await this.ensureImage()).diskSize);
      rmSync(old, { force: true });
      vm.meta.hostname = ckpt.hostname;
      vm.meta.machineId = ckpt.machineId;
      vm.meta.workspacePath = ckpt.workspacePath;
      this.saveMeta(vm);
      if (ckpt.kind === 'memory') await this.boot(vm, this.memorySource(ckpt.id), {});
      else await this.boot(vm, { template: await this.ensureTemplate(vm.meta.memMiB), bare: true }, { hostname: ckpt.hostname, machineId: ckpt.machineId });
      this.timings.lastRestoreMs = performance.now() - t0;
    });
    if (ckpt.kind === 'memory') this.convertCheckpoint(ckpt);
    this.gcDisks();
  }

  async deleteCheckpoint(checkpointId: string): Promise<void> {
    if (typeof checkpointId !== 'string' || !ID_RE.test(checkpointId)) return;
    await this.conversions.get(checkpointId);
    rmSync(this.ckptDir(checkpointId), { recursive: true, force: true });
    this.gcDisks();
  }

  /**
   * Saves the parent once (memory and a frozen disk) and starts every child from it, each
   * on its own overlay with a new hostname, machine-id and RNG seed. The parent keeps
   * running (it is stopped only while its state is saved).
   */
  async fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    // VMs have no network yet: a child can only be forked without one.
    if (opts?.network && opts.network.mode !== 'none') throw new RuntimeError('Unsupported', `vm sandboxes have no network; a fork with network mode ${opts.network.mode} is not possible`);
    const parent = this.vm(parentId);
    if (!Array.isArray(childIds) || childIds.length === 0) throw new RuntimeError('InvalidArgument', 'fork needs child ids');
    for (const c of childIds) {
      if (typeof c !== 'string' || !ID_RE.test(c)) throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(c)}`);
    }
    if (new Set(childIds).size !== childIds.length) throw new RuntimeError('InvalidArgument', 'duplicate child ids');
    const fresh = childIds.filter((c) => !this.vms.has(c));
    const t0 = performance.now();
    const tmp = join(this.stateDir, 'tmp', `fork-${randomUUID()}`);
    mkdirSync(tmp, { recursive: true });
    const stream = join(tmp, 'mem.state');
    let frozen = '';
    // One load of the parent's stream into a RAM file that every child maps privately, by
    // a helper QEMU started right away (it needs only the template's disk). The children's
    // QEMUs start once the parent's disk is frozen: they map the (same) file before it is
    // filled and touch no guest RAM until their state is loaded, and a private mapping
    // shows the file's pages until the first write to each. The file is in tmpfs and is
    // unlinked when the fork ends; the children's mappings keep its pages.
    const mem: MemImage = { ram: shmFile('fork'), state: join(tmp, 'state') };
    writeFileSync(mem.ram, '', { mode: 0o600 });
    truncateSync(mem.ram, parent.meta.memMiB * 1024 * 1024);
    giveToQemu(mem.ram, this.qemuUser);
    let streamSaved!: (p: string) => void;
    let streamFailed!: (e: Error) => void;
    const saved = new Promise<string>((res, rej) => {
      streamSaved = res;
      streamFailed = rej;
    });
    saved.catch(() => undefined);
    const tpl = await this.ensureTemplate(parent.meta.memMiB);
    const converting = fresh.length ? this.convertStream(saved, mem, parent.meta.memMiB, tpl.disk) : Promise.resolve(mem);
    converting.catch(() => undefined);
    let tConverted = 0;
    void converting.then(() => (tConverted = performance.now()), () => undefined);
    try {
      await this.locked(parent, async () => {
        const qmp = this.qmpOf(parent);
        const wasRunning = parent.meta.state === 'running';
        if (wasRunning) await qmp.execute('stop');
        try {
          frozen = this.freezeDisk(parent);
          await this.ignoreShared(qmp, false);
          await migrateToFile(qmp, this.socketDir, stream, this.qemuUser);
        } finally {
          if (wasRunning) await qmp.execute('cont');
        }
      }).then(() => streamSaved(stream), (e: Error) => {
        streamFailed(e);
        throw e;
      });
      const image = await this.ensureImage();
      const tSaved = performance.now();
      const image1 = mem;
      const results = await Promise.allSettled(
        fresh.map(async (cid) => {
          const dir = this.vmDir(cid);
          removeSockets(dir);
          rmSync(dir, { recursive: true, force: true });
          mkdirSync(dir, { recursive: true });
          const vm: Vm = {
            dir,
            lock: Promise.resolve(),
            pending: 0,
            meta: {
              ...parent.meta,
              id: cid,
              createdAt: new Date().toISOString(),
              hostname: hostnameFor(cid),
              machineId: randomBytes(16).toString('hex'),
              disk: '',
              diskSeq: 0,
              state: 'running',
              pid: undefined,
              restarted: undefined,
            },
          };
          vm.meta.disk = this.nextOverlay(vm);
          this.vms.set(cid, vm);
          await this.locked(vm, async () => {
            await this.overlay(vm.meta.disk, frozen, image.diskSize);
            this.saveMeta(vm);
            const qemu = await this.prelaunch(vm, image1.ram);
            try {
              await converting;
            } catch (e) {
              vm.meta.pid = qemu.pid;
              vm.meta.qemuName = qemu.name;
              vm.qmp = qemu.qmp;
              throw e;
            }
            await this.boot(vm, image1, { hostname: vm.meta.hostname, machineId: vm.meta.machineId }, qemu);
          });
        }),
      );
      const tDone = performance.now();
      this.timings.lastForkPhases = { save: Math.round(tSaved - t0), convert: Math.round(Math.max(tConverted, tSaved) - tSaved), children: Math.round(tDone - Math.max(tConverted, tSaved)) };
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) {
        await Promise.all(fresh.map((c) => this.destroy(c).catch(() => undefined)));
        throw failed.reason;
      }
    } finally {
      await converting.catch(() => undefined);
      rmSync(tmp, { recursive: true, force: true });
      rmSync(mem.ram, { force: true });
      if (frozen) this.inflightDisks.delete(frozen);
      this.gcDisks();
    }
    this.timings.lastForkMs = performance.now() - t0;
    return {
      children: childIds.map((c) => this.info(this.vm(c))),
      parentMark: { sandboxId: parentId, token: frozen.split('/').pop()!.replace(/\.qcow2$/, '') },
    };
  }

  async mark(id: string): Promise<WorkspaceMark> {
    this.vm(id);
    throw new RuntimeError('Unsupported', 'VM workspaces are not layered: compare manifests instead');
  }

  async changesSince(id: string, _mark: WorkspaceMark, _paths?: string[]): Promise<Diff> {
    this.vm(id);
    throw new RuntimeError('Unsupported', 'VM workspaces are not layered: compare manifests instead');
  }

  // ---- files on the host ----

  private requireStarted(): void {
    if (!this.started) throw new RuntimeError('Internal', 'VmRuntime.start() was not called');
  }

  private vmDir(id: string): string {
    return join(this.stateDir, 'vms', id);
  }

  private ckptDir(id: string): string {
    return join(this.stateDir, 'checkpoints', id);
  }

  private tryCheckpointMeta(id: string): CheckpointMeta | undefined {
    try {
      return JSON.parse(readFileSync(join(this.ckptDir(id), 'checkpoint.json'), 'utf8')) as CheckpointMeta;
    } catch {
      return undefined;
    }
  }

  private checkpointMeta(id: string): CheckpointMeta {
    if (typeof id !== 'string' || !ID_RE.test(id)) throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(id)}`);
    const m = this.tryCheckpointMeta(id);
    if (!m) throw new RuntimeError('NotFound', `no checkpoint ${id}`);
    return m;
  }

  /** Deletes frozen disks that no VM, checkpoint or running operation needs any more. */
  private gcDisks(): void {
    const keep = new Set<string>(this.inflightDisks);
    const follow = (f: string | undefined) => {
      for (let i = 0; f && i < 256 && !keep.has(f); i++) {
        keep.add(f);
        f = qcow2Backing(f);
      }
    };
    const overlays = join(this.stateDir, 'overlays');
    for (const f of safeReaddir(overlays)) follow(join(overlays, f));
    for (const c of safeReaddir(join(this.stateDir, 'checkpoints'))) follow(this.tryCheckpointMeta(c)?.disk);
    const disks = join(this.stateDir, 'disks');
    for (const f of safeReaddir(disks)) {
      const p = join(disks, f);
      if (!keep.has(p)) rmSync(p, { force: true });
    }
  }
}

/** Mounts the workspace disk at /run/disk and binds its work/ directory at `path`. */
async function mountWorkspace(agent: AgentClient, path: string): Promise<void> {
  await Promise.all([
    agent.mount('/dev/disk-work', '/run/disk', { fstype: 'ext4' }),
    agent.mkdir('/run/disk/work'),
    agent.mount('/run/disk/work', path, { bind: true }),
  ]);
}

/** A new file name in /dev/shm (tmpfs) when there is one, else in the system temp dir. */
function shmFile(tag: string): string {
  const base = existsSync('/dev/shm') ? '/dev/shm' : tmpdir();
  return join(base, `fluxvm-${tag}-${randomUUID()}.ram`);
}

function readPid(dir: string): number | undefined {
  try {
    return Number(readFileSync(socketPaths(dir).pidfile, 'utf8').trim()) || undefined;
  } catch {
    return undefined;
  }
}

function safeReaddir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

function fileSize(p: string): number {
  try {
    return statSync(p).blocks * 512;
  } catch {
    return 0;
  }
}

function hostnameFor(id: string): string {
  const h = id.toLowerCase().replace(/[^a-z0-9-]/g, '-').replace(/^-+/, '').slice(0, 63);
  return h || 'sandbox';
}

function ckptInfo(m: CheckpointMeta): CheckpointInfo {
  return { id: m.id, sandboxId: m.sandboxId, kind: m.kind, sizeBytes: m.sizeBytes, takenAt: m.takenAt };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

