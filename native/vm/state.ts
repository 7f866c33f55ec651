// The VM backend's state on disk and in memory: the records (vm.json, checkpoint.json,
// template.json), the in-memory VM, the runtime's options, and small pure helpers shared by
// the files of native/vm (vm.ts, host.ts, template.ts, checkpoint.ts, fork.ts).
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, lstatSync, readdirSync, readFileSync, statSync, unlinkSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { EgressHook, NetworkState } from '../procbox/network.js';
import {
  RuntimeError,
  type CheckpointInfo,
  type Confinement,
  type InstanceFailure,
  type VolumeMount,
} from '../runtime.js';
import type { AGENT_LIMITS, AgentClient } from './agent-client.js';
import type { QmpClient } from './qmp.js';
import { socketPaths, type Accel } from './qemu.js';

/** A named volume of a VM (volumes.ts): the mount and the guest's virtio-fs tag. */
export interface VmVolume extends VolumeMount {
  /** The guest's virtio-fs tag. */
  tag: string;
}

/** A virtiofsd serving one of a VM's volumes (volumes.ts). */
export interface VirtiofsdProc {
  pid: number;
  socket: string;
}

// 3: every machine has a virtio-net NIC (a hub port without a network). 4: the guest kernel
// zeroes freed pages (init_on_free=1: smaller saved machines).
export const TEMPLATE_VERSION = 4;
/**
 * The repository root (it holds hack/vm-image.sh): the nearest directory above this module with
 * a package.json, so it is the same whether this file runs from native/vm (tsx) or from
 * dist/native/vm (after `make build`).
 */
export const REPO_ROOT = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'hack', 'vm-image.sh'))) return dir;
    const up = dirname(dir);
    if (up === dir) return resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
    dir = up;
  }
})();
export const ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/**
 * The names `SandboxConfig.image` may give on a runtime with these options: its one guest
 * image, `debian` when it has the Debian root filesystem (`rootfs`, or an `imageDir` built
 * with --rootfs), else `busybox` (the initramfs userland). Absent image: that one too.
 */
export function imageNames(opts: Pick<VmRuntimeOptions, 'imageDir' | 'rootfs'>): string[] {
  let rootfs = !!opts.rootfs;
  if (opts.imageDir) {
    try {
      rootfs = !!(JSON.parse(readFileSync(join(opts.imageDir, 'image.json'), 'utf8')) as { rootfs?: string }).rootfs;
    } catch {
      // not built yet: it is built as the options say
    }
  }
  return [rootfs ? 'debian' : 'busybox'];
}

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
  /**
   * The host egress proxy (as procbox gets it): network mode allowList leads to it. Without
   * it a VM can have network none or open only (network.ts).
   */
  egress?: EgressHook;
}

/** A saved machine as a RAM file (mapped privately by its users) plus its device state. */
export interface MemImage {
  ram: string;
  state: string;
}

export interface PoolEntry {
  dir: string;
  disk: string;
  name: string;
  pid: number;
  qmp: QmpClient;
  templateKey: string;
  /** Started with LaunchSpec.incomingFile: it loads its stream from its own fd (migrateFromFd), not over a socket. */
  incomingFd?: boolean;
  /** Its machine is loaded already (a standby: checkpoint.ts prepareStandby), paused: boot only continues it. */
  loaded?: boolean;
}

/** A QEMU started for the next restore of `checkpointId` (in pool/, waiting for `from` on its fd). */
export interface Standby {
  checkpointId: string;
  entry: PoolEntry;
  from: MemImage | { stream: string };
}

export interface ImageInfo {
  dir: string;
  hash: string;
  kernel: string;
  initrd: string;
  disk: string;
  rootfs?: string;
  diskSize: string;
}

export interface TemplateInfo {
  key: string;
  dir: string;
  memMiB: number;
  /** vCPUs (absent: 1). */
  cpus?: number;
  disk: string;
  ram: string;
  state: string;
  ramBare: string;
  stateBare: string;
  bootMs: number;
}

export interface VmMeta {
  id: string;
  createdAt: string;
  workspacePath: string;
  hostname: string;
  machineId: string;
  env: Record<string, string>;
  memMiB: number;
  /** vCPUs (SandboxConfig.resources.cpuMillis rounded up; absent: 1). */
  cpus?: number;
  /** The confinement of every command (SandboxConfig.confinement, checked), applied by the guest agent. */
  confinement?: Confinement;
  templateKey: string;
  /** The overlay the VM writes to now (absolute). */
  disk: string;
  diskSeq: number;
  state: 'running' | 'paused';
  /** On idle standby (idle.ts): QEMU stopped until a wake; written before the stop. */
  standby?: boolean;
  pid?: number;
  /** QEMU's -name, unique per process: how a restart recognises our QEMU. */
  qemuName?: string;
  restarted?: boolean;
  /** The guest broke the agent protocol: QEMU was stopped and the VM is never used again. */
  failed?: InstanceFailure;
  /** The VM's link (allowList, open): its tap, subnet, address and allow-list; absent: no network. */
  network?: NetworkState;
  /** Named volumes (volumes.ts): the VM cold-boots with a virtio-fs device for each and is never saved. */
  volumes?: VmVolume[];
  /** The virtiofsds serving them to the running QEMU. */
  virtiofsd?: VirtiofsdProc[];
}

export interface CheckpointMeta {
  id: string;
  sandboxId: string;
  kind: 'disk' | 'memory';
  takenAt: string;
  sizeBytes: number;
  disk: string;
  memMiB: number;
  /** The VM's vCPUs (absent: 1): a memory checkpoint loads only into a machine with as many. */
  cpus?: number;
  templateKey: string;
  workspacePath: string;
  hostname: string;
  machineId: string;
  /**
   * Saved from a VM without a network (a memory checkpoint): the guest's eth0 is as the runtime
   * leaves it for such a VM (down, no address), so a restore into a VM without one skips the
   * guest `net` step (60 ms of guest work under TCG). Absent in older records: the step runs.
   */
  netNone?: boolean;
}

export interface Vm {
  meta: VmMeta;
  dir: string;
  qmp?: QmpClient;
  agent?: AgentClient;
  agentConnecting?: Promise<AgentClient>;
  /** Serialises lifecycle operations (checkpoint, restore, fork, pause, destroy). */
  lock: Promise<void>;
  /** Lifecycle operations running or queued. */
  pending: number;
  /** The egress CA bundle last written into this guest (network.ts syncGuestTrust); reset by each boot. */
  trustPem?: string;
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
  /**
   * Milliseconds per phase of the last checkpoint (stopped: until the guest runs again, with the stream written; sync:
   * making it durable).
   */
  lastCheckpointPhases?: Record<string, number>;
  /** Milliseconds per phase of the last fork (save: parent stopped; convert; children). */
  lastForkPhases?: Record<string, number>;
}

const shmBase = () => (existsSync('/dev/shm') ? '/dev/shm' : tmpdir());

/** The names of the RAM files of the runtime of `stateDir` start with this (sweepShm). */
export function shmPrefix(stateDir: string): string {
  return `fluxvm-${createHash('sha256').update(resolve(stateDir)).digest('hex').slice(0, 12)}-`;
}

/**
 * A new file name in /dev/shm (tmpfs) when there is one, else in the system temp dir, for a
 * RAM file of the runtime of `stateDir` (a template's boot, a fork, a conversion): each is
 * removed when its operation ends, and sweepShm removes those a crash left.
 */
export function shmFile(stateDir: string, tag: string): string {
  return join(shmBase(), `${shmPrefix(stateDir)}${tag}-${randomUUID()}.ram`);
}

/**
 * Removes the RAM files of the runtime of `stateDir` that a crash left in /dev/shm (memory
 * the host would not get back until it reboots: up to a guest's RAM each). At start, before
 * any operation of this runtime makes one; other runtimes' files have other names.
 */
export function sweepShm(stateDir: string): number {
  const base = shmBase();
  const prefix = shmPrefix(stateDir);
  let n = 0;
  for (const f of readdirSync(base)) {
    if (!f.startsWith(prefix) || !f.endsWith('.ram')) continue;
    // /dev/shm is writable by every local user: only a file or a symlink of that name is
    // unlinked (never followed); anything else, or one gone meanwhile, is left and never
    // stops the start.
    try {
      const st = lstatSync(join(base, f));
      if (!st.isFile() && !st.isSymbolicLink()) continue;
      unlinkSync(join(base, f));
      n++;
    } catch {
      /* gone meanwhile, or not ours to remove */
    }
  }
  return n;
}

export function readPid(dir: string): number | undefined {
  try {
    return Number(readFileSync(socketPaths(dir).pidfile, 'utf8').trim()) || undefined;
  } catch {
    return undefined;
  }
}

export function safeReaddir(d: string): string[] {
  try {
    return readdirSync(d);
  } catch {
    return [];
  }
}

export function fileSize(p: string): number {
  try {
    return statSync(p).blocks * 512;
  } catch {
    return 0;
  }
}

export function hostnameFor(id: string): string {
  const h = id
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, '-')
    .replace(/^-+/, '')
    .slice(0, 63);
  return h || 'sandbox';
}

export function ckptInfo(m: CheckpointMeta): CheckpointInfo {
  return { id: m.id, sandboxId: m.sandboxId, kind: m.kind, sizeBytes: m.sizeBytes, takenAt: m.takenAt };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Mounts the workspace disk of a guest (booted bare from a template) at `path`. */
export async function mountWorkspace(agent: AgentClient, path: string): Promise<void> {
  await Promise.all([
    agent.mount('/dev/disk-work', '/run/disk', { fstype: 'ext4' }),
    agent.mkdir('/run/disk/work'),
    agent.mount('/run/disk/work', path, { bind: true }),
  ]);
}

/**
 * The vCPUs of a VM asked for `cpuMillis` (SandboxConfig.resources; rounded up to whole CPUs,
 * absent: 1), within the host's cores: more is InvalidArgument naming resources.cpu (QEMU's
 * TCG threads would only contend with each other).
 */
export function vcpus(cpuMillis: number | undefined, hostCores = availableParallelism()): number {
  if (cpuMillis === undefined) return 1;
  if (!Number.isFinite(cpuMillis) || cpuMillis <= 0)
    throw new RuntimeError('InvalidArgument', `resources.cpu: ${cpuMillis} millicores is not a positive amount`);
  const n = Math.ceil(cpuMillis / 1000);
  if (n > hostCores)
    throw new RuntimeError(
      'InvalidArgument',
      `resources.cpu: ${n} vCPUs asked (${cpuMillis}m), but this host has ${hostCores} cores: at most ${hostCores * 1000}m on runtime vm`,
    );
  return n;
}
