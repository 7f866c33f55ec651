// Checkpoints of the VM backend: a disk checkpoint freezes the VM's overlay, a memory
// checkpoint also migrates the whole machine to a file; restore starts a new QEMU from them;
// after a memory checkpoint its stream is converted in the background (template.ts
// convertStream) so later restores map a RAM file instead of loading the stream.
import { randomUUID } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { RuntimeError, type CheckpointInfo } from '../runtime.js';
import type { VmHost } from './host.js';
import { execFileP, giveToQemu, migrateToFile } from './qemu.js';
import { ckptInfo, fileSize, ID_RE, shmFile, type CheckpointMeta, type MemImage } from './state.js';
import { convertStream } from './template.js';

export async function checkpointVm(h: VmHost, id: string, checkpointId: string, opts: { memory?: boolean } = {}): Promise<CheckpointInfo> {
  if (typeof checkpointId !== 'string' || !ID_RE.test(checkpointId)) throw new RuntimeError('InvalidArgument', `invalid checkpoint id ${JSON.stringify(checkpointId)}`);
  const existing = h.tryCheckpointMeta(checkpointId);
  if (existing) {
    if (existing.sandboxId !== id) throw new RuntimeError('Conflict', `checkpoint ${checkpointId} belongs to sandbox ${existing.sandboxId}`);
    return ckptInfo(existing);
  }
  const vm = h.vm(id);
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
        await migrateToFile(qmp, h.socketDir, join(tmp, 'mem.state'), h.qemuUser);
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
    if (h.qemuUser) chmodSync(tmp, 0o711); // a converted RAM file lands here for QEMU to map
    renameSync(tmp, dir);
    h.inflightDisks.delete(frozen);
    h.timings.lastCheckpointMs = performance.now() - t0;
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
  const ckpt = h.checkpointMeta(checkpointId);
  if (ckpt.memMiB !== vm.meta.memMiB && ckpt.kind === 'memory') throw new RuntimeError('InvalidArgument', 'checkpoint has another memory size');
  await h.locked(vm, async () => {
    const t0 = performance.now();
    await h.halt(vm);
    const old = vm.meta.disk;
    vm.meta.disk = h.nextOverlay(vm);
    await h.overlay(vm.meta.disk, ckpt.disk, (await h.ensureImage()).diskSize);
    rmSync(old, { force: true });
    vm.meta.hostname = ckpt.hostname;
    vm.meta.machineId = ckpt.machineId;
    vm.meta.workspacePath = ckpt.workspacePath;
    h.saveMeta(vm);
    if (ckpt.kind === 'memory') await h.boot(vm, memorySource(h, ckpt.id), {});
    else await h.boot(vm, { template: await h.ensureTemplate(vm.meta.memMiB), bare: true }, { hostname: ckpt.hostname, machineId: ckpt.machineId });
    h.timings.lastRestoreMs = performance.now() - t0;
  });
  if (ckpt.kind === 'memory') convertCheckpoint(h, ckpt);
  h.gcDisks();
}

export async function deleteCheckpointOf(h: VmHost, checkpointId: string): Promise<void> {
  if (typeof checkpointId !== 'string' || !ID_RE.test(checkpointId)) return;
  await h.conversions.get(checkpointId);
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
  const shm = shmFile('ckpt');
  const p = h.convQueue
    .then(async () => {
      if (!existsSync(join(dir, 'checkpoint.json'))) return false; // deleted while queued
      mkdirSync(work, { recursive: true });
      await convertStream(h, join(dir, 'mem.state'), { ram: shm, state: join(work, 'state') }, meta.memMiB, meta.disk, 10);
      return true;
    })
    .then(async (converted) => {
      if (!converted) return;
      await execFileP('nice', ['-n', '10', 'cp', '--sparse=always', shm, join(work, 'ram')]);
      if (!existsSync(join(dir, 'checkpoint.json'))) return; // deleted meanwhile
      // state before ram: memorySource() takes the converted form once `ram` exists. The
      // stream stays (a restore may be reading it right now).
      renameSync(join(work, 'state'), join(dir, 'state'));
      giveToQemu(join(work, 'ram'), h.qemuUser); // mapped privately by restores (opened read-write by QEMU 7.2)
      renameSync(join(work, 'ram'), join(dir, 'ram'));
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
