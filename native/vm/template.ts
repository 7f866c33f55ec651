// The guest image, the golden templates and the warm pool of the VM backend: the image is
// built on demand (hack/vm-image.sh), a template is one cold boot per (image, memory size,
// accelerator) saved twice with x-ignore-shared, warm QEMUs wait for a template's state, and
// convertStream turns a whole-machine stream into a RAM file plus device state (forks and
// memory checkpoints map it instead of loading the stream).
import { execFile } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  existsSync,
  linkSync,
  mkdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { RuntimeError } from '../runtime.js';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { AgentClient } from './agent-client.js';
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
import { migrateFromFile, migrateToFile } from './migrate.js';
import {
  mountWorkspace,
  REPO_ROOT,
  safeReaddir,
  TEMPLATE_VERSION,
  type ImageInfo,
  shmFile,
  type MemImage,
  type PoolEntry,
  type TemplateInfo,
} from './state.js';

export async function dropPoolEntry(h: VmHost, e: PoolEntry): Promise<void> {
  e.qmp.close();
  if (isOurQemu(e.pid, e.name)) await killAndWait(e.pid);
  removeSockets(e.dir);
  rmSync(e.dir, { recursive: true, force: true });
  rmSync(e.disk, { force: true });
}

/** Starts QEMUs in the background until the pool is full. Never throws. */
export function fillPool(h: VmHost, tpl: TemplateInfo): void {
  const want = h.opts.warmPool ?? 1;
  while (h.started && h.pool.length + h.poolFilling < want && tpl.memMiB === h.memMiB && (tpl.cpus ?? 1) === 1) {
    h.poolFilling++;
    startPoolEntry(h, tpl)
      .then((e) => {
        if (h.started) h.pool.push(e);
        else void dropPoolEntry(h, e);
      })
      .catch((err: Error) => h.log(`vm: warm pool: ${err.message}`))
      .finally(() => h.poolFilling--);
  }
}

async function startPoolEntry(h: VmHost, tpl: TemplateInfo): Promise<PoolEntry> {
  const image = await h.ensureImage();
  const token = randomBytes(6).toString('hex');
  const dir = join(h.stateDir, 'pool', token);
  mkdirSync(dir, { recursive: true });
  const name = `fluxvm-${token}`;
  const disk = join(h.stateDir, 'overlays', `${randomUUID()}.qcow2`);
  let pid: number | undefined;
  try {
    await h.overlay(disk, tpl.disk, image.diskSize);
    let qmp: QmpClient;
    ({ pid, qmp } = await launchQemu(
      h.machine(tpl.memMiB, image, tpl.cpus),
      {
        dir,
        sockDir: h.socketDir,
        disk,
        ram: { path: tpl.ram, share: false },
        incoming: true,
        name,
      },
      h.launchOpts(),
    ));
    await h.prepareMigration(qmp);
    await h.ignoreShared(qmp, true);
    return { dir, disk, name, pid, qmp, templateKey: tpl.key };
  } catch (e) {
    if (isOurQemu(pid, name)) await killAndWait(pid);
    removeSockets(dir);
    rmSync(dir, { recursive: true, force: true });
    rmSync(disk, { force: true });
    throw e;
  }
}

export function takePool(h: VmHost, tpl: TemplateInfo): PoolEntry | undefined {
  while (h.pool.length) {
    const e = h.pool.shift()!;
    if (e.templateKey === tpl.key && isOurQemu(e.pid, e.name)) {
      fillPool(h, tpl);
      return e;
    }
    void dropPoolEntry(h, e);
  }
  fillPool(h, tpl);
  return undefined;
}

/**
 * The guest image, built on demand (hack/vm-image.sh) and staged into the state directory
 * (`images/<hash>/`, stageImage): what every QEMU of this runtime boots. Cached; concurrent
 * callers share one build. A failed build rejects with reason `ImageBuildFailed` and the last
 * line the script wrote (the next call tries again).
 */
export async function ensureImage(h: VmHost): Promise<ImageInfo> {
  if (h.image) return h.image;
  h.imageBuilding ??= (async () => {
    let dir = h.opts.imageDir;
    if (!dir || !existsSync(join(dir, 'image.json'))) {
      const args = [...(h.opts.rootfs ? ['--rootfs'] : []), ...(dir ? [dir] : [])];
      try {
        const out = await promisify(execFile)(join(REPO_ROOT, 'hack/vm-image.sh'), args, {
          maxBuffer: 1 << 20,
          timeout: 900_000,
        });
        dir = out.stdout.trim().split('\n').pop()!;
      } catch (e) {
        const err = e as Error & { stderr?: string };
        const last = (err.stderr ?? '').trim().split('\n').pop() || err.message.split('\n')[0];
        throw new RuntimeError(
          'Internal',
          `building the guest image (hack/vm-image.sh) failed: ${last}`,
          'ImageBuildFailed',
        );
      }
    }
    return stageImage(h, dir);
  })();
  try {
    h.image = await h.imageBuilding;
  } finally {
    h.imageBuilding = undefined;
  }
  return h.image;
}

const IMAGE_HASH_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$/;

/**
 * Puts the image in `src` (a hack/vm-image.sh output) into the state directory as
 * `images/<hash>/` and describes that copy. QEMU runs as its own user in the state directory
 * and reaches files only by relative paths from there (the state directory and `images/` are
 * 0711), so it can read the image wherever the checkout is: under /root, or in a `mktemp -d`
 * (0700) that its user cannot traverse. Hard links where the file is on the same filesystem
 * and readable by everyone (no bytes copied), else a copy (reflinked where the filesystem can)
 * made readable. Staged once per hash (an image rebuild gets a new hash: the files are renamed
 * into the build directory, never rewritten, so a link keeps the bytes it was made with);
 * start() removes staged images no template uses. Safe to call twice.
 */
async function stageImage(h: VmHost, src: string): Promise<ImageInfo> {
  const j = JSON.parse(readFileSync(join(src, 'image.json'), 'utf8')) as Record<string, string>;
  const hash = IMAGE_HASH_RE.test(j.hash ?? '')
    ? j.hash!
    : createHash('sha256').update(String(j.hash)).digest('hex').slice(0, 24);
  const names = [j.kernel!, j.initrd!, j.disk!, ...(j.rootfs ? [j.rootfs] : []), 'image.json'];
  const root = join(h.stateDir, 'images');
  const dir = join(root, hash);
  if (!existsSync(join(dir, 'image.json'))) {
    mkdirSync(root, { recursive: true, mode: 0o711 });
    const tmp = `${dir}.tmp-${process.pid}-${randomBytes(3).toString('hex')}`;
    mkdirSync(tmp, { mode: 0o711 });
    try {
      chmodSync(tmp, 0o711);
      for (const name of names) {
        const from = join(src, name);
        const to = join(tmp, name);
        let linked = false;
        if (statSync(from).mode & 0o004) {
          try {
            linkSync(from, to);
            linked = true;
          } catch {
            // another filesystem (or links refused): copy
          }
        }
        if (!linked) {
          await execFileP('cp', ['--reflink=auto', '--sparse=always', from, to]);
          chmodSync(to, 0o644);
        }
      }
      try {
        renameSync(tmp, dir);
      } catch {
        rmSync(tmp, { recursive: true, force: true }); // another process staged it first
      }
    } catch (e) {
      rmSync(tmp, { recursive: true, force: true });
      throw new RuntimeError(
        'Internal',
        `staging the guest image from ${src} into ${root}: ${(e as Error).message}`,
        'ImageBuildFailed',
      );
    }
  }
  return {
    dir,
    hash: j.hash!,
    kernel: join(dir, j.kernel!),
    initrd: join(dir, j.initrd!),
    disk: join(dir, j.disk!),
    ...(j.rootfs ? { rootfs: join(dir, j.rootfs) } : {}),
    diskSize: j.diskSize!,
  };
}

/**
 * Removes staged images (`images/<hash>`) that no template was built from, and leftovers of
 * an interrupted staging. Call before any image is staged (start()). Never throws.
 */
export function gcImages(h: VmHost): void {
  const used = new Set<string>();
  for (const t of safeReaddir(join(h.stateDir, 'templates'))) {
    try {
      used.add(
        (JSON.parse(readFileSync(join(h.stateDir, 'templates', t, 'template.json'), 'utf8')) as { image: string })
          .image,
      );
    } catch {
      // not a finished template
    }
  }
  for (const name of safeReaddir(join(h.stateDir, 'images'))) {
    if (!used.has(name)) rmSync(join(h.stateDir, 'images', name), { recursive: true, force: true });
  }
}

/** The golden template for `memMiB` and `cpus`, cold-booting it once (cached across restarts). */
export async function ensureTemplate(h: VmHost, memMiB = h.memMiB, cpus = 1): Promise<TemplateInfo> {
  const image = await h.ensureImage();
  const key = createHash('sha256')
    .update(`${TEMPLATE_VERSION}|${image.hash}|${memMiB}|${h.accel}${cpus > 1 ? `|cpus=${cpus}` : ''}`)
    .digest('hex')
    .slice(0, 16);
  let p = h.templates.get(key);
  if (!p) {
    p = buildTemplate(h, key, memMiB, image, cpus);
    h.templates.set(key, p);
    p.catch(() => h.templates.delete(key));
  }
  const tpl = await p;
  fillPool(h, tpl);
  return tpl;
}

async function buildTemplate(
  h: VmHost,
  key: string,
  memMiB: number,
  image: ImageInfo,
  cpus: number,
): Promise<TemplateInfo> {
  const dir = join(h.stateDir, 'templates', key);
  const info = (bootMs: number): TemplateInfo => ({
    key,
    dir,
    memMiB,
    ...(cpus > 1 ? { cpus } : {}),
    bootMs,
    disk: join(dir, 'disk.qcow2'),
    ram: join(dir, 'ram'),
    state: join(dir, 'state'),
    ramBare: join(dir, 'ram-bare'),
    stateBare: join(dir, 'state-bare'),
  });
  if (existsSync(join(dir, 'template.json'))) {
    const t = JSON.parse(readFileSync(join(dir, 'template.json'), 'utf8')) as { bootMs: number };
    return info(t.bootMs);
  }
  mkdirSync(join(h.stateDir, 'templates'), { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}-${randomBytes(3).toString('hex')}`;
  mkdirSync(tmp);
  let pid: number | undefined;
  let qmp: QmpClient | undefined;
  // The guest's RAM while it boots: a shared file in tmpfs, copied sparsely into the template
  // once QEMU is done with it. On the state directory's file system (ext4 here) every first
  // touch of a page of a shared mapping allocates a block: the boot to agent-ready took
  // 5.0-6.1 s that way against 3.0-3.6 s with anonymous memory (same kernel, initrd and
  // devices, QEMU by hand); convertCheckpoint fills its RAM file in tmpfs for the same reason.
  const shm = shmFile(h.stateDir, 'template');
  try {
    if (h.qemuUser) chmodSync(tmp, 0o711);
    await h.overlay(join(tmp, 'disk.qcow2'), image.disk, image.diskSize);
    writeFileSync(shm, '', { mode: 0o600, flag: 'wx' }); // a new name: never an existing file or link
    giveToQemu(shm, h.qemuUser);
    const t0 = performance.now();
    ({ pid, qmp } = await launchQemu(
      h.machine(memMiB, image, cpus),
      {
        dir: tmp,
        sockDir: h.socketDir,
        disk: join(tmp, 'disk.qcow2'),
        ram: { path: shm, share: true },
        incoming: false,
        name: `fluxvm-template-${key}`,
      },
      h.launchOpts(),
    ));
    const agent = await h.connectAgent(tmp, 180_000);
    const bootMs = performance.now() - t0;
    h.timings.coldBootMs = bootMs;
    h.log(`vm: template ${key} booted in ${bootMs.toFixed(0)} ms`);
    agent.close();
    await h.prepareMigration(qmp);
    await h.ignoreShared(qmp, true);
    // Save 1, bare: the device state now and a copy of the RAM file as it is now.
    await qmp.execute('stop');
    await migrateToFile(qmp, h.socketDir, join(tmp, 'state-bare'), h.qemuUser);
    await execFileP('cp', ['--sparse=always', shm, join(tmp, 'ram-bare')]);
    // QEMU 7.2 opens a RAM file read-write even to map it privately (no rom=on before 8.2).
    giveToQemu(join(tmp, 'ram-bare'), h.qemuUser);
    // Save 2: the workspace disk mounted at /run/disk and bound at /work, so that
    // creating a VM needs no mount.
    await qmp.execute('cont');
    const a2 = await h.connectAgent(tmp, 60_000);
    await mountWorkspace(a2, '/work');
    await a2.sync();
    a2.close();
    await qmp.execute('stop');
    await migrateToFile(qmp, h.socketDir, join(tmp, 'state'), h.qemuUser);
    await qmp.execute('quit').catch(() => undefined);
    qmp.close();
    await killAndWait(pid);
    await execFileP('cp', ['--sparse=always', shm, join(tmp, 'ram')]);
    rmSync(shm, { force: true });
    giveToQemu(join(tmp, 'ram'), h.qemuUser); // mapped privately by every VM of the template (opened read-write by QEMU 7.2)
    // The template disk is a read-only base from now on: no QEMU may write it.
    if (h.qemuUser) chownSync(join(tmp, 'disk.qcow2'), 0, 0);
    // The template never runs again: its RAM file and disk are now immutable bases.
    removeSockets(tmp);
    rmSync(join(tmp, 'qemu.pid'), { force: true });
    writeFileSync(
      join(tmp, 'template.json'),
      JSON.stringify({ key, memMiB, cpus, bootMs, image: image.hash, accel: h.accel }, null, 2),
    );
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
    rmSync(shm, { force: true });
    throw e;
  }
}

/**
 * Loads a whole-machine stream into a new shared RAM file in `outDir` with a helper QEMU
 * (never started) and saves its device state beside it. Restoring from the result maps the
 * RAM file privately and loads a few KiB, instead of copying the whole stream into memory.
 * `stream` may still be being written: the helper starts first and loads it once the
 * promise resolves. `disk` only gives the helper a disk of the right size (it never runs
 * the guest), so the template's disk serves.
 */
export async function convertStream(
  h: VmHost,
  stream: string | Promise<string>,
  out: MemImage,
  memMiB: number,
  disk: string,
  nice = 0,
  cpus = 1,
): Promise<MemImage> {
  const image = await h.ensureImage();
  const dir = join(h.stateDir, 'tmp', `conv-${randomUUID()}`);
  mkdirSync(dir, { recursive: true });
  const name = `fluxvm-conv-${randomBytes(6).toString('hex')}`;
  // In overlays/ (QEMU can reach it there, not in tmp/); removed below.
  const convDisk = join(h.stateDir, 'overlays', `conv-${randomUUID()}.qcow2`);
  let pid: number | undefined;
  let qmp: QmpClient | undefined;
  try {
    await h.overlay(convDisk, disk, image.diskSize);
    if (!existsSync(out.ram)) writeFileSync(out.ram, '');
    giveToQemu(out.ram, h.qemuUser);
    ({ pid, qmp } = await launchQemu(
      h.machine(memMiB, image, cpus),
      {
        dir,
        sockDir: h.socketDir,
        disk: convDisk,
        ram: { path: out.ram, share: true },
        incoming: true,
        name,
      },
      { nice, ...h.launchOpts() },
    ));
    await h.prepareMigration(qmp);
    await h.ignoreShared(qmp, false);
    await migrateFromFile(qmp, h.socketDir, stream);
    await h.ignoreShared(qmp, true);
    await migrateToFile(qmp, h.socketDir, out.state, h.qemuUser);
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

/** Mounts the workspace disk at /run/disk and binds its work/ directory at `path`. */
