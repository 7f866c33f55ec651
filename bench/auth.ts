// Authentication and RBAC measurements, printed as a markdown section by bench/apiserver.ts (no pass/fail):
//   - creates per second over HTTPS with a bearer token (a --token-auth-file user bound by a
//     RoleBinding to fluxvm-edit) and RBAC on, with 1000 more RoleBindings stored, beside the
//     same run against a server without auth (--insecure-http), through the same Node client
//     (keep-alive Agent, the same number in flight). The runs alternate (plain, auth, three
//     times) and each side reports its best run, so a load spike on a shared machine does not
//     decide the ratio; the server CPU per create of each side (/proc) is reported beside it.
//   - the RBAC decision cost with 1000 bindings, in process (the authorizer the server runs).
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { RbacAuthorizer } from '../runtime/apiserver/auth/rbac.js';
import { bootstrapClusterRoles } from '../runtime/apiserver/auth/bootstrap.js';
import { allKinds } from '../apis/registry.js';
import type { KubeObject } from '../runtime/meta/types.js';
import { median, section } from './lib.js';
import { tokenOf } from '../cmd/fluxctl/kubeconfig.js';

interface Srv {
  url: string;
  child: ChildProcess;
  stateDir: string;
  stop(): Promise<void>;
}

export interface AuthBenchOptions {
  start(args: string[]): Promise<Srv>;
  creates: number;
  inFlight: number;
  grant(i: number, prefix?: string): object;
}

const NS = 'bench';
const TOKEN = 'bench-user-token-0123456789abcdef';

function client(url: string, ca: string | undefined, inFlight: number, token?: string) {
  const tls = url.startsWith('https:');
  const agent = tls
    ? new https.Agent({ keepAlive: true, maxSockets: inFlight, ca })
    : new http.Agent({ keepAlive: true, maxSockets: inFlight });
  const mod = tls ? https : http;
  const send = (method: string, p: string, body: unknown): Promise<{ status: number; body: string }> =>
    new Promise((resolve, reject) => {
      const data = Buffer.from(JSON.stringify(body));
      const req = mod.request(
        url + p,
        {
          method,
          agent,
          headers: {
            accept: 'application/json',
            'content-type': 'application/json',
            'content-length': data.length,
            ...(token ? { authorization: `Bearer ${token}` } : {}),
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

/** CPU seconds (user + system) a process has used so far (clock ticks of 10 ms); 0 when unknown. */
function cpuSeconds(pid: number | undefined): number {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return 0;
  }
}

async function load(
  send: (i: number) => Promise<number>,
  from: number,
  count: number,
  inFlight: number,
  serverPid?: number,
): Promise<{ rate: number; failures: number; cpuUs: number }> {
  let next = from;
  let failures = 0;
  const c0 = cpuSeconds(serverPid);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next < from + count) {
        const i = next++;
        if ((await send(i)) !== 201) failures++;
      }
    }),
  );
  return {
    rate: count / ((performance.now() - t0) / 1000),
    failures,
    cpuUs: ((cpuSeconds(serverPid) - c0) / count) * 1e6,
  };
}

function binding(i: number, ns: string, subject: { kind: string; name: string }, role = 'fluxvm-edit'): KubeObject {
  return {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'RoleBinding',
    metadata: { name: `b-${i}`, namespace: ns },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: role },
    subjects: [{ apiGroup: 'rbac.authorization.k8s.io', ...subject }],
  } as unknown as KubeObject;
}

/**
 * Decision cost of the authorizer with `n` bindings (the user's in the middle), in us: warm
 * (the user's rules compiled), across `n` distinct users in turn, and cold (each decision
 * right after an RBAC change, which drops every compilation: the worst case; only the
 * decision is timed).
 */
export function decisionCost(n: number): {
  allowUs: number;
  denyUs: number;
  distinctUs: number;
  coldUs: { median: number; mean: number };
} {
  const rbac = new RbacAuthorizer();
  for (const r of bootstrapClusterRoles(allKinds))
    rbac.upsert({
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: r.name },
      rules: r.rules,
    } as unknown as KubeObject);
  for (let i = 0; i < n; i++)
    rbac.upsert(
      binding(
        i,
        `ns-${i % 100}`,
        i % 3 ? { kind: 'User', name: `user-${i}` } : { kind: 'Group', name: `group-${i % 50}` },
      ),
    );
  // A user bound by name (i % 3 != 0) in the middle of the set, in one group bound elsewhere.
  const mid = Math.floor(n / 2) + (Math.floor(n / 2) % 3 === 0 ? 1 : 0);
  const user = { name: `user-${mid}`, groups: ['group-7', 'system:authenticated'] };
  const ns = `ns-${mid % 100}`;
  const attrs = {
    user,
    resource: { verb: 'create', namespace: ns, group: 'fluxvm.dev', version: 'v1alpha1', resource: 'grants' },
  };
  const deny = { user, resource: { ...attrs.resource, namespace: 'elsewhere' } };
  if (!rbac.authorize(attrs).allowed || rbac.authorize(deny).allowed) throw new Error('decision bench: wrong answers');
  const time = (a: typeof attrs) => {
    const k = 50_000;
    const t = process.hrtime.bigint();
    for (let i = 0; i < k; i++) rbac.authorize(a);
    return Number(process.hrtime.bigint() - t) / 1000 / k;
  };
  const users = Array.from({ length: n }, (_, i) => ({
    name: `user-${i}`,
    groups: [`group-${i % 50}`, 'system:authenticated'],
  }));
  const k = 50_000;
  let t = process.hrtime.bigint();
  for (let i = 0; i < k; i++)
    rbac.authorize({ ...attrs, user: users[i % n], resource: { ...attrs.resource, namespace: `ns-${i % 100}` } });
  const distinctUs = Number(process.hrtime.bigint() - t) / 1000 / k;
  const churn = binding(n + 1, 'churn', { kind: 'User', name: 'nobody' });
  // Each sample alone (one decision is a few us, so a time slice lost to another process on a
  // loaded host would dominate a mean): the median, and the mean beside it.
  const cold: number[] = [];
  for (let i = 0; i < 5_000; i++) {
    rbac.upsert(churn);
    const t1 = process.hrtime.bigint();
    rbac.authorize(attrs);
    cold.push(Number(process.hrtime.bigint() - t1) / 1000);
  }
  const coldUs = { median: median(cold), mean: cold.reduce((a, x) => a + x, 0) / cold.length };
  return { allowUs: time(attrs), denyUs: time(deny), distinctUs, coldUs };
}

export async function authSection(o: AuthBenchOptions): Promise<void> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-auth-'));
  const tokenFile = path.join(tmp, 'tokens.csv');
  fs.writeFileSync(tokenFile, `${TOKEN},bench-user,1,bench-devs\n`);
  const plain = await o.start(['--insecure-http']);
  const secure = await o.start(['--token-auth-file', tokenFile]);
  try {
    const ca = fs.readFileSync(path.join(secure.stateDir, 'ca.crt'), 'utf8');
    const adminToken = tokenOf(path.join(secure.stateDir, 'kubeconfig'))!;
    const p = client(plain.url, undefined, o.inFlight);
    const admin = client(secure.url, ca, o.inFlight, adminToken);
    const user = client(secure.url, ca, o.inFlight, TOKEN);
    for (const c of [p, admin]) {
      const r = await c.send('POST', '/api/v1/namespaces', {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name: NS },
      });
      if (r.status !== 201) throw new Error(`namespace: ${r.status} ${r.body}`);
    }
    // 1000 bindings: the user's (by group) among 999 others in this and other namespaces.
    for (let i = 0; i < 20; i++)
      await admin.send('POST', '/api/v1/namespaces', {
        apiVersion: 'v1',
        kind: 'Namespace',
        metadata: { name: `other-${i}` },
      });
    const rbs = (i: number) =>
      i === 500
        ? binding(i, NS, { kind: 'Group', name: 'bench-devs' })
        : binding(
            i,
            i % 2 ? NS : `other-${i % 20}`,
            { kind: 'User', name: `someone-${i}` },
            i % 3 ? 'fluxvm-view' : 'fluxvm-edit',
          );
    const made = await load(
      async (i) => {
        const b = rbs(i) as any;
        return (
          await admin.send(
            'POST',
            `/apis/rbac.authorization.k8s.io/v1/namespaces/${b.metadata.namespace}/rolebindings`,
            b,
          )
        ).status;
      },
      0,
      1000,
      o.inFlight,
    );
    if (made.failures) throw new Error(`${made.failures} RoleBindings failed`);
    const path_ = `/apis/fluxvm.dev/v1alpha1/namespaces/${NS}/grants`;
    const ROUNDS = 3;
    const part = Math.floor(o.creates / ROUNDS);
    const runs: Record<'plain' | 'auth', Array<{ rate: number; failures: number; cpuUs: number }>> = {
      plain: [],
      auth: [],
    };
    for (let round = 0; round < ROUNDS; round++) {
      runs.plain.push(
        await load(
          async (i) => (await p.send('POST', path_, o.grant(i, 'p'))).status,
          round * part,
          part,
          o.inFlight,
          plain.child.pid,
        ),
      );
      runs.auth.push(
        await load(
          async (i) => (await user.send('POST', path_, o.grant(i, 'a'))).status,
          round * part,
          part,
          o.inFlight,
          secure.child.pid,
        ),
      );
    }
    const medianCpu = (xs: Array<{ cpuUs: number }>) =>
      [...xs.map((x) => x.cpuUs)].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const best = (xs: Array<{ rate: number }>) => Math.max(...xs.map((x) => x.rate));
    const fails = (xs: Array<{ failures: number }>) => xs.reduce((a, x) => a + x.failures, 0);
    const denied = await user.send('POST', `/apis/fluxvm.dev/v1alpha1/namespaces/other-1/grants`, o.grant(0, 'x'));
    const auditLines = fs
      .readFileSync(path.join(secure.stateDir, 'audit.log'), 'utf8')
      .split('\n')
      .filter(Boolean).length;
    const cost = decisionCost(1000);
    const ratio = best(runs.auth) / best(runs.plain);
    for (const c of [p, admin, user]) c.close();
    section('Authentication and RBAC', [
      `${o.creates} Grant creates per server, ${o.inFlight} in flight through Node's https/http client (keep-alive Agent), runs alternating plain, auth three times; each side's best run. ${os.cpus().length} CPUs, load average ${os
        .loadavg()
        .map((x) => x.toFixed(1))
        .join(' ')} at the end.`,
      '',
      '| measure | result | goal |',
      '|---|---|---|',
      `| creates/s, HTTPS + bearer token (token-file user) + RBAC (1000 RoleBindings stored) + audit log | ${best(runs.auth).toFixed(0)}/s (runs ${runs.auth.map((r) => r.rate.toFixed(0)).join(', ')}; ${fails(runs.auth)} failed) | |`,
      `| creates/s, same server code with --insecure-http (no TLS, no auth, no audit) | ${best(runs.plain).toFixed(0)}/s (runs ${runs.plain.map((r) => r.rate.toFixed(0)).join(', ')}; ${fails(runs.plain)} failed) | |`,
      `| ratio auth / no auth | ${ratio.toFixed(2)}x | >= 0.9x |`,
      `| server CPU per create, auth / no auth (median of the runs; steadier than rates on a loaded host) | ${medianCpu(runs.auth).toFixed(0)} / ${medianCpu(runs.plain).toFixed(0)} us: no auth / auth = ${(medianCpu(runs.plain) / medianCpu(runs.auth)).toFixed(2)}x | >= 0.9x |`,
      `| the user's create in a namespace it has no binding in | ${denied.status} | 403 |`,
      `| audit records written by the auth server | ${auditLines} | one per request |`,
      `| RBAC decision, 1000 bindings, in process (allowed / denied; the user's rules compiled) | ${cost.allowUs.toFixed(2)} / ${cost.denyUs.toFixed(2)} us | < 50 us |`,
      `| RBAC decision, 1000 bindings, 1000 distinct users in turn over 100 namespaces | ${cost.distinctUs.toFixed(2)} us | < 50 us |`,
      `| RBAC decision right after an RBAC change (every compilation dropped; the change itself not counted), median (mean) of 5000 | ${cost.coldUs.median.toFixed(2)} (${cost.coldUs.mean.toFixed(2)}) us | < 50 us |`,
    ]);
  } finally {
    await plain.stop();
    await secure.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}
