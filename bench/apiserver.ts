// API machinery measurements (issue 2), printed as a markdown section; no pass/fail.
//   npx tsx bench/apiserver.ts [--objects N] [--concurrency C]
// In one run, on this machine: raw better-sqlite3 inserts of the same JSON (WAL,
// synchronous=FULL, one transaction per insert, as the store acknowledges each write), then
// against a real `fluxctl serve` child process: creates per second over HTTP, a Table list of
// every object, watch delivery latency from write acknowledgement to the event arriving, and
// the server's resident memory. Objects are Grants, a kind no controller of this build
// reconciles, so the numbers are the API machinery's alone.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import Database from 'better-sqlite3';
import { startFluxctl } from '../test/e2e/harness.js';
import { arg, median, percentile, section } from './lib.js';

const N = arg('objects', 10_000);
const C = arg('concurrency', 16);
const NS = 'bench';
const TABLE = 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json';

function grant(i: number) {
  return {
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Grant',
    metadata: { name: `g-${i}`, namespace: NS, labels: { bench: 'yes', shard: String(i % 10) } },
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

function request(url: string, method: string, body?: unknown, accept = 'application/json'): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request(
      url,
      { method, agent, headers: { accept, ...(data ? { 'content-type': 'application/json', 'content-length': data.length } : {}) } },
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

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

async function main() {
  const rawRate = rawSqlite(N);
  const srv = await startFluxctl({ readyTimeoutMs: 60_000 });
  try {
    const base = `${srv.url}/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`;
    const ns = await request(`${srv.url}/api/v1/namespaces`, 'POST', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } });
    if (ns.status >= 300) throw new Error(`namespace: ${ns.status} ${ns.body}`);

    // Creates per second, C in flight.
    let next = 0;
    let failures = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: C }, async () => {
        while (next < N) {
          const i = next++;
          const r = await request(base, 'POST', grant(i));
          if (r.status !== 201) failures++;
        }
      }),
    );
    const createRate = N / ((performance.now() - t0) / 1000);

    // Table list of all objects.
    const listTimes: number[] = [];
    let rows = 0;
    for (let k = 0; k < 7; k++) {
      const t = performance.now();
      const r = await request(base, 'GET', undefined, TABLE);
      listTimes.push(performance.now() - t);
      rows = JSON.parse(r.body).rows.length;
    }
    const rss = rssMiB(srv.child.pid!);

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
          { method: 'PATCH', agent, headers: { 'content-type': 'application/merge-patch+json', 'content-length': patch.length } },
          (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (c) => chunks.push(c));
            res.on('end', () => resolve({ rv: JSON.parse(Buffer.concat(chunks).toString()).metadata.resourceVersion, at: performance.now() }));
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

    section('API machinery (issue 2)', [
      `Objects: ${N} Grants, ${C} creates in flight, one \`fluxctl serve\` child process (SQLite WAL, synchronous=FULL).`,
      '',
      '| measure | result | goal | peer | ratio |',
      '|---|---|---|---|---|',
      `| creates per second over HTTP | ${createRate.toFixed(0)}/s (${failures} failed) | >= 2000/s | raw better-sqlite3 inserts: ${rawRate.toFixed(0)}/s | ${(createRate / rawRate).toFixed(2)}x of raw |`,
      `| list ${rows} objects as a Table (median of 7) | ${median(listTimes).toFixed(1)} ms | < 100 ms | | |`,
      `| watch delivery after ack, p50 / p99 (${lat.length} writes) | ${percentile(lat, 50).toFixed(2)} / ${percentile(lat, 99).toFixed(2)} ms | p99 < 10 ms | | |`,
      `| server resident memory at ${N} objects | ${rss.toFixed(0)} MiB | < 300 MB | | |`,
    ]);
  } finally {
    await srv.stop();
    agent.destroy();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
