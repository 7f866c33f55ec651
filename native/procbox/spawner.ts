// Standby exec helpers started by `procbox spawner` (spawner.c) instead of Node's spawn: one
// spawner per runtime, spawned once; each standby then costs a fork of that small static
// process, not a fork of the Node server (page tables of hundreds of MiB copied, the event loop
// blocked until the child has exec'd: 3-9 ms of CPU per helper measured, more under load).
// The helper's fds 0-3 are unix stream sockets the spawner connects to a listening socket of
// this process at a random abstract address (the host's network namespace only; a sandbox has its
// own), each announcing "TOKEN K\n" first; they are paired with the request by its 128-bit token.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import net from 'node:net';
import { PassThrough, type Readable, type Writable } from 'node:stream';

/** What exec.ts uses of a helper process: a ChildProcess, or a SpawnedHelper. */
export type HelperProcess = Pick<
  ChildProcess,
  'stdin' | 'stdout' | 'stderr' | 'stdio' | 'pid' | 'exitCode' | 'signalCode' | 'kill' | 'ref' | 'unref'
> &
  Pick<EventEmitter, 'once' | 'on'>;

const HELLO_BYTES = 35; // 32 hex digits, a space, the fd digit, a newline
const CONNECT_MS = 5000;

/** A helper started by the spawner: its fds 0-3 are sockets (set as they connect), its exit comes from the spawner. */
export class SpawnedHelper extends EventEmitter {
  pid: number | undefined;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  readonly streams: (net.Socket | null)[] = [null, null, null, null];
  /** Stand-ins for fds not connected yet when a command takes the helper (bridge). */
  private readonly proxies: (PassThrough | null)[] = [null, null, null, null];
  private exited = false;
  private refd = false;
  /** This helper counts in its spawner's holds (ref'd and not yet reported ended). */
  private holding = false;

  constructor(
    readonly token: string,
    private readonly owner: Spawner,
  ) {
    super();
  }
  private stream(k: number): net.Socket | PassThrough | null {
    return this.proxies[k] ?? this.streams[k] ?? null;
  }
  get stdin(): Writable | null {
    return this.stream(0);
  }
  get stdout(): Readable | null {
    return this.stream(1);
  }
  get stderr(): Readable | null {
    return this.stream(2);
  }
  get stdio(): ChildProcess['stdio'] {
    return [this.stdin, this.stdout, this.stderr, this.stream(3), undefined];
  }
  /**
   * A command takes the helper before all its fds are connected (right after the spawn): each missing one gets a
   * stand-in stream, joined to the socket when it connects, so the command need not wait for it nor spawn its own.
   */
  bridge(): void {
    if (this.exited) return;
    for (let k = 0; k < 4; k++) {
      if (this.streams[k] || this.proxies[k]) continue;
      const p = new PassThrough();
      this.proxies[k] = p;
      if (k === 3) this.emit('fd3', p);
    }
  }
  /** The spawner reported its exit (or it failed). */
  get hasExited(): boolean {
    return this.exited;
  }
  /** All four fds connected. */
  get connected(): boolean {
    return this.streams.every((s) => s !== null);
  }
  kill(signal: NodeJS.Signals | number = 'SIGTERM'): boolean {
    if (this.exited) return false;
    const n = typeof signal === 'number' ? signal : (SIGNALS[signal] ?? 9);
    this.owner.send(`kill\t${this.token}\t${n}`);
    return true;
  }
  /**
   * Keeps the event loop alive until the helper's end is known: its sockets, and the spawner's
   * pipe that reports the end (the sockets may close before that line arrives), as a spawned
   * ChildProcess's ref() does. A command or job waiting on a standby refs it.
   */
  ref(): void {
    this.refd = true;
    for (const s of this.streams) s?.ref();
    if (!this.holding && !this.exited) ((this.holding = true), this.owner.hold(1));
  }
  unref(): void {
    this.refd = false;
    for (const s of this.streams) s?.unref();
    this.release();
  }
  private release(): void {
    if (this.holding) ((this.holding = false), this.owner.hold(-1));
  }
  attach(k: number, s: net.Socket): void {
    this.streams[k] = s;
    if (!this.refd) s.unref();
    if (k === 0) s.on('error', () => undefined);
    const p = this.proxies[k];
    if (!p) return void this.emit(`fd${k}`, s);
    if (k === 0) p.pipe(s);
    else s.pipe(p);
    p.once('close', () => s.destroy());
  }
  exit(code: number, sig: number): void {
    if (this.exited) return;
    this.exited = true;
    this.exitCode = sig ? null : code;
    this.signalCode = sig ? ((SIGNAL_NAMES.get(sig) as NodeJS.Signals | undefined) ?? 'SIGKILL') : null;
    this.release();
    this.emit('exit', this.exitCode, this.signalCode);
  }
  fail(err: Error): void {
    if (this.exited) return;
    this.exited = true;
    this.release();
    for (const s of this.streams) s?.destroy();
    for (const p of this.proxies) p?.end();
    this.emit('error', err);
  }
}

const SIGNALS: Record<string, number> = { SIGTERM: 15, SIGKILL: 9, SIGINT: 2, SIGHUP: 1 };
const SIGNAL_NAMES = new Map(Object.entries(SIGNALS).map(([k, v]) => [v, k]));

/** One `procbox spawner` and the listening socket its helpers' fds connect to. */
export class Spawner {
  private readonly child: ChildProcess;
  private readonly server: net.Server;
  private readonly helpers = new Map<string, SpawnedHelper>();
  private buf = '';
  dead = false;
  /** Helpers started through it (tests, metrics). */
  started = 0;
  /** Ref'd helpers not yet ended: while there are any, the pipe reporting their ends is ref'd. */
  private holds = 0;

  /** The abstract address its helpers connect to ("\0" + name). */
  readonly address: string;

  constructor(helper: string) {
    const name = `fluxvm-spawner-${randomBytes(16).toString('hex')}`;
    this.address = `\0${name}`;
    this.server = net.createServer((s) => this.accept(s));
    this.server.on('error', () => this.stop());
    this.server.listen(this.address);
    this.server.unref();
    this.child = spawn(helper, ['spawner', name], { stdio: ['pipe', 'pipe', 'ignore'] });
    this.child.unref();
    (this.child.stdout as unknown as { unref(): void }).unref();
    (this.child.stdin as unknown as { unref(): void }).unref();
    this.child.stdin!.on('error', () => undefined);
    this.child.stdout!.setEncoding('utf8');
    this.child.stdout!.on('data', (d: string) => this.onData(d));
    this.child.on('exit', () => this.stop());
    this.child.on('error', () => this.stop());
  }

  /** Starts `procbox exec PID WS - ...` (a standby: `args` after the binary's name). */
  spawnStandby(args: string[]): SpawnedHelper {
    if (this.dead) throw new Error('the procbox spawner has ended');
    if (args.some((a) => a.includes('\t') || a.includes('\n') || a.includes('\0')))
      throw new Error('a spawner argument holds a tab, newline or NUL');
    const h = new SpawnedHelper(randomBytes(16).toString('hex'), this);
    this.helpers.set(h.token, h);
    this.started++;
    this.send(['spawn', h.token, ...args].join('\t'));
    return h;
  }

  /** One ref'd helper more (+1) or less (-1); see SpawnedHelper.ref. */
  hold(d: 1 | -1): void {
    const before = this.holds;
    this.holds = Math.max(0, this.holds + d);
    const out = this.child.stdout as unknown as { ref(): void; unref(): void };
    if (before === 0 && this.holds > 0 && !this.dead) out.ref();
    else if (before > 0 && this.holds === 0) out.unref();
  }

  send(line: string): void {
    if (!this.dead) this.child.stdin!.write(line + '\n');
  }

  /** Ends the spawner (its helpers are killed by it) and the listening socket. */
  stop(): void {
    if (this.dead) return;
    this.dead = true;
    this.server.close();
    this.child.stdin?.end();
    this.child.kill('SIGKILL');
    for (const h of this.helpers.values()) h.fail(new Error('the procbox spawner ended'));
    this.helpers.clear();
    this.holds = 0;
    (this.child.stdout as unknown as { unref(): void }).unref();
  }

  private onData(d: string): void {
    this.buf += d;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const [word, token, ...rest] = this.buf.slice(0, nl).split(' ');
      this.buf = this.buf.slice(nl + 1);
      const h = token ? this.helpers.get(token) : undefined;
      if (!h) continue;
      if (word === 'pid') h.pid = Number(rest[0]);
      else if (word === 'exit') {
        // Its sockets were connected before it ran, but this process may not have accepted them all yet
        // (a fast command, a busy event loop): it stays findable by its token until they are in.
        if (h.connected) this.helpers.delete(h.token);
        else setTimeout(() => this.helpers.delete(h.token), CONNECT_MS).unref();
        h.exit(Number(rest[0]), Number(rest[1]));
      } else if (word === 'err') {
        this.helpers.delete(h.token);
        h.fail(new Error(`procbox spawner: ${rest.join(' ')}`));
      }
    }
  }

  /** A helper's fd connecting: its first 35 bytes name the request (token) and the fd; anything else is dropped. */
  private accept(s: net.Socket): void {
    s.unref();
    const timer = setTimeout(() => s.destroy(), CONNECT_MS);
    timer.unref();
    s.on('error', () => undefined);
    // Read in paused mode (no 'data' listener), so nothing after the greeting is lost before the user of the
    // stream attaches its own listeners.
    const onReadable = () => {
      const b = s.read(HELLO_BYTES) as Buffer | null;
      if (b === null) return;
      s.off('readable', onReadable);
      clearTimeout(timer);
      const m = /^([0-9a-f]{32}) ([0-3])\n$/.exec(b.toString('latin1'));
      const h = m ? this.helpers.get(m[1]!) : undefined;
      const k = m ? Number(m[2]) : -1;
      if (!h || h.streams[k]) return void s.destroy();
      h.attach(k, s);
      if (h.connected && h.hasExited) this.helpers.delete(h.token);
    };
    s.on('readable', onReadable);
  }
}
