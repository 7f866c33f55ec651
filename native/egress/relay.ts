// Hands an established plain tunnel (CONNECT or transparent TLS, neither intercepted nor
// L7-limited: those bytes are never looked at) to the splice helper (relay/relay.c), which
// moves them kernel to kernel: the JS relay copies every chunk through the event loop, and on
// a loaded host that CPU is what bounds a tunnel's throughput (README.md "Performance").
// The proxy hands a tunnel over only once it has carried `afterBytes` (a bulk transfer), so
// short tunnels and held idle ones cost no process.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import type net from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The helper `make -C native/egress` builds (the same path from native/egress under tsx and from dist/native/egress). */
export const RELAY_HELPER = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    const p = join(dir, 'native', 'egress', 'build', 'fluxvm-egress-relay');
    if (existsSync(p)) return p;
    dir = dirname(dir);
  }
  return join(dirname(fileURLToPath(import.meta.url)), 'build', 'fluxvm-egress-relay');
})();

export interface RelayOptions {
  /** The helper binary. Default RELAY_HELPER; a missing binary leaves every tunnel in JS. */
  helper?: string;
  /** Bytes a tunnel carries (both ways together) in JS before it is handed over. Default 1 MiB. */
  afterBytes?: number;
  /** Helper processes at once; tunnels beyond stay in JS. Default 64. */
  max?: number;
}

/** What a relay reports when it ends: bytes written to the upstream (the prefix included), read from it (past the prefix). */
export interface RelayReport {
  out: number;
  in: number;
  /** eof, idle, terminated, error:<what>; `exited <code>` when the helper said nothing. */
  reason: string;
}

/** One running helper. */
export interface Relay {
  client: string;
  child: ChildProcess;
  done: Promise<RelayReport>;
}

/** Resolves once everything written to `s` so far has gone to the kernel; false when the socket went first. */
function flushed(s: net.Socket): Promise<boolean> {
  if (s.destroyed || s.writableEnded) return Promise.resolve(false);
  if (s.writableLength === 0) return Promise.resolve(true);
  return new Promise((resolve) => s.write(Buffer.alloc(0), (err) => resolve(!err && !s.destroyed)));
}

function drain(s: net.Socket): Buffer {
  const parts: Buffer[] = [];
  for (let b: Buffer | null; (b = s.read() as Buffer | null) !== null; ) parts.push(b);
  return Buffer.concat(parts);
}

/**
 * Moves the tunnel `s` (the sandbox) <-> `up` (the upstream) to a helper: stops the JS relay,
 * waits until what it wrote is in the kernel, then in one synchronous step takes what it had
 * read but not written yet (handed to the helper as prefixes), spawns the helper with both
 * sockets as its fds 0 and 1 and closes the proxy's descriptors (no byte can be read by the
 * proxy after the spawn). Undefined when the tunnel ended meanwhile (the caller's JS tunnel
 * then finishes as it would have); `s` and `up` are destroyed when it returns a relay, `onHanded`
 * called just before (their close events come after it).
 */
export async function handOver(s: net.Socket, up: net.Socket, o: { helper: string; client: string; idleMs: number; onHanded: () => void }): Promise<Relay | undefined> {
  s.unpipe(up);
  up.unpipe(s);
  s.pause();
  up.pause();
  const live = (x: net.Socket) => !x.destroyed && !x.readableEnded && !x.writableEnded;
  const ok = (await Promise.all([flushed(up), flushed(s)])).every(Boolean) && live(s) && live(up) && s.writableLength === 0 && up.writableLength === 0;
  if (!ok) {
    if (live(s) && live(up)) {
      s.pipe(up);
      up.pipe(s);
    }
    return undefined;
  }
  const out = drain(s);
  const inb = drain(up);
  let child: ChildProcess;
  try {
    child = spawn(o.helper, [String(o.idleMs), String(out.length), String(inb.length)], { stdio: [s, up, 'ignore', 'pipe'] });
  } catch {
    child = undefined as never;
  }
  if (!child?.pid) {
    // Could not start it: the bytes read stay with the JS relay.
    child?.on('error', () => undefined);
    if (out.length) up.write(out);
    if (inb.length) s.write(inb);
    s.pipe(up);
    up.pipe(s);
    return undefined;
  }
  o.onHanded();
  s.destroy();
  up.destroy();
  const ctl = child.stdio[3] as net.Socket;
  ctl.on('error', () => undefined);
  if (out.length || inb.length) ctl.write(Buffer.concat([out, inb]));
  let line = '';
  ctl.on('data', (d: Buffer) => (line += d.toString('latin1')));
  const done = new Promise<RelayReport>((resolve) => {
    child.once('close', (code, sig) => {
      const m = /^(\d+) (\d+) (\S+)\n/.exec(line);
      resolve(m ? { out: Number(m[1]), in: Number(m[2]), reason: m[3]! } : { out: 0, in: 0, reason: `exited ${code ?? sig}` });
    });
  });
  return { client: o.client, child, done };
}
