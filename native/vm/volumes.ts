// Named volumes in a VM (SandboxConfig.volumes): each volume's host directory (the mounted
// root of its file system, native/volumes/) is served to the guest by its own virtiofsd over a
// vhost-user socket, a `vhost-user-fs-device` on the microvm, and mounted by the guest agent at
// the volume's mountPath. This Debian's guest kernel has virtio-fs (fuse, virtiofs) and no 9p,
// and its QEMU 7.2 ships the C virtiofsd (/usr/lib/qemu/virtiofsd, qemu-system-common).
//
// Why a cold boot: a VM normally starts from the template's saved machine, and a saved machine
// loads only into a QEMU with the same devices (the guest found its virtio-mmio devices when it
// booted). A VM with volumes therefore boots its kernel (as the template did), with shared guest
// memory (a memfd: virtiofsd maps it), and is never saved: vhost-user-fs is not migratable in
// QEMU 7.2, so checkpoint, fork and a restore of such a VM are refused (Unsupported, saying why),
// and a fork child sees no volumes of its parent. A volume's contents are never in a
// checkpoint anyway (controllers/volume/README.md: by reference only).
//
// Trust (the guest is hostile; virtiofsd runs as root on the host):
// - virtiofsd's own sandbox (`sandbox=namespace`): new mount, pid and net namespaces and a
//   pivot_root into the volume's directory, so no name the guest sends (`..`, a symlink it
//   wrote pointing at `/`) resolves outside the volume; symlinks are resolved by the guest
//   kernel, inside the guest. It keeps only the file capabilities it needs (no
//   CAP_SYS_RESOURCE: the volume's reserved blocks stay out of reach, so its size holds);
//   mknod is dropped too.
// - Read-only is enforced on the host: a read-only volume's virtiofsd runs in a private mount
//   namespace of its own where its source is a read-only bind of the volume (`unshare`, `mount
//   -o bind,ro`), so every write it is asked for fails with EROFS whatever the guest mounts; the
//   guest's mount is read-only too (MS_RDONLY).
// - The host never opens a path below the volume's root: virtiofsd gets the root only.
import { spawn } from 'node:child_process';
import { chmodSync, chownSync, closeSync, existsSync, openSync, readFileSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { RuntimeError, type VolumeMount } from '../runtime.js';
import { checkVolumes } from '../procbox/binds.js';
import type { VmHost } from './host.js';
import { configureGuest } from './network.js';
import { launchQemu, removeSockets } from './qemu.js';
import { mountWorkspace, type VirtiofsdProc, type Vm, type VmVolume } from './state.js';

export type { VirtiofsdProc, VmVolume };

/** Where Debian's QEMU 7.2 installs its virtiofsd (qemu-system-common), then the standalone package's. */
const VIRTIOFSD_PATHS = ['/usr/lib/qemu/virtiofsd', '/usr/libexec/virtiofsd'];

/** A volume of a VM, as its record keeps it (vm.json). */

/** The virtiofsd binary of this host, or undefined. */
export function virtiofsd(): string | undefined {
  return VIRTIOFSD_PATHS.find((p) => existsSync(p));
}

/** Why this host cannot attach volumes to VMs, or undefined when it can (root, virtiofsd). */
export function vmVolumesUnsupported(): string | undefined {
  if (process.getuid?.() !== 0) return 'volumes in a VM need root (virtiofsd)';
  if (!virtiofsd()) return 'virtiofsd is not installed (qemu-system-common)';
  return undefined;
}

/**
 * The volumes of a new VM, checked as procbox checks them (absolute, normalized, not over `/`,
 * the workspace or another volume; at most 8) and given their tags. Throws the RuntimeError
 * naming the entry, or Unsupported when the host cannot serve them.
 */
export function vmVolumes(volumes: VolumeMount[] | undefined, workspacePath: string): VmVolume[] {
  const checked = checkVolumes(volumes, workspacePath);
  if (!checked.length) return [];
  const why = vmVolumesUnsupported();
  if (why) throw new RuntimeError('Unsupported', `volumes: ${why}`);
  return checked.map((v, i) => ({ ...v, tag: `vol${i}` }));
}

/** Refuses an operation that saves a VM's machine (checkpoint, fork, restore) when it has volumes. */
export function refuseSavedVolumes(meta: { id: string; volumes?: VmVolume[] }, op: string): void {
  if (meta.volumes?.length)
    throw new RuntimeError(
      'Unsupported',
      `${op}: sandbox ${meta.id} mounts volumes, and a VM with volumes cannot be saved (QEMU's virtio-fs device is not migratable); a procbox sandbox can`,
    );
}

/**
 * Starts one virtiofsd per volume, each listening on a new socket in `sockDir` that QEMU's group
 * (`qemuGid`) may connect to, and resolves once every socket is there. Each exits when its QEMU
 * disconnects (a QEMU that stops ends them); `stop` kills the ones still running. Logs go to
 * `<dir>/virtiofsd-<tag>.log`. On failure nothing is left running.
 */
export async function startVirtiofsds(
  volumes: VmVolume[],
  o: { dir: string; sockDir: string; qemuGid?: number },
): Promise<{ fs: { tag: string; socket: string }[]; procs: VirtiofsdProc[] }> {
  const bin = virtiofsd();
  if (!bin) throw new RuntimeError('Unsupported', 'volumes: virtiofsd is not installed (qemu-system-common)');
  const fs: { tag: string; socket: string }[] = [];
  const procs: VirtiofsdProc[] = [];
  try {
    for (const v of volumes) {
      const socket = join(o.sockDir, `${randomBytes(8).toString('hex')}.fs`);
      const args = [
        `--socket-path=${socket}`,
        '-o',
        `source=${v.source}`,
        '-o',
        'sandbox=namespace',
        '-o',
        'cache=auto',
        '-o',
        'no_xattr',
        '-o',
        'modcaps=-mknod',
      ];
      // Read-only on the host: a private mount namespace where the source is a read-only bind
      // of itself, then virtiofsd (whose own bind of the source keeps the read-only flag).
      const argv = v.readOnly
        ? [
            'unshare',
            '--mount',
            '--propagation',
            'private',
            '--',
            'sh',
            '-c',
            'src=$1; shift; mount --bind -o ro "$src" "$src" && exec "$@"',
            'sh',
            v.source,
            bin,
            ...args,
          ]
        : [bin, ...args];
      const log = openSync(join(o.dir, `virtiofsd-${v.tag}.log`), 'w', 0o600);
      let child;
      try {
        child = spawn(argv[0]!, argv.slice(1), { detached: true, stdio: ['ignore', log, log] });
      } finally {
        closeSync(log);
      }
      child.unref();
      let exited: number | undefined;
      child.once('exit', (code) => (exited = code ?? 1));
      child.once('error', () => (exited = 127));
      if (child.pid) procs.push({ pid: child.pid, socket });
      const t0 = Date.now();
      while (!existsSync(socket)) {
        if (exited !== undefined)
          throw new RuntimeError('Internal', `virtiofsd for volume ${v.mountPath} exited (${exited}) before listening`);
        if (Date.now() - t0 > 10_000)
          throw new RuntimeError('Internal', `virtiofsd for volume ${v.mountPath} did not listen within 10 s`);
        await new Promise((r) => setTimeout(r, 5));
      }
      // QEMU runs as its own user: its group may connect (the socket directory lets it pass).
      if (o.qemuGid !== undefined) {
        chownSync(socket, 0, o.qemuGid);
        chmodSync(socket, 0o660);
      }
      fs.push({ tag: v.tag, socket });
    }
  } catch (e) {
    stopVirtiofsds(procs);
    throw e;
  }
  return { fs, procs };
}

/** A virtiofsd of a VM, as its record keeps it: the process and the socket it serves. */

/**
 * Kills the virtiofsds still running (SIGKILL; they hold nothing worth a clean exit), only a
 * process whose command line names its socket (a pid from a record may be reused), and removes
 * the sockets. Never throws.
 */
export function stopVirtiofsds(procs: VirtiofsdProc[] | undefined): void {
  for (const p of procs ?? []) {
    try {
      if (readFileSync(`/proc/${p.pid}/cmdline`, 'utf8').includes(p.socket)) process.kill(p.pid, 'SIGKILL');
    } catch {
      // gone with its QEMU
    }
    rmSync(p.socket, { force: true });
  }
}

/**
 * Boots the VM's kernel with its volumes (see the top of this file): its virtiofsds, a QEMU
 * with a virtio-fs device per volume and shared memory, then in the guest the clock and
 * identity, the workspace disk (vm.meta.disk, an overlay of the template's), the network and
 * each volume at its mountPath (read-only ones MS_RDONLY). Used by create and by a revive (the
 * disk is kept; processes are not). Throws what failed; the caller destroys or retries.
 */
export async function bootWithVolumes(
  h: VmHost,
  vm: Vm,
  identity: { hostname?: string; machineId?: string },
): Promise<void> {
  const volumes = vm.meta.volumes ?? [];
  const image = await h.ensureImage();
  stopVirtiofsds(vm.meta.virtiofsd);
  removeSockets(vm.dir);
  rmSync(join(vm.dir, 'qemu.pid'), { force: true });
  const { fs, procs } = await startVirtiofsds(volumes, {
    dir: vm.dir,
    sockDir: h.socketDir,
    ...(h.qemuUser ? { qemuGid: h.qemuUser.gid } : {}),
  });
  vm.meta.virtiofsd = procs;
  h.saveMeta(vm);
  try {
    const name = `fluxvm-${randomBytes(6).toString('hex')}`;
    const q = await launchQemu(
      h.machine(vm.meta.memMiB, image, vm.meta.cpus),
      {
        dir: vm.dir,
        sockDir: h.socketDir,
        disk: vm.meta.disk,
        ram: { memfd: true },
        incoming: false,
        name,
        fs,
        ...(vm.meta.network?.hostIf ? { tap: vm.meta.network.hostIf } : {}),
      },
      h.launchOpts(),
    );
    vm.meta.pid = q.pid;
    vm.meta.qemuName = name;
    h.watchQemu(vm, q.qmp);
    h.saveMeta(vm);
    // A cold boot: as long as the template's (the caller's create waits for it).
    const agent = await h.connectAgent(vm.dir, 180_000, vm);
    try {
      await agent.identity({ time: new Date(), seed: randomBytes(64), ...identity });
      await mountWorkspace(agent, vm.meta.workspacePath);
      vm.trustPem = undefined;
      if (vm.meta.network) await configureGuest(agent, vm.meta.network);
      for (const v of volumes)
        await agent.mount(v.tag, v.mountPath, { fstype: 'virtiofs', ...(v.readOnly ? { readOnly: true } : {}) });
    } catch (e) {
      agent.close();
      throw e;
    }
    vm.agent = agent;
    vm.meta.state = 'running';
    h.saveMeta(vm);
  } catch (e) {
    stopVirtiofsds(vm.meta.virtiofsd);
    throw e;
  }
}
