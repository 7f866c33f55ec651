// QEMU process helpers for the VM backend: accelerator probe, the command line (one
// machine shape for every VM, so any saved state loads into any new process), overlays,
// qcow2 backing chains and process lifetime.
import { execFile, spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  accessSync,
  chmodSync,
  chownSync,
  constants,
  existsSync,
  lstatSync,
  mkdirSync,
  open,
  openSync,
  readSync,
  closeSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join, relative } from 'node:path';
import { QmpClient } from './qmp.js';
import { writeQcow2Overlay } from './qcow2.js';
import { promisify } from 'node:util';
import { RuntimeError } from '../runtime.js';

export const execFileP = promisify(execFile);

export type Accel = 'kvm' | 'tcg';

/**
 * KVM only where it is a normal hardware KVM (VT-x/AMD-V with kvm_intel/kvm_amd loaded and
 * /dev/kvm usable). A PVM /dev/kvm (nested, kvm_pvm) cannot run stock guest kernels: TCG.
 */
export function probeAccel(): Accel {
  try {
    closeSync(openSync('/dev/kvm', 'r+'));
  } catch {
    return 'tcg';
  }
  const hw = existsSync('/sys/module/kvm_intel') || existsSync('/sys/module/kvm_amd');
  const flags = /\b(vmx|svm)\b/.test(readFileSync('/proc/cpuinfo', 'utf8'));
  return hw && flags ? 'kvm' : 'tcg';
}

/**
 * True when `binary` (default qemu-system-x86_64) and qemu-img are executable files on this
 * host's PATH: whether the vm backend can exist at all. A PATH lookup, not a run: starting QEMU
 * with --version loads its ~100 libraries (0.1-0.3 s of CPU), paid by every `serve` start. A
 * QEMU that is there but cannot run fails its first VM with QEMU's own error. Never throws.
 */
export function qemuInstalled(binary = 'qemu-system-x86_64'): boolean {
  const dirs = (process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin').split(':').filter((d) => d !== '');
  const executable = (f: string) => {
    try {
      accessSync(f, constants.X_OK);
      return statSync(f).isFile();
    } catch {
      return false;
    }
  };
  return [binary, 'qemu-img'].every((b) =>
    b.includes('/') ? executable(b) : dirs.some((d) => executable(join(d, b))),
  );
}

/**
 * The unprivileged user QEMU runs as. Every QEMU of a runtime gets the same one: it can open
 * only what is its own (the VM overlays and RAM files it writes, chowned to it) or readable
 * by everyone (kernel, initrd, images, frozen disks), reaches the state directory only
 * through its working directory (relative paths; the directories it needs are 0711, never
 * listable), and binds its sockets in the socket directory (group-writable for `gid`).
 */
export interface QemuUser {
  name: string;
  uid: number;
  gid: number;
  /** Supplementary groups: `kvm` when the host has that group (for /dev/kvm). */
  groups: number[];
}

/** The default QEMU user, created by hack/setup.sh. */
export const QEMU_USER = 'fluxvm-qemu';

/**
 * Looks up `name` (a user name, or `uid:gid`) in the host's user database; undefined when
 * there is no such user. Adds the `kvm` group when the host has one. Never throws.
 */
export function resolveQemuUser(name: string): QemuUser | undefined {
  const kvm = spawnSync('getent', ['group', 'kvm'], { encoding: 'utf8' });
  const groups = kvm.status === 0 ? [Number(kvm.stdout.split(':')[2])].filter((g) => Number.isInteger(g)) : [];
  const numeric = /^(\d+):(\d+)$/.exec(name);
  if (numeric) return { name, uid: Number(numeric[1]), gid: Number(numeric[2]), groups };
  const r = spawnSync('getent', ['passwd', name], { encoding: 'utf8' });
  if (r.status !== 0) return undefined;
  const f = r.stdout.trim().split(':');
  const uid = Number(f[2]);
  const gid = Number(f[3]);
  if (!Number.isInteger(uid) || !Number.isInteger(gid) || uid === 0) return undefined;
  return { name, uid, gid, groups };
}

/** Makes `path` QEMU's own (it writes it). No-op without a QEMU user. */
export function giveToQemu(path: string, user: QemuUser | undefined): void {
  if (user) chownSync(path, user.uid, user.gid);
}

/**
 * The `-sandbox` option every QEMU runs with (seccomp: no obsolete syscalls, no set*id, no fork/exec, no
 * priority/affinity changes).
 */
export const QEMU_SANDBOX = 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny';

/** Host TSC frequency in kHz (from /proc/cpuinfo), for tsc_early_khz under TCG. */
export function hostTscKhz(): number {
  const m = /cpu MHz\s*:\s*([0-9.]+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'));
  return m ? Math.round(Number(m[1]) * 1000) : 2_000_000;
}

export interface MachineSpec {
  qemu: string;
  accel: Accel;
  memMiB: number;
  /** vCPUs (-smp; default 1). Saved states depend on it: a machine loads only into a QEMU with as many. */
  cpus?: number;
  kernel: string;
  initrd: string;
  /** Read-only Debian root filesystem image, when the guest image has one. */
  rootfs?: string;
  tscKhz: number;
}

export interface LaunchSpec {
  dir: string; // holds qmp.sock and agent.sock (links to the sockets in sockDir), console.log, qemu.pid
  /** Where QEMU binds its unix sockets: a short directory (see socketDirFor). */
  sockDir: string;
  disk: string;
  /**
   * Guest RAM: a file mapped shared (template) or privately (clones), anonymous, or a shared
   * memfd (`memfd`: a vhost-user device such as virtio-fs maps the guest's memory).
   */
  ram: { path: string; share: boolean } | { anonymous: true } | { memfd: true };
  /**
   * virtio-fs devices (a VM with volumes: native/vm/volumes.ts), each on the vhost-user socket of
   * its virtiofsd. Only a cold-booted machine has them (no saved state carries one).
   */
  fs?: { tag: string; socket: string }[];
  incoming: boolean;
  name: string;
  /**
   * The host tap device of the VM's link (its name), handed to QEMU as fd 3 by the tap helper;
   * absent: the NIC's backend is a hub port with nothing else on it (no network).
   */
  tap?: string;
  /**
   * With `incoming`: the saved machine this QEMU will load (migrateFromFd). The host opens it
   * read-only and QEMU inherits it as fd INCOMING_FD, so the load reads the file itself (no
   * copier process and socket in between, and QEMU needs no access to the file's path).
   */
  incomingFile?: string;
}

/** The fd a QEMU started with LaunchSpec.incomingFile has its stream on (3 is the tap helper's). */
export const INCOMING_FD = 4;

/**
 * The files of a QEMU in its directory. `qmp` and `agent` are symlinks to the sockets, which
 * live in a short directory (unix socket paths must fit in 108 bytes, a state directory
 * may be any length); connect through `socketTarget`, never through the link's own path.
 */
export const socketPaths = (dir: string) => ({
  qmp: `${dir}/qmp.sock`,
  agent: `${dir}/agent.sock`,
  pidfile: `${dir}/qemu.pid`,
  console: `${dir}/console.log`,
  /** QEMU's own stderr (why a start failed). */
  log: `${dir}/qemu.log`,
});

/** Longest socket directory: it leaves room for `<16 hex>.agent` within sun_path. */
export const MAX_SOCKET_DIR = 80;

/**
 * The short socket directory of the runtime whose state is in `stateDir`: named by a hash of
 * the state directory and the uid, under /run/fluxvm when this process may write there, else
 * under the system temp directory (or /tmp when that path is too long). Deterministic, so a
 * restarted runtime finds (and cleans) the same one; VM directories link to their sockets,
 * so adoption does not depend on it. Creates nothing.
 */
export function socketDirFor(stateDir: string): string {
  const h = createHash('sha256')
    .update(`${process.getuid?.() ?? ''}:${stateDir}`)
    .digest('hex')
    .slice(0, 16);
  const candidates: string[] = [];
  try {
    accessSync(existsSync('/run/fluxvm') ? '/run/fluxvm' : '/run', constants.W_OK);
    candidates.push(`/run/fluxvm/${h}`);
  } catch {
    // not writable here (not root): the temp directory
  }
  candidates.push(join(tmpdir(), `fluxvm-${h}`), `/tmp/fluxvm-${h}`);
  return candidates.find((d) => d.length <= MAX_SOCKET_DIR)!;
}

/**
 * Creates the socket directory (mode 0700) or checks that an existing one is a real
 * directory of this user that nobody else can enter; throws Internal otherwise (another
 * user could otherwise see or replace the sockets). Safe to call any number of times.
 */
export function ensureSocketDir(dir: string, qemuGid?: number): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  // With a QEMU user, its group may enter and create sockets but not list (0730): the names
  // are random, so one QEMU cannot find another's sockets.
  if (qemuGid !== undefined) {
    // Our /run/fluxvm (created above, 0700) must let the QEMU user pass through to its directory.
    const parent = dirname(dir);
    const pst = lstatSync(parent);
    if (
      parent.endsWith('/fluxvm') &&
      pst.isDirectory() &&
      pst.uid === process.getuid?.() &&
      (pst.mode & 0o011) !== 0o011
    )
      chmodSync(parent, 0o711);
    const st0 = lstatSync(dir);
    if (st0.isDirectory() && st0.uid === process.getuid?.()) {
      chownSync(dir, st0.uid, qemuGid);
      chmodSync(dir, 0o730);
    }
  }
  const st = lstatSync(dir);
  const uid = process.getuid?.();
  const groupOk = qemuGid !== undefined ? st.gid === qemuGid && (st.mode & 0o047) === 0 : (st.mode & 0o070) === 0;
  if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o007) !== 0 || !groupOk) {
    throw new RuntimeError('Internal', `socket directory ${dir} is not a private directory of this user`);
  }
}

/**
 * Where to connect for the socket linked at `link`: the link's target; the path itself when
 * it is not a link (a VM started before sockets moved out of VM directories).
 */
export function socketTarget(link: string): string {
  try {
    return readlinkSync(link);
  } catch {
    return link;
  }
}

/** Removes the QMP and agent sockets of the QEMU in `dir` and their links. Never throws. */
export function removeSockets(dir: string): void {
  const s = socketPaths(dir);
  for (const link of [s.qmp, s.agent]) {
    const target = socketTarget(link);
    if (target !== link) rmSync(target, { force: true });
    rmSync(link, { force: true });
  }
}

/**
 * The full command line. Devices and their order never vary: saved states depend on it.
 * Paths below `cwd` (the state directory QEMU runs in) are given relative to it. The console
 * is QEMU's stdout (a file the host opened), so QEMU opens nothing in the VM directory.
 */
export function qemuArgs(m: MachineSpec, l: LaunchSpec, s: { qmp: string; agent: string }, cwd?: string): string[] {
  const rel = (p: string) => (cwd && isAbsolute(p) && p.startsWith(`${cwd}/`) ? relative(cwd, p) : p);
  const append = [
    'console=ttyS0',
    'quiet',
    'panic=-1',
    'mitigations=off',
    // Freed guest pages are zeroed, so a saved machine carries only what the guest uses (zero
    // pages are a few bytes in a stream): a fresh VM's stream went from 93 to 56 MiB (the freed
    // kernel decompression and initramfs buffers were in it).
    'init_on_free=1',
    ...(m.accel === 'tcg' ? [`tsc_early_khz=${m.tscKhz}`, 'tsc=reliable', 'no_timer_check'] : []),
  ].join(' ');
  const ram =
    'anonymous' in l.ram
      ? `memory-backend-ram,id=mem,size=${m.memMiB}M`
      : 'memfd' in l.ram
        ? `memory-backend-memfd,id=mem,size=${m.memMiB}M,share=on`
        : `memory-backend-file,id=mem,size=${m.memMiB}M,mem-path=${rel(l.ram.path)},share=${l.ram.share ? 'on' : 'off'}`;
  return [
    '-name',
    l.name,
    '-M',
    `microvm,accel=${m.accel},memory-backend=mem`,
    '-cpu',
    m.accel === 'kvm' ? 'host' : 'max',
    '-m',
    `${m.memMiB}M`,
    '-smp',
    String(m.cpus ?? 1),
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-object',
    ram,
    '-kernel',
    rel(m.kernel),
    '-initrd',
    rel(m.initrd),
    '-append',
    append,
    '-serial',
    'stdio',
    '-device',
    'virtio-serial-device',
    '-chardev',
    `socket,id=agent,path=${s.agent},server=on,wait=off`,
    '-device',
    'virtserialport,chardev=agent,name=agent',
    '-drive',
    `id=disk,file=${rel(l.disk)},format=qcow2,if=none,cache=writeback`,
    '-device',
    'virtio-blk-device,drive=disk,serial=work',
    ...(m.rootfs
      ? [
          '-drive',
          `id=root,file=${rel(m.rootfs)},format=qcow2,if=none,readonly=on`,
          '-device',
          'virtio-blk-device,drive=root,serial=root',
        ]
      : []),
    // Every VM has the NIC (saved states need the same devices); only a networked VM's leads anywhere.
    '-netdev',
    l.tap ? 'tap,id=net0,fd=3' : 'hubport,id=net0,hubid=0',
    '-device',
    'virtio-net-device,netdev=net0',
    // libvhost-user (virtiofsd) serves modern virtio only; microvm's virtio-mmio is legacy by default.
    ...(l.fs?.length ? ['-global', 'virtio-mmio.force-legacy=false'] : []),
    ...(l.fs ?? []).flatMap((f, i) => [
      '-chardev',
      `socket,id=fs${i},path=${f.socket}`,
      '-device',
      `vhost-user-fs-device,chardev=fs${i},tag=${f.tag}`,
    ]),
    '-qmp',
    `unix:${s.qmp},server=on,wait=off`,
    '-no-reboot',
    '-sandbox',
    QEMU_SANDBOX,
    ...(l.incoming ? ['-incoming', 'defer'] : []),
  ];
}

/** A QEMU that started: its pid and its QMP connection (greeted: QEMU finished its init). */
export interface Launched {
  pid: number;
  qmp: QmpClient;
}

/**
 * The first line of what QEMU (or setpriv, or the tap helper) wrote to its stderr, without
 * the program's name: why it could not start. Empty when it wrote nothing. Never throws.
 */
export function qemuStartError(log: string): string {
  try {
    const line =
      readFileSync(log, 'utf8')
        .split('\n')
        .map((l) => l.trim())
        .find((l) => l !== '') ?? '';
    return line.replace(/^[^\s:]*qemu-system-[^\s:]*: /, '').slice(0, 1000);
  } catch {
    return '';
  }
}

/**
 * Starts QEMU and returns once it answers QMP (it has opened its devices: without
 * -daemonize the greeting comes at the end of QEMU's init). It runs in its own session (it
 * outlives this process; a restart adopts it), in `opts.cwd` (the state directory: the
 * paths it gets are relative to it), as `opts.user` when given (setpriv: that uid/gid, no
 * capabilities, no_new_privs) and under QEMU_SANDBOX. Its sockets get new names in
 * `l.sockDir`, linked from `l.dir` (any sockets linked there before are removed first); the
 * host writes `qemu.pid` and opens `console.log` (QEMU's stdout) and `qemu.log` (stderr).
 * With `l.tap`, `opts.tapHelper` (native/vm/tapfd) opens the tap as root and execs the rest.
 * A QEMU that exits while starting (it cannot open an image, rejects its machine) fails the
 * call at once: RuntimeError Internal, reason `QemuFailed`, with the first line of its error.
 * On failure the links may remain: removeSockets(l.dir) cleans them.
 */
export async function launchQemu(
  m: MachineSpec,
  l: LaunchSpec,
  opts: { nice?: number; user?: QemuUser; cwd?: string; tapHelper?: string } = {},
): Promise<Launched> {
  if (l.tap && !opts.tapHelper) throw new RuntimeError('Internal', 'a VM with a tap needs the tap helper');
  removeSockets(l.dir);
  ensureSocketDir(l.sockDir, opts.user?.gid);
  const token = randomBytes(8).toString('hex');
  const sockets = { qmp: join(l.sockDir, `${token}.qmp`), agent: join(l.sockDir, `${token}.agent`) };
  const files = socketPaths(l.dir);
  symlinkSync(sockets.qmp, files.qmp);
  symlinkSync(sockets.agent, files.agent);
  const args = qemuArgs(m, l, sockets, opts.cwd);
  const u = opts.user;
  const argv = [
    // As root, before setpriv: QEMU gets its own tap open as fd 3 and cannot open any other.
    ...(l.tap ? [opts.tapHelper!, l.tap] : []),
    ...(opts.nice ? ['nice', '-n', String(opts.nice)] : []),
    ...(u
      ? [
          'setpriv',
          `--reuid=${u.uid}`,
          `--regid=${u.gid}`,
          ...(u.groups.length ? [`--groups=${u.groups.join(',')}`] : ['--clear-groups']),
          '--inh-caps=-all',
          '--bounding-set=-all',
          '--no-new-privs',
          '--',
        ]
      : []),
    m.qemu,
    ...args,
  ];
  const out = openSync(files.console, 'a', 0o600);
  const err = openSync(files.log, 'w', 0o600);
  let child;
  let stream: number | undefined;
  try {
    stream = l.incomingFile !== undefined ? openSync(l.incomingFile, 'r') : undefined;
    // fd 3 stays closed: the tap helper opens the tap there.
    const stdio = stream === undefined ? ['ignore', out, err] : ['ignore', out, err, 'ignore', stream];
    child = spawn(argv[0]!, argv.slice(1), { cwd: opts.cwd, detached: true, stdio: stdio as ('ignore' | number)[] });
  } finally {
    closeSync(out);
    closeSync(err);
    if (stream !== undefined) closeSync(stream);
  }
  child.unref();
  let exited: number | undefined;
  const exit = new Promise<number>((resolve) => {
    child.once('exit', (code, sig) => resolve((exited = code ?? (sig ? 128 : 1))));
    child.once('error', () => resolve((exited = 127)));
  });
  const failed = (code: number) => {
    const why = qemuStartError(files.log);
    return new RuntimeError('Internal', `qemu could not start (exit ${code})${why ? `: ${why}` : ''}`, 'QemuFailed');
  };
  const started = Date.now();
  // Sockets first (QmpClient.connect retries the instant between bind and listen), then the
  // greeting, each raced against QEMU's exit.
  for (;;) {
    if (exited !== undefined) throw failed(exited);
    if (Date.now() - started > 30_000) {
      if (child.pid) killQuietly(child.pid);
      throw new RuntimeError('Internal', `qemu did not open its sockets within 30 s: ${qemuStartError(files.log)}`);
    }
    if (existsSync(sockets.qmp) && existsSync(sockets.agent)) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const pid = child.pid!;
  writeFileSync(files.pidfile, `${pid}\n`);
  const connecting = QmpClient.connect(sockets.qmp);
  const outcome = await Promise.race([connecting.then((qmp) => ({ qmp })), exit.then((code) => ({ code }))]).catch(
    (e: Error) => ({ error: e }),
  );
  if ('qmp' in outcome) return { pid, qmp: outcome.qmp };
  // QEMU exited meanwhile (or QMP failed: then say what QEMU said if it is gone by now).
  void connecting.then(
    (q) => q.close(),
    () => undefined,
  );
  if ('code' in outcome) throw failed(outcome.code);
  // QMP failed first. A QEMU that rejects its machine has opened its sockets already (chardevs
  // come before the machine) and removes them as it exits, so its connect fails at once, and on
  // a busy host its exit reaches this process much later (a loaded run: more than the 200 ms
  // waited here before, so the Sandbox got a bare QMP error instead of QEMU's and was not
  // Stalled). QEMU's exit is waited for up to QMP_FAILED_EXIT_MS; a QEMU still running then
  // cannot be driven without QMP and is killed.
  let wake: (v: undefined) => void = () => undefined;
  const timer = setTimeout(() => wake(undefined), QMP_FAILED_EXIT_MS);
  const code = await Promise.race([exit, new Promise<undefined>((r) => (wake = r))]);
  clearTimeout(timer); // an exit that came first leaves no 5 s timer holding the process
  if (code !== undefined) throw failed(code);
  killQuietly(pid);
  throw outcome.error;
}

/** How long a launch whose QMP failed waits for QEMU's exit (and its first error line) before it kills it. */
export const QMP_FAILED_EXIT_MS = 5000;

function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone
  }
}

/**
 * A copy-on-write overlay over `backing` (never opens the backing: it may be in use). The
 * backing is recorded relative to the overlay's directory when both are in `base` (the state
 * directory, which QEMU reaches only relatively), else as given.
 */
export async function createOverlay(path: string, backing: string, size: string, base?: string): Promise<void> {
  const inBase = (p: string) => base !== undefined && p.startsWith(`${base}/`);
  const ref = inBase(path) && inBase(backing) ? relative(dirname(path), backing) : backing;
  // qemu-img's bytes written without starting it (qcow2.ts); qemu-img for what that does not cover.
  if (await writeQcow2Overlay(path, ref, size)) return;
  await execFileP('qemu-img', ['create', '-q', '-f', 'qcow2', '-u', '-F', 'qcow2', '-b', ref, path, size]);
}

/** The backing file named in a qcow2 header (a relative name resolved against the image's directory), or undefined. */
export function qcow2Backing(path: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch {
    return undefined;
  }
  try {
    const h = Buffer.alloc(20);
    if (readSync(fd, h, 0, 20, 0) < 20 || h.readUInt32BE(0) !== 0x514649fb) return undefined;
    const off = Number(h.readBigUInt64BE(8));
    const len = h.readUInt32BE(16);
    if (!off || !len || len > 4096) return undefined;
    const b = Buffer.alloc(len);
    readSync(fd, b, 0, len, off);
    const name = b.toString('utf8');
    return isAbsolute(name) ? name : join(dirname(path), name);
  } finally {
    closeSync(fd);
  }
}

export function pidAlive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/**
 * True when `pid` is a QEMU whose command line mentions `marker` (its -name, or our VM
 * directory), or whose working directory contains the directory `marker` (QEMU runs in the
 * state directory with relative paths, so a directory need not be on its command line).
 */
export function isOurQemu(pid: number | undefined, marker: string): boolean {
  if (!pidAlive(pid)) return false;
  try {
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    if (!cmd.includes('qemu-system')) return false;
    if (cmd.includes(marker)) return true;
    const cwd = readlinkSync(`/proc/${pid}/cwd`);
    return marker.startsWith(`${cwd}/`);
  } catch {
    return false;
  }
}

/** SIGKILLs a process and waits until it is gone (up to 5 s). */
export async function killAndWait(pid: number | undefined): Promise<void> {
  if (!pid || !pidAlive(pid)) return;
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  await untilGone(pid, 5000);
}

/**
 * Resolves once `pid` is gone or a zombie, or after `ms`. A killed QEMU closes its sockets while
 * the kernel is still tearing it down, so whoever hears the close first waits here before
 * reading its state (polled: Node has no pidfd).
 */
export async function untilGone(pid: number, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (pidAlive(pid) && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
}

export const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
