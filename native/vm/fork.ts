// Fork of the VM backend: the parent is stopped just long enough to freeze its disk and save
// its machine; one helper QEMU loads that stream into a RAM file in /dev/shm which every child
// maps copy-on-write, each child on its own overlay with a new identity.
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdirSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { RuntimeError, type ForkOptions, type ForkResult, type NetworkConfig } from '../runtime.js';
import type { VmHost } from './host.js';
import { checkVmNetwork, setupVmLink } from './network.js';
import { giveToQemu, removeSockets } from './qemu.js';
import { migrateToFile } from './migrate.js';
import { hostnameFor, ID_RE, shmFile, type MemImage, type Vm } from './state.js';
import { convertStream } from './template.js';
import { refuseSavedVolumes } from './volumes.js';

/**
 * Saves the parent once (memory and a frozen disk) and starts every child from it, each
 * on its own overlay with a new hostname, machine-id and RNG seed. The parent keeps
 * running (it is stopped only while its state is saved).
 */
export async function forkVm(
  h: VmHost & { destroy(id: string): Promise<void> },
  parentId: string,
  childIds: string[],
  opts?: ForkOptions,
): Promise<ForkResult> {
  const parent = h.vm(parentId);
  refuseSavedVolumes(parent.meta, 'fork');
  // Each child gets a link of its own (never the parent's: the proxy tells sandboxes apart by
  // link): `opts.network` (a speculation copy: none or a watched allowList), else the parent's
  // mode and allow-list. The child's guest takes its new address after the load (boot).
  const pn = parent.meta.network;
  const childNet: NetworkConfig =
    opts?.network ??
    (pn
      ? { mode: pn.mode, ...(pn.allow ? { allow: pn.allow } : {}), ...(pn.http ? { http: pn.http } : {}) }
      : { mode: 'none' });
  checkVmNetwork(childNet, h.networkModes);
  if (!Array.isArray(childIds) || childIds.length === 0)
    throw new RuntimeError('InvalidArgument', 'fork needs child ids');
  for (const c of childIds) {
    if (typeof c !== 'string' || !ID_RE.test(c))
      throw new RuntimeError('InvalidArgument', `invalid sandbox id ${JSON.stringify(c)}`);
  }
  if (new Set(childIds).size !== childIds.length) throw new RuntimeError('InvalidArgument', 'duplicate child ids');
  const fresh = childIds.filter((c) => !h.vms.has(c));
  const t0 = performance.now();
  const tmp = join(h.stateDir, 'tmp', `fork-${randomUUID()}`);
  mkdirSync(tmp, { recursive: true });
  const stream = join(tmp, 'mem.state');
  let frozen = '';
  // One load of the parent's stream into a RAM file that every child maps privately, by
  // a helper QEMU started right away (it needs only the template's disk). The children's
  // QEMUs start once the parent's disk is frozen: they map the (same) file before it is
  // filled and touch no guest RAM until their state is loaded, and a private mapping
  // shows the file's pages until the first write to each. The file is in tmpfs and is
  // unlinked when the fork ends; the children's mappings keep its pages.
  const mem: MemImage = { ram: shmFile(h.stateDir, 'fork'), state: join(tmp, 'state') };
  writeFileSync(mem.ram, '', { mode: 0o600, flag: 'wx' }); // a new name: never an existing file or link
  truncateSync(mem.ram, parent.meta.memMiB * 1024 * 1024);
  giveToQemu(mem.ram, h.qemuUser);
  let streamSaved!: (p: string) => void;
  let streamFailed!: (e: Error) => void;
  const saved = new Promise<string>((res, rej) => {
    streamSaved = res;
    streamFailed = rej;
  });
  saved.catch(() => undefined);
  const tpl = await h.ensureTemplate(parent.meta.memMiB, parent.meta.cpus);
  const converting = fresh.length
    ? convertStream(h, saved, mem, parent.meta.memMiB, tpl.disk, 0, parent.meta.cpus)
    : Promise.resolve(mem);
  converting.catch(() => undefined);
  let tConverted = 0;
  void converting.then(
    () => (tConverted = performance.now()),
    () => undefined,
  );
  try {
    await h
      .locked(parent, async () => {
        const qmp = h.qmpOf(parent);
        const wasRunning = parent.meta.state === 'running';
        if (wasRunning) await qmp.execute('stop');
        try {
          frozen = h.freezeDisk(parent);
          await h.ignoreShared(qmp, false);
          await migrateToFile(qmp, h.socketDir, stream, h.qemuUser);
        } finally {
          if (wasRunning) await qmp.execute('cont');
        }
      })
      .then(
        () => streamSaved(stream),
        (e: Error) => {
          streamFailed(e);
          throw e;
        },
      );
    const image = await h.ensureImage();
    const tSaved = performance.now();
    const image1 = mem;
    const results = await Promise.allSettled(
      fresh.map(async (cid) => {
        const dir = h.vmDir(cid);
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
            network: undefined,
          },
        };
        vm.meta.disk = h.nextOverlay(vm);
        h.vms.set(cid, vm);
        await h.locked(vm, async () => {
          await h.overlay(vm.meta.disk, frozen, image.diskSize);
          if (childNet.mode !== 'none')
            vm.meta.network = await setupVmLink(h.linkKey(cid), cid, childNet, h.linkIndexes, h.opts.egress);
          h.saveMeta(vm);
          const qemu = await h.prelaunch(vm, image1.ram);
          try {
            await converting;
          } catch (e) {
            vm.meta.pid = qemu.pid;
            vm.meta.qemuName = qemu.name;
            vm.qmp = qemu.qmp;
            throw e;
          }
          await h.boot(vm, image1, { hostname: vm.meta.hostname, machineId: vm.meta.machineId }, qemu);
        });
      }),
    );
    const tDone = performance.now();
    h.timings.lastForkPhases = {
      save: Math.round(tSaved - t0),
      convert: Math.round(Math.max(tConverted, tSaved) - tSaved),
      children: Math.round(tDone - Math.max(tConverted, tSaved)),
    };
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await Promise.all(fresh.map((c) => h.destroy(c).catch(() => undefined)));
      throw failed.reason;
    }
  } finally {
    await converting.catch(() => undefined);
    rmSync(tmp, { recursive: true, force: true });
    rmSync(mem.ram, { force: true });
    if (frozen) h.inflightDisks.delete(frozen);
    h.gcDisks();
  }
  h.timings.lastForkMs = performance.now() - t0;
  return {
    children: childIds.map((c) => h.info(h.vm(c))),
    parentMark: {
      sandboxId: parentId,
      token: frozen
        .split('/')
        .pop()!
        .replace(/\.qcow2$/, ''),
    },
  };
}
