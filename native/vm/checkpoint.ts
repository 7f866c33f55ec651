// Checkpoints of the VM backend: a disk checkpoint freezes the VM's overlay, a memory
// checkpoint also migrates the whole machine to a file; restore starts a new QEMU from them;
// after a memory checkpoint its stream is converted in the background (template.ts
// convertStream) so later restores map a RAM file instead of loading the stream.
import { randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { RuntimeError, type CheckpointInfo } from '../runtime.js';
import type { VmHost } from './host.js';
import type { QmpClient } from './qmp.js';
import {
  execFileP,
  giveToQemu,
  isOurQemu,
  killAndWait,
  launchQemu,
  removeSockets,
  socketPaths,
  socketTarget,
} from './qemu.js';
import { fsyncPath, migrateFromFd, migrateToFile } from './migrate.js';
import {
  ckptInfo,
  fileSize,
  ID_RE,
  shmFile,
  type CheckpointMeta,
  type MemImage,
  type PoolEntry,
  type Standby,
  type Vm,
} from './state.js';
import { convertStream, dropPoolEntry } from './template.js';
import { refuseSavedVolumes } from './volumes.js';

export async function checkpointVm(
  h: VmHost,
  id: string,
  checkpointId: string,
  opts: { memory?: boolean } = {},
): Promise<CheckpointInfo> {
  if (typeof checkpointId !== 'string' || !ID_RE.test(checkpointId))
    throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
  const existing = h.tryCheckpointMeta(checkpointId);
  if (existing) {
    if (existing.sandboxId !== id)
      throw new RuntimeError('Conflict', `checkpoint ${checkpointId} belongs to sandbox ${existing.sandboxId}`);
    return ckptInfo(existing);
  }
  const vm = h.vm(id);
  refuseSavedVolumes(vm.meta, 'checkpoint');
  const memory = opts.memory ?? false;
  return h.locked(vm, async () => {
    const t0 = performance.now();
    const dir = h.ckptDir(checkpointId);
    const tmp = `${dir}.tmp`;
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { recursive: true });
    const qmp = h.qmpOf(vm);
    const wasRunning = vm.meta.state === 'running';
    if (!memory && wasRunning) await (await h.agentOf(vm)).sync();
    if (wasRunning) await qmp.execute('stop');
    let frozen: string | undefined;
    try {
      frozen = h.freezeDisk(vm);
      if (memory) {
        await h.ignoreShared(qmp, false);
        // Flushed while written; fsynced below, once the guest runs again.
        await migrateToFile(qmp, h.socketDir, join(tmp, 'mem.state'), h.qemuUser, { flushWhileWriting: true });
      }
    } catch (e) {
      if (wasRunning) await qmp.execute('cont');
      throw e;
    }
    // Its reply is awaited with the fsyncs below (they need no running guest, nor it them).
    const resumed = wasRunning ? qmp.execute('cont') : Promise.resolve();
    resumed.catch(() => undefined); // rejects the Promise.all below; nothing else may leave it unhandled
    const tRunning = performance.now();
    const meta: CheckpointMeta = {
      id: checkpointId,
      sandboxId: id,
      kind: memory ? 'memory' : 'disk',
      takenAt: new Date().toISOString(),
      sizeBytes: fileSize(frozen) + (memory ? fileSize(join(tmp, 'mem.state')) : 0),
      disk: frozen,
      memMiB: vm.meta.memMiB,
      ...(vm.meta.cpus ? { cpus: vm.meta.cpus } : {}),
      templateKey: vm.meta.templateKey,
      workspacePath: vm.meta.workspacePath,
      hostname: vm.meta.hostname,
      machineId: vm.meta.machineId,
      ...(memory && !vm.meta.network ? { netNone: true } : {}),
    };
    writeFileSync(join(tmp, 'checkpoint.json'), JSON.stringify(meta, null, 2), { mode: 0o600 });
    if (h.qemuUser) chmodSync(tmp, 0o711); // a converted RAM file lands here for QEMU to map
    // Acknowledged only once on disk (a host crash keeps it): the stream, the frozen disk and
    // its entry, checkpoint.json and the directory's entries (all at once: nothing names the
    // directory before the rename); then the rename and its directory.
    await Promise.all([
      fsyncPath(frozen),
      fsyncPath(join(tmp, 'checkpoint.json')),
      ...(memory ? [fsyncPath(join(tmp, 'mem.state'))] : []),
      fsyncPath(tmp),
      fsyncPath(dirname(frozen)),
      resumed,
    ]);
    renameSync(tmp, dir);
    await fsyncPath(dirname(dir));
    h.inflightDisks.delete(frozen);
    h.timings.lastCheckpointMs = performance.now() - t0;
    h.timings.lastCheckpointPhases = { stopped: round1(tRunning - t0), sync: round1(performance.now() - tRunning) };
    prepareRestore(h, vm, meta);
    if (memory) convertCheckpoint(h, meta);
    return ckptInfo(meta);
  });
}

/**
 * Puts the VM back to the checkpoint: a new QEMU (same id, directory and socket links)
 * from the checkpoint's memory stream, or for a disk checkpoint a fresh guest from the
 * template over the checkpoint's disk. The checkpoint itself is never written.
 */
export async function restoreVm(h: VmHost, id: string, checkpointId: string): Promise<void> {
  const vm = h.vm(id);
  refuseSavedVolumes(vm.meta, 'restore');
  const ckpt = h.checkpointMeta(checkpointId);
  if (ckpt.memMiB !== vm.meta.memMiB && ckpt.kind === 'memory')
    throw new RuntimeError('InvalidArgument', 'checkpoint has another memory size');
  if ((ckpt.cpus ?? 1) !== (vm.meta.cpus ?? 1) && ckpt.kind === 'memory')
    throw new RuntimeError('InvalidArgument', 'checkpoint has another number of vCPUs');
  await h.locked(vm, async () => {
    const t0 = performance.now();
    const standbyReady = takeStandby(h, id, ckpt.id);
    const spareMade = takeSpareOverlay(h, ckpt.id);
    await h.halt(vm, { wait: false });
    const tHalt = performance.now();
    const standby = await standbyReady;
    const old = vm.meta.disk;
    const spare = await spareMade;
    vm.meta.disk = h.nextOverlay(vm);
    if (standby) {
      vm.meta.disk = standby.entry.disk;
      if (spare) rmSync(spare, { force: true });
      adoptStandbyFiles(standby.entry, vm.dir);
    } else if (spare) vm.meta.disk = spare;
    else await h.overlay(vm.meta.disk, ckpt.disk, (await h.ensureImage()).diskSize);
    rmSync(old, { force: true });
    const tOverlay = performance.now();
    vm.meta.hostname = ckpt.hostname;
    vm.meta.machineId = ckpt.machineId;
    vm.meta.workspacePath = ckpt.workspacePath;
    h.saveMeta(vm);
    // The machine's eth0 is already as this VM (without a network) needs it.
    const netAsSaved = ckpt.netNone === true && !vm.meta.network;
    if (standby) await h.boot(vm, standby.from, {}, { ...standby.entry, dir: vm.dir }, { netAsSaved });
    else if (ckpt.kind === 'memory') await h.boot(vm, memorySource(h, ckpt.id), {}, undefined, { netAsSaved });
    else
      await h.boot(
        vm,
        { template: await h.ensureTemplate(vm.meta.memMiB, vm.meta.cpus), bare: true },
        { hostname: ckpt.hostname, machineId: ckpt.machineId },
      );
    h.timings.lastRestoreMs = performance.now() - t0;
    h.timings.lastBootPhases = {
      halt: round1(tHalt - t0),
      [standby ? 'standby' : 'overlay']: round1(tOverlay - tHalt),
      ...h.timings.lastBootPhases,
    };
  });
  prepareRestore(h, vm, ckpt);
  if (ckpt.kind === 'memory') convertCheckpoint(h, ckpt);
  h.gcDisks();
}

/**
 * After a checkpoint or a restore, for the next restore: a QEMU waiting for the machine when
 * it is the VM's memory checkpoint and the VM has no network (a networked VM's tap is held
 * by its running QEMU), else a spare overlay.
 */
function prepareRestore(h: VmHost, vm: Vm, meta: CheckpointMeta): void {
  if (
    meta.kind === 'memory' &&
    !vm.meta.network &&
    meta.memMiB === vm.meta.memMiB &&
    (meta.cpus ?? 1) === (vm.meta.cpus ?? 1)
  )
    prepareStandby(h, vm, meta);
  else prepareSpareOverlay(h, meta);
}

/**
 * Starts, in the background, the QEMU the next restore of `meta` on this VM will use: its
 * own overlay over the checkpoint's disk, the checkpoint's RAM file mapped privately (or
 * anonymous RAM for a stream not converted yet), the device state or stream on its fd,
 * waiting (-incoming defer: nothing loaded, no guest code run). It lives in pool/ like a warm
 * QEMU (a restart kills it there); the restore moves its sockets into the VM's directory.
 * Takes the launch and QMP start (80 ms idle, 200-400 ms under load here) off the restore.
 * One per VM: the one for an older checkpoint is stopped.
 */
function prepareStandby(h: VmHost, vm: Vm, meta: CheckpointMeta): void {
  if (!h.started) return;
  const id = vm.meta.id;
  void dropStandby(h, id);
  const made = (async (): Promise<Standby | undefined> => {
    const image = await h.ensureImage();
    const token = randomBytes(6).toString('hex');
    const dir = join(h.stateDir, 'pool', token);
    const name = `fluxvm-${token}`;
    const disk = join(h.stateDir, 'overlays', `${randomUUID()}.qcow2`);
    const from = memorySource(h, meta.id);
    let pid: number | undefined;
    let qmp: QmpClient | undefined;
    try {
      mkdirSync(dir, { recursive: true });
      await h.overlay(disk, meta.disk, image.diskSize);
      ({ pid, qmp } = await launchQemu(
        h.machine(meta.memMiB, image, meta.cpus),
        {
          dir,
          sockDir: h.socketDir,
          disk,
          ram: 'ram' in from ? { path: from.ram, share: false } : { anonymous: true },
          incoming: true,
          name,
          incomingFile: 'ram' in from ? from.state : from.stream,
        },
        h.launchOpts(),
      ));
      await h.prepareMigration(qmp);
      await h.ignoreShared(qmp, 'ram' in from);
      // Loaded now, not at the restore: the machine waits paused (saved from a stopped guest),
      // so a restore only continues it (the whole stream's load, 100-300 ms here, was on its path).
      await migrateFromFd(qmp);
      return {
        checkpointId: meta.id,
        from,
        entry: { dir, disk, name, pid, qmp, templateKey: vm.meta.templateKey, incomingFd: true, loaded: true },
      };
    } catch (e) {
      h.log(`vm: standby QEMU for ${id} (checkpoint ${meta.id}): ${(e as Error).message}`);
      qmp?.close();
      if (isOurQemu(pid, name)) await killAndWait(pid);
      removeSockets(dir);
      rmSync(dir, { recursive: true, force: true });
      rmSync(disk, { force: true });
      return undefined;
    }
  })();
  h.standbys.set(id, made);
}

/** The VM's standby QEMU when it is for `checkpointId` and still runs (now the caller's); any other is stopped. */
async function takeStandby(h: VmHost, id: string, checkpointId: string): Promise<Standby | undefined> {
  const p = h.standbys.get(id);
  h.standbys.delete(id);
  const s = await p;
  if (!s) return undefined;
  if (s.checkpointId === checkpointId && isOurQemu(s.entry.pid, s.entry.name)) return s;
  await dropPoolEntry(h, s.entry);
  return undefined;
}

/** Stops the VM's standby QEMU, if any (a newer checkpoint, destroy, close). */
export async function dropStandby(h: VmHost, id: string): Promise<void> {
  const p = h.standbys.get(id);
  if (!p) return;
  h.standbys.delete(id);
  const s = await p;
  if (s) await dropPoolEntry(h, s.entry);
}

/** Moves a standby QEMU's socket links, pid file and logs from its pool directory into the VM's. */
function adoptStandbyFiles(e: PoolEntry, vmDir: string): void {
  const from = socketPaths(e.dir);
  const to = socketPaths(vmDir);
  for (const k of ['qmp', 'agent', 'pidfile', 'console', 'log'] as const) {
    if (existsSync(from[k]) || k === 'qmp' || k === 'agent') renameSync(from[k], to[k]);
  }
  rmSync(e.dir, { recursive: true, force: true });
}

/**
 * Makes, in the background, an overlay over the checkpoint's disk for its next restore (a
 * `qemu-img create` less on that path: 25 ms idle, 40-100 ms under load here). One per
 * checkpoint; it is an ordinary file in overlays/, so a restart removes it with the other
 * overlays no VM uses, and its backing disk stays (gcDisks follows overlays/).
 */
function prepareSpareOverlay(h: VmHost, meta: CheckpointMeta): void {
  if (h.spareOverlays.has(meta.id) || !h.started) return;
  const path = join(h.stateDir, 'overlays', `${randomUUID()}.qcow2`);
  const made = h
    .ensureImage()
    .then((image) => h.overlay(path, meta.disk, image.diskSize))
    .then(
      () => path,
      (e: Error) => {
        rmSync(path, { force: true });
        h.log(`vm: spare overlay for checkpoint ${meta.id}: ${e.message}`);
        return undefined;
      },
    );
  h.spareOverlays.set(meta.id, made);
}

/**
 * The checkpoint's spare overlay (waiting for it when it is being made), now the caller's; undefined when there is
 * none.
 */
async function takeSpareOverlay(h: VmHost, checkpointId: string): Promise<string | undefined> {
  const p = h.spareOverlays.get(checkpointId);
  h.spareOverlays.delete(checkpointId);
  return p;
}

/** Removes the checkpoint's spare overlay (checkpoint deleted, runtime closing). */
export async function dropSpareOverlay(h: VmHost, checkpointId: string): Promise<void> {
  const path = await takeSpareOverlay(h, checkpointId);
  if (path) rmSync(path, { force: true });
}

export async function deleteCheckpointOf(h: VmHost, checkpointId: string): Promise<void> {
  if (typeof checkpointId !== 'string' || !ID_RE.test(checkpointId)) return;
  await h.conversions.get(checkpointId);
  await dropSpareOverlay(h, checkpointId);
  for (const [vmId, p] of [...h.standbys]) {
    if ((await p)?.checkpointId === checkpointId && h.standbys.get(vmId) === p) await dropStandby(h, vmId);
  }
  rmSync(h.ckptDir(checkpointId), { recursive: true, force: true });
  h.gcDisks();
}

/**
 * After a memory checkpoint: its stream becomes a RAM file + device state in the
 * background, at low CPU priority, so restores map it instead of loading the stream (a
 * dry-run restores while its command ran long enough for this). A restore before it is
 * ready loads the stream.
 */
export function convertCheckpoint(h: VmHost, meta: CheckpointMeta): void {
  if (h.conversions.has(meta.id) || existsSync(join(h.ckptDir(meta.id), 'ram'))) return;
  const dir = h.ckptDir(meta.id);
  const work = join(h.stateDir, 'tmp', `ckconv-${randomUUID()}`);
  // Filled in tmpfs (page faults on a shared ext4 mapping cost a block allocation each),
  // then copied sparsely next to the checkpoint. One conversion at a time.
  const shm = shmFile(h.stateDir, 'ckpt');
  // After the standby QEMU the checkpoint's VM may have just started (prepareRestore, called
  // first) has loaded its machine: the next restore waits for that one, not for this.
  const standby = h.standbys.get(meta.sandboxId);
  const p = h.convQueue
    .then(() => standby)
    .then(async () => {
      if (!existsSync(join(dir, 'checkpoint.json'))) return false; // deleted while queued
      mkdirSync(work, { recursive: true });
      await convertStream(
        h,
        join(dir, 'mem.state'),
        { ram: shm, state: join(work, 'state') },
        meta.memMiB,
        meta.disk,
        10,
        meta.cpus,
      );
      return true;
    })
    .then(async (converted) => {
      if (!converted) return;
      await execFileP('nice', ['-n', '10', 'cp', '--sparse=always', shm, join(work, 'ram')]);
      if (!existsSync(join(dir, 'checkpoint.json'))) return; // deleted meanwhile
      // Synced before they are put in place (after a host crash a `ram` there is whole).
      await Promise.all([fsyncPath(join(work, 'ram')), fsyncPath(join(work, 'state'))]);
      // state before ram: memorySource() takes the converted form once `ram` exists. The
      // stream stays (a restore may be reading it right now).
      renameSync(join(work, 'state'), join(dir, 'state'));
      giveToQemu(join(work, 'ram'), h.qemuUser); // mapped privately by restores (opened read-write by QEMU 7.2)
      renameSync(join(work, 'ram'), join(dir, 'ram'));
      await fsyncPath(dir);
      // A standby QEMU that loaded the stream stays: it is ready (a replacement mapping the RAM
      // file would hold less memory, but a restore meanwhile would wait for its start). The
      // next standby (after a restore) maps the RAM file.
    })
    .catch((e: Error) => h.log(`vm: checkpoint ${meta.id} stays a plain stream: ${e.message}`))
    .finally(() => {
      rmSync(work, { recursive: true, force: true });
      rmSync(shm, { force: true });
      h.conversions.delete(meta.id);
    });
  h.conversions.set(meta.id, p);
  h.convQueue = p;
}

/** Where a memory checkpoint's machine comes from: the converted form when it is ready. */
export function memorySource(h: VmHost, checkpointId: string): MemImage | { stream: string } {
  const dir = h.ckptDir(checkpointId);
  if (existsSync(join(dir, 'ram'))) return { ram: join(dir, 'ram'), state: join(dir, 'state') };
  return { stream: join(dir, 'mem.state') };
}

const round1 = (ms: number) => Math.round(ms * 10) / 10;
