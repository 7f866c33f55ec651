// QEMU process helpers for the VM backend: accelerator probe, the command line (one
// machine shape for every VM, so any saved state loads into any new process), overlays,
// qcow2 backing chains and process lifetime.
import { execFile, spawnSync } from 'node:child_process';
import { existsSync, openSync, readSync, closeSync, readFileSync } from 'node:fs';
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
  dir: string; // holds qmp.sock, agent.sock, console.log, qemu.pid
  disk: string;
  /** Guest RAM: a file mapped shared (template) or privately (clones), or anonymous. */
  ram: { path: string; share: boolean } | { anonymous: true };
  incoming: boolean;
  name: string;
}

export const socketPaths = (dir: string) => ({
  qmp: `${dir}/qmp.sock`,
  agent: `${dir}/agent.sock`,
  pidfile: `${dir}/qemu.pid`,
  console: `${dir}/console.log`,
});

/** The full command line. Devices and their order never vary: saved states depend on it. */
export function qemuArgs(m: MachineSpec, l: LaunchSpec): string[] {
  const s = socketPaths(l.dir);
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
    '-serial', `file:${s.console}`,
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
    '-pidfile', s.pidfile,
    '-daemonize',
    ...(l.incoming ? ['-incoming', 'defer'] : []),
  ];
}

/** Starts QEMU (daemonized: resolves once its sockets listen) and returns its pid. */
export async function launchQemu(m: MachineSpec, l: LaunchSpec, opts: { nice?: number } = {}): Promise<number> {
  try {
    if (opts.nice) await execFileP('nice', ['-n', String(opts.nice), m.qemu, ...qemuArgs(m, l)], { timeout: 30_000 });
    else await execFileP(m.qemu, qemuArgs(m, l), { timeout: 30_000 });
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
