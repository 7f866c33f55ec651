// RemoteRuntime: the Runtime of a node agent (server.ts), reached over HTTP(S) with a bearer
// token. Controllers and API servers use it exactly as a local Runtime: every call goes to the
// agent's runtime and a RuntimeError thrown there is thrown here with the same code. A
// transport failure (agent unreachable, refused token, a reply that is not the agent's) is a
// RuntimeError 'Internal': callers retry it like any transient failure, and every call is
// idempotent by id, so repeating one after a lost reply is safe.
import http from 'node:http';
import https from 'node:https';
import { PassThrough } from 'node:stream';
import tls from 'node:tls';
import { nodeIdentityMismatch } from './identity.js';
import WebSocket from 'ws';
import {
  RuntimeError,
  type Capabilities,
  type CheckpointInfo,
  type ExecRequest,
  type ExecResult,
  type ExecStream,
  type FileEntry,
  type EgressTraffic,
  type ForkOptions,
  type ForkResult,
  type IdleDecision,
  type ResolvedExecutables,
  type Runtime,
  type SandboxConfig,
  type SandboxInfo,
  type TtySize,
  type WorkspaceMark,
  type WriteFileOptions,
} from '../runtime.js';
import type { Diff, Manifest, ManifestLimits } from '../workspace/types.js';
import {
  CH_CONTROL,
  CH_STDERR,
  CH_STDIN,
  CH_STDOUT,
  decode,
  encode,
  frame,
  NODE_HEADER,
  runtimeErrorOf,
  type CallName,
} from './wire.js';

export interface RemoteRuntimeOptions {
  /** http(s)://host:port of the node agent. */
  url: string;
  /** The agent's bearer token (optional with a client certificate, when the agent takes mTLS alone). */
  token?: string;
  /** mTLS: this caller's client certificate and key (PEM), from the cluster CA (identity.ts). */
  clientCert?: { cert: string | Buffer; key: string | Buffer };
  /** PEM CA bundle to verify an https agent with (default: the system CAs). */
  ca?: string | Buffer;
  /** Skip verification of the agent's certificate (tests only). */
  insecureSkipVerify?: boolean;
  /**
   * A call without an answer for this long fails with RuntimeError 'Internal' (a hung agent must
   * not hold a reconcile forever). Default 5 minutes; a buffered exec gets its own timeoutMs
   * (default 5 minutes) plus a minute.
   */
  callTimeoutMs?: number;
  /**
   * The node this client means to reach (a router that picked the agent for a sandbox bound to
   * this node): sent with every request as `X-Fluxvm-Node`, and the agent refuses (409 Conflict)
   * when it runs another node; start() fails the same way when /v1/info names another node.
   */
  node?: string;
  /** How often onWake listeners learn that a sandbox this client saw on standby woke (default 1 s). */
  wakePollMs?: number;
}

export class RemoteRuntime implements Runtime {
  private readonly base: URL;
  private readonly agent: http.Agent;
  private caps?: Capabilities;
  private backends: Partial<Record<Capabilities['backend'], Capabilities>> = {};
  private node = '';
  /** Sandboxes this client saw on standby (standbyIfIdle, inspect, list): polled for a wake while onWake listens. */
  private readonly sleeping = new Set<string>();
  private readonly wakeListeners: Array<(id: string) => void> = [];
  private wakePoll?: NodeJS.Timeout;

  constructor(private readonly o: RemoteRuntimeOptions) {
    if (!o.token && !o.clientCert) throw new Error('RemoteRuntime: a token or a client certificate is required');
    this.base = new URL(o.url);
    if (this.base.protocol !== 'http:' && this.base.protocol !== 'https:')
      throw new Error(`RemoteRuntime: unsupported URL ${o.url}`);
    this.agent =
      this.base.protocol === 'https:'
        ? new https.Agent({ keepAlive: true, ...this.tlsOptions() })
        : new http.Agent({ keepAlive: true });
  }

  private authHeader(): Record<string, string> {
    return this.o.token ? { authorization: `Bearer ${this.o.token}` } : {};
  }

  /**
   * How an https agent is verified: the CA (default: the system's), the host name or address in
   * the URL (tls.checkServerIdentity), and, when this client means a node, that the certificate is
   * that node's (identity.ts): another node's valid certificate is refused. The client certificate
   * when mTLS.
   */
  private tlsOptions(): https.AgentOptions {
    const node = this.o.node;
    return {
      ca: this.o.ca,
      rejectUnauthorized: !this.o.insecureSkipVerify,
      ...(this.o.clientCert ? { cert: this.o.clientCert.cert, key: this.o.clientCert.key } : {}),
      checkServerIdentity: (host, cert) => {
        const e = tls.checkServerIdentity(host, cert);
        if (e || !node) return e;
        const wrong = nodeIdentityMismatch(cert, node);
        return wrong ? new Error(wrong) : undefined;
      },
    };
  }

  /**
   * The capabilities fetched by start(): of `backend` when the agent's runtime has it, else of
   * its default backend (the Runtime contract). Throws before start().
   */
  capabilities(backend?: Capabilities['backend']): Capabilities {
    if (!this.caps) throw new Error('RemoteRuntime: capabilities() before start()');
    return (backend && this.backends[backend]) || this.caps;
  }

  /** The agent's node name, from start() ('' when the agent was given none). */
  nodeName(): string {
    return this.node;
  }

  /**
   * Fetches the agent's capabilities and node name (the agent adopted its sandboxes when it started). Throws
   * RuntimeError when unreachable.
   */
  async start(): Promise<void> {
    const info = (await this.request('GET', '/v1/info')) as {
      nodeName: string;
      capabilities: Capabilities;
      backends?: Partial<Record<Capabilities['backend'], Capabilities>>;
    };
    if (this.o.node && info.nodeName !== this.o.node)
      throw new RuntimeError(
        'Conflict',
        `the node agent at ${this.base.host} runs node "${info.nodeName}", not "${this.o.node}"`,
      );
    this.caps = info.capabilities;
    this.backends = info.backends ?? {};
    this.node = info.nodeName;
  }

  /** Closes idle connections; the agent and its sandboxes keep running. */
  async close(): Promise<void> {
    clearInterval(this.wakePoll);
    this.wakePoll = undefined;
    this.agent.destroy();
  }

  create(cfg: SandboxConfig): Promise<SandboxInfo> {
    return this.call('create', cfg) as Promise<SandboxInfo>;
  }
  async inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo> {
    return this.saw((await this.call('inspect', id, opts)) as SandboxInfo);
  }
  async list(): Promise<SandboxInfo[]> {
    return ((await this.call('list')) as SandboxInfo[]).map((i) => this.saw(i));
  }

  // Idle standby (native/idle.ts) on the agent's runtime: the agent tracks activity (every call
  // reaching it wakes a standby sandbox and counts), so the controller's idle step asks it here.
  // A runtime without standby answers Unsupported (controllers/sandbox/idle.ts notes it).
  async standbyIfIdle(id: string, idleMs: number, notBeforeMs?: number): Promise<IdleDecision> {
    const d = (await this.call('standbyIfIdle', id, idleMs, notBeforeMs)) as
      { standby: true } | { standby: false; waitMs: number | null; why: string };
    if (d.standby) {
      this.sleeping.add(id);
      return { standby: true };
    }
    // JSON has no Infinity: the agent's "never" arrives as null.
    return { standby: false, waitMs: d.waitMs ?? Infinity, why: d.why };
  }
  /** Wakes `id` if on standby (true when it was); false where the agent's runtime has no standby. */
  async wake(id: string): Promise<boolean> {
    let woke: boolean;
    try {
      woke = (await this.call('wake', id)) === true;
    } catch (e) {
      if (e instanceof RuntimeError && e.code === 'Unsupported') return false;
      throw e;
    }
    if (woke) this.woke(id);
    return woke;
  }
  /**
   * A sandbox seen on standby woke (an exec, file call or preview through another client of the
   * agent, say the API server's): the agent has no push channel, so while a listener is registered
   * the client lists the agent's sandboxes every wakePollMs while it saw any on standby.
   */
  onWake(listener: (id: string) => void): void {
    this.wakeListeners.push(listener);
    this.wakePoll ??= setInterval(() => void this.pollWakes(), this.o.wakePollMs ?? 1000);
    this.wakePoll.unref();
  }
  private saw(info: SandboxInfo): SandboxInfo {
    if (info.standby) this.sleeping.add(info.id);
    else if (this.sleeping.has(info.id)) this.woke(info.id);
    return info;
  }
  private woke(id: string): void {
    if (!this.sleeping.delete(id)) return;
    for (const l of this.wakeListeners) l(id);
  }
  private polling = false;
  private async pollWakes(): Promise<void> {
    if (!this.sleeping.size || this.polling) return;
    this.polling = true;
    try {
      const infos = await this.list();
      const present = new Set(infos.map((i) => i.id));
      // A sandbox gone from the agent is not asleep either (its reconcile finds out why).
      for (const id of [...this.sleeping]) if (!present.has(id)) this.woke(id);
    } catch {
      // The agent unreachable: the next tick tries again.
    } finally {
      this.polling = false;
    }
  }
  async destroy(id: string): Promise<void> {
    await this.call('destroy', id);
  }
  async pause(id: string): Promise<void> {
    await this.call('pause', id);
  }
  async resume(id: string): Promise<void> {
    await this.call('resume', id);
  }
  async freeze(id: string): Promise<void> {
    await this.call('freeze', id);
  }
  async thaw(id: string): Promise<void> {
    await this.call('thaw', id);
  }
  /**
   * The node's runtime resolves the sandbox's exec allow-list (Runtime.resolveExecutables; Unsupported when it has
   * none).
   */
  resolveExecutables(id: string): Promise<ResolvedExecutables> {
    return this.call('resolveExecutables', id) as Promise<ResolvedExecutables>;
  }
  exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return this.callWithin((req.timeoutMs ?? 300_000) + 60_000, 'exec', [id, req]) as Promise<ExecResult>;
  }
  listFiles(id: string, path: string): Promise<FileEntry[]> {
    return this.call('listFiles', id, path) as Promise<FileEntry[]>;
  }
  stat(id: string, path: string): Promise<FileEntry> {
    return this.call('stat', id, path) as Promise<FileEntry>;
  }
  readFile(id: string, path: string, opts?: { maxBytes?: number }): Promise<Buffer> {
    return this.call('readFile', id, path, opts) as Promise<Buffer>;
  }
  async writeFile(id: string, path: string, data: Buffer, opts?: WriteFileOptions): Promise<void> {
    await this.call('writeFile', id, path, data, opts);
  }
  async deleteFile(id: string, path: string, opts?: { recursive?: boolean }): Promise<void> {
    await this.call('deleteFile', id, path, opts);
  }
  manifest(id: string, paths: string[], limits?: Partial<ManifestLimits>): Promise<Manifest> {
    return this.call('manifest', id, paths, limits) as Promise<Manifest>;
  }
  checkpoint(id: string, checkpointId: string, opts?: { memory?: boolean }): Promise<CheckpointInfo> {
    return this.call('checkpoint', id, checkpointId, opts) as Promise<CheckpointInfo>;
  }
  async restore(id: string, checkpointId: string): Promise<void> {
    await this.call('restore', id, checkpointId);
  }
  async deleteCheckpoint(checkpointId: string): Promise<void> {
    await this.call('deleteCheckpoint', checkpointId);
  }
  fork(parentId: string, childIds: string[], opts?: ForkOptions): Promise<ForkResult> {
    return this.call('fork', parentId, childIds, opts) as Promise<ForkResult>;
  }
  egressTraffic(id: string): Promise<EgressTraffic | undefined> {
    return this.call('egressTraffic', id) as Promise<EgressTraffic | undefined>;
  }
  mark(id: string): Promise<WorkspaceMark> {
    return this.call('mark', id) as Promise<WorkspaceMark>;
  }
  changesSince(id: string, mark: WorkspaceMark, paths?: string[]): Promise<Diff> {
    return this.call('changesSince', id, mark, paths) as Promise<Diff>;
  }

  /**
   * Starts the command on the agent over a WebSocket. Resolves once it runs; rejects with the
   * runtime's RuntimeError (NotFound, Conflict, ...) when it cannot start. Closing the
   * connection kills the command on the agent.
   */
  execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    const wsUrl = new URL('/v1/exec', this.base);
    wsUrl.protocol = this.base.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(wsUrl, {
      headers: { ...this.authHeader(), ...(this.o.node ? { [NODE_HEADER]: this.o.node } : {}) },
      ...(this.base.protocol === 'https:' ? this.tlsOptions() : {}),
      maxPayload: 16 * 1024 * 1024,
    });
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const stdin = new PassThrough();
    let resolveExit!: (v: { exitCode: number; signal?: string; timedOut: boolean }) => void;
    let rejectExit!: (e: unknown) => void;
    const exit = new Promise<{ exitCode: number; signal?: string; timedOut: boolean }>((res, rej) => {
      resolveExit = res;
      rejectExit = rej;
    });
    exit.catch(() => {}); // a caller that only reads the streams must not see an unhandled rejection
    const send = (b: Buffer) => ws.readyState === WebSocket.OPEN && ws.send(b);
    stdin.on('data', (d: Buffer) => send(frame(CH_STDIN, d)));
    stdin.on('end', () => send(frame(CH_STDIN)));
    let settled = false;
    const finishStreams = () => {
      stdout.end();
      stderr.end();
    };
    // `exit` resolves once the caller has read stdout and stderr to their end (the Runtime
    // contract, and what a caller that sends the exit status and closes relies on), or, like
    // procbox, once a grace period after the exit passed without a reader (then the unread
    // output is dropped).
    const consumed = () =>
      Promise.all(
        [stdout, stderr].map(
          (st) =>
            new Promise<void>((resolve) => {
              if (st.readableEnded || st.destroyed) return resolve();
              const t = setTimeout(() => {
                st.destroy();
                resolve();
              }, 500);
              const done = () => {
                clearTimeout(t);
                resolve();
              };
              st.once('end', done);
              st.once('close', done);
            }),
        ),
      );
    return new Promise<ExecStream>((resolve, reject) => {
      let started = false;
      ws.on('open', () => send(frame(CH_CONTROL, JSON.stringify({ op: 'start', id, req: encode(req) }))));
      ws.on('unexpected-response', (_req, res) => {
        const fail = (err: RuntimeError) => {
          settled = true;
          reject(err);
          rejectExit(err);
        };
        if (res.statusCode !== 409) {
          res.resume();
          return fail(new RuntimeError('Internal', `node agent refused the exec stream: HTTP ${res.statusCode}`));
        }
        // Another node's agent (X-Fluxvm-Node): its reason, as a Conflict like every call's.
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.length < 64 && chunks.push(c));
        res.on('end', () => {
          let body: { error?: unknown } | undefined;
          try {
            body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
          } catch {
            body = undefined;
          }
          fail(runtimeErrorOf(body?.error, 'node agent refused the exec stream: HTTP 409'));
        });
      });
      ws.on('message', (data: Buffer, isBinary) => {
        if (!isBinary || data.length === 0) return;
        const ch = data[0];
        const payload = data.subarray(1);
        if (ch === CH_STDOUT) stdout.write(Buffer.from(payload));
        else if (ch === CH_STDERR) stderr.write(Buffer.from(payload));
        else if (ch === CH_CONTROL) {
          const m = JSON.parse(payload.toString('utf8')) as {
            op: string;
            code?: string;
            message?: string;
            exitCode?: number;
            signal?: string;
            timedOut?: boolean;
          };
          if (m.op === 'started') {
            started = true;
            resolve({
              stdin,
              stdout,
              stderr,
              exit,
              kill: () => {
                send(frame(CH_CONTROL, JSON.stringify({ op: 'kill' })));
              },
              ...(req.tty
                ? {
                    resize: (size: TtySize) =>
                      void send(frame(CH_CONTROL, JSON.stringify({ op: 'resize', rows: size.rows, cols: size.cols }))),
                  }
                : {}),
            });
          } else if (m.op === 'exit') {
            settled = true;
            finishStreams();
            const r = { exitCode: m.exitCode ?? -1, ...(m.signal ? { signal: m.signal } : {}), timedOut: !!m.timedOut };
            void consumed().then(() => resolveExit(r));
          } else if (m.op === 'error') {
            settled = true;
            const err = runtimeErrorOf(m, 'exec failed on the node agent');
            finishStreams();
            if (!started) reject(err);
            rejectExit(err);
          }
        }
      });
      const lost = (why: string) => {
        if (settled) return;
        settled = true;
        const err = new RuntimeError('Internal', `exec stream to the node agent ${why}`);
        finishStreams();
        if (!started) reject(err);
        rejectExit(err);
      };
      ws.on('close', () => lost('closed before the command exited'));
      ws.on('error', (e) => lost(`failed: ${e.message}`));
    });
  }

  private call(method: CallName, ...args: unknown[]): Promise<unknown> {
    return this.callWithin(this.o.callTimeoutMs ?? 300_000, method, args);
  }

  private callWithin(timeoutMs: number, method: CallName, args: unknown[]): Promise<unknown> {
    // Trailing undefined options are dropped: JSON has no undefined in arrays.
    while (args.length && args[args.length - 1] === undefined) args.pop();
    return this.request('POST', `/v1/call/${method}`, { args: encode(args) }, timeoutMs);
  }

  private request(
    method: string,
    path: string,
    body?: unknown,
    timeoutMs = this.o.callTimeoutMs ?? 300_000,
    retried = false,
  ): Promise<unknown> {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const mod = this.base.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = mod.request(
        new URL(path, this.base),
        {
          method,
          agent: this.agent,
          headers: {
            ...this.authHeader(),
            accept: 'application/json',
            ...(this.o.node ? { [NODE_HEADER]: this.o.node } : {}),
            ...(text !== undefined
              ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }
              : {}),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('error', (e) => reject(new RuntimeError('Internal', `node agent reply failed: ${e.message}`)));
          res.on('end', () => {
            let parsed: { result?: unknown; error?: unknown } | undefined;
            try {
              parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'));
            } catch {
              parsed = undefined;
            }
            if (res.statusCode === 200 && parsed && 'result' in parsed) return resolve(decode(parsed.result));
            if (res.statusCode === 401)
              return reject(
                new RuntimeError(
                  'Internal',
                  `node agent refused the caller (401 Unauthorized): ${(parsed?.error as { message?: string } | undefined)?.message ?? ''}`,
                ),
              );
            reject(runtimeErrorOf(parsed?.error, `node agent answered HTTP ${res.statusCode} to ${method} ${path}`));
          });
        },
      );
      req.on('error', (e: NodeJS.ErrnoException) => {
        // A kept-alive connection the agent closed as idle just as this request went out on it
        // (the agent's keep-alive timer against ours, late on a loaded host): the agent read
        // nothing of it, so it is sent once more on a new connection, as Node's docs advise.
        if (!retried && req.reusedSocket && e.code === 'ECONNRESET')
          return resolve(this.request(method, path, body, timeoutMs, true));
        reject(
          e instanceof RuntimeError
            ? e
            : new RuntimeError('Internal', `node agent ${this.base.host} unreachable: ${e.message}`),
        );
      });
      req.setTimeout(timeoutMs, () =>
        req.destroy(
          new RuntimeError(
            'Internal',
            `node agent ${this.base.host} did not answer ${method} ${path} within ${timeoutMs} ms`,
          ),
        ),
      );
      req.end(text);
    });
  }
}
