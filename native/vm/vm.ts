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
//   images/<hash>/{vmlinuz,initrd.cpio,disk.qcow2[,rootfs.qcow2],image.json}
//     (the guest image, staged here: QEMU reaches nothing outside the state directory)
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
// Files: vm.ts (this class: the Runtime), host.ts (what every operation shares), template.ts
// (image, templates, warm pool), checkpoint.ts (checkpoint, restore), fork.ts, state.ts (records).
//
// Socket directory (socketDirFor: /run/fluxvm/<hash> or <tmp>/fluxvm-<hash>, mode 0700):
//   <random>.qmp, <random>.agent  the sockets of each running QEMU (new names per launch)
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, chmodSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import {
  checkConfinement,
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type ForkOptions,
  type ForkResult,
  type EgressTraffic,
  type HttpRule,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
  type WorkspaceMark,
} from '../runtime.js';
import type { Diff } from '../workspace/types.js';
import {
  checkpointVm,
  deleteCheckpointOf,
  dropSpareOverlay,
  dropStandby,
  memorySource,
  restoreVm,
} from './checkpoint.js';
import { forkVm } from './fork.js';
import { bootWithVolumes, stopVirtiofsds, vmVolumes } from './volumes.js';
import { withVolumes } from '../procbox/binds.js';
import { attachLink, checkAllow, checkVmNetwork, setupVmLink, teardownVmLink } from './network.js';
import { VmGuest } from './guest.js';
import { adoptRunState, standbyVm, wakeVm } from './idle.js';
import { recordVmOwner, VM_OWNERS, vmScope } from './orphans.js';
import { dropOwner } from '../owners.js';
import * as vmJobs from './jobs.js';
import { QmpClient } from './qmp.js';
import {
  ensureSocketDir,
  isOurQemu,
  killAndWait,
  pidAlive,
  QEMU_USER,
  removeSockets,
  resolveQemuUser,
  socketPaths,
  socketTarget,
} from './qemu.js';
import {
  hostnameFor,
  ID_RE,
  readPid,
  safeReaddir,
  sleep,
  sweepShm,
  vcpus,
  type ImageInfo,
  type TemplateInfo,
  type Vm,
  type VmMeta,
} from './state.js';
import { dropPoolEntry, ensureImage, ensureTemplate, gcImages, takePool } from './template.js';

export type { VmRuntimeOptions, VmTimings } from './state.js';

export class VmRuntime extends VmGuest implements Runtime {
  ensureImage(): Promise<ImageInfo> {
    return ensureImage(this);
  }

  ensureTemplate(memMiB = this.memMiB, cpus = 1): Promise<TemplateInfo> {
    return ensureTemplate(this, memMiB, cpus);
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
      networkModes: [...this.networkModes],
      images: [...this.images],
      limits: { memory: true, pids: false, cpu: true, cgroup: 'none' },
      // The guest agent opens ptys (agent/pty.c) and applies the confinement in every command's
      // child (agent/confine.c: read-only mounts, Landlock, the exec view and its seccomp rule).
      // The exec allow-list only on the Debian image: on busybox every program is /bin/sh's binary.
      pty: true,
      confinement: { execAllowlist: this.images.includes('debian'), paths: true },
      ...(this.guestLandlockAbi !== undefined ? { landlockAbi: this.guestLandlockAbi } : {}),
    };
  }

  // ---- lifecycle of the runtime ----

  /** Adopts VMs whose QEMU still runs and answers QMP; removes the rest. Safe to call twice. */
  async start(): Promise<void> {
    if (process.getuid?.() === 0 && this.opts.qemuUser !== false) {
      const name = this.opts.qemuUser ?? QEMU_USER;
      this.qemuUser = resolveQemuUser(name);
      if (!this.qemuUser)
        throw new RuntimeError(
          'Internal',
          `the QEMU user ${name} does not exist (hack/setup.sh creates ${QEMU_USER}); QEMU never runs as root`,
        );
    }
    for (const d of ['images', 'templates', 'vms', 'checkpoints', 'disks', 'tmp', 'pool', 'overlays'])
      mkdirSync(join(this.stateDir, d), { recursive: true });
    rmSync(join(this.stateDir, 'tmp'), { recursive: true, force: true });
    mkdirSync(join(this.stateDir, 'tmp'));
    const swept = sweepShm(this.stateDir); // RAM files a crash left (a template's boot, a fork, a conversion)
    if (swept) this.log(`vm: removed ${swept} RAM file(s) a stopped runtime left in /dev/shm`);
    // QEMU reaches the state directory only relatively from its working directory (this one):
    // it may pass through (never list) the directories holding its disks and RAM files, and
    // cannot enter the others (metadata, pool, temporary files).
    if (this.qemuUser) {
      chmodSync(this.stateDir, 0o711);
      for (const d of ['images', 'templates', 'checkpoints', 'disks', 'overlays'])
        chmodSync(join(this.stateDir, d), 0o711);
      for (const d of ['vms', 'tmp', 'pool']) chmodSync(join(this.stateDir, d), 0o700);
    }
    ensureSocketDir(this.socketDir, this.qemuUser?.gid);
    recordVmOwner(this.stateDir); // what its QEMUs and links are released by once the directory is gone (orphans.ts)
    for (const name of readdirSync(join(this.stateDir, 'templates'))) {
      if (name.includes('.tmp')) rmSync(join(this.stateDir, 'templates', name), { recursive: true, force: true });
    }
    for (const name of readdirSync(join(this.stateDir, 'checkpoints'))) {
      const dir = join(this.stateDir, 'checkpoints', name);
      if (name.includes('.tmp') || !existsSync(join(dir, 'checkpoint.json')))
        rmSync(dir, { recursive: true, force: true });
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
        if (meta.network?.index !== undefined) this.linkIndexes.add(meta.network.index);
        continue;
      }
      if (meta && isOurQemu(pid, marker)) {
        try {
          const qmp = await QmpClient.connect(socketTarget(socketPaths(dir).qmp), 3000);
          const status = await qmp.status();
          if (meta.standby || meta.state !== 'paused') await adoptRunState(qmp, meta, status);
          else meta.state = status === 'paused' ? 'paused' : 'running';
          const vm: Vm = { meta, dir, lock: Promise.resolve(), pending: 0 };
          this.watchQemu(vm, qmp);
          this.vms.set(id, vm);
          // Its QEMU holds the tap; the proxy (new with this process) learns the link again.
          if (meta.network?.index !== undefined) this.linkIndexes.add(meta.network.index);
          attachLink(id, meta.network, this.opts.egress);
          this.log(`vm: adopted ${id} (pid ${pid})`);
          continue;
        } catch {
          // Not answering: clean it up below.
        }
      }
      this.log(`vm: removing ${id} (not running)`);
      if (isOurQemu(pid, marker)) await killAndWait(pid);
      removeSockets(dir);
      if (meta?.network) await teardownVmLink(this.linkKey(id), meta.network, this.opts.egress);
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
    const liveSockets = new Set(
      liveDirs.flatMap((d) => [socketTarget(socketPaths(d).qmp), socketTarget(socketPaths(d).agent)]),
    );
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
    gcImages(this);
    this.started = true;
  }

  /** Disconnects from every VM and leaves them running (the next start() adopts them). */
  async close(): Promise<void> {
    this.started = false;
    await Promise.all(this.conversions.values());
    for (const id of [...this.spareOverlays.keys()]) await dropSpareOverlay(this, id);
    for (const id of [...this.standbys.keys()]) await dropStandby(this, id);
    for (const vm of this.vms.values()) this.disconnect(vm);
    if (this.vms.size === 0) dropOwner(VM_OWNERS, vmScope(this.stateDir));
    this.vms.clear();
    while (this.poolFilling > 0) await sleep(20);
    const pool = this.pool;
    this.pool = [];
    for (const e of pool) await dropPoolEntry(this, e);
    // Only when empty: the sockets of VMs left running stay for the next start() to adopt.
    if (safeReaddir(this.socketDir).length === 0) rmSync(this.socketDir, { recursive: true, force: true });
  }

  // ---- Runtime: sandboxes ----

  async create(cfg: SandboxConfig): Promise<SandboxInfo> {
    this.requireStarted();
    if (!cfg || typeof cfg.id !== 'string' || !ID_RE.test(cfg.id))
      throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(cfg?.id)}`);
    const existing = this.vms.get(cfg.id);
    if (existing) return this.info(existing);
    if (cfg.image !== undefined && !this.images.includes(cfg.image)) {
      throw new RuntimeError(
        'InvalidArgument',
        `image ${JSON.stringify(cfg.image)} is not on this host (its VM images: ${this.images.join(', ')}; leave the image out for that one)`,
        'ImageNotFound',
      );
    }
    checkVmNetwork(cfg.network, this.networkModes);
    const networked = (cfg.network?.mode ?? 'none') !== 'none';
    // Paths and the exec allow-list: applied by the guest agent (confine.ts, agent/confine.c).
    const workspacePath = cfg.workspacePath ?? '/work';
    if (!workspacePath.startsWith('/') || workspacePath === '/' || workspacePath.split('/').includes('..')) {
      throw new RuntimeError('InvalidPath', `invalid workspace path ${workspacePath}`);
    }
    // Named volumes (volumes.ts): virtio-fs, a cold boot; a read-write one is writable under confinement.
    const volumes = vmVolumes(cfg.volumes, workspacePath);
    if (volumes.length && cfg.source)
      throw new RuntimeError(
        'Unsupported',
        'volumes: a VM with volumes boots fresh (its virtio-fs devices are in no saved machine); it cannot start from a checkpoint or a fork',
      );
    const confined = checkConfinement(this.capabilities(), cfg.confinement);
    const confinement = confined && volumes.length ? withVolumes(confined, volumes, true) : confined;
    if (cfg.source && 'sandboxId' in cfg.source) {
      await forkVm(this, cfg.source.sandboxId, [cfg.id], { network: cfg.network ?? { mode: 'none' } });
      return this.info(this.vm(cfg.id));
    }
    const memMiB = cfg.resources?.memoryBytes
      ? Math.max(128, Math.ceil(cfg.resources.memoryBytes / (1 << 20)))
      : this.memMiB;
    const dir = this.vmDir(cfg.id);
    const t0 = performance.now();
    const ckpt = cfg.source && 'checkpointId' in cfg.source ? this.checkpointMeta(cfg.source.checkpointId) : undefined;
    const cpus = ckpt?.cpus ?? vcpus(cfg.resources?.cpuMillis);
    const tpl = await this.ensureTemplate(ckpt?.memMiB ?? memMiB, cpus);
    removeSockets(dir);
    rmSync(dir, { recursive: true, force: true });
    // A warm QEMU's directory becomes the VM's (its sockets and open files move with it).
    // Warm QEMUs have no link: a networked VM starts its own.
    const pooled = ckpt || networked || cpus > 1 || volumes.length ? undefined : takePool(this, tpl);
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
        ...(cpus > 1 ? { cpus } : {}),
        ...(confinement ? { confinement } : {}),
        ...(volumes.length ? { volumes } : {}),
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
        if (networked)
          vm.meta.network = await setupVmLink(
            this.linkKey(cfg.id),
            cfg.id,
            cfg.network!,
            this.linkIndexes,
            this.opts.egress,
          );
        this.saveMeta(vm);
        const identity = { hostname: vm.meta.hostname, machineId: vm.meta.machineId };
        if (volumes.length) await bootWithVolumes(this, vm, identity);
        else if (ckpt?.kind === 'memory') await this.boot(vm, memorySource(this, ckpt.id), identity);
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
        // Processes are lost; the disk (workspace) is intact: boot it from the template. It runs:
        // an idle standby (its guest was stopped) ended with its QEMU.
        await this.halt(vm);
        delete vm.meta.standby;
        const identity = { hostname: vm.meta.hostname, machineId: vm.meta.machineId };
        if (vm.meta.volumes?.length) await bootWithVolumes(this, vm, identity);
        else
          await this.boot(
            vm,
            { template: await this.ensureTemplate(vm.meta.memMiB, vm.meta.cpus), bare: true },
            identity,
          );
        vm.meta.restarted = true;
        this.saveMeta(vm);
      });
    }
    return this.info(vm);
  }

  async list(): Promise<SandboxInfo[]> {
    return [...this.vms.values()].map((vm) => this.info(vm)).sort((a, b) => a.id.localeCompare(b.id));
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
          const meta = JSON.parse(readFileSync(join(dir, 'vm.json'), 'utf8')) as VmMeta;
          stopVirtiofsds(meta.virtiofsd);
          if (meta.disk) rmSync(meta.disk, { force: true });
          if (meta.network) await teardownVmLink(this.linkKey(id), meta.network, this.opts.egress, this.linkIndexes);
        } catch {
          // nothing recorded
        }
        removeSockets(dir);
        rmSync(dir, { recursive: true, force: true });
        this.gcDisks();
      }
      return;
    }
    await this.locked(
      vm,
      async () => {
        await dropStandby(this, id);
        await this.halt(vm); // removes the sockets too
        stopVirtiofsds(vm.meta.virtiofsd);
        if (vm.meta.network)
          await teardownVmLink(this.linkKey(id), vm.meta.network, this.opts.egress, this.linkIndexes);
        rmSync(dir, { recursive: true, force: true });
        if (vm.meta.disk) rmSync(vm.meta.disk, { force: true });
        this.vms.delete(id);
      },
      { wait: true },
    );
    this.gcDisks();
  }

  /** Replaces an allowList VM's allow-list: the egress proxy enforces it from the next connection. */
  async setNetworkAllow(id: string, allow: string[], http?: HttpRule[]): Promise<void> {
    const vm = this.vm(id);
    const net = vm.meta.network;
    if (net?.mode !== 'allowList')
      throw new RuntimeError('Unsupported', `sandbox ${id} has network mode ${net?.mode ?? 'none'}, not allowList`);
    checkAllow(allow, http);
    net.allow = [...allow];
    if (http?.length) net.http = http.map((r) => ({ ...r }));
    else delete net.http;
    this.saveMeta(vm);
    attachLink(id, net, this.opts.egress);
  }

  /** A watched copy's egress (NetworkConfig.watch): what the proxy recorded; the link is sealed from now on. */
  async egressTraffic(id: string): Promise<EgressTraffic | undefined> {
    const net = this.vm(id).meta.network;
    if (net?.mode !== 'allowList' || !net.watch || !net.address) return undefined;
    return this.opts.egress?.takeTraffic?.(net.address);
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

  /** Idle standby (idle.ts): QMP stop with the record on disk first; wake continues it. */
  standby(id: string): Promise<void> {
    return standbyVm(this, id);
  }
  wake(id: string): Promise<boolean> {
    return wakeVm(this, id);
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

  // ---- Runtime: checkpoints, restore, fork ----

  checkpoint(id: string, checkpointId: string, opts: { memory?: boolean } = {}): Promise<CheckpointInfo> {
    return checkpointVm(this, id, checkpointId, opts);
  }

  /**
   * Puts the VM back to the checkpoint: a new QEMU (same id, directory and socket links)
   * from the checkpoint's memory stream, or for a disk checkpoint a fresh guest from the
   * template over the checkpoint's disk. The checkpoint itself is never written.
   */
  restore(id: string, checkpointId: string): Promise<void> {
    return restoreVm(this, id, checkpointId);
  }

  deleteCheckpoint(checkpointId: string): Promise<void> {
    return deleteCheckpointOf(this, checkpointId);
  }

  fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    return forkVm(this, parentId, childIds, opts);
  }

  async mark(id: string): Promise<WorkspaceMark> {
    this.vm(id);
    throw new RuntimeError('Unsupported', 'VM workspaces are not layered: compare manifests instead');
  }

  async changesSince(id: string, _mark: WorkspaceMark, _paths?: string[]): Promise<Diff> {
    this.vm(id);
    throw new RuntimeError('Unsupported', 'VM workspaces are not layered: compare manifests instead');
  }
}
