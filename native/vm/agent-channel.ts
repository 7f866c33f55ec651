// Host side of the guest agent protocol (native/vm/agent/README.md), the connection: frames of
// u32 total | u32 header length | JSON header | payload, requests matched to replies by id,
// commands (exec events) and the checks on what the guest sends back for them. Works over any
// byte stream: the VM's virtio-serial unix socket, or a host process's stdin/stdout in the tests.
// The file, manifest and setup requests are in agent-client.ts (AgentClient extends AgentChannel).
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { RuntimeError, type ExecRequest, type ExecResult, type ExecStream, type TtySize } from '../runtime.js';
import { validTty, type GuestConfine } from './confine.js';
import { HoldableTimeouts } from './holdable.js';

import {
  AGENT_LIMITS,
  AgentProtocolError,
  FrameDecoder,
  text,
  toError,
  PROTOCOL_VERSION,
  type Header,
} from './agent-frames.js';

/** How long a command's unread output waits for a reader after its exit (readOut). */
const READ_GRACE_MS = 500;

/** Timers the client uses (injectable so tests control time). */
export interface AgentTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(t: unknown): void;
}

export interface AgentClientOptions {
  /**
   * Called once when the guest breaks the protocol, after the channel is closed and every
   * pending call rejected: the VM backend fails the sandbox. Must not throw (a throw is caught).
   */
  onViolation?: (err: AgentProtocolError) => void;
  /** Overrides of AGENT_LIMITS (tests). */
  limits?: Partial<typeof AGENT_LIMITS>;
  timers?: AgentTimers;
}

interface Pending {
  resolve(v: { h: Header; payload: Buffer }): void;
  reject(e: Error): void;
}

interface ExecHandler {
  onEvent(h: Header, payload: Buffer): void;
  onClose(e: Error): void;
}

export interface AgentHello {
  v: number;
  agent: string;
  pid: number;
  /** The Landlock ABI the guest kernel offers (0: none). */
  landlock: number;
}

/**
 * One connection to a guest agent. Requests may be issued concurrently. When the stream
 * ends every pending call rejects with RuntimeError('Internal'); the client is then dead
 * (connect a new one).
 */
export class AgentChannel {
  private nextId = 1;
  private readonly decoder: FrameDecoder;
  protected readonly limits: typeof AGENT_LIMITS;
  private readonly timers: AgentTimers;
  private stallTimer: unknown;
  /** Call timeouts; held while the guest is paused (hold/release). */
  private readonly callTimeouts = new HoldableTimeouts();
  private pending = new Map<number, Pending>();
  private execs = new Map<number, ExecHandler>();
  private closedErr: Error | undefined;
  /** Exec output streams whose reader lags: the channel is paused until they drain. */
  private readonly backlogged = new Set<PassThrough>();
  /** The violation that closed this client, if one did. */
  violation: AgentProtocolError | undefined;

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
    private readonly opts: AgentClientOptions = {},
  ) {
    this.limits = { ...AGENT_LIMITS, ...(opts.limits ?? {}) };
    this.decoder = new FrameDecoder(this.limits);
    this.timers = opts.timers ?? {
      setTimeout: (fn, ms) => setTimeout(fn, ms),
      clearTimeout: (t) => clearTimeout(t as NodeJS.Timeout),
    };
    input.on('data', (d: Buffer) => this.onData(d));
    input.on('end', () => this.fail(new RuntimeError('Internal', 'agent connection closed')));
    input.on('close', () => this.fail(new RuntimeError('Internal', 'agent connection closed')));
    input.on('error', (e) => this.fail(new RuntimeError('Internal', `agent connection: ${e.message}`)));
    output.on('error', (e) => this.fail(new RuntimeError('Internal', `agent connection: ${e.message}`)));
  }

  get closed(): boolean {
    return this.closedErr !== undefined;
  }

  /** Rejects everything pending; safe to call twice. */
  fail(err: Error): void {
    if (this.closedErr) return;
    this.closedErr = err;
    if (this.stallTimer !== undefined) this.timers.clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const x of this.execs.values()) x.onClose(err);
    this.execs.clear();
  }

  /** Closes the connection; pending calls reject. Safe to call twice. */
  close(): void {
    this.fail(new RuntimeError('Internal', 'agent connection closed by the host'));
    this.input.destroy();
    this.output.destroy();
  }

  /**
   * The guest broke the protocol: close the channel (every pending call rejects with `err`),
   * then tell the owner once. Returns the error so callers can `throw this.violate(...)`.
   */
  violate(message: string | AgentProtocolError): AgentProtocolError {
    const err = typeof message === 'string' ? new AgentProtocolError(message) : message;
    if (this.violation || this.closedErr) return this.violation ?? err;
    this.violation = err;
    this.fail(err);
    this.input.destroy();
    this.output.destroy();
    try {
      this.opts.onViolation?.(err);
    } catch {
      // the owner's bookkeeping must not turn a guest's bad frame into a host exception
    }
    return err;
  }

  private onData(d: Buffer): void {
    if (this.closedErr) return;
    try {
      for (const { h, payload } of this.decoder.push(d)) {
        this.dispatch(h, payload);
        if (this.closedErr) return;
      }
    } catch (e) {
      this.violate(
        e instanceof AgentProtocolError ? e : new AgentProtocolError(`handling a frame: ${(e as Error).message}`),
      );
      return;
    }
    this.armStall();
  }

  /**
   * The guest is paused (idle standby, idle.ts): call timeouts stop counting and an incomplete
   * frame is not a stall until release() (a stopped guest cannot finish it).
   */
  hold(): void {
    this.callTimeouts.hold();
    if (this.stallTimer !== undefined) this.timers.clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
  }

  /** The guest runs again: the held timeouts go on for what they had left; a stall counts anew. */
  release(): void {
    this.callTimeouts.release();
    this.armStall();
  }

  /** A frame left incomplete with no new byte for stallMs is a truncated frame. */
  private armStall(): void {
    if (this.stallTimer !== undefined) this.timers.clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
    if (this.decoder.buffered === 0 || this.closedErr || this.callTimeouts.held) return;
    const held = this.decoder.buffered;
    this.stallTimer = this.timers.setTimeout(() => {
      this.stallTimer = undefined;
      this.violate(
        `truncated frame: ${held} bytes of an incomplete frame and nothing more for ${this.limits.stallMs} ms`,
      );
    }, this.limits.stallMs);
  }

  /**
   * Resolves once an ended exec stream was read to its end: at once when nothing is left in it,
   * else when its reader gets the end. Output nobody started reading within READ_GRACE_MS is
   * dropped (a caller that never reads must not hold its exit); a reader that paused (a slow
   * socket behind it) is waited for.
   */
  private readOut(s: PassThrough): Promise<void> {
    if (s.destroyed || s.readableEnded || s.readableLength + s.writableLength === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = this.timers.setTimeout(() => {
        if (s.readableFlowing !== null || s.listenerCount('readable') > 0) return;
        s.destroy();
        resolve();
      }, READ_GRACE_MS);
      const done = () => {
        this.timers.clearTimeout(timer);
        resolve();
      };
      s.once('end', done);
      s.once('close', done);
    });
  }

  /** Writes exec output; pauses the whole channel while a reader lags by more than the cap. */
  private deliver(s: PassThrough, payload: Buffer): void {
    if (s.writableEnded || s.destroyed) return;
    // The streams' highWaterMark is maxBufferedOutput: write() says false once a reader lags
    // by about that much, and the channel waits for it ('drain') rather than buffer on.
    if (!s.write(payload) && !this.backlogged.has(s)) {
      this.backlogged.add(s);
      this.input.pause();
      const resume = () => {
        this.backlogged.delete(s);
        if (this.backlogged.size === 0 && !this.closedErr) this.input.resume();
      };
      s.once('drain', resume);
      s.once('close', resume);
    }
  }

  private dispatch(h: Header, payload: Buffer): void {
    const x = this.execs.get(h.id);
    if (x && (h.ev !== undefined || h.ok === false)) {
      x.onEvent(h, payload);
      return;
    }
    const p = this.pending.get(h.id);
    if (!p) return;
    this.pending.delete(h.id);
    if (h.ok === false) p.reject(toError(h));
    else p.resolve({ h, payload });
  }

  /** Sends one frame; false when the connection's buffer is full (wait for its 'drain'). */
  private send(h: Record<string, unknown>, payload?: Buffer): boolean {
    if (this.closedErr) throw this.closedErr;
    const hb = Buffer.from(JSON.stringify(h), 'utf8');
    const pre = Buffer.alloc(8);
    const plen = payload?.length ?? 0;
    pre.writeUInt32BE(4 + hb.length + plen, 0);
    pre.writeUInt32BE(hb.length, 4);
    return this.output.write(payload && plen ? Buffer.concat([pre, hb, payload]) : Buffer.concat([pre, hb]));
  }

  /** Sends one request and resolves with the reply; rejects with the agent's RuntimeError. */
  async call(
    op: string,
    args: Record<string, unknown> = {},
    payload?: Buffer,
    timeoutMs?: number,
  ): Promise<{ h: Header; payload: Buffer }> {
    if (this.closedErr) throw this.closedErr;
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      let timer: object | undefined;
      if (timeoutMs) {
        timer = this.callTimeouts.set(() => {
          this.pending.delete(id);
          reject(new RuntimeError('Internal', `agent did not answer ${op} within ${timeoutMs} ms`));
        }, timeoutMs);
      }
      this.pending.set(id, {
        resolve: (v) => {
          this.callTimeouts.clear(timer);
          resolve(v);
        },
        reject: (e) => {
          this.callTimeouts.clear(timer);
          reject(e);
        },
      });
      try {
        this.send({ ...args, op, id }, payload);
      } catch (e) {
        this.pending.delete(id);
        this.callTimeouts.clear(timer);
        reject(e as Error);
      }
    });
  }

  async hello(timeoutMs?: number): Promise<AgentHello> {
    const { h } = await this.call('hello', { v: PROTOCOL_VERSION }, undefined, timeoutMs);
    if (h.v !== PROTOCOL_VERSION)
      throw new RuntimeError(
        'Internal',
        `guest agent speaks protocol ${text(JSON.stringify(h.v), 64)}, host ${PROTOCOL_VERSION}`,
      );
    // The guest's Landlock ABI (confine.c); a missing or odd value is 0 (no confinement offered).
    const ll =
      typeof h.landlock === 'number' && Number.isSafeInteger(h.landlock) && h.landlock >= 0 && h.landlock <= 64
        ? h.landlock
        : 0;
    return { v: h.v as number, agent: text(h.agent, 64), pid: Number(h.pid), landlock: ll };
  }

  async ping(timeoutMs?: number): Promise<void> {
    await this.call('ping', {}, undefined, timeoutMs);
  }

  /** Starts a command; events stream into the returned ExecStream. */
  execStream(
    req: Omit<ExecRequest, 'maxOutputBytes' | 'stdin'> & { stdin?: Buffer | string | boolean; confine?: GuestConfine },
  ): Promise<ExecStream> {
    if (req.tty && !validTty(req.tty))
      return Promise.reject(new RuntimeError('InvalidArgument', 'tty: rows and cols must be integers 1..65535'));
    if (!Array.isArray(req.argv) || req.argv.length === 0 || req.argv.some((a) => typeof a !== 'string')) {
      return Promise.reject(new RuntimeError('InvalidArgument', 'argv must be a non-empty list of strings'));
    }
    if (this.closedErr) return Promise.reject(this.closedErr);
    const id = this.nextId++;
    const stdout = new PassThrough({ highWaterMark: this.limits.maxBufferedOutput });
    const stderr = new PassThrough({ highWaterMark: this.limits.maxBufferedOutput });
    const started = performance.now();
    let exitResolve!: (v: { exitCode: number; signal?: string; timedOut: boolean }) => void;
    let exitReject!: (e: Error) => void;
    const exit = new Promise<{ exitCode: number; signal?: string; timedOut: boolean }>((res, rej) => {
      exitResolve = res;
      exitReject = rej;
    });
    exit.catch(() => undefined); // the caller may only await `started`
    let done = false;
    let isStarted = false;
    const client = this;
    const stdin = new PassThrough();
    stdin.on('data', (d: Buffer) => {
      // Backpressure: a writer to stdin waits while the connection to the guest is full.
      if (!done && !client.closedErr && !client.send({ op: 'stdin', id: client.nextId++, exec: id }, d)) {
        stdin.pause();
        client.output.once('drain', () => stdin.resume());
      }
    });
    stdin.on('end', () => {
      if (!done && !client.closedErr) client.send({ op: 'stdin', id: client.nextId++, exec: id, eof: true });
    });
    return new Promise<ExecStream>((resolve, reject) => {
      this.execs.set(id, {
        onEvent: (h, payload) => {
          if (h.ok === false) {
            this.execs.delete(id);
            done = true;
            const err = toError(h);
            reject(err);
            // After `started` the caller holds the streams: end them and fail the exit.
            stdout.end();
            stderr.end();
            exitReject(err);
            return;
          }
          switch (h.ev) {
            case 'started':
              if (isStarted) throw new AgentProtocolError(`exec ${id} started twice`);
              isStarted = true;
              resolve({
                stdin,
                stdout,
                stderr,
                exit,
                kill: () => {
                  if (!done && !this.closedErr) this.call('kill', { exec: id }).catch(() => undefined);
                },
                // On a pty (pty.c): the new window size; no reply (the command may be gone).
                ...(req.tty
                  ? {
                      resize: (s: TtySize) => {
                        if (!done && !this.closedErr && validTty(s))
                          this.send({ op: 'resize', id: this.nextId++, exec: id, tty: { rows: s.rows, cols: s.cols } });
                      },
                    }
                  : {}),
              });
              break;
            case 'stdout':
              this.deliver(stdout, payload);
              break;
            case 'stderr':
              this.deliver(stderr, payload);
              break;
            case 'exit': {
              const code = h.exitCode;
              if (typeof code !== 'number' || !Number.isSafeInteger(code) || code < -1 || code > 512) {
                throw new AgentProtocolError(`exec ${id} exit code ${text(JSON.stringify(code), 64)}`);
              }
              if (
                h.signal !== undefined &&
                h.signal !== null &&
                (typeof h.signal !== 'string' || !/^[A-Z0-9+-]{1,16}$/.test(h.signal))
              ) {
                throw new AgentProtocolError(`exec ${id} signal name ${text(JSON.stringify(h.signal), 64)}`);
              }
              done = true;
              this.execs.delete(id);
              stdout.end();
              stderr.end();
              const r = {
                exitCode: code,
                ...(typeof h.signal === 'string' ? { signal: h.signal } : {}),
                timedOut: h.timedOut === true,
              };
              // The Runtime contract: `exit` resolves once the output was read. Frames that came
              // in one read (a busy host) end the streams before a caller that awaited `started`
              // attached its reader; resolving now let it see the exit first and lose the output.
              void Promise.all([this.readOut(stdout), this.readOut(stderr)]).then(() => exitResolve(r));
              break;
            }
            default:
              throw new AgentProtocolError(`exec ${id} event ${text(JSON.stringify(h.ev), 64)}`);
          }
        },
        onClose: (e) => {
          done = true;
          reject(e);
          stdout.end();
          stderr.end();
          exitReject(e);
        },
      });
      const hasStdin = req.stdin !== undefined && req.stdin !== false;
      try {
        this.send({
          op: 'exec',
          id,
          argv: req.argv,
          env: req.env ?? {},
          cwd: req.cwd,
          timeoutMs: req.timeoutMs ?? 0,
          stdin: hasStdin,
          ...(req.tty ? { tty: { rows: req.tty.rows, cols: req.tty.cols } } : {}),
          ...(req.confine ? { confine: req.confine } : {}),
        });
      } catch (e) {
        this.execs.delete(id);
        reject(e as Error);
        return;
      }
      if (typeof req.stdin === 'string' || Buffer.isBuffer(req.stdin)) {
        stdin.end(Buffer.from(req.stdin));
      }
      void started;
    });
  }

  /** Buffered exec: output beyond maxOutputBytes per stream is counted, not kept. */
  async exec(req: ExecRequest): Promise<ExecResult> {
    const t0 = performance.now();
    const max = req.maxOutputBytes ?? 64 * 1024 * 1024;
    const s = await this.execStream({ ...req, stdin: req.stdin ?? undefined });
    const collect = (r: Readable) => {
      const parts: Buffer[] = [];
      let kept = 0;
      let dropped = 0;
      r.on('data', (d: Buffer) => {
        const room = Math.max(0, max - kept);
        if (d.length <= room) {
          parts.push(d);
          kept += d.length;
        } else {
          if (room) parts.push(d.subarray(0, room));
          kept += room;
          dropped += d.length - room;
        }
      });
      return new Promise<{ data: Buffer; dropped: number }>((res) =>
        r.on('end', () => res({ data: Buffer.concat(parts), dropped })),
      );
    };
    const [out, err, ex] = await Promise.all([collect(s.stdout), collect(s.stderr), s.exit]);
    return {
      exitCode: ex.exitCode,
      ...(ex.signal ? { signal: ex.signal } : {}),
      stdout: out.data,
      stderr: err.data,
      stdoutDropped: out.dropped,
      stderrDropped: err.dropped,
      truncated: out.dropped > 0 || err.dropped > 0,
      timedOut: ex.timedOut,
      durationMs: performance.now() - t0,
    };
  }
}
