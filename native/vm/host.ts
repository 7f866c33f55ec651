// The machinery every VM operation of the VM backend shares (VmHost, which VmRuntime
// extends): the runtime's state in memory, how a QEMU is started and stopped for a VM, the
// agent connection and the failure of a hostile guest, the per-VM lifecycle lock, frozen
// disks and their garbage collection. Its members are internal to native/vm: the template,
// checkpoint and fork files act on a VmHost; only VmRuntime is the public face.
import { randomBytes, randomUUID } from 'node:crypto';
import { copyFileSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join, resolve } from 'node:path';
import { RuntimeError, type InstanceFailure, type NetworkMode, type SandboxInfo } from '../runtime.js';
import { AgentClient, type AgentProtocolError } from './agent-client.js';
import type { QmpClient } from './qmp.js';
import {
  createOverlay,
  giveToQemu,
  isOurQemu,
  killAndWait,
  launchQemu,
  pidAlive,
  untilGone,
  probeAccel,
  hostTscKhz,
  qcow2Backing,
  removeSockets,
  socketDirFor,
  socketPaths,
  socketTarget,
  type Accel,
  type LaunchSpec,
  type MachineSpec,
  type QemuUser,
} from './qemu.js';
import { migrateFromFd, migrateFromFile } from './migrate.js';
import {
  ID_RE,
  imageNames,
  mountWorkspace,
  safeReaddir,
  sleep,
  type CheckpointMeta,
  type ImageInfo,
  type MemImage,
  type PoolEntry,
  type Standby,
  type TemplateInfo,
  type Vm,
  type VmRuntimeOptions,
  type VmTimings,
} from './state.js';
import { configureGuest, linkKey, TAP_HELPER, vmNetworkModes } from './network.js';

export abstract class VmHost {
  readonly stateDir: string;
  /** The short directory holding the QEMU sockets; see socketDirFor. */
  readonly socketDir: string;
  readonly accel: Accel;
  readonly qemu: string;
  readonly memMiB: number;
  /** The Landlock ABI the guest kernel offered at the last hello (capabilities().landlockAbi). */
  guestLandlockAbi?: number;
  readonly log: (msg: string) => void;
  readonly vms = new Map<string, Vm>();
  readonly templates = new Map<string, Promise<TemplateInfo>>();
  readonly inflightDisks = new Set<string>();
  image?: ImageInfo;
  imageBuilding?: Promise<ImageInfo>;
  started = false;
  pool: PoolEntry[] = [];
  poolFilling = 0;
  readonly conversions = new Map<string, Promise<void>>();
  /** Per checkpoint id: an overlay over its disk made ahead for its next restore (checkpoint.ts takeSpareOverlay). */
  readonly spareOverlays = new Map<string, Promise<string | undefined>>();
  /** Per VM id: a QEMU started ahead for a restore of its latest memory checkpoint (checkpoint.ts prepareStandby). */
  readonly standbys = new Map<string, Promise<Standby | undefined>>();
  convQueue: Promise<void> = Promise.resolve();
  readonly failureListeners: Array<(id: string, f: InstanceFailure) => void> = [];
  readonly stoppedListeners: Array<(id: string) => void> = [];
  /** Who QEMU runs as (undefined: this process's user). Set by start(). */
  qemuUser: QemuUser | undefined;
  readonly timings: VmTimings = {};
  /** The names a create's `image` may give (state.ts imageNames): the one guest image this runtime boots. */
  readonly images: string[];
  /** What network a VM can have here (network.ts vmNetworkModes). */
  readonly networkModes: NetworkMode[];
  /** Subnet indexes of this runtime's VM links, reserved from allocation to teardown. */
  readonly linkIndexes = new Set<number>();

  constructor(readonly opts: VmRuntimeOptions) {
    this.stateDir = resolve(opts.stateDir);
    this.socketDir = resolve(opts.socketDir ?? socketDirFor(this.stateDir));
    this.accel = !opts.accel || opts.accel === 'auto' ? probeAccel() : opts.accel;
    this.qemu = opts.qemuBinary ?? 'qemu-system-x86_64';
    this.memMiB = opts.memoryMiB ?? 256;
    this.log = opts.log ?? (() => undefined);
    this.networkModes = vmNetworkModes(opts.egress);
    this.images = imageNames(opts);
  }

  /** The name of the VM's link on the host (tap, rule tag). */
  linkKey(id: string): string {
    return linkKey(this.stateDir, id);
  }

  disconnect(vm: Vm): void {
    vm.qmp?.close();
    vm.qmp = undefined;
    vm.agent?.close();
    vm.agent = undefined;
    vm.agentConnecting = undefined;
  }

  /** How every QEMU of this runtime is started: as the QEMU user, in the state directory. */
  launchOpts(): { user?: QemuUser; cwd: string; tapHelper: string } {
    return { ...(this.qemuUser ? { user: this.qemuUser } : {}), cwd: this.stateDir, tapHelper: TAP_HELPER };
  }

  /** A new overlay QEMU writes (its backing recorded relative to the state directory), owned by the QEMU user. */
  async overlay(path: string, backing: string, size: string): Promise<void> {
    await createOverlay(path, backing, size, this.stateDir);
    giveToQemu(path, this.qemuUser);
  }

  machine(memMiB: number, image: ImageInfo, cpus = 1): MachineSpec {
    return {
      qemu: this.qemu,
      accel: this.accel,
      memMiB,
      cpus,
      kernel: image.kernel,
      initrd: image.initrd,
      rootfs: image.rootfs,
      tscKhz: hostTscKhz(),
    };
  }

  /**
   * The guest image (built on demand: template.ts; VmRuntime wires it, so this file does not import template.ts, which
   * takes a VmHost).
   */
  abstract ensureImage(): Promise<ImageInfo>;

  /** The golden template for `memMiB` (default: the runtime's), cold-booting it once (cached across restarts). */
  abstract ensureTemplate(memMiB?: number, cpus?: number): Promise<TemplateInfo>;

  /** Unthrottled migrations that announce their state changes (QmpClient.waitMigration wakes on them). */
  async prepareMigration(qmp: QmpClient): Promise<void> {
    await qmp.execute('migrate-set-parameters', {
      'max-bandwidth': 64 * 1024 * 1024 * 1024,
      'downtime-limit': 100_000,
    });
    await qmp.execute('migrate-set-capabilities', { capabilities: [{ capability: 'events', state: true }] });
  }

  /**
   * Two stream formats: with x-ignore-shared (device state only; RAM in a shared file:
   * templates and converted checkpoints) and without (the whole RAM: checkpoints and forks
   * of running VMs). The capability changes the stream header, so both ends must agree,
   * and a destination with it set refuses pages for its shared RAM.
   */
  async ignoreShared(qmp: QmpClient, on: boolean): Promise<void> {
    // `events` again: a VM adopted from a runtime before them has it off (waitMigration would poll).
    await qmp.execute('migrate-set-capabilities', {
      capabilities: [
        { capability: 'x-ignore-shared', state: on },
        { capability: 'events', state: true },
      ],
    });
  }

  // ---- connections ----

  /**
   * Connects to the agent of the QEMU in `dir`. With `vm`, a protocol violation by the guest
   * fails that VM (failVm); without (a template boot, before any user code ran), it only
   * closes the connection.
   */
  async connectAgent(dir: string, timeoutMs: number, vm?: Vm): Promise<AgentClient> {
    const client = await this.openAgent(dir, vm);
    try {
      this.guestLandlockAbi = (await client.hello(timeoutMs)).landlock;
    } catch (e) {
      client.close();
      throw e;
    }
    return client;
  }

  /** The connection to the agent of the QEMU in `dir`, before any request (connectAgent without the hello). */
  openAgent(dir: string, vm?: Vm): Promise<AgentClient> {
    return new Promise<AgentClient>((resolveP, rejectP) => {
      const sock = connect(socketTarget(socketPaths(dir).agent));
      sock.once('error', (e) => rejectP(new RuntimeError('Internal', `agent socket: ${e.message}`)));
      sock.once('connect', () => {
        resolveP(
          new AgentClient(sock, sock, {
            onViolation: (err) => (vm ? this.failVm(vm, err) : this.log(`vm: agent in ${dir}: ${err.message}`)),
            ...(this.opts.agentLimits ? { limits: this.opts.agentLimits } : {}),
          }),
        );
      });
    });
  }

  /**
   * The guest broke the agent protocol: the channel is closed already; record the failure
   * (vm.json, so it survives a restart), stop QEMU (a hostile guest gets no more CPU) and
   * tell the listeners. Never throws; once per VM.
   */
  failVm(vm: Vm, err: AgentProtocolError): void {
    if (vm.meta.failed) return;
    const failure: InstanceFailure = {
      reason: 'GuestProtocolError',
      message: err.message,
      at: new Date().toISOString(),
    };
    vm.meta.failed = failure;
    this.log(`vm: ${vm.meta.id} failed: ${err.message}`);
    try {
      if (this.vms.get(vm.meta.id) === vm) this.saveMeta(vm);
    } catch (e) {
      this.log(`vm: ${vm.meta.id}: recording the failure: ${(e as Error).message}`);
    }
    void this.locked(vm, () => this.halt(vm), { wait: true }).catch((e: Error) =>
      this.log(`vm: ${vm.meta.id}: stopping QEMU: ${e.message}`),
    );
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

  onInstanceStopped(listener: (id: string) => void): void {
    this.stoppedListeners.push(listener);
  }

  /**
   * Makes `qmp` the VM's QMP connection and tells the stopped-listeners when it closes while it
   * still is (QEMU exited on its own: halt and disconnect drop it from the VM first). Never throws.
   */
  watchQemu(vm: Vm, qmp: QmpClient): void {
    vm.qmp = qmp;
    const pid = vm.meta.pid;
    const ours = () => vm.qmp === qmp && this.vms.get(vm.meta.id) === vm && this.started;
    const tell = () => {
      if (!ours()) return;
      this.log(`vm: ${vm.meta.id}: QEMU (pid ${pid}) exited`);
      for (const l of this.stoppedListeners) {
        try {
          l(vm.meta.id);
        } catch (e) {
          this.log(`vm: stopped listener: ${(e as Error).message}`);
        }
      }
    };
    // Told once QEMU is gone, so a listener's inspect says stopped (a killed QEMU's sockets close
    // while the kernel still tears it down: inspect said running, and nothing came until the
    // health check).
    qmp.onClose(() => {
      if (ours()) void untilGone(pid ?? 0, 10_000).then(tell);
    });
  }

  async agentOf(vm: Vm): Promise<AgentClient> {
    if (vm.meta.failed)
      throw new RuntimeError(
        'Conflict',
        `sandbox ${vm.meta.id} failed (${vm.meta.failed.reason}): ${vm.meta.failed.message}`,
      );
    if (vm.meta.state === 'paused') throw new RuntimeError('Conflict', `sandbox ${vm.meta.id} is paused`);
    if (vm.meta.standby)
      throw new RuntimeError('Conflict', `sandbox ${vm.meta.id} is on standby (native/idle.ts wakes it)`);
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

  vm(id: string): Vm {
    const vm = this.vms.get(id);
    if (!vm) throw new RuntimeError('NotFound', `no VM sandbox ${id}`);
    return vm;
  }

  /** The agent of a VM for a public call: waits out a checkpoint, restore or fork first. */
  async agentFor(id: string): Promise<AgentClient> {
    const vm = this.vm(id);
    while (vm.pending > 0) await vm.lock;
    return this.agentOf(this.vm(id));
  }

  /**
   * Runs `fn` with the VM's lifecycle lock. Another lifecycle call meanwhile gets Busy unless
   * `wait`; public exec and file calls wait for it. The VM counts as busy from the moment
   * of the call (synchronously), so a call issued right after sees it.
   */
  async locked<T>(vm: Vm, fn: () => Promise<T>, opts: { wait?: boolean } = {}): Promise<T> {
    if (vm.pending > 0 && !opts.wait)
      throw new RuntimeError('Busy', `sandbox ${vm.meta.id} is busy (checkpoint, restore or fork in progress)`);
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

  saveMeta(vm: Vm): void {
    const tmp = join(vm.dir, 'vm.json.tmp');
    writeFileSync(tmp, JSON.stringify(vm.meta, null, 2));
    renameSync(tmp, join(vm.dir, 'vm.json'));
  }

  // ---- starting QEMU for a VM ----

  /**
   * Starts the VM's QEMU. `from` says where its machine state comes from: the template
   * (device state over the template's RAM file, then mount the workspace disk) or a saved
   * memory stream (anonymous RAM). Sets the guest clock and reseeds its RNG. `pooled`: a QEMU
   * started ahead (warm pool, standby; `loaded`: its machine is in already, it is only
   * continued). `opts.netAsSaved`: the machine's guest network is this VM's already (no `net`).
   */
  async boot(
    vm: Vm,
    from: { template: TemplateInfo; bare?: boolean } | { stream: string } | MemImage,
    identity: { hostname?: string; machineId?: string },
    pooled?: PoolEntry,
    opts: { netAsSaved?: boolean } = {},
  ): Promise<void> {
    const image = await this.ensureImage();
    const spec: LaunchSpec = {
      dir: vm.dir,
      sockDir: this.socketDir,
      disk: vm.meta.disk,
      ram:
        'template' in from
          ? { path: from.bare ? from.template.ramBare : from.template.ram, share: false }
          : 'ram' in from
            ? { path: from.ram, share: false }
            : { anonymous: true },
      incoming: true,
      name: `fluxvm-${randomBytes(6).toString('hex')}`,
      ...(vm.meta.network?.hostIf ? { tap: vm.meta.network.hostIf } : {}),
    };
    const stream =
      'template' in from
        ? from.bare
          ? from.template.stateBare
          : from.template.state
        : 'ram' in from
          ? from.state
          : from.stream;
    if (!pooled) {
      // A QEMU started here reads its stream from an fd it inherits (a pooled one got its own, or none).
      spec.incomingFile = stream;
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
    let qmp: QmpClient;
    if (pooled) {
      vm.meta.pid = pooled.pid;
      vm.meta.qemuName = pooled.name;
      qmp = pooled.qmp;
      this.watchQemu(vm, qmp);
      this.saveMeta(vm);
    } else {
      const q = await launchQemu(this.machine(vm.meta.memMiB, image, vm.meta.cpus), spec, this.launchOpts());
      vm.meta.pid = q.pid;
      vm.meta.qemuName = spec.name;
      qmp = q.qmp;
      this.watchQemu(vm, qmp);
      this.saveMeta(vm);
      lap('launch');
      await this.prepareMigration(qmp);
    }
    lap('qmp');
    if (!pooled) await this.ignoreShared(qmp, !('stream' in from));
    // Streams are saved from a stopped guest, so the loaded guest stays paused until cont.
    if (pooled?.loaded) {
      // a standby: loaded ahead
    } else if (pooled && !pooled.incomingFd) await migrateFromFile(qmp, this.socketDir, stream);
    else await migrateFromFd(qmp);
    lap('load');
    // Connected and asked while the guest is still paused (the agent's port is open when it
    // resumes, and the requests are waiting for it): hello and the identity steps are one
    // round of guest work after cont, not two round trips after it.
    const agent = await this.openAgent(vm.dir, vm);
    const hello = agent.hello(60_000);
    // Pipelined: the agent runs them in order without waiting for the host in between.
    const steps: Promise<unknown>[] = [agent.identity({ time: new Date(), seed: randomBytes(64), ...identity })];
    if ('template' in from && from.bare) steps.push(mountWorkspace(agent, vm.meta.workspacePath));
    else if ('template' in from && vm.meta.workspacePath !== '/work')
      steps.push(agent.mount('/run/disk/work', vm.meta.workspacePath, { bind: true }));
    // A machine from a stream (restore, fork) may carry another link's address: set this one's.
    vm.trustPem = undefined;
    if (vm.meta.network || (!('template' in from) && !opts.netAsSaved)) {
      steps.push(
        configureGuest(agent, vm.meta.network).catch((e: Error) => {
          // A guest saved by an agent without `net` (before VM networking) has no NIC to clear.
          if (vm.meta.network || (e as RuntimeError).code !== 'Unsupported') throw e;
        }),
      );
    }
    for (const p of steps) p.catch(() => undefined); // awaited below, after the hello
    try {
      await qmp.execute('cont');
      lap('cont');
      this.guestLandlockAbi = (await hello).landlock;
    } catch (e) {
      agent.close();
      throw e;
    }
    vm.agent = agent;
    lap('agent');
    await Promise.all(steps);
    lap('identity');
    this.timings.lastBootPhases = phases;
    vm.meta.state = 'running';
    this.saveMeta(vm);
  }

  /**
   * Stops QEMU (if any) and drops the connections. `wait: false` (a restore of a VM without a
   * network, whose disk is dropped): SIGKILL without waiting for the process to be gone; it
   * holds nothing the next QEMU needs (a tap would be: networked VMs always wait).
   */
  async halt(vm: Vm, opts: { wait?: boolean } = {}): Promise<void> {
    const pid = vm.meta.pid;
    const wait = opts.wait !== false || vm.meta.network !== undefined;
    if (vm.qmp && wait) await Promise.race([vm.qmp.execute('quit').catch(() => undefined), sleep(1000)]);
    this.disconnect(vm);
    if (isOurQemu(pid, vm.meta.qemuName ?? vm.dir)) {
      if (wait) await killAndWait(pid);
      else {
        try {
          process.kill(pid!, 'SIGKILL');
        } catch {
          // gone already
        }
      }
    }
    removeSockets(vm.dir);
    vm.meta.pid = undefined;
  }

  nextOverlay(vm: Vm): string {
    vm.meta.diskSeq += 1;
    return join(this.stateDir, 'overlays', `${randomUUID()}.qcow2`);
  }

  /**
   * Copies the VM's current overlay (only what the VM wrote since its last base) into
   * disks/ as an immutable base for checkpoints and forks. The VM must be stopped (QEMU
   * flushes on stop). A live external snapshot would avoid the copy, but QEMU 7.2 then
   * fails the next migration (bdrv_inactivate_all).
   */
  freezeDisk(vm: Vm): string {
    const frozen = join(this.stateDir, 'disks', `${randomUUID()}.qcow2`);
    this.inflightDisks.add(frozen);
    copyFileSync(vm.meta.disk, frozen);
    return frozen;
  }

  /** Starts a QEMU for `vm` waiting for a device-state stream over `ram` (mapped privately). */
  async prelaunch(vm: Vm, ram: string): Promise<PoolEntry> {
    const image = await this.ensureImage();
    const name = `fluxvm-${randomBytes(6).toString('hex')}`;
    removeSockets(vm.dir);
    rmSync(join(vm.dir, 'qemu.pid'), { force: true });
    const { pid, qmp } = await launchQemu(
      this.machine(vm.meta.memMiB, image, vm.meta.cpus),
      {
        dir: vm.dir,
        sockDir: this.socketDir,
        disk: vm.meta.disk,
        ram: { path: ram, share: false },
        incoming: true,
        name,
        ...(vm.meta.network?.hostIf ? { tap: vm.meta.network.hostIf } : {}),
      },
      this.launchOpts(),
    );
    vm.meta.pid = pid;
    vm.meta.qemuName = name;
    this.watchQemu(vm, qmp);
    await this.prepareMigration(qmp);
    await this.ignoreShared(qmp, true);
    return { dir: vm.dir, disk: vm.meta.disk, name, pid, qmp, templateKey: vm.meta.templateKey };
  }

  info(vm: Vm): SandboxInfo {
    const alive = pidAlive(vm.meta.pid);
    return {
      id: vm.meta.id,
      state: alive ? vm.meta.state : 'stopped',
      ...(alive ? { pid: vm.meta.pid } : {}),
      workspacePath: vm.meta.workspacePath,
      createdAt: vm.meta.createdAt,
      ...(vm.meta.network?.address ? { address: vm.meta.network.address } : {}),
      ...(vm.meta.restarted ? { restarted: true } : {}),
      ...(vm.meta.failed ? { failed: vm.meta.failed } : {}),
      ...(vm.meta.standby && alive ? { standby: true } : {}),
    };
  }

  qmpOf(vm: Vm): QmpClient {
    if (!vm.qmp || !pidAlive(vm.meta.pid)) throw new RuntimeError('Conflict', `sandbox ${vm.meta.id} is not running`);
    return vm.qmp;
  }

  // ---- files on the host ----

  requireStarted(): void {
    if (!this.started) throw new RuntimeError('Internal', 'VmRuntime.start() was not called');
  }

  vmDir(id: string): string {
    return join(this.stateDir, 'vms', id);
  }

  ckptDir(id: string): string {
    return join(this.stateDir, 'checkpoints', id);
  }

  tryCheckpointMeta(id: string): CheckpointMeta | undefined {
    try {
      return JSON.parse(readFileSync(join(this.ckptDir(id), 'checkpoint.json'), 'utf8')) as CheckpointMeta;
    } catch {
      return undefined;
    }
  }

  checkpointMeta(id: string): CheckpointMeta {
    if (typeof id !== 'string' || !ID_RE.test(id))
      throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(id)}`);
    const m = this.tryCheckpointMeta(id);
    if (!m) throw new RuntimeError('NotFound', `no checkpoint ${id}`);
    return m;
  }

  /** Deletes frozen disks that no VM, checkpoint or running operation needs any more. */
  gcDisks(): void {
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
