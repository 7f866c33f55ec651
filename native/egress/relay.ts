// Hands an established plain tunnel (CONNECT or transparent TLS, neither intercepted nor
// L7-limited: those bytes are never looked at) to the splice helper (relay/relay.c), which
// moves them kernel to kernel: the JS relay copies every chunk through the event loop, and on
// a loaded host that CPU is what bounds a tunnel's throughput (README.md "Performance").
// The proxy hands a tunnel over only once it has carried `afterBytes` (a bulk transfer): short
// tunnels and held idle ones stay in JS, where a hand-over would cost more than it saves.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import type net from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The helper `make -C native/egress` builds (the same path from native/egress under tsx and from dist/native/egress).
 */
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
  /** Tunnels the helper carries at once; tunnels beyond stay in JS. Default 64. */
  max?: number;
}

/**
 * What a relay reports when it ends: bytes written to the upstream (the prefix included), read from it (past the
 * prefix).
 */
export interface RelayReport {
  out: number;
  in: number;
  /** eof, idle, terminated, error:<what>; `helper exited` when the helper died first (the counts then are 0). */
  reason: string;
}

/** One tunnel the helper carries. */
export interface Relay {
  client: string;
  done: Promise<RelayReport>;
  /** Closes it (its sandbox went); `done` then says terminated. */
  kill(): void;
}

/** Resolves once everything written to `s` so far has gone to the kernel; false when the socket went first. */
function flushed(s: net.Socket): Promise<boolean> {
  if (s.destroyed || s.writableEnded) return Promise.resolve(false);
  if (s.writableLength === 0) return Promise.resolve(true);
  return new Promise((resolve) => s.write(Buffer.alloc(0), (err) => resolve(!err && !s.destroyed)));
}

/** libuv's TCP handle under a net.Socket (what Node's IPC passes as a descriptor). */
type TcpHandle = { readStop(): number; reading?: boolean };
const handleOf = (s: net.Socket): TcpHandle => (s as unknown as { _handle: TcpHandle })._handle;

/** What the socket had read and not handed on yet; then it reads no more (the helper does). */
function takeBuffered(s: net.Socket): Buffer {
  const parts: Buffer[] = [];
  for (let b: Buffer | null; (b = s.read() as Buffer | null) !== null;) parts.push(b);
  const h = handleOf(s);
  h.reading = false;
  h.readStop();
  return Buffer.concat(parts);
}

/**
 * The splice helper of one proxy: one long-lived process (started at the first hand-over,
 * again after it died), which gets each tunnel's two sockets over Node's IPC channel
 * (SCM_RIGHTS): no fork per tunnel, which would stall the proxy's event loop for a time that
 * grows with serve's memory.
 */
export class RelayHelper {
  private child?: ChildProcess;
  private next = 1;
  private readonly pending = new Map<number, { child: ChildProcess; resolve: (r: RelayReport) => void }>();
  /** After a failed start no new one for a minute (each try is a fork of serve). */
  private retryAt = 0;

  constructor(private readonly o: { helper: string; idleMs: number; now?: () => number }) {}

  private process(): ChildProcess | undefined {
    if (this.child?.connected) return this.child;
    const now = this.o.now?.() ?? Date.now();
    if (now < this.retryAt) return undefined;
    this.retryAt = now + 60_000;
    const c = spawn(this.o.helper, [String(this.o.idleMs)], {
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
      serialization: 'json',
    });
    c.on('error', () => undefined);
    c.on('message', (m: { t?: number; out?: number; in?: number; reason?: string }) => {
      const p = typeof m.t === 'number' ? this.pending.get(m.t) : undefined;
      if (!p) return;
      this.pending.delete(m.t!);
      p.resolve({ out: Number(m.out), in: Number(m.in), reason: String(m.reason) });
    });
    c.on('exit', () => {
      if (this.child === c) this.child = undefined;
      for (const [id, p] of this.pending) {
        if (p.child !== c) continue;
        this.pending.delete(id);
        p.resolve({ out: 0, in: 0, reason: 'helper exited' });
      }
    });
    c.unref();
    (c.channel as { unref?: () => void } | undefined)?.unref?.();
    if (!c.pid || !c.connected) return undefined;
    this.retryAt = 0;
    this.child = c;
    return c;
  }

  /**
   * Moves the tunnel `s` (the sandbox) <-> `up` (the upstream) to the helper: stops the JS
   * relay, waits until what it wrote is in the kernel, then in one synchronous step takes
   * what it had read but not written yet (handed on as prefixes) and stops reading, sends
   * both descriptors, and once they are sent closes the proxy's (`onHanded` first: their
   * close events come after it). Undefined when the tunnel ended meanwhile or there is no
   * helper: the JS relay then goes on as before.
   */
  async handOver(s: net.Socket, up: net.Socket, client: string, onHanded: () => void): Promise<Relay | undefined> {
    s.unpipe(up);
    up.unpipe(s);
    s.pause();
    up.pause();
    const live = (x: net.Socket) => !x.destroyed && !x.readableEnded && !x.writableEnded;
    const ok =
      (await Promise.all([flushed(up), flushed(s)])).every(Boolean) &&
      live(s) &&
      live(up) &&
      s.writableLength === 0 &&
      up.writableLength === 0;
    const child = ok ? this.process() : undefined;
    if (!child) {
      if (live(s) && live(up)) {
        s.pipe(up);
        up.pipe(s);
      }
      return undefined;
    }
    const id = this.next++;
    const out = takeBuffered(s);
    const inb = takeBuffered(up);
    const done = new Promise<RelayReport>((resolve) => this.pending.set(id, { child, resolve }));
    const sent = (which: net.Socket, side: 0 | 1, prefix: Buffer): Promise<boolean> =>
      new Promise((resolve) => {
        try {
          child.send(
            { t: id, s: side, p: prefix.toString('base64') },
            handleOf(which) as unknown as net.Socket,
            (err) => resolve(!err),
          );
        } catch {
          resolve(false);
        }
      });
    const both = await Promise.all([sent(s, 0, out), sent(up, 1, inb)]);
    if (!both.every(Boolean)) {
      // The helper went during the hand-over: the tunnel is lost (cut, as a proxy restart would).
      this.kill(id);
      s.destroy();
      up.destroy();
      return undefined;
    }
    onHanded();
    s.destroy();
    up.destroy();
    return { client, done, kill: () => this.kill(id) };
  }

  private kill(id: number): void {
    const c = this.pending.get(id)?.child;
    if (c?.connected) c.send({ kill: id }, (err) => err && undefined);
  }

  /** Ends the helper (every tunnel it carries closes); resolves once it has exited. */
  async stop(): Promise<void> {
    const c = this.child;
    this.child = undefined;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    const gone = new Promise<void>((r) => c.once('exit', () => r()));
    c.kill('SIGKILL');
    await gone;
  }
}
