// Spawns a real `fluxctl serve` for end-to-end tests: a temp state dir, a free port (the
// server binds 127.0.0.1:0 and reports the port it got), ready once /readyz answers 200.
// The server is HTTPS with the state CA and the admin token by default (--insecure-http in
// `args` makes it plain HTTP without auth): talk to it through kubectl(), fluxctl(), request()
// or wsOptions(), which carry the CA and the admin token of <state>/kubeconfig.
// Runs the TypeScript sources through tsx, or dist/ when it was built after every source
// file. kubectl runs with a private kubeconfig copy and cache dir (test/e2e/kubectl.ts).
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Kubectl, runProcess, type KubectlResult } from './kubectl.js';
import { tokenOf } from '../../cmd/fluxctl/kubeconfig.js';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface StartOptions {
  args?: string[];
  env?: Record<string, string>;
  /** Reuse a state dir (restart after kill -9); default: a new temp dir. */
  stateDir?: string;
  /** Milliseconds to wait for /readyz (default READY_TIMEOUT_MS). */
  readyTimeoutMs?: number;
  /**
   * The argv prefix that runs fluxctl (default fluxctlCommand(): this checkout), and the server's working directory
   * (default this checkout): another checkout's.
   */
  command?: string[];
  cwd?: string;
}

/**
 * How long a serve may take to print its address and answer /readyz. 90 s: it starts in 2-4 s
 * on an idle host, but through tsx on a 2-core host running other suites it took 17 s and more,
 * and a too-short bound failed whole files before a test ran. Only a broken serve waits it out.
 */
const READY_TIMEOUT_MS = 90_000;

export interface HttpResult {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  /** The body parsed as JSON, undefined when it is not JSON. */
  json: any;
}

export interface RequestOptions {
  /** Sent as JSON (content-type application/json unless headers say otherwise). */
  body?: unknown;
  /** Sent as is. */
  raw?: Buffer | string;
  headers?: Record<string, string>;
  /** Bearer token to send instead of the admin token; null sends none. */
  token?: string | null;
  /** Client certificate and key (PEM) to present. */
  cert?: { cert: string; key: string };
  timeoutMs?: number;
}

/** The socket error listener of httpRequest (below): errors after the answer has ended are dropped. */
function ignoreLateSocketError(): void {}

/**
 * One HTTP(S) request; trusts `ca` when given. Never rejects on a status code, only when
 * the request cannot be made (connection refused, TLS failure, timeout).
 */
export function httpRequest(
  url: string,
  method: string,
  o: RequestOptions & { ca?: string } = {},
): Promise<HttpResult> {
  const u = new URL(url);
  const mod = u.protocol === 'https:' ? https : http;
  const headers: Record<string, string> = { ...(o.headers ?? {}) };
  let payload: Buffer | undefined;
  if (o.raw !== undefined) payload = Buffer.from(o.raw);
  else if (o.body !== undefined) {
    payload = Buffer.from(JSON.stringify(o.body));
    headers['content-type'] ??= 'application/json';
  }
  if (o.token) headers.authorization = `Bearer ${o.token}`;
  return new Promise((resolve, reject) => {
    const req = mod.request(
      u,
      {
        method,
        headers,
        ...(o.ca ? { ca: o.ca } : {}),
        ...(o.cert ? { cert: o.cert.cert, key: o.cert.key } : {}),
        timeout: o.timeoutMs ?? 30_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          const body = Buffer.concat(chunks);
          let json: any;
          try {
            json = JSON.parse(body.toString('utf8'));
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body, json });
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${url}: no answer within ${o.timeoutMs ?? 30_000} ms`)));
    req.on('error', reject);
    // An answer can come while the body is still being sent (a refused upload). Once the answer
    // has ended, Node no longer forwards the socket's errors to the request, and the server may
    // cut the connection on the rest of the body: that write's EPIPE would be an uncaught error.
    // One listener per socket: a kept-alive socket serves many requests.
    req.on('socket', (s) => {
      if (!s.listeners('error').includes(ignoreLateSocketError)) s.on('error', ignoreLateSocketError);
    });
    req.end(payload);
  });
}

export interface Fluxctl {
  /** https://127.0.0.1:<port> (http:// with --insecure-http). */
  url: string;
  kubeconfig: string;
  /** PEM of the state CA (undefined for plain HTTP). */
  ca?: string;
  /** The admin token of the kubeconfig (group system:masters; undefined for plain HTTP). */
  token?: string;
  /** A request as the admin (or as `o.token` / `o.cert`), trusting the state CA. */
  request(method: string, path: string, o?: RequestOptions): Promise<HttpResult>;
  /** Options for `new WebSocket(url, protocols, options)` (ws package): the CA and the admin token. */
  wsOptions(): { ca?: string; headers: Record<string, string> };
  /** The WebSocket URL (wss:// or ws://) of a path. */
  wsUrl(path: string): string;
  stateDir: string;
  child: ChildProcess;
  /** stdout + stderr of the server so far. */
  logs(): string;
  /** stderr alone (the log lines: JSON unless a terminal). */
  stderr(): string;
  /** HTTP watches open right now (apiserver_watch_count from /metrics). */
  watchCount(): Promise<number>;
  /**
   * Resolves once a watch opened after `than` (a watchCount() taken before starting a client)
   * is open: the count rose above `than`, or above the lowest count seen since (a watch that
   * was still closing when `than` was read, then the client's). Rejects when `client` (the
   * run of the waiting client) ends first, or after timeoutMs (default 60 s: a client started
   * through tsx on a loaded machine can take tens of seconds to send its first request).
   */
  waitForWatches(than: number, opts?: { timeoutMs?: number; client?: Promise<unknown> }): Promise<void>;
  kubectl(args: string[], opts?: { input?: string; timeoutMs?: number }): Promise<KubectlResult>;
  fluxctl(
    args: string[],
    opts?: { input?: string; timeoutMs?: number; env?: Record<string, string> },
  ): Promise<RunResult>;
  /** SIGTERM and wait for exit; resolves with the exit code. Removes the temp state dir unless keepState. */
  stop(opts?: { keepState?: boolean }): Promise<number | null>;
  /** SIGKILL and wait for exit; the state dir is kept (kubectl's temp dir goes whenever the server exits). */
  kill9(): Promise<void>;
  /** Removes the state dir and kubectl temp dir (after stop/kill9). */
  cleanup(): void;
}

function newestMtime(dir: string): number {
  let newest = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) newest = Math.max(newest, newestMtime(p));
    else if (e.name.endsWith('.ts')) newest = Math.max(newest, fs.statSync(p).mtimeMs);
  }
  return newest;
}

/**
 * argv prefix that runs fluxctl: the build's bundle (dist/fluxctl/main.js, what `make run` and the
 * installed fluxctl start) when it is fresh, else tsc's modules when they are, else the sources
 * through tsx.
 */
export function fluxctlCommand(): string[] {
  const src = Math.max(
    ...['cmd', 'runtime', 'apis', 'controllers', 'native']
      .filter((d) => fs.existsSync(path.join(REPO, d)))
      .map((d) => newestMtime(path.join(REPO, d))),
  );
  for (const dist of [
    path.join(REPO, 'dist', 'fluxctl', 'main.js'),
    path.join(REPO, 'dist', 'cmd', 'fluxctl', 'main.js'),
  ])
    if (fs.existsSync(dist) && fs.statSync(dist).mtimeMs >= src) return [process.execPath, dist];
  return [process.execPath, '--import', 'tsx', path.join(REPO, 'cmd', 'fluxctl', 'main.ts')];
}

function run(
  argv: string[],
  opts: { input?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number; cwd?: string },
): Promise<RunResult> {
  return runProcess(argv, { ...opts, cwd: opts.cwd ?? REPO, timeoutMs: opts.timeoutMs ?? 30_000 });
}

async function waitReady(
  url: string,
  ca: () => string | undefined,
  child: ChildProcess,
  timeoutMs: number,
  logs: () => string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`fluxctl serve exited with ${child.exitCode}:\n${logs()}`);
    try {
      const r = await httpRequest(`${url}/readyz`, 'GET', { ca: ca(), timeoutMs: 5000 });
      if (r.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`fluxctl serve not ready after ${timeoutMs} ms:\n${logs()}`);
}

// Servers still running when the test process exits (a failed test skipped stop()) are
// killed, so no test leaves a server behind.
const running = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of running) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

// State dirs this harness made, by the fixture that owns each now. A test restarts serve on a kept
// dir by passing it back as `stateDir`: the new fixture takes the dir over, so its stop() removes it
// (each such run used to leave its ~270 MB dir in /tmp), and the old fixture no longer can.
const stateOwners = new Map<string, object>();
process.on('exit', () => {
  for (const dir of stateOwners.keys()) fs.rmSync(dir, { recursive: true, force: true });
});

export async function startFluxctl(opts: StartOptions = {}): Promise<Fluxctl> {
  const stateDir = opts.stateDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-e2e-'));
  const me = {};
  if (!opts.stateDir || stateOwners.has(stateDir)) stateOwners.set(stateDir, me);
  const argv = [
    ...(opts.command ?? fluxctlCommand()),
    'serve',
    '--state-dir',
    stateDir,
    '--listen',
    '127.0.0.1:0',
    ...(opts.args ?? []),
  ];
  const child = spawn(argv[0], argv.slice(1), {
    cwd: opts.cwd ?? REPO,
    env: { ...process.env, ...opts.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let errOut = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => {
    out += d;
    errOut += d;
  });
  running.add(child);
  const exited = new Promise<number | null>((r) =>
    child.on('exit', (code) => {
      running.delete(child);
      r(code);
    }),
  );
  const url = await new Promise<string>((resolve, reject) => {
    const deadline = setTimeout(
      () => reject(new Error(`fluxctl serve printed no address:\n${out}`)),
      opts.readyTimeoutMs ?? READY_TIMEOUT_MS,
    );
    const check = () => {
      const m = /listening on (https?:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(deadline);
        resolve(m[1]);
      }
    };
    child.stdout!.on('data', check);
    child.on('exit', () => {
      clearTimeout(deadline);
      reject(new Error(`fluxctl serve exited:\n${out}`));
    });
  });
  const kubeconfig = path.join(stateDir, 'kubeconfig');
  const tls = url.startsWith('https:');
  const ca = tls ? fs.readFileSync(path.join(stateDir, 'ca.crt'), 'utf8') : undefined;
  await waitReady(
    url,
    () => ca,
    child,
    opts.readyTimeoutMs ?? READY_TIMEOUT_MS,
    () => out,
  );
  const token = tls ? tokenOf(kubeconfig) : undefined;
  const k = new Kubectl(url, 'kubectl', tls ? kubeconfig : undefined);
  // kubectl's temp dir (kubeconfig copy and cache) is good only for this server, so it goes when the
  // server exits, however that happens: a test that signals the child itself and restarts serve on the
  // kept state dir never calls this fixture's stop(), and its dir was left in /tmp.
  void exited.then(() => k.cleanup());
  const request = (method: string, p: string, o: RequestOptions = {}) =>
    httpRequest(url + p, method, {
      ...o,
      ca,
      token: o.token === null ? undefined : (o.token ?? (o.cert ? undefined : token)),
    });
  const watchCount = async () => {
    const text = (await request('GET', '/metrics')).body.toString('utf8');
    const m = /^apiserver_watch_count (\d+)/m.exec(text);
    return m ? Number(m[1]) : 0;
  };
  let cleaned = false;
  const cleanup = () => {
    if (cleaned) return;
    cleaned = true;
    k.cleanup();
    if (stateOwners.get(stateDir) === me) {
      stateOwners.delete(stateDir);
      fs.rmSync(stateDir, { recursive: true, force: true });
    }
  };
  return {
    url,
    kubeconfig,
    ca,
    token,
    request,
    wsOptions: () => ({
      ...(ca ? { ca } : {}),
      headers: token ? ({ authorization: `Bearer ${token}` } as Record<string, string>) : {},
    }),
    wsUrl: (p) => url.replace(/^http/, 'ws') + p,
    stateDir,
    child,
    logs: () => out,
    stderr: () => errOut,
    watchCount,
    async waitForWatches(than, o = {}) {
      const timeoutMs = o.timeoutMs ?? 60_000;
      const deadline = Date.now() + timeoutMs;
      let ended: unknown;
      o.client?.then(
        (r) => (ended ??= r),
        (e) => (ended ??= { error: String(e) }),
      );
      let lowest = than;
      for (let n = await watchCount(); n <= lowest; n = await watchCount()) {
        lowest = Math.min(lowest, n);
        if (ended !== undefined) throw new Error(`the client ended before it watched: ${JSON.stringify(ended)}`);
        if (Date.now() > deadline) throw new Error(`no new watch within ${timeoutMs} ms (${n} open, ${than} before)`);
        await new Promise((r) => setTimeout(r, 25));
      }
    },
    kubectl: (args, o = {}) => k.run(args, { stdin: o.input, timeoutMs: o.timeoutMs }),
    fluxctl: (args, o = {}) =>
      run([...fluxctlCommand(), ...args], {
        input: o.input,
        timeoutMs: o.timeoutMs,
        env: { ...process.env, KUBECONFIG: kubeconfig, ...o.env },
      }),
    async stop(o = {}) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const code = await exited;
      // keepState keeps the server's state dir for a restart; kubectl's temp dir went with the exit
      // (the restarted fixture makes its own).
      if (!o.keepState) cleanup();
      return code;
    },
    async kill9() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
    cleanup,
  };
}
