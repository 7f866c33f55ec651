// The wire side of `procbox fileops` (fileops.c): the op codes, the errno names, the framed
// request/response protocol and one helper process serving requests in order (Server). The
// pool, the anchors and every operation's arguments and answers are in fileops.ts, the one
// module the rest of the code calls.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { RuntimeError } from '../runtime.js';

export const OP = {
  stat: 1,
  list: 2,
  read: 3,
  write: 4,
  delete: 5,
  walk: 6,
  scan: 7,
  cmp: 8,
  rmtree: 9,
  ping: 10,
  statv: 11,
  merge: 12,
  release: 13,
  syncfs: 14,
  run: 15,
  snapshot: 16,
} as const;
export type Op = keyof typeof OP;

export const ERRNO: Record<number, string> = {
  1: 'EPERM',
  2: 'ENOENT',
  5: 'EIO',
  7: 'E2BIG',
  12: 'ENOMEM',
  13: 'EACCES',
  17: 'EEXIST',
  18: 'EXDEV',
  20: 'ENOTDIR',
  21: 'EISDIR',
  22: 'EINVAL',
  27: 'EFBIG',
  28: 'ENOSPC',
  30: 'EROFS',
  36: 'ENAMETOOLONG',
  38: 'ENOSYS',
  39: 'ENOTEMPTY',
  40: 'ELOOP',
  116: 'ESTALE',
  122: 'EDQUOT',
};

/** A failed operation: the helper's errno name and message. */
export class FileOpError extends Error {
  constructor(
    readonly errno: string,
    message: string,
  ) {
    super(message);
  }
}

/** The FileOpError of a one-shot helper's last stderr line ("E<errno> message"), or undefined. */
export function oneShotError(stderr: string): FileOpError | undefined {
  const line = stderr.trim().split('\n').pop() ?? '';
  const m = /^E(\d+) (.*)$/.exec(line);
  return m ? new FileOpError(ERRNO[Number(m[1])] ?? `E${m[1]}`, m[2]!) : undefined;
}

/** The fields of a stat/list entry as the helper sends them. */
export interface RawEntry {
  type: 'f' | 'd' | 'l' | 'w' | 'c' | 'b' | 'p' | 's' | 'o';
  size: number;
  mode: number;
  mtimeMs: number;
  uid: number;
  gid: number;
  name: Buffer;
  link: Buffer;
}

/** One regular file of a walk: path relative to the start, fingerprint, permission bits. */
export interface WalkedFile {
  rel: Buffer;
  fingerprint: string;
  mode: number;
}

/** Where an operation is anchored: a host-controlled root and its sandbox path (for symlinks). */
export interface Anchor {
  /** Host path of the root directory (trusted: the host built every component of it). */
  root: string;
  /** Sandbox path at which the root appears; absolute symlink targets must lie below it. */
  view: string;
}

export interface Pending {
  frame: Buffer;
  /** Read-only ops are sent again (once) when their helper dies before answering. */
  retry?: (p: Pending) => boolean;
  /** Called with the answer and the helper that gave it, synchronously. */
  resolve: (b: Buffer, from: Server) => void;
  reject: (e: Error) => void;
}

/** Requests written to one helper ahead of its answers (it serves them in order). */
export const PIPELINE = 8;
export const noop = (): undefined => undefined;

/** One helper process serving requests in order; up to PIPELINE of them are in flight. */
export class Server {
  private readonly child: ChildProcessWithoutNullStreams;
  private chunks: Buffer[] = [];
  private have = 0;
  private need = -1;
  private readonly inflight: Pending[] = [];
  private readonly releases: number[] = [];
  dead = false;

  constructor(
    helper: string,
    private readonly onDead: (s: Server) => void,
  ) {
    this.child = spawn(helper, ['fileops'], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stdout.on('data', (b: Buffer) => this.onData(b));
    let err = '';
    this.child.stderr.on('data', (b: Buffer) => (err = (err + b.toString()).slice(-500)));
    this.child.stdin.on('error', () => undefined); // shows as an exit
    const die = (why: string) => {
      if (this.dead) return;
      this.dead = true;
      for (const p of this.inflight.splice(0).reverse()) {
        if (!p.retry?.(p))
          p.reject(new RuntimeError('Internal', `procbox fileops helper ${why}${err ? `: ${err.trim()}` : ''}`));
      }
      this.onDead(this);
    };
    this.child.on('error', (e) => die(`failed: ${e.message}`));
    this.child.on('exit', (code, sig) => die(`exited (${sig ?? code})`));
    this.idle();
  }

  get load(): number {
    return this.inflight.length;
  }

  get pid(): number {
    return this.child.pid ?? 0;
  }

  send(p: Pending): void {
    if (this.inflight.length === 0) {
      this.child.ref();
      (this.child.stdout as unknown as { ref(): void }).ref();
    }
    // Handed-over fds to close ride along with the next request (one write, one wake-up).
    const frames = this.releases.splice(0).map((fd) => {
      const b = Buffer.alloc(21);
      b.writeUInt32LE(17, 0);
      b.writeUInt32LE(0, 4);
      b.writeUInt8(OP.release, 8);
      b.writeUInt32LE(8, 9);
      b.writeBigUInt64LE(BigInt(fd), 13);
      this.inflight.push({ frame: b, resolve: noop, reject: noop });
      return b;
    });
    this.inflight.push(p);
    this.child.stdin.write(frames.length ? Buffer.concat([...frames, p.frame]) : p.frame);
  }

  /** Lets the helper close an fd it handed over, with the next request it is sent. */
  release(fd: number): void {
    this.releases.push(fd);
  }

  private idle(): void {
    // An idle helper does not keep the process alive.
    this.child.unref();
    (this.child.stdout as unknown as { unref(): void }).unref();
    (this.child.stderr as unknown as { unref(): void }).unref();
    (this.child.stdin as unknown as { unref(): void }).unref();
  }

  private onData(b: Buffer): void {
    // Chunks are kept apart until a whole frame is there (a 1 MiB read is 16+ chunks).
    this.chunks.push(b);
    this.have += b.length;
    for (;;) {
      if (this.need < 0) {
        if (this.have < 4) return;
        this.flatten();
        this.need = 4 + this.chunks[0]!.readUInt32LE(0);
      }
      if (this.have < this.need) return;
      this.flatten();
      const all = this.chunks[0]!;
      const frame = all.subarray(4, this.need);
      const rest = all.subarray(this.need);
      this.chunks = rest.length ? [rest] : [];
      this.have = rest.length;
      this.need = -1;
      const p = this.inflight.shift();
      if (this.inflight.length === 0) this.idle();
      p?.resolve(frame, this);
      this.pump();
    }
  }

  private flatten(): void {
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks, this.have)];
  }

  pump: () => void = () => undefined;

  close(): void {
    this.dead = true;
    this.child.stdin.end();
    this.child.kill('SIGKILL');
  }
}
