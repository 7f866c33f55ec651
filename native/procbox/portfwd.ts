// Connections to a TCP port inside a sandbox's network namespace (Runtime.connectPort, used by
// preview URLs). Node cannot setns, so one helper per sandbox (`procbox-portfwd`, portfwd.c)
// enters the init's network namespace, drops to uid 65534 under a seccomp allow-list, and
// relays each connection it accepts on a host-side unix socket to 127.0.0.1:PORT in the
// sandbox. The helper is started on the first connection and ends with its init or with this
// process (its stdin is our pipe). It is not egress: it reaches the sandbox's own loopback,
// so a sandbox with network `none` (only lo) can be reached too, and nothing the sandbox does
// can make it connect anywhere else (the address is fixed, the port is the host's choice).
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import { dirname, join } from 'node:path';
import { RuntimeError } from '../runtime.js';
import type { ProcboxCore } from './core.js';

/** How long a connection may take (the helper gives up after 5 s itself). */
const CONNECT_TIMEOUT_MS = 6000;
/** The longest unix socket path (sun_path is 108 bytes with its NUL). */
const MAX_SOCK_PATH = 100;

interface Helper {
  proc: ChildProcess;
  sock: string;
  pid: number;
  pidStart: string;
  ready: Promise<void>;
  exited: boolean;
}

/** The helper binary beside the procbox helper (both built by `make -C native/procbox`). */
export function portfwdPath(procboxHelper: string): string {
  return join(dirname(procboxHelper), 'procbox-portfwd');
}

export class PortForwarders {
  private readonly helpers = new Map<string, Helper>();
  private readonly dir: string;

  constructor(private readonly core: ProcboxCore) {
    const inState = join(core.root, 'pf');
    // A socket path must fit sun_path: a long state directory gets a directory under /run.
    this.dir =
      join(inState, 'x'.repeat(12 + 5)).length <= MAX_SOCK_PATH ? inState : join('/run', 'fluxvm', `pf-${core.scope}`);
  }

  /** Whether this host has the helper (built by the setup step). */
  available(): boolean {
    return existsSync(portfwdPath(this.core.helper));
  }

  /**
   * A connected socket to 127.0.0.1:`port` inside sandbox `id`. Rejects NotFound (no such
   * sandbox), Conflict (its init is not running), Unavailable (connection refused or timed out:
   * nothing listens on the port).
   */
  async connect(id: string, port: number): Promise<net.Socket> {
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      throw new RuntimeError('InvalidArgument', `port must be 1-65535, got ${port}`);
    const h = await this.helper(id);
    return new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect(h.sock);
      s.setNoDelay(true);
      const timer = setTimeout(
        () => fail(new RuntimeError('Conflict', `connecting to port ${port} of sandbox ${id} timed out`)),
        CONNECT_TIMEOUT_MS,
      );
      const fail = (e: Error) => {
        clearTimeout(timer);
        s.off('readable', onReadable);
        s.destroy();
        reject(e);
      };
      // The helper answers one byte before relaying: 0, or the errno of the connect.
      const onReadable = () => {
        const b = s.read(1) as Buffer | null;
        if (b === null) return;
        clearTimeout(timer);
        s.off('readable', onReadable); // flowing goes back to null: the next 'data' listener resumes it
        s.off('error', fail);
        s.off('end', onEnd);
        if (b[0] === 0) return resolve(s);
        s.destroy();
        reject(
          new RuntimeError(
            'Conflict',
            `nothing accepts connections on port ${port} of sandbox ${id} (${b[0] === 111 ? 'connection refused' : b[0] === 110 ? 'timed out' : `errno ${b[0]}`})`,
          ),
        );
      };
      const onEnd = () =>
        fail(new RuntimeError('Conflict', `the port helper of sandbox ${id} closed the connection to port ${port}`));
      s.once('connect', () => s.write(Buffer.from([port >> 8, port & 255])));
      s.on('readable', onReadable);
      s.once('end', onEnd);
      s.once('error', fail);
    });
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
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      const sock = join(this.dir, `${createHash('sha256').update(id).digest('hex').slice(0, 12)}.sock`);
      const proc = spawn(portfwdPath(this.core.helper), [String(rec.pid), rec.pidStart, sock], {
        stdio: ['pipe', 'pipe', 'pipe'],
      });
      const made: Helper = {
        proc,
        sock,
        pid: rec.pid,
        pidStart: rec.pidStart,
        exited: false,
        ready: Promise.resolve(),
      };
      let err = '';
      proc.stderr!.on('data', (b: Buffer) => (err = (err + b.toString('utf8')).slice(-2000)));
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
          reject(
            new RuntimeError('Internal', `the port helper of sandbox ${id} exited (${sig ?? code}): ${err.trim()}`),
          );
        });
      });
      made.ready.catch(() => undefined);
      proc.stdin!.on('error', () => undefined);
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
    h.proc.stdin?.end();
    h.proc.kill('SIGKILL');
    rmSync(h.sock, { force: true });
  }

  /** Ends every helper (runtime close). */
  closeAll(): void {
    for (const id of [...this.helpers.keys()]) this.stop(id);
  }
}
