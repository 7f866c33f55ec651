// Host side of the guest agent protocol (native/vm/agent/README.md): frames of
// u32 total | u32 header length | JSON header | payload, requests matched to replies by id.
// Works over any byte stream: the VM's virtio-serial unix socket, or a host process's
// stdin/stdout in the tests.
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { posix } from 'node:path';
import { RuntimeError, type RuntimeErrorCode, type ExecRequest, type ExecResult, type ExecStream, type FileEntry, type WriteFileOptions } from '../runtime.js';
import { DEFAULT_MANIFEST_LIMITS, type Manifest, type ManifestLimits } from '../workspace/types.js';
import { compareUtf8, encodePath, normalizeSandboxPath, validateSandboxPaths } from '../workspace/paths.js';

export const PROTOCOL_VERSION = 1;
const MAX_FRAME = 64 * 1024 * 1024 + 64 * 1024;
/** Bytes per read/write request; the agent accepts up to 16 MiB. */
const FILE_CHUNK = 4 * 1024 * 1024;

type Header = Record<string, unknown> & { id: number };

interface Pending {
  resolve(v: { h: Header; payload: Buffer }): void;
  reject(e: Error): void;
}

interface ExecHandler {
  onEvent(h: Header, payload: Buffer): void;
  onClose(e: Error): void;
}

const CODES = new Set<RuntimeErrorCode>([
  'NotFound', 'InvalidPath', 'InvalidArgument', 'LimitExceeded', 'Unsupported', 'Busy', 'Conflict',
  'NotADirectory', 'IsADirectory', 'Internal',
]);

function toError(h: Header): RuntimeError {
  const code = CODES.has(h.code as RuntimeErrorCode) ? (h.code as RuntimeErrorCode) : 'Internal';
  return new RuntimeError(code, String(h.error ?? 'agent error'));
}

/** Same path rules as the workspace layer: absolute, no '..', no control characters. */
export function checkPath(p: string): string {
  // eslint-disable-next-line no-control-regex
  if (typeof p !== 'string' || !p.startsWith('/') || /[\x00-\x1f\x7f]/.test(p) || p.split('/').includes('..') || Buffer.byteLength(p) > 4096) {
    throw new RuntimeError('InvalidPath', `invalid path ${JSON.stringify(p)}`);
  }
  return p.length > 1 ? p.replace(/\/+$/, '') : p;
}

export interface AgentHello {
  v: number;
  agent: string;
  pid: number;
}

/**
 * One connection to a guest agent. Requests may be issued concurrently. When the stream
 * ends every pending call rejects with RuntimeError('Internal'); the client is then dead
 * (connect a new one).
 */
export class AgentClient {
  private nextId = 1;
  private buf: Buffer = Buffer.alloc(0);
  private pending = new Map<number, Pending>();
  private execs = new Map<number, ExecHandler>();
  private closedErr: Error | undefined;

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
  ) {
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

  private onData(d: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
    let off = 0;
    while (this.buf.length - off >= 8) {
      const total = this.buf.readUInt32BE(off);
      const hl = this.buf.readUInt32BE(off + 4);
      if (total > MAX_FRAME || hl + 4 > total) {
        this.fail(new RuntimeError('Internal', `agent sent a bad frame (${total}/${hl})`));
        return;
      }
      if (this.buf.length - off < 4 + total) break;
      const h = JSON.parse(this.buf.subarray(off + 8, off + 8 + hl).toString('utf8')) as Header;
      const payload = Buffer.from(this.buf.subarray(off + 8 + hl, off + 4 + total));
      off += 4 + total;
      this.dispatch(h, payload);
    }
    this.buf = off === this.buf.length ? Buffer.alloc(0) : this.buf.subarray(off);
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

  private send(h: Record<string, unknown>, payload?: Buffer): void {
    if (this.closedErr) throw this.closedErr;
    const hb = Buffer.from(JSON.stringify(h), 'utf8');
    const pre = Buffer.alloc(8);
    const plen = payload?.length ?? 0;
    pre.writeUInt32BE(4 + hb.length + plen, 0);
    pre.writeUInt32BE(hb.length, 4);
    this.output.write(payload && plen ? Buffer.concat([pre, hb, payload]) : Buffer.concat([pre, hb]));
  }

  /** Sends one request and resolves with the reply; rejects with the agent's RuntimeError. */
  async call(op: string, args: Record<string, unknown> = {}, payload?: Buffer, timeoutMs?: number): Promise<{ h: Header; payload: Buffer }> {
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
        resolve: (v) => { if (timer) clearTimeout(timer); resolve(v); },
        reject: (e) => { if (timer) clearTimeout(timer); reject(e); },
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
    if (h.v !== PROTOCOL_VERSION) throw new RuntimeError('Internal', `guest agent speaks protocol ${String(h.v)}, host ${PROTOCOL_VERSION}`);
    return { v: h.v as number, agent: String(h.agent), pid: Number(h.pid) };
  }

  async ping(timeoutMs?: number): Promise<void> {
    await this.call('ping', {}, undefined, timeoutMs);
  }

  /** Starts a command; events stream into the returned ExecStream. */
  execStream(req: Omit<ExecRequest, 'maxOutputBytes' | 'stdin'> & { stdin?: Buffer | string | boolean }): Promise<ExecStream> {
    if (!Array.isArray(req.argv) || req.argv.length === 0 || req.argv.some((a) => typeof a !== 'string')) {
      return Promise.reject(new RuntimeError('InvalidArgument', 'argv must be a non-empty list of strings'));
    }
    if (this.closedErr) return Promise.reject(this.closedErr);
    const id = this.nextId++;
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const started = performance.now();
    let exitResolve!: (v: { exitCode: number; signal?: string; timedOut: boolean }) => void;
    let exitReject!: (e: Error) => void;
    const exit = new Promise<{ exitCode: number; signal?: string; timedOut: boolean }>((res, rej) => {
      exitResolve = res;
      exitReject = rej;
    });
    exit.catch(() => undefined); // the caller may only await `started`
    let done = false;
    const client = this;
    const stdin = new PassThrough();
    stdin.on('data', (d: Buffer) => {
      if (!done && !client.closedErr) client.send({ op: 'stdin', id: client.nextId++, exec: id }, d);
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
            reject(toError(h));
            return;
          }
          switch (h.ev) {
            case 'started':
              resolve({
                stdin,
                stdout,
                stderr,
                exit,
                kill: () => {
                  if (!done && !this.closedErr) this.call('kill', { exec: id }).catch(() => undefined);
                },
              });
              break;
            case 'stdout':
              stdout.write(payload);
              break;
            case 'stderr':
              stderr.write(payload);
              break;
            case 'exit':
              done = true;
              this.execs.delete(id);
              stdout.end();
              stderr.end();
              exitResolve({
                exitCode: Number(h.exitCode),
                ...(typeof h.signal === 'string' ? { signal: h.signal } : {}),
                timedOut: h.timedOut === true,
              });
              break;
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
      return new Promise<{ data: Buffer; dropped: number }>((res) => r.on('end', () => res({ data: Buffer.concat(parts), dropped })));
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

  private entry(dir: string, e: Record<string, unknown>): FileEntry {
    const name = String(e.name);
    const ms = Number(e.mtimeSec) * 1000 + Math.floor(Number(e.mtimeNsec) / 1e6);
    return {
      path: dir === undefined ? name : posix.join(dir, name),
      name,
      type: e.type as FileEntry['type'],
      size: Number(e.size),
      mode: Number(e.mode) & 0o7777,
      mtime: new Date(ms).toISOString(),
      ...(typeof e.linkTarget === 'string' ? { linkTarget: e.linkTarget } : {}),
    };
  }

  async stat(path: string): Promise<FileEntry> {
    const p = checkPath(path);
    const { h } = await this.call('stat', { path: p });
    return { ...this.entry(posix.dirname(p), h.entry as Record<string, unknown>), path: p };
  }

  async listFiles(path: string): Promise<FileEntry[]> {
    const p = checkPath(path);
    const { h } = await this.call('list', { path: p });
    return (h.entries as Record<string, unknown>[]).map((e) => this.entry(p, e));
  }

  /** Reads a whole file in chunks; LimitExceeded when it is larger than maxBytes. */
  async readFile(path: string, opts: { maxBytes?: number } = {}): Promise<Buffer> {
    const p = checkPath(path);
    const max = opts.maxBytes ?? Number.MAX_SAFE_INTEGER;
    const parts: Buffer[] = [];
    let off = 0;
    for (;;) {
      const { h, payload } = await this.call('read', { path: p, offset: off, length: FILE_CHUNK });
      const size = Number(h.size);
      if (size > max) throw new RuntimeError('LimitExceeded', `${p} is ${size} bytes, more than ${max}`);
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
      await this.call('write', { path: p, offset: off, last, mkdirs: opts.mkdirs ?? false, ...(opts.mode !== undefined ? { mode: opts.mode } : {}) }, chunk);
      off += chunk.length;
    } while (off < data.length);
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
    const { payload } = await this.call('manifest', { paths: roots, maxFiles: l.maxFiles, maxListingBytes: l.maxListingBytes });
    const entries: { key: string; fp: string; mode: number }[] = [];
    const seen = new Set<string>();
    let listing = 0;
    let i = 0;
    const next = (): Buffer => {
      const j = payload.indexOf(0, i);
      if (j < 0) throw new RuntimeError('Internal', 'agent sent a malformed manifest');
      const b = payload.subarray(i, j);
      i = j + 1;
      return b;
    };
    while (i < payload.length) {
      const fp = next().toString('latin1');
      const mode = parseInt(next().toString('latin1'), 8);
      const key = encodePath(next());
      if (seen.has(key)) continue; // overlapping starting paths
      seen.add(key);
      entries.push({ key, fp, mode });
      listing += Buffer.byteLength(key, 'utf8') + fp.length;
    }
    if (entries.length > l.maxFiles) throw new RuntimeError('LimitExceeded', `more than ${l.maxFiles} files below ${roots.join(', ')}; narrow paths`);
    if (listing > l.maxListingBytes) throw new RuntimeError('LimitExceeded', `listing larger than ${l.maxListingBytes} bytes; narrow paths`);
    entries.sort((a, b) => compareUtf8(a.key, b.key));
    const files: Record<string, string> = {};
    const modes: Record<string, number> = {};
    for (const e of entries) {
      files[e.key] = e.fp;
      modes[e.key] = e.mode;
    }
    return { mode: 'sha256', paths: roots, files, modes, takenAt };
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
