// The session tokens' performance line: a request authenticated with a session token costs at most
// 0.1 ms more than one with the admin token. Two measurements, printed as a markdown section:
//   - in process, the embedded chain as fluxctl serve builds it (admin token, then session
//     tokens; the session scope in front of RBAC with the bootstrap roles): authenticate +
//     authorize per request, admin vs session token;
//   - over HTTPS against a real `fluxctl serve` (procbox session), GET of the session with
//     either token on one keep-alive connection, sequentially; rounds alternate (admin,
//     session, admin, ...) and each side reports the median of its round medians, so a load
//     spike on the shared machine does not decide the difference.
//   npx tsx bench/session-token.ts [--requests N] [--rounds N]
// Needs root (procbox) for the HTTPS part.
import https from 'node:https';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { IncomingMessage } from 'node:http';
import { allKinds } from '../apis/registry.js';
import { SessionTokens, sessionTokenScope } from '../controllers/agentsession/tokens.js';
import { AdminToken, bearerAuthenticator } from '../runtime/apiserver/auth/authn.js';
import { bootstrapClusterRoles, BOOTSTRAP_BINDINGS } from '../runtime/apiserver/auth/bootstrap.js';
import { scopedAuthorizer } from '../runtime/apiserver/auth/embedded.js';
import { RbacAuthorizer } from '../runtime/apiserver/auth/rbac.js';
import type { KubeObject } from '../runtime/meta/types.js';
import { startFluxctl } from '../test/e2e/harness.js';
import { arg, median, section } from './lib.js';

const REQUESTS = arg('requests', 2000);
const ROUNDS = arg('rounds', 6);

async function inProcess(): Promise<string[]> {
  const dir = mkdtempSync(join(tmpdir(), 'fluxvm-bench-tok-'));
  try {
    const { admin, token: adminToken } = AdminToken.ensure(join(dir, 'admin-token.sha256'));
    const tokens = new SessionTokens(join(dir, 'agentsessions'));
    const live = { metadata: { name: 's1', namespace: 'default', uid: 'u1' }, status: { phase: 'Running' } };
    tokens.attach((ns, name) => (ns === 'default' && name === 's1' ? (live as any) : undefined));
    const { token } = await tokens.mint(
      { namespace: 'default', name: 's1', uid: 'u1' },
      { ops: ['read', 'exec'], ttlSeconds: 3600, label: '' },
      undefined,
    );
    const rbac = new RbacAuthorizer();
    for (const r of bootstrapClusterRoles(allKinds))
      rbac.upsert({
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRole',
        metadata: { name: r.name },
        rules: r.rules,
      } as unknown as KubeObject);
    for (const b of BOOTSTRAP_BINDINGS)
      rbac.upsert({
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: { name: b.name },
        roleRef: { kind: 'ClusterRole', name: b.role },
        subjects: b.groups.map((g) => ({ kind: 'Group', name: g })),
      } as unknown as KubeObject);
    const authn = bearerAuthenticator([admin.authenticate, tokens.authenticate]);
    const authz = scopedAuthorizer([sessionTokenScope], rbac.authorize);
    const resource = {
      verb: 'get',
      namespace: 'default',
      group: 'fluxvm.dev',
      version: 'v1alpha1',
      resource: 'agentsessions',
      name: 's1',
    };
    const one = async (t: string) => {
      const user = (await authn({ headers: { authorization: `Bearer ${t}` } } as IncomingMessage))!;
      if (!(await authz({ user, resource })).allowed) throw new Error('denied');
    };
    const perCall = async (t: string, n: number) => {
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) await one(t);
      return Number(process.hrtime.bigint() - t0) / 1e3 / n; // us
    };
    await perCall(adminToken, 20_000); // warm up
    await perCall(token, 20_000);
    const a: number[] = [];
    const s: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      a.push(await perCall(adminToken, 50_000));
      s.push(await perCall(token, 50_000));
    }
    return [
      `| in process: authenticate + authorize | ${median(a).toFixed(2)} us | ${median(s).toFixed(2)} us | ${(median(s) - median(a)).toFixed(2)} us |`,
    ];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function overHttps(): Promise<string[]> {
  if (process.getuid?.() !== 0) return ['| over HTTPS | (needs root for procbox: not run) | | |'];
  const fx = await startFluxctl();
  try {
    const path = '/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/b1';
    const body = {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'AgentSession',
      metadata: { name: 'b1' },
      spec: { agent: 'bench', policy: { preset: 'offline' } },
    };
    if (
      (await fx.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions', { body })).status !== 201
    )
      throw new Error('create failed');
    const minted = await fx.request('POST', path + '/token', { body: { ops: ['read'] } });
    if (minted.status !== 201) throw new Error(`mint failed: ${minted.body}`);
    const sessionToken: string = minted.json.status.token;
    const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ca: fx.ca });
    const get = (token: string) =>
      new Promise<void>((resolve, reject) => {
        const req = https.request(
          fx.url + path,
          { agent, headers: { authorization: `Bearer ${token}`, accept: 'application/json' } },
          (res) => {
            res.resume();
            res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
          },
        );
        req.on('error', reject);
        req.end();
      });
    const round = async (token: string) => {
      const xs: number[] = [];
      for (let i = 0; i < REQUESTS; i++) {
        const t0 = process.hrtime.bigint();
        await get(token);
        xs.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
      return median(xs);
    };
    await round(fx.token!);
    await round(sessionToken);
    const a: number[] = [];
    const s: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      a.push(await round(fx.token!));
      s.push(await round(sessionToken));
    }
    agent.destroy();
    await fx.request('DELETE', path);
    return [
      `| over HTTPS: GET the session (median of ${ROUNDS} round medians, ${REQUESTS} requests each) | ${median(a).toFixed(3)} ms | ${median(s).toFixed(3)} ms | ${(median(s) - median(a)).toFixed(3)} ms |`,
    ];
  } finally {
    await fx.stop();
  }
}

const lines = [
  '| | admin token | session token | difference |',
  '|---|---|---|---|',
  ...(await inProcess()),
  ...(await overHttps()),
];
section('Session tokens: cost of a request (target: at most 0.1 ms more than the admin token)', lines);
