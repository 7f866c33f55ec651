// Connections to a TCP port inside a sandbox's network namespace (Runtime.connectPort, used by
// preview URLs). Node cannot setns, so one helper per sandbox (`procbox-portfwd`, portfwd.c)
// enters the init's network namespace and drops to uid 65534 under a seccomp allow-list; for
// each connection asked over its IPC channel it connects to 127.0.0.1:PORT in the sandbox and
// hands the connected socket over (SCM_RIGHTS, Node's own framing: the socket arrives as the
// handle of a 'message'). This process then talks to the sandbox's port directly: no process
// relays the bytes. The helper is started on the first connection and ends with its init or
// with this process (the channel closes). It is not egress: it reaches the sandbox's own
// loopback, so a sandbox with network `none` (only lo) can be reached too, and nothing the
// sandbox does can make it connect anywhere else (the address is fixed, the port is the host's
// choice); it reads nothing from the sandbox.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import { dirname, join } from 'node:path';
import { RuntimeError } from '../runtime.js';
import type { ProcboxCore } from './core.js';

/** How long a connection may take (the helper gives up after 5 s itself). */
const CONNECT_TIMEOUT_MS = 6000;

interface Waiter {
  resolve: (s: net.Socket) => void;
  reject: (e: Error) => void;
  /** The error of a connect the helper answered with an errno. */
  refused: (errno: number) => Error;
}

interface Helper {
  proc: ChildProcess;
  pid: number;
  pidStart: string;
  ready: Promise<void>;
  exited: boolean;
  /** Connections asked for and not answered yet, by request id. */
  waiting: Map<number, Waiter>;
}

/** The helper binary beside the procbox helper (both built by `make -C native/procbox`). */
export function portfwdPath(procboxHelper: string): string {
  return join(dirname(procboxHelper), 'procbox-portfwd');
}

export class PortForwarders {
  private readonly helpers = new Map<string, Helper>();
  private nextId = 1;

  constructor(private readonly core: ProcboxCore) {}

  /** Whether this host has the helper (built by the setup step). */
  available(): boolean {
    return existsSync(portfwdPath(this.core.helper));
  }

  /**
   * A connected socket to 127.0.0.1:`port` inside sandbox `id`. Rejects NotFound (no such
   * sandbox), Conflict (its init is not running, or nothing accepts connections on the port).
   */
  async connect(id: string, port: number): Promise<net.Socket> {
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw new RuntimeError('InvalidArgument', `port must be 1-65535, got ${port}`);
    const h = await this.helper(id);
    const req = this.nextId++;
    return new Promise<net.Socket>((resolve, reject) => {
      const timer = setTimeout(() => {
        h.waiting.delete(req);
        reject(new RuntimeError('Conflict', `connecting to port ${port} of sandbox ${id} timed out`));
      }, CONNECT_TIMEOUT_MS);
      h.waiting.set(req, {
        resolve: (s) => (clearTimeout(timer), resolve(s)),
        reject: (e) => (clearTimeout(timer), reject(e)),
        refused: (errno) =>
          new RuntimeError(
            'Conflict',
            `nothing accepts connections on port ${port} of sandbox ${id} (${errno === 111 ? 'connection refused' : errno === 110 ? 'timed out' : errno === 11 ? 'too many connections at once' : `errno ${errno}`})`,
          ),
      });
      h.proc.send({ id: req, port }, (err) => {
        if (!err) return;
        h.waiting.delete(req);
        clearTimeout(timer);
        reject(new RuntimeError('Conflict', `the port helper of sandbox ${id}: ${err.message}`));
      });
    });
  }

  /** A message from a helper: a handed-over socket, or a failed connect's errno. */
  private onMessage(h: Helper, msg: unknown, handle: unknown): void {
    const m = msg as { id?: unknown; errno?: unknown } | null;
    const w = typeof m?.id === 'number' ? h.waiting.get(m.id) : undefined;
    if (!w) {
      if (handle instanceof net.Socket) handle.destroy(); // a connect whose caller gave up
      return;
    }
    h.waiting.delete(m!.id as number);
    if (handle instanceof net.Socket) return w.resolve(handle);
    w.reject(w.refused(Number(m!.errno)));
  }

  private async helper(id: string): Promise<Helper> {
    const rec = this.core.rec(id);
    if (!this.core.alive(rec) || !rec.pid || !rec.pidStart)
      throw new RuntimeError('Conflict', `sandbox ${id} is not running`);
    let h = this.helpers.get(id);
    if (h && (h.exited || h.pid !== rec.pid || h.pidStart !== rec.pidStart)) {
      this.stop(id); // the init was restarted (or the helper died): a new one for the new namespace
      h = undefined;
    }
    if (!h) {
      // The IPC channel is fd 3 (NODE_CHANNEL_FD); stdin is /dev/null, stdout says "ready".
      const proc = spawn(portfwdPath(this.core.helper), [String(rec.pid), rec.pidStart], {
        stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
        serialization: 'json',
      });
      const made: Helper = {
        proc,
        pid: rec.pid,
        pidStart: rec.pidStart,
        exited: false,
        ready: Promise.resolve(),
        waiting: new Map(),
      };
      let err = '';
      proc.stderr!.on('data', (b: Buffer) => (err = (err + b.toString('utf8')).slice(-2000)));
      proc.on('message', (msg, handle) => this.onMessage(made, msg, handle));
      proc.on('error', () => undefined); // an exit follows, or the spawn's error below
      made.ready = new Promise<void>((resolve, reject) => {
        let out = '';
        proc.stdout!.on('data', (b: Buffer) => {
          out += b.toString('utf8');
          if (out.startsWith('ready\n')) resolve();
        });
        proc.once('error', (e) =>
          reject(new RuntimeError('Internal', `starting the port helper of sandbox ${id}: ${e.message}`)),
        );
        proc.once('exit', (code, sig) => {
          made.exited = true;
          if (this.helpers.get(id) === made) this.helpers.delete(id);
          const e = new RuntimeError(
            'Internal',
            `the port helper of sandbox ${id} exited (${sig ?? code}): ${err.trim()}`,
          );
          for (const w of made.waiting.values()) w.reject(e);
          made.waiting.clear();
          reject(e);
        });
      });
      made.ready.catch(() => undefined);
      // Neither the channel nor the helper keeps this process alive.
      proc.unref();
      (proc as unknown as { channel?: { unref(): void } }).channel?.unref();
      this.helpers.set(id, made);
      h = made;
    }
    await h.ready;
    return h;
  }

  /** Ends the helper of one sandbox (destroy, restart). Idempotent. */
  stop(id: string): void {
    const h = this.helpers.get(id);
    if (!h) return;
    this.helpers.delete(id);
    h.proc.kill('SIGKILL');
  }

  /** Ends every helper (runtime close). */
  closeAll(): void {
    for (const id of [...this.helpers.keys()]) this.stop(id);
  }
}
