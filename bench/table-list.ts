// A 10,000-object list as a Table, this tree beside another checkout in one run:
//   npx tsx bench/table-list.ts --before DIR [--objects 10000] [--rounds 7]
// Both servers are the shipped serve (transpiled, --insecure-http --no-controllers: the API alone) with N
// Grants created over HTTP (16 in flight); then the two are listed as a Table
// (`as=Table;v=v1;g=meta.k8s.io`, includeObject unset = Metadata, what kubectl get asks)
// in alternating rounds, each side first in half of them. Reported per side: server CPU per
// list from /proc/<pid>/task/*/schedstat (the first, cold list apart), wall time to the last byte,
// response bytes, and resident memory after the creates and after the lists. Each server is
// left to go quiet after its creates (the Grant controller writes a status per Grant).
// The machine is shared: compare the two sides of one run, with the load printed beside.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { REPO } from '../test/e2e/harness.js';
import { startCompiled, transpile, type Server } from './serve-js.js';
import { arg, cpuMs, median, section, settle } from './lib.js';

const N = arg('objects', 10_000);
const ROUNDS = arg('rounds', 7);
const BEFORE = strArg('before');
const AFTER = path.resolve(strArg('after') ?? REPO);
const NS = 'bench';
const TABLE = 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json';

function strArg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });

function request(url: string, method: string, body?: unknown, accept = 'application/json') {
  return new Promise<{ status: number; bytes: number; body?: string }>((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request(
      url,
      {
        method,
        agent,
        headers: { accept, ...(data ? { 'content-type': 'application/json', 'content-length': data.length } : {}) },
      },
      (res) => {
        let bytes = 0;
        const keep: Buffer[] = [];
        res.on('data', (c: Buffer) => {
          bytes += c.length;
          if (keep.length < 4) keep.push(c);
        });
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            bytes,
            body: method === 'GET' ? undefined : Buffer.concat(keep).toString(),
          }),
        );
      },
    );
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

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

interface Side {
  name: string;
  srv: Server;
  /** The transpiled sources, removed at the end. */
  jsDir: string;
  pid: number;
  base: string;
  cold?: { cpu: number; ms: number };
  cpu: number[];
  ms: number[];
  bytes: number;
  rssCreated: number;
  rssListed: number;
}

async function prepare(name: string, dir: string): Promise<Side> {
  const js = await transpile(dir);
  const srv = await startCompiled(js.entry, {}, ['--insecure-http', '--no-controllers']);
  const pid = srv.child.pid!;
  const base = `${srv.url}/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`;
  try {
    const ns = await request(`${srv.url}/api/v1/namespaces`, 'POST', {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: NS },
    });
    if (ns.status >= 300) throw new Error(`${name}: namespace ${ns.status} ${ns.body}`);
    let next = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (next < N) {
          const r = await request(base, 'POST', grant(next++));
          if (r.status >= 300) throw new Error(`${name}: create ${r.status} ${r.body}`);
        }
      }),
    );
    await settle(pid);
  } catch (e) {
    await srv.stop();
    fs.rmSync(js.dir, { recursive: true, force: true });
    throw e;
  }
  return { name, srv, jsDir: js.dir, pid, base, cpu: [], ms: [], bytes: 0, rssCreated: rssMiB(pid), rssListed: 0 };
}

async function listOnce(s: Side): Promise<{ cpu: number; ms: number }> {
  const c0 = cpuMs(s.pid);
  const t0 = performance.now();
  const r = await request(s.base, 'GET', undefined, TABLE);
  const ms = performance.now() - t0;
  if (r.status !== 200) throw new Error(`${s.name}: list ${r.status}`);
  s.bytes = r.bytes;
  return { cpu: cpuMs(s.pid) - c0, ms };
}

async function main() {
  if (!BEFORE) throw new Error('--before DIR (another checkout, e.g. git archive <rev> | tar -x -C DIR) is required');
  const load0 = os.loadavg()[0];
  const sides: Side[] = [];
  try {
    sides.push(await prepare('this tree', AFTER));
    sides.push(await prepare('before', path.resolve(BEFORE)));
    for (const s of sides) s.cold = await listOnce(s);
    for (let k = 0; k < ROUNDS; k++) {
      const order = k % 2 ? [sides[1], sides[0]] : sides;
      for (const s of order) {
        const r = await listOnce(s);
        s.cpu.push(r.cpu);
        s.ms.push(r.ms);
      }
    }
    for (const s of sides) s.rssListed = rssMiB(s.pid);
  } finally {
    for (const s of sides) {
      await s.srv.stop();
      fs.rmSync(s.jsDir, { recursive: true, force: true });
    }
  }
  const load1 = os.loadavg()[0];
  section(`List ${N} Grants as a Table, this tree beside another checkout`, [
    `${ROUNDS} alternating rounds after one cold list each; server CPU from /proc/<pid>/task/*/schedstat; ${os.cpus().length} CPUs, load average ${load0.toFixed(1)} -> ${load1.toFixed(1)}.`,
    '',
    '| side | server CPU per list, median (cold) | wall to last byte, median | bytes | RSS after creates / after lists |',
    '|---|---:|---:|---:|---:|',
    ...sides.map(
      (s) =>
        `| ${s.name} | ${median(s.cpu).toFixed(1)} ms (${s.cold!.cpu.toFixed(1)} ms) | ${median(s.ms).toFixed(0)} ms | ${s.bytes} | ${s.rssCreated.toFixed(0)} / ${s.rssListed.toFixed(0)} MiB |`,
    ),
    '',
    `this / before, server CPU: ${(median(sides[0].cpu) / median(sides[1].cpu)).toFixed(2)}`,
  ]);
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
