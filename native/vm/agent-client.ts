// Host side of the guest agent protocol (native/vm/agent/README.md): frames of
// u32 total | u32 header length | JSON header | payload, requests matched to replies by id.
// Works over any byte stream: the VM's virtio-serial unix socket, or a host process's
// stdin/stdout in the tests.
import { createHash } from 'node:crypto';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { posix } from 'node:path';
import {
  RuntimeError,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type FileRange,
  type TtySize,
  type WriteFileOptions,
} from '../runtime.js';
import { validTty, type GuestConfine } from './confine.js';
import { DEFAULT_MANIFEST_LIMITS, type Manifest, type ManifestLimits } from '../workspace/types.js';
import { compareUtf8, encodePath, normalizeSandboxPath, validateSandboxPaths } from '../workspace/paths.js';

import {
  AGENT_LIMITS,
  AgentProtocolError,
  ENTRY_TYPES,
  FINGERPRINT_RE,
  FrameDecoder,
  text,
  toError,
  checkPath,
  PROTOCOL_VERSION,
  type Header,
} from './agent-frames.js';

// The protocol's frames and value checks live in agent-frames.ts; importers of this module keep
// finding them here.
export {
  AGENT_LIMITS,
  AgentProtocolError,
  checkJsonDepth,
  checkPath,
  FrameDecoder,
  parseHeader,
  PROTOCOL_VERSION,
} from './agent-frames.js';

/** Bytes per read/write request; the agent accepts up to 16 MiB. */
const FILE_CHUNK = 4 * 1024 * 1024;

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
export class AgentClient {
  private nextId = 1;
  private readonly decoder: FrameDecoder;
  private readonly limits: typeof AGENT_LIMITS;
  private readonly timers: AgentTimers;
  private stallTimer: unknown;
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

  /** A frame left incomplete with no new byte for stallMs is a truncated frame. */
  private armStall(): void {
    if (this.stallTimer !== undefined) this.timers.clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
    if (this.decoder.buffered === 0 || this.closedErr) return;
    const held = this.decoder.buffered;
    this.stallTimer = this.timers.setTimeout(() => {
      this.stallTimer = undefined;
      this.violate(
        `truncated frame: ${held} bytes of an incomplete frame and nothing more for ${this.limits.stallMs} ms`,
      );
    }, this.limits.stallMs);
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
      let timer: NodeJS.Timeout | undefined;
      if (timeoutMs) {
        timer = setTimeout(() => {
          this.pending.delete(id);
          reject(new RuntimeError('Internal', `agent did not answer ${op} within ${timeoutMs} ms`));
        }, timeoutMs);
      }
      this.pending.set(id, {
        resolve: (v) => {
          if (timer) clearTimeout(timer);
          resolve(v);
        },
        reject: (e) => {
          if (timer) clearTimeout(timer);
          reject(e);
        },
      });
      try {
        this.send({ ...args, op, id }, payload);
      } catch (e) {
        this.pending.delete(id);
        if (timer) clearTimeout(timer);
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
              exitResolve({
                exitCode: code,
                ...(typeof h.signal === 'string' ? { signal: h.signal } : {}),
                timedOut: h.timedOut === true,
              });
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

  /** One directory entry from the guest, checked field by field (a bad one is a violation). */
  private entry(dir: string, e: unknown, what: string): FileEntry {
    const bad = (why: string) => this.violate(`${what}: ${why}`);
    if (typeof e !== 'object' || e === null || Array.isArray(e)) throw bad('entry is not an object');
    const r = e as Record<string, unknown>;
    const name = r.name;
    if (
      typeof name !== 'string' ||
      name === '' ||
      Buffer.byteLength(name) > 255 ||
      name.includes('/') ||
      name.includes('\0')
    )
      throw bad('entry name');
    if (typeof r.type !== 'string' || !ENTRY_TYPES.has(r.type)) throw bad('entry type');
    for (const k of ['size', 'mode', 'mtimeSec', 'mtimeNsec'] as const) {
      if (typeof r[k] !== 'number' || !Number.isSafeInteger(r[k])) throw bad(`entry ${k}`);
    }
    if ((r.size as number) < 0 || (r.mtimeNsec as number) < 0 || (r.mtimeNsec as number) >= 1e9)
      throw bad('entry size or time');
    if (r.linkTarget !== undefined && (typeof r.linkTarget !== 'string' || Buffer.byteLength(r.linkTarget) > 4096))
      throw bad('entry link target');
    const e2 = r;
    const ms = Number(e2.mtimeSec) * 1000 + Math.floor(Number(e2.mtimeNsec) / 1e6);
    if (!Number.isFinite(new Date(ms).getTime())) throw bad('entry time out of range');
    return {
      path: dir === undefined ? name : posix.join(dir, name),
      name,
      type: e2.type as FileEntry['type'],
      size: Number(e2.size),
      mode: Number(e2.mode) & 0o7777,
      mtime: new Date(ms).toISOString(),
      ...(typeof e2.linkTarget === 'string' ? { linkTarget: e2.linkTarget } : {}),
    };
  }

  async stat(path: string): Promise<FileEntry> {
    const p = checkPath(path);
    const { h } = await this.call('stat', { path: p });
    return { ...this.entry(posix.dirname(p), h.entry, 'stat reply'), path: p };
  }

  async listFiles(path: string): Promise<FileEntry[]> {
    const p = checkPath(path);
    const { h } = await this.call('list', { path: p });
    if (!Array.isArray(h.entries)) throw this.violate('list reply without an entries array');
    if (h.entries.length > this.limits.maxListEntries)
      throw this.violate(`list reply of ${h.entries.length} entries (cap ${this.limits.maxListEntries})`);
    return h.entries.map((e) => this.entry(p, e, 'list reply'));
  }

  /** Reads a whole file in chunks; LimitExceeded when it is larger than maxBytes. */
  async readFile(path: string, opts: { maxBytes?: number } = {}): Promise<Buffer> {
    const p = checkPath(path);
    const max = Math.min(opts.maxBytes ?? this.limits.maxReadBytes, this.limits.maxReadBytes);
    const parts: Buffer[] = [];
    let off = 0;
    for (;;) {
      const { h, payload } = await this.call('read', { path: p, offset: off, length: FILE_CHUNK });
      const size = h.size;
      if (typeof size !== 'number' || !Number.isSafeInteger(size) || size < 0)
        throw this.violate('read reply without a size');
      if (payload.length > FILE_CHUNK)
        throw this.violate(`read reply of ${payload.length} bytes for a request of ${FILE_CHUNK}`);
      if (size > max) throw new RuntimeError('LimitExceeded', `${p} is ${size} bytes, more than ${max}`);
      // The guest's size may change between chunks (the file grows): never keep past max.
      if (off + payload.length > max) throw new RuntimeError('LimitExceeded', `${p} is more than ${max} bytes`);
      parts.push(payload);
      off += payload.length;
      if (payload.length < FILE_CHUNK || off >= size) break;
    }
    return Buffer.concat(parts);
  }

  /** Writes through a temporary file renamed over the target, so readers never see half a file. */
  async writeFile(path: string, data: Buffer, opts: WriteFileOptions = {}): Promise<void> {
    const p = checkPath(path);
    if (p === '/') throw new RuntimeError('InvalidPath', 'cannot write /');
    let off = 0;
    do {
      const chunk = data.subarray(off, off + FILE_CHUNK);
      const last = off + chunk.length >= data.length;
      await this.call(
        'write',
        {
          path: p,
          offset: off,
          last,
          mkdirs: opts.mkdirs ?? false,
          ...(opts.mode !== undefined ? { mode: opts.mode } : {}),
        },
        chunk,
      );
      off += chunk.length;
    } while (off < data.length);
  }

  /**
   * Streams exactly `opts.size` bytes of `data` into the file at `path` through the agent's
   * chunked write (a partial file next to the destination, renamed over it by the last chunk):
   * at most one chunk (4 MiB) is held here. A stream that ends short or runs long never sends
   * the last chunk, so nothing is renamed into place (InvalidArgument); the partial file is removed.
   */
  async writeFileStream(
    path: string,
    data: AsyncIterable<Buffer>,
    opts: WriteFileOptions & { size: number },
  ): Promise<void> {
    const p = checkPath(path);
    if (p === '/') throw new RuntimeError('InvalidPath', 'cannot write /');
    const base = { path: p, mkdirs: opts.mkdirs ?? false, ...(opts.mode !== undefined ? { mode: opts.mode } : {}) };
    let off = 0;
    let pending: Buffer[] = [];
    let held = 0;
    const flush = async (last: boolean) => {
      const chunk = Buffer.concat(pending, held);
      pending = [];
      held = 0;
      await this.call('write', { ...base, offset: off, last }, chunk);
      off += chunk.length;
    };
    try {
      for await (const piece of data) {
        let b = piece;
        if (off + held + b.length > opts.size)
          throw new RuntimeError('InvalidArgument', `${p}: more than the ${opts.size} bytes announced`);
        while (b.length > 0) {
          const take = b.subarray(0, FILE_CHUNK - held);
          pending.push(take);
          held += take.length;
          b = b.subarray(take.length);
          if (held === FILE_CHUNK && off + held < opts.size) await flush(false);
        }
      }
      if (off + held !== opts.size)
        throw new RuntimeError('InvalidArgument', `${p}: ${off + held} bytes arrived, ${opts.size} were announced`);
      await flush(true);
    } catch (e) {
      if (off > 0)
        await this.deleteFile(posix.join(posix.dirname(p), `.${posix.basename(p)}.fluxvm-partial`)).catch(
          () => undefined,
        );
      throw e;
    }
  }

  /**
   * Up to `length` bytes of the file at `path` from `offset` (the agent's read, in chunks), its
   * size and mtime from a stat before and after (a validator no later read matches when they
   * differ), and with `checksum` the sha256 of the whole file, hashed here from chunked reads.
   */
  async readRange(path: string, offset: number, length: number, opts: { checksum?: boolean } = {}): Promise<FileRange> {
    const p = checkPath(path);
    const before = await this.stat(p);
    if (before.type === 'dir') throw new RuntimeError('IsADirectory', `is a directory: ${p}`);
    if (before.type !== 'file') throw new RuntimeError('InvalidArgument', `not a regular file: ${p}`);
    const readAt = async (off: number, len: number): Promise<{ payload: Buffer; size: number }> => {
      const { h, payload } = await this.call('read', { path: p, offset: off, length: len });
      const size = h.size;
      if (typeof size !== 'number' || !Number.isSafeInteger(size) || size < 0)
        throw this.violate('read reply without a size');
      if (payload.length > len) throw this.violate(`read reply of ${payload.length} bytes for a request of ${len}`);
      return { payload, size };
    };
    const parts: Buffer[] = [];
    let got = 0;
    let sizeSeen = before.size;
    while (got < length) {
      const { payload, size } = await readAt(offset + got, Math.min(FILE_CHUNK, length - got));
      sizeSeen = size;
      parts.push(payload);
      got += payload.length;
      if (payload.length === 0) break;
    }
    let sha256: string | undefined;
    if (opts.checksum) {
      const h = createHash('sha256');
      for (let off = 0; ;) {
        const { payload } = await readAt(off, FILE_CHUNK);
        if (payload.length === 0) break;
        h.update(payload);
        off += payload.length;
      }
      sha256 = h.digest('hex');
    }
    const after = await this.stat(p);
    const same = after.size === before.size && after.mtime === before.mtime && sizeSeen === before.size;
    return {
      data: Buffer.concat(parts, got),
      size: before.size,
      mtime: before.mtime,
      etag: same ? `"v-${before.size}-${Date.parse(before.mtime)}"` : `"changing-${Date.now()}"`,
      ...(sha256 ? { sha256 } : {}),
    };
  }

  async deleteFile(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const p = checkPath(path);
    if (p.split('/').filter(Boolean).length < 2) throw new RuntimeError('InvalidPath', `refusing to delete ${p}`);
    await this.call('delete', { path: p, recursive: opts.recursive ?? false });
  }

  async mkdir(path: string, mode = 0o755): Promise<void> {
    await this.call('mkdir', { path: checkPath(path), mode });
  }

  async mount(source: string, target: string, opts: { fstype?: string; bind?: boolean } = {}): Promise<void> {
    await this.call('mount', { source, target: checkPath(target), ...opts });
  }

  async sync(): Promise<void> {
    await this.call('sync');
  }

  /** sha256 manifest of regular files below `paths`, with the workspace layer's rules. */
  async manifest(paths: string[], limits: Partial<ManifestLimits> = {}): Promise<Manifest> {
    const l = { ...DEFAULT_MANIFEST_LIMITS, ...limits };
    validateSandboxPaths(paths, l);
    const roots = [...new Set(paths.map(normalizeSandboxPath))].sort(compareUtf8);
    const takenAt = new Date().toISOString();
    const { payload } = await this.call('manifest', {
      paths: roots,
      maxFiles: l.maxFiles,
      maxListingBytes: l.maxListingBytes,
    });
    const entries: { key: string; fp: string; mode: number }[] = [];
    const seen = new Set<string>();
    let listing = 0;
    let i = 0;
    const next = (): Buffer => {
      const j = payload.indexOf(0, i);
      if (j < 0) throw this.violate('manifest listing does not end in NUL');
      const b = payload.subarray(i, j);
      i = j + 1;
      return b;
    };
    const under = (k: string) => roots.some((r) => k.startsWith(r === '/' ? '/' : `${r}/`));
    while (i < payload.length) {
      const fp = next().toString('latin1');
      const modeText = next().toString('latin1');
      const key = encodePath(next());
      if (!FINGERPRINT_RE.test(fp)) throw this.violate('manifest entry with a malformed fingerprint');
      if (!/^[0-7]{1,4}$/.test(modeText)) throw this.violate('manifest entry with a malformed mode');
      if (!under(key) || key.split('/').some((c) => c === '..' || c === '.') || key.includes('//'))
        throw this.violate('manifest entry outside the requested paths');
      if (seen.has(key)) continue; // overlapping starting paths
      seen.add(key);
      entries.push({ key, fp, mode: parseInt(modeText, 8) });
      listing += Buffer.byteLength(key, 'utf8') + fp.length;
      // Counted while parsing: a guest listing past the caps costs no more than the caps.
      if (entries.length > l.maxFiles)
        throw new RuntimeError(
          'LimitExceeded',
          `more than ${l.maxFiles} files below ${roots.join(', ')}; narrow paths`,
        );
      if (listing > l.maxListingBytes)
        throw new RuntimeError('LimitExceeded', `listing larger than ${l.maxListingBytes} bytes; narrow paths`);
    }
    if (entries.length > l.maxFiles)
      throw new RuntimeError('LimitExceeded', `more than ${l.maxFiles} files below ${roots.join(', ')}; narrow paths`);
    if (listing > l.maxListingBytes)
      throw new RuntimeError('LimitExceeded', `listing larger than ${l.maxListingBytes} bytes; narrow paths`);
    entries.sort((a, b) => compareUtf8(a.key, b.key));
    const files: Record<string, string> = {};
    const modes: Record<string, number> = {};
    for (const e of entries) {
      files[e.key] = e.fp;
      modes[e.key] = e.mode;
    }
    return { mode: 'sha256', paths: roots, files, modes, takenAt };
  }

  /**
   * Configures the guest's NIC (eth0): `address`/`prefix` with a default route via `gateway`;
   * without `address`, no address and down. Loopback up, IPv6 off on it.
   */
  async net(opts: { address?: string; prefix?: number; gateway?: string } = {}): Promise<void> {
    await this.call('net', { ifname: 'eth0', ...opts });
  }

  /** Sets the clock, reseeds the kernel RNG, and optionally the hostname and machine-id. */
  async identity(opts: { time?: Date; seed?: Buffer; hostname?: string; machineId?: string }): Promise<void> {
    const args: Record<string, unknown> = {};
    if (opts.time) {
      const ms = opts.time.getTime();
      args.timeSec = Math.floor(ms / 1000);
      args.timeNsec = (ms % 1000) * 1e6;
    }
    if (opts.hostname !== undefined) args.hostname = opts.hostname;
    if (opts.machineId !== undefined) args.machineId = opts.machineId;
    await this.call('identity', args, opts.seed);
  }
}
