// Server CPU per create on the secured path, A/B in one run: HTTPS, a bearer token
// (a --token-auth-file user bound by group to fluxvm-edit among --bindings RoleBindings), RBAC,
// the audit log, 16 in flight on a keep-alive https.Agent. Server CPU per create comes from
// /proc/<pid>/stat (user + system), which a loaded shared host disturbs far less than rates.
//   npx tsx bench/api-cpu.ts [--creates 3000] [--rounds 3] [--bindings 1000] [--in-flight 16]
//                            [--before DIR] [--after DIR] [--profile FILE.cpuprofile] [--no-controllers]
// `--before DIR`: a second server built from another checkout (`git archive <rev> | tar -x -C DIR`),
// driven in alternating rounds with this tree's; `--profile FILE`: this tree's server writes a V8
// CPU profile of the measured rounds to FILE (bench/cpuprofile-top.ts FILE --per <creates> summarises it).
// Raw better-sqlite3 single-row commits (WAL, synchronous=FULL) of the same JSON run between the
// rounds, for the ratio the performance goal names.
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { tokenOf } from '../cmd/fluxctl/kubeconfig.js';
import { REPO } from '../test/e2e/harness.js';
import { arg, median, section } from './lib.js';
import { startCompiled, transpile, type Server } from './serve-js.js';

const CREATES = arg('creates', 3000);
const ROUNDS = arg('rounds', 3);
const BINDINGS = arg('bindings', 1000);
const INFLIGHT = arg('in-flight', 16);
const str = (name: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const BEFORE = str('before');
/** `--after DIR`: the first server from this checkout instead of this tree (e.g. an A/A run, or sides swapped). */
const AFTER = str('after');
const PROFILE = str('profile');
/** `--no-controllers`: the servers run the API alone (the Grant controller's status write and Event not counted). */
const NO_CONTROLLERS = process.argv.includes('--no-controllers');
const NS = 'bench';
const TOKEN = 'bench-user-token-0123456789abcdef';
const load = () =>
  os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(' ');

function grant(i: number, prefix: string) {
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

function cpuSeconds(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

function client(url: string, ca: string, token: string) {
  const agent = new https.Agent({ keepAlive: true, maxSockets: INFLIGHT, ca });
  const send = (method: string, p: string, body: unknown): Promise<{ status: number; body: string }> =>
    new Promise((resolve, reject) => {
      const data = Buffer.from(JSON.stringify(body));
      const req = https.request(
        url + p,
        {
          method,
          agent,
          headers: {
            accept: 'application/json',
            'content-type': 'application/json',
            'content-length': data.length,
            authorization: `Bearer ${token}`,
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
        },
      );
      req.on('error', reject);
      req.end(data);
    });
  return { send, close: () => agent.destroy() };
}

async function many(count: number, from: number, fn: (i: number) => Promise<number>) {
  let next = from;
  let failures = 0;
  await Promise.all(
    Array.from({ length: INFLIGHT }, async () => {
      while (next < from + count) if ((await fn(next++)) !== 201) failures++;
    }),
  );
  if (failures) throw new Error(`${failures} of ${count} requests failed`);
}

interface Side {
  label: string;
  srv: Server & { stateDir: string };
  user: ReturnType<typeof client>;
  admin: ReturnType<typeof client>;
  runs: Array<{ rate: number; cpuUs: number }>;
}

async function side(label: string, source: string, tokenFile: string, profile?: string): Promise<Side> {
  const js = await transpile(source);
  const env: Record<string, string> = {};
  if (profile) {
    env.NODE_OPTIONS = `--import=${new URL('./probe.mjs', import.meta.url).href}`;
    env.FLUXVM_CPU_PROFILE = path.resolve(profile);
    env.FLUXVM_CPU_PROFILE_ON_SIGNAL = '1';
  }
  const srv = await startCompiled(js.entry, env, [
    '--token-auth-file',
    tokenFile,
    ...(NO_CONTROLLERS ? ['--no-controllers'] : []),
  ]).catch((e: unknown) => {
    fs.rmSync(js.dir, { recursive: true, force: true });
    throw e;
  });
  const stop = srv.stop;
  srv.stop = async () => {
    await stop();
    fs.rmSync(js.dir, { recursive: true, force: true });
  };
  const ca = fs.readFileSync(path.join(srv.stateDir, 'ca.crt'), 'utf8');
  const admin = client(srv.url, ca, tokenOf(path.join(srv.stateDir, 'kubeconfig'))!);
  const user = client(srv.url, ca, TOKEN);
  for (const ns of [NS, ...Array.from({ length: 20 }, (_, i) => `other-${i}`)]) {
    const r = await admin.send('POST', '/api/v1/namespaces', {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: ns },
    });
    if (r.status !== 201) throw new Error(`namespace: ${r.status} ${r.body}`);
  }
  await many(BINDINGS, 0, async (i) => {
    const ns = i === 0 || i % 2 ? NS : `other-${i % 20}`;
    const subject = i === 0 ? { kind: 'Group', name: 'bench-devs' } : { kind: 'User', name: `someone-${i}` };
    const b = {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: `b-${i}`, namespace: ns },
      roleRef: {
        apiGroup: 'rbac.authorization.k8s.io',
        kind: 'ClusterRole',
        name: i % 3 ? 'fluxvm-view' : 'fluxvm-edit',
      },
      subjects: [{ apiGroup: 'rbac.authorization.k8s.io', ...subject }],
    };
    return (await admin.send('POST', `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/rolebindings`, b)).status;
  });
  // Warm-up: JIT and caches, not counted; the profile (when asked for) starts after it.
  await many(
    500,
    0,
    async (i) => (await user.send('POST', `/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`, grant(i, 'w'))).status,
  );
  if (profile) process.kill(srv.child.pid!, 'SIGUSR2');
  return { label, srv, user, admin, runs: [] };
}

function rawSqlite(n: number, from: number, db: Database.Database): number {
  const ins = db.prepare('INSERT INTO objects (k, rv, json) VALUES (?, ?, ?)');
  const tx = db.transaction((i: number) => ins.run(`g-${i}`, i, JSON.stringify(grant(i, 'r'))));
  const t = performance.now();
  for (let i = from; i < from + n; i++) tx(i);
  return n / ((performance.now() - t) / 1000);
}

async function main() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-apicpu-'));
  const tokenFile = path.join(tmp, 'tokens.csv');
  fs.writeFileSync(tokenFile, `${TOKEN},bench-user,1,bench-devs\n`);
  const db = new Database(path.join(tmp, 'raw.db'));
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.exec('CREATE TABLE objects (k TEXT PRIMARY KEY, rv INTEGER, json TEXT)');
  const loadBefore = load();
  const sides: Side[] = [];
  try {
    sides.push(
      await side(AFTER ? `after (${AFTER})` : 'this tree', AFTER ? path.resolve(AFTER) : REPO, tokenFile, PROFILE),
    );
    if (BEFORE) sides.push(await side(`before (${BEFORE})`, path.resolve(BEFORE), tokenFile));
    const raw: number[] = [];
    const part = Math.floor(CREATES / ROUNDS);
    for (let round = 0; round < ROUNDS; round++) {
      for (const s of round % 2 ? [...sides].reverse() : sides) {
        const pid = s.srv.child.pid!;
        const c0 = cpuSeconds(pid);
        const t0 = performance.now();
        await many(
          part,
          round * part,
          async (i) =>
            (await s.user.send('POST', `/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`, grant(i, 'g'))).status,
        );
        s.runs.push({ rate: part / ((performance.now() - t0) / 1000), cpuUs: ((cpuSeconds(pid) - c0) / part) * 1e6 });
      }
      raw.push(rawSqlite(part, round * part, db));
    }
    const rawBest = Math.max(...raw);
    section('API creates: server CPU per create on the secured path', [
      `${CREATES} Grant creates per server in ${ROUNDS} alternating rounds, ${INFLIGHT} in flight, HTTPS + bearer token (token-file user, bound by group among ${BINDINGS} RoleBindings) + RBAC + audit log, keep-alive https.Agent; transpiled server (\`node main.js serve${NO_CONTROLLERS ? ' --no-controllers' : ''}\`; ${NO_CONTROLLERS ? 'the API alone' : 'with the controllers: the Grant controller writes a Pending status and an Event per Grant'})${PROFILE ? ', this tree under the CPU profiler' : ''}. ${os.cpus().length} CPUs, load average ${loadBefore} before, ${load()} at the end.`,
      '',
      '| server | CPU per create (median of rounds) | rounds (us) | creates/s (best; rounds) | best / raw |',
      '|---|---:|---|---|---:|',
      ...sides.map(
        (s) =>
          `| ${s.label} | ${median(s.runs.map((r) => r.cpuUs)).toFixed(0)} us | ${s.runs.map((r) => r.cpuUs.toFixed(0)).join(', ')} | ${Math.max(...s.runs.map((r) => r.rate)).toFixed(0)}/s; ${s.runs.map((r) => r.rate.toFixed(0)).join(', ')} | ${(Math.max(...s.runs.map((r) => r.rate)) / rawBest).toFixed(2)}x |`,
      ),
      `| raw better-sqlite3, WAL, synchronous=FULL, one transaction per row | | | ${rawBest.toFixed(0)}/s; ${raw.map((r) => r.toFixed(0)).join(', ')} | 1.00x |`,
      ...(sides.length === 2
        ? [
            '',
            `CPU per create, this tree / before, round by round (the two ran back to back): ${sides[0]!.runs.map((r, i) => (r.cpuUs / sides[1]!.runs[i]!.cpuUs).toFixed(2)).join(', ')}; median ${median(sides[0]!.runs.map((r, i) => r.cpuUs / sides[1]!.runs[i]!.cpuUs)).toFixed(2)}.`,
          ]
        : []),
    ]);
  } finally {
    for (const s of sides) {
      s.user.close();
      s.admin.close();
      await s.srv.stop();
    }
    db.close();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
