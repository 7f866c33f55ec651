// Connections to a TCP port on a VM guest's loopback (Runtime.connectPort, preview URLs). The
// host reaches the guest only through the agent's channel (virtio-serial) in every network
// mode (a VM with network `none` has no link at all), so each connection is a streamed exec of
// the guest's `nc 127.0.0.1 PORT` (busybox in the stock image), its stdin and stdout as the
// two directions: the agent's frames already carry them with backpressure and caps. Not
// egress: the relay runs inside the guest and reaches its own loopback only. The guest's
// output is bytes for the caller (the preview proxy's HTTP parser), never parsed here.
import { Duplex } from 'node:stream';
import type { ExecRequest, ExecStream } from '../runtime.js';

/** How long one relayed connection may live (the exec's timeout): a day, like the longest preview. */
const CONNECTION_TIMEOUT_MS = 86_400_000;

/**
 * The guest command: loopback brought up (the stock guest leaves `lo` down in a VM without a
 * network, where every connection to 127.0.0.1 is "Network is unreachable"; a guest's own
 * loopback up is what any Linux system has), then nc where the image has it, else busybox's. Pure.
 */
export function relayArgv(port: number): string[] {
  const p = String(port);
  return [
    'sh',
    '-c',
    `ip link set lo up 2>/dev/null || busybox ip link set lo up 2>/dev/null; if command -v nc >/dev/null 2>&1; then exec nc 127.0.0.1 ${p}; else exec busybox nc 127.0.0.1 ${p}; fi`,
  ];
}

/**
 * A Duplex over a streamed exec: writes go to its stdin, reads come from its stdout; destroying
 * it kills the command. It has the net.Socket methods an http.Agent calls on pooled sockets
 * (setKeepAlive, setNoDelay, ref, unref, setTimeout with its 'timeout' event).
 */
export function execDuplex(p: ExecStream): Duplex {
  p.stdin.on('error', () => undefined);
  p.stderr.resume();
  const d = Duplex.from({ readable: p.stdout, writable: p.stdin }) as Duplex & Record<string, unknown>;
  let timer: NodeJS.Timeout | undefined;
  let idleMs = 0;
  const arm = () => {
    if (timer) clearTimeout(timer);
    timer = idleMs > 0 ? setTimeout(() => d.emit('timeout'), idleMs) : undefined;
  };
  p.stdout.on('data', () => idleMs && arm());
  d.setKeepAlive = () => d;
  d.setNoDelay = () => d;
  d.ref = () => d;
  d.unref = () => d;
  d.setTimeout = (ms: number, cb?: () => void) => {
    idleMs = ms;
    if (cb) d.once('timeout', cb);
    arm();
    return d;
  };
  d.once('close', () => {
    if (timer) clearTimeout(timer);
    p.kill();
  });
  void p.exit.then(() => {
    if (!d.destroyed) d.push(null);
  });
  return d;
}

/** Connects through `execStream` (the VM runtime's) to `port` on the guest's loopback. */
export async function connectGuestPort(
  execStream: (req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>) => Promise<ExecStream>,
  port: number,
): Promise<Duplex> {
  return execDuplex(await execStream({ argv: relayArgv(port), timeoutMs: CONNECTION_TIMEOUT_MS }));
}
