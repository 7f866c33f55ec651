// Warm claims of the agent-sandbox API: SandboxClaim -> bound and Ready, through the
// HTTPS API as kubectl or the agent-sandbox Python client does it (POST the claim, a watch on the
// claims says Ready with status.sandbox.name).
//   npx tsx bench/agentsandbox.ts [--runs 100] [--burst 100] [--checkout DIR] [--profile FILE]
// The server runs as shipped: its sources transpiled to JavaScript (bench/serve-js.ts; `--tsx` runs
// it through tsx instead). --checkout DIR: serve another checkout (e.g. a `git archive` of an older
// commit), for A/B runs alternated on one host.
// --profile FILE: a V8 CPU profile of the server from the first sequential claim to the last burst
// claim bound (--profile-window fill: the pool's first fill only; seq: the sequential claims only)
// (bench/probe.mjs), summarised by
// bench/cpuprofile-top.ts.
// Sequential: a pool of `runs` procbox sandboxes, Ready before the timing; `runs` claims one
// after the other (each: POST -> the watch shows Ready=True and a sandbox name); p50/p99.
// Burst: the pool refilled to `burst`, then `burst` claims POSTed at once (one kept-alive
// connection each, opened before); the time until the last is bound and Ready; how many warm.
// Published peers, quoted (not measured here): cocoon sandbox-operator 33 ms p50 warm claim,
// agent-sandbox 50-64 ms.
import fs from 'node:fs';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { REPO, startFluxctl, type Fluxctl } from '../test/e2e/harness.js';
import { arg, percentile, section } from './lib.js';
import { transpile } from './serve-js.js';

const RUNS = arg('runs', 100);
const BURST = arg('burst', 100);
const EXT = '/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default';
const opt = (name: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const CHECKOUT = opt('checkout');
const PROFILE = opt('profile');
/** --series FILE: each sequential claim's start (ms from the first), POST answer and bound-and-Ready times, as JSON. */
const SERIES = opt('series');

function call(fx: Fluxctl, agent: https.Agent, method: string, p: string, body?: unknown): Promise<any> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string> = { authorization: `Bearer ${fx.token}` };
    if (payload) headers['content-type'] = method === 'PATCH' ? 'application/merge-patch+json' : 'application/json';
    const req = https.request(`${fx.url}${p}`, { method, agent, ca: fx.ca, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        if ((res.statusCode ?? 0) > 299) reject(new Error(`${method} ${p}: ${res.statusCode} ${text}`));
        else resolve(text ? JSON.parse(text) : undefined);
      });
    });
    req.on('error', reject);
    req.end(payload);
  });
}

/** A watch of `path`; `until(name, pred)` resolves with the first object of that name for which pred holds. */
async function watch(fx: Fluxctl, path: string) {
  const latest = new Map<string, any>();
  const waiting = new Map<string, Array<{ pred: (o: any) => boolean; resolve: (o: any) => void }>>();
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    https
      .get(`${fx.url}${path}?watch=true`, { ca: fx.ca, headers: { authorization: `Bearer ${fx.token}` } }, resolve)
      .on('error', reject);
  });
  res.setEncoding('utf8');
  let buf = '';
  res.on('data', (c: string) => {
    buf += c;
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      const o = JSON.parse(buf.slice(0, i)).object;
      buf = buf.slice(i + 1);
      const n = o?.metadata?.name;
      if (!n) continue;
      latest.set(n, o);
      const ws = waiting.get(n) ?? [];
      for (const w of [...ws]) if (w.pred(o)) (ws.splice(ws.indexOf(w), 1), w.resolve(o));
    }
  });
  return {
    until: (name: string, pred: (o: any) => boolean) =>
      new Promise<any>((resolve) => {
        const o = latest.get(name);
        if (o && pred(o)) return resolve(o);
        waiting.set(name, [...(waiting.get(name) ?? []), { pred, resolve }]);
      }),
    stop: () => res.destroy(),
  };
}

const ready = (o: any) =>
  !!o.status?.sandbox?.name && o.status?.conditions?.some((c: any) => c.type === 'Ready' && c.status === 'True');
const claim = (name: string) => ({
  apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
  kind: 'SandboxClaim',
  metadata: { name },
  spec: { warmPoolRef: { name: 'bench' } },
});

async function main(): Promise<void> {
  const env: Record<string, string> = {};
  if (PROFILE) {
    env.NODE_OPTIONS = `--import=${new URL('./probe.mjs', import.meta.url).href}`;
    env.FLUXVM_CPU_PROFILE = path.resolve(PROFILE);
    env.FLUXVM_CPU_PROFILE_ON_SIGNAL = '1';
  }
  const js = process.argv.includes('--tsx') ? undefined : await transpile(CHECKOUT);
  const fx = await startFluxctl({
    env,
    command: js
      ? [process.execPath, js.entry]
      : [process.execPath, '--import', 'tsx', path.join(CHECKOUT ?? REPO, 'cmd', 'fluxctl', 'main.ts')],
    cwd: CHECKOUT ?? REPO,
  });
  const window = opt('profile-window') ?? 'claims';
  const profileMark = (w: string) => PROFILE && window === w && process.kill(fx.child.pid!, 'SIGUSR2');
  // The server's own CPU time (user + system, ms; its children, the sandboxes, not included): a
  // measure of the work per claim that the host's load does not inflate, unlike latencies.
  const tick = 10; // ms per clock tick (USER_HZ is 100 on Linux)
  const cpuMs = () => {
    const f = fs.readFileSync(`/proc/${fx.child.pid}/stat`, 'utf8');
    const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
    return (Number(rest[11]) + Number(rest[12])) * tick;
  };
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    await call(fx, agent, 'POST', `${EXT}/sandboxtemplates`, {
      apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
      kind: 'SandboxTemplate',
      metadata: { name: 'bench' },
      spec: { podTemplate: { spec: { containers: [{ name: 'main' }] } } },
    });
    const pools = await watch(fx, `${EXT}/sandboxwarmpools`);
    const claims = await watch(fx, `${EXT}/sandboxclaims`);
    const full = (n: number) => (o: any) => o.status?.readyReplicas === n && o.status?.replicas === n;
    profileMark('fill');
    const fill0 = cpuMs();
    const fillT0 = performance.now();
    await call(fx, agent, 'POST', `${EXT}/sandboxwarmpools`, {
      apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
      kind: 'SandboxWarmPool',
      metadata: { name: 'bench' },
      spec: { replicas: RUNS, sandboxTemplateRef: { name: 'bench' } },
    });
    await pools.until('bench', full(RUNS));
    // The pool's first fill: the server's CPU per warm sandbox made Ready (what each refill costs).
    const fillCpu = (cpuMs() - fill0) / RUNS;
    profileMark('fill');
    console.error(
      `pool of ${RUNS} Ready in ${(performance.now() - fillT0).toFixed(0)} ms, server CPU ${fillCpu.toFixed(1)} ms per sandbox`,
    );
    // The floor on this host right now: one write seen on a watch (a SandboxTemplate POST).
    const templates = await watch(fx, `${EXT}/sandboxtemplates`);
    const floor: number[] = [];
    const idle0 = cpuMs();
    await new Promise((r) => setTimeout(r, 2000));
    const idleCpu = (cpuMs() - idle0) / 2; // per second, nothing asked of it
    const floorCpu0 = cpuMs();
    for (let i = 0; i < RUNS; i++) {
      const t0 = performance.now();
      await call(fx, agent, 'POST', `${EXT}/sandboxtemplates`, {
        apiVersion: 'extensions.agents.x-k8s.io/v1beta1',
        kind: 'SandboxTemplate',
        metadata: { name: `floor${i}` },
        spec: { podTemplate: { spec: { containers: [{ name: 'main' }] } } },
      });
      await templates.until(`floor${i}`, () => true);
      floor.push(performance.now() - t0);
    }
    templates.stop();
    const floorCpu = (cpuMs() - floorCpu0) / RUNS;
    const seq: number[] = [];
    const posts: number[] = [];
    const starts: number[] = [];
    let warmSeq = 0;
    profileMark('seq');
    profileMark('claims');
    const cpu0 = cpuMs();
    const seq0 = performance.now();
    for (let i = 0; i < RUNS; i++) {
      const t0 = performance.now();
      starts.push(t0 - seq0);
      await call(fx, agent, 'POST', `${EXT}/sandboxclaims`, claim(`q${i}`));
      posts.push(performance.now() - t0);
      const o = await claims.until(`q${i}`, ready);
      seq.push(performance.now() - t0);
      if (o.status.launchType === 'warm') warmSeq++;
    }
    profileMark('seq');
    const seqCpu = (cpuMs() - cpu0) / RUNS;
    if (SERIES) fs.writeFileSync(SERIES, JSON.stringify(starts.map((t, i) => ({ t, post: posts[i], ready: seq[i] }))));
    console.error(
      `sequential: p50 ${percentile(seq, 50).toFixed(1)} ms, p99 ${percentile(seq, 99).toFixed(1)} ms, ` +
        `the POST's answer p50 ${percentile(posts, 50).toFixed(1)} ms, ${warmSeq} warm, ` +
        `server CPU ${seqCpu.toFixed(1)} ms per claim (a template POST ${floorCpu.toFixed(1)} ms, idle ${idleCpu.toFixed(0)} ms/s)`,
    );
    await call(fx, agent, 'DELETE', `${EXT}/sandboxclaims`);
    await call(fx, agent, 'PATCH', `${EXT}/sandboxwarmpools/bench`, { spec: { replicas: BURST } });
    await pools.until('bench', full(BURST));
    const agents = Array.from({ length: BURST }, () => new https.Agent({ keepAlive: true, maxSockets: 1 }));
    await Promise.all(agents.map((a) => call(fx, a, 'GET', `${EXT}/sandboxclaims?limit=1`)));
    const t0 = performance.now();
    const cpu1 = cpuMs();
    const done = await Promise.all(
      agents.map(async (a, i) => {
        await call(fx, a, 'POST', `${EXT}/sandboxclaims`, claim(`b${i}`));
        const o = await claims.until(`b${i}`, ready);
        return { ms: performance.now() - t0, warm: o.status.launchType === 'warm' };
      }),
    );
    const burstAll = Math.max(...done.map((d) => d.ms));
    const burstCpu = (cpuMs() - cpu1) / BURST;
    profileMark('claims');
    const p = (q: number) => percentile(seq, q).toFixed(1);
    section('Agent-sandbox warm claims (SandboxClaim -> bound and Ready, through the API)', [
      `Machine: ${os.cpus().length} cpus${CHECKOUT ? `, checkout ${CHECKOUT}` : ''}, load ${os
        .loadavg()
        .map((x) => x.toFixed(1))
        .join(
          ' ',
        )}. \`npx tsx bench/agentsandbox.ts --runs ${RUNS} --burst ${BURST}\`, procbox, pool of ${RUNS} Ready before the timing.`,
      '',
      '| what | p50 | p99 | goal | peers (published, not measured here) |',
      '|---|---|---|---|---|',
      `| ${RUNS} sequential claims (POST -> watch: Ready with a sandbox), ${warmSeq} warm | ${p(50)} ms | ${p(99)} ms | <= 20 ms p50, <= 50 ms p99 | cocoon 33 ms p50, agent-sandbox 50-64 ms |`,
      `| the POST's answer alone (sequential) | ${percentile(posts, 50).toFixed(1)} ms | ${percentile(posts, 99).toFixed(1)} ms | | |`,
      `| server CPU (user + system) per claim, sequential / burst (until the last is bound) | ${seqCpu.toFixed(1)} ms | ${burstCpu.toFixed(1)} ms | | |`,
      `| floor: ${RUNS} sequential writes of one object seen on a watch (SandboxTemplate POST) | ${percentile(floor, 50).toFixed(1)} ms | ${percentile(floor, 99).toFixed(1)} ms | | a plain claim is 1 such write (claim and bind in one batch, bound at create) |`,
      `| burst of ${BURST} claims on a pool of ${BURST}: all bound and Ready, ${done.filter((d) => d.warm).length} warm | ${percentile(
        done.map((d) => d.ms),
        50,
      ).toFixed(1)} ms | last ${burstAll.toFixed(1)} ms | all <= 1000 ms | |`,
    ]);
    pools.stop();
    claims.stop();
    await call(fx, agent, 'DELETE', `${EXT}/sandboxclaims`);
    await call(fx, agent, 'DELETE', `${EXT}/sandboxwarmpools/bench`);
    agents.forEach((a) => a.destroy());
  } finally {
    agent.destroy();
    await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=180s'], { timeoutMs: 190_000 });
    await fx.stop();
    if (js) fs.rmSync(js.dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
