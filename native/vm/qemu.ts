// QEMU process helpers for the VM backend: accelerator probe, the command line (one
// machine shape for every VM, so any saved state loads into any new process), overlays,
// qcow2 backing chains and process lifetime.
import { execFile, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { accessSync, constants, existsSync, lstatSync, mkdirSync, openSync, readSync, closeSync, readFileSync, readlinkSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
 * True when `binary` (default qemu-system-x86_64) and qemu-img run on this host: whether the
 * vm backend can exist at all. Runs both with --version (a few ms); never throws.
 */
export function qemuInstalled(binary = 'qemu-system-x86_64'): boolean {
  return [binary, 'qemu-img'].every((b) => spawnSync(b, ['--version'], { stdio: 'ignore', timeout: 10_000 }).status === 0);
}

/** Host TSC frequency in kHz (from /proc/cpuinfo), for tsc_early_khz under TCG. */
export function hostTscKhz(): number {
  const m = /cpu MHz\s*:\s*([0-9.]+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'));
  return m ? Math.round(Number(m[1]) * 1000) : 2_000_000;
}

export interface MachineSpec {
  qemu: string;
  accel: Accel;
  memMiB: number;
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
  /** Guest RAM: a file mapped shared (template) or privately (clones), or anonymous. */
  ram: { path: string; share: boolean } | { anonymous: true };
  incoming: boolean;
  name: string;
}

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
  const h = createHash('sha256').update(`${process.getuid?.() ?? ''}:${stateDir}`).digest('hex').slice(0, 16);
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
export function ensureSocketDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const st = lstatSync(dir);
  const uid = process.getuid?.();
  if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o077) !== 0) {
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

/** The full command line. Devices and their order never vary: saved states depend on it. */
export function qemuArgs(m: MachineSpec, l: LaunchSpec, s: { qmp: string; agent: string }): string[] {
  const files = socketPaths(l.dir);
  const append = [
    'console=ttyS0', 'quiet', 'panic=-1', 'mitigations=off',
    ...(m.accel === 'tcg' ? [`tsc_early_khz=${m.tscKhz}`, 'tsc=reliable', 'no_timer_check'] : []),
  ].join(' ');
  const ram = 'anonymous' in l.ram
    ? `memory-backend-ram,id=mem,size=${m.memMiB}M`
    : `memory-backend-file,id=mem,size=${m.memMiB}M,mem-path=${l.ram.path},share=${l.ram.share ? 'on' : 'off'}`;
  return [
    '-name', l.name,
    '-M', `microvm,accel=${m.accel},memory-backend=mem`,
    '-cpu', m.accel === 'kvm' ? 'host' : 'max',
    '-m', `${m.memMiB}M`, '-smp', '1',
    '-nodefaults', '-no-user-config', '-display', 'none',
    '-object', ram,
    '-kernel', m.kernel, '-initrd', m.initrd, '-append', append,
    '-serial', `file:${files.console}`,
    '-device', 'virtio-serial-device',
    '-chardev', `socket,id=agent,path=${s.agent},server=on,wait=off`,
    '-device', 'virtserialport,chardev=agent,name=agent',
    '-drive', `id=disk,file=${l.disk},format=qcow2,if=none,cache=writeback`,
    '-device', 'virtio-blk-device,drive=disk,serial=work',
    ...(m.rootfs
      ? ['-drive', `id=root,file=${m.rootfs},format=qcow2,if=none,readonly=on`, '-device', 'virtio-blk-device,drive=root,serial=root']
      : []),
    '-qmp', `unix:${s.qmp},server=on,wait=off`,
    '-no-reboot',
    '-pidfile', files.pidfile,
    '-daemonize',
    ...(l.incoming ? ['-incoming', 'defer'] : []),
  ];
}

/**
 * Starts QEMU (daemonized: resolves once its sockets listen) and returns its pid. Its sockets
 * get new names in `l.sockDir`, linked from `l.dir` (any sockets linked there before are
 * removed first). On failure the links may remain: removeSockets(l.dir) cleans them.
 */
export async function launchQemu(m: MachineSpec, l: LaunchSpec, opts: { nice?: number } = {}): Promise<number> {
  removeSockets(l.dir);
  ensureSocketDir(l.sockDir);
  const token = randomBytes(8).toString('hex');
  const sockets = { qmp: join(l.sockDir, `${token}.qmp`), agent: join(l.sockDir, `${token}.agent`) };
  const links = socketPaths(l.dir);
  symlinkSync(sockets.qmp, links.qmp);
  symlinkSync(sockets.agent, links.agent);
  const args = qemuArgs(m, l, sockets);
  try {
    if (opts.nice) await execFileP('nice', ['-n', String(opts.nice), m.qemu, ...args], { timeout: 30_000 });
    else await execFileP(m.qemu, args, { timeout: 30_000 });
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new RuntimeError('Internal', `qemu failed to start: ${(err.stderr || err.message).trim()}`);
  }
  const pid = Number(readFileSync(socketPaths(l.dir).pidfile, 'utf8').trim());
  if (!Number.isInteger(pid) || pid <= 0) throw new RuntimeError('Internal', 'qemu wrote no pid');
  return pid;
}

/** A copy-on-write overlay over `backing` (never opens the backing: it may be in use). */
export async function createOverlay(path: string, backing: string, size: string): Promise<void> {
  await execFileP('qemu-img', ['create', '-q', '-f', 'qcow2', '-u', '-F', 'qcow2', '-b', backing, path, size]);
}

/** The backing file named in a qcow2 header, or undefined. */
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
    return b.toString('utf8');
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

/** True when `pid` is a QEMU whose command line mentions `marker` (our VM directory). */
export function isOurQemu(pid: number | undefined, marker: string): boolean {
  if (!pidAlive(pid)) return false;
  try {
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return cmd.includes('qemu-system') && cmd.includes(marker);
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
  for (let i = 0; i < 500 && pidAlive(pid); i++) await new Promise((r) => setTimeout(r, 10));
}

export const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
