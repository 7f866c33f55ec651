// Preview URL latency (target: a preview request adds at most 0.5 ms p50 over a direct
// connection to the port). A real `fluxctl serve` (procbox, --insecure-http so both paths are
// plain HTTP) runs an offline AgentSession; the same small node HTTP server runs inside the
// session (reached through /preview/<token>/: serve's proxy, the kept-alive upstream
// connection through procbox-portfwd into the sandbox's network namespace) and on the host
// loopback (the direct connection: an offline sandbox has no address the host could reach, so
// the direct baseline is the same server, same node, on the host). Each path: one kept-alive
// client connection, sequential GETs of a 2-byte body, measured in alternating blocks of 100
// so load drift hits both alike; the added latency is the difference of the medians.
//   npx tsx bench/preview.ts [--requests 1000] [--warmup 2000] [--quiet] [--cpu-prof FILE]
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { startFluxctl } from '../test/e2e/harness.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const N = arg('requests', 1000);
// Requests per path before the measured ones: serve's HTTP server and proxy client reach their
// steady state (V8's optimizing tiers) only after ~2,000 requests; with 200, the first half of a
// 2,000-request run measured the warm-up (0.47-0.51 ms added, against 0.22-0.33 with 4,000).
const WARMUP = arg('warmup', 2000);
const BLOCK = 100;
const SERVER = `require('http').createServer((q, s) => { s.writeHead(200, {'content-type': 'text/plain'}); s.end('ok'); }).listen(Number(process.argv[1]), '127.0.0.1', () => console.log('listening'));`;

/** CPU time a process spent so far, in ms (/proc/PID/schedstat: ns on a CPU), 0 when it is gone. */
const cpuMs = (pid: number | undefined) => {
  try {
    return pid ? Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e6 : 0;
  } catch {
    return 0;
  }
};

const q = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
};

function getter(base: string) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const get = () =>
    new Promise<number>((resolve, reject) => {
      const t = process.hrtime.bigint();
      http
        .get(base, { agent }, (res) => {
          res.resume();
          res.on('end', () =>
            res.statusCode === 200
              ? resolve(Number(process.hrtime.bigint() - t) / 1e6)
              : reject(new Error(`${base}: ${res.statusCode}`)),
          );
        })
        .on('error', reject);
    });
  return { get, agent };
}

async function main() {
  const load = os.loadavg()[0]!.toFixed(1);
  const pi = process.argv.indexOf('--cpu-prof');
  const fx = await startFluxctl({
    readyTimeoutMs: 90_000,
    args: ['--insecure-http', ...(process.argv.includes('--quiet') ? ['--quiet'] : [])],
    // --cpu-prof FILE: a V8 profile of serve over the measured requests (bench/probe.mjs).
    ...(pi > 0
      ? {
          env: {
            NODE_OPTIONS: `--import=${new URL('./probe.mjs', import.meta.url).href}`,
            FLUXVM_CPU_PROFILE: path.resolve(process.argv[pi + 1]!),
            FLUXVM_CPU_PROFILE_ON_SIGNAL: '1',
          },
        }
      : {}),
  });
  const host = spawn(process.execPath, ['-e', SERVER, '18765'], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    await new Promise<void>((resolve) => host.stdout!.once('data', () => resolve()));
    const ags = JSON.stringify({
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'AgentSession',
      metadata: { name: 'bench' },
      spec: { agent: 'bench', policy: { preset: 'offline' } },
    });
    const applied = await fx.kubectl(['apply', '-f', '-'], { input: ags });
    if (applied.code !== 0) throw new Error(applied.stderr);
    const w = await fx.kubectl(['wait', 'ags/bench', '--for=condition=Ready', '--timeout=60s'], { timeoutMs: 70_000 });
    if (w.code !== 0) throw new Error(w.stderr);
    const sub = (s: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/bench/${s}`;
    const run = await fx.request('POST', sub('exec'), {
      body: {
        command: ['sh', '-c', `nohup node -e "${SERVER.replace(/"/g, '\\"')}" 8000 >/tmp/srv.log 2>&1 </dev/null &`],
      },
    });
    if (run.status !== 200) throw new Error(run.body.toString());
    const p = await fx.request('POST', sub('previews'), { body: { port: 8000, ttlSeconds: 3600 } });
    if (p.status !== 201) throw new Error(p.body.toString());
    const direct = getter('http://127.0.0.1:18765/');
    const preview = getter(`${fx.url}${p.json.path}`);
    for (let i = 0; ; i++) {
      try {
        await preview.get();
        break;
      } catch (e) {
        if (i > 300) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    for (let i = 0; i < WARMUP; i++) (await direct.get(), await preview.get()); // warm-up (JIT, connections)
    const d: number[] = [];
    const v: number[] = [];
    // CPU spent by serve and by the sandbox's port helper during the preview requests (load-independent).
    const helperPid =
      Number(
        execFileSync('pgrep', ['-P', String(fx.child.pid), '-f', 'procbox-portfwd'])
          .toString()
          .trim()
          .split('\n')[0],
      ) || undefined;
    let serveCpu = 0;
    let helperCpu = 0;
    // serve's own background work (controllers, timers) while it serves nothing of this bench: per ms of wall time.
    let idleCpu = 0;
    let idleWall = 0;
    let busyWall = 0;
    if (pi > 0) process.kill(fx.child.pid!, 'SIGUSR2');
    for (let done = 0; done < N; done += BLOCK) {
      const i0 = cpuMs(fx.child.pid);
      const w0 = performance.now();
      for (let i = 0; i < BLOCK; i++) d.push(await direct.get());
      idleCpu += cpuMs(fx.child.pid) - i0;
      idleWall += performance.now() - w0;
      const b0 = performance.now();
      const s0 = cpuMs(fx.child.pid);
      const h0 = cpuMs(helperPid);
      for (let i = 0; i < BLOCK; i++) v.push(await preview.get());
      serveCpu += cpuMs(fx.child.pid) - s0;
      helperCpu += cpuMs(helperPid) - h0;
      busyWall += performance.now() - b0;
    }
    if (pi > 0) process.kill(fx.child.pid!, 'SIGUSR2');
    direct.agent.destroy();
    preview.agent.destroy();
    const f = (x: number) => x.toFixed(3);
    const added = q(v, 0.5) - q(d, 0.5);
    console.log('## preview');
    console.log('');
    console.log(
      `Preview URL request latency (bench/preview.ts): ${N} sequential GETs per path on one kept-alive connection after ${WARMUP} unmeasured ones each, plain HTTP, a 2-byte body; load average ${load} before it.`,
    );
    console.log('');
    console.log('| path | p50 ms | p90 ms | p99 ms |');
    console.log('|---|---|---|---|');
    console.log(`| direct: the server on the host loopback | ${f(q(d, 0.5))} | ${f(q(d, 0.9))} | ${f(q(d, 0.99))} |`);
    console.log(
      `| preview: serve /preview/<token>/ -> procbox-portfwd -> the server in an offline sandbox | ${f(q(v, 0.5))} | ${f(q(v, 0.9))} | ${f(q(v, 0.99))} |`,
    );
    console.log('');
    console.log(`Added latency (p50 preview - p50 direct): **${f(added)} ms** (target <= 0.5 ms).`);
    console.log('');
    console.log(
      `CPU per preview request (independent of the load): serve ${f((serveCpu - (idleCpu / idleWall) * busyWall) / N)} ms (its background work while idle, ${f((idleCpu / idleWall) * 1000)} ms per s, subtracted), procbox-portfwd ${f(helperCpu / N)} ms${helperPid ? '' : ' (helper not found)'}.`,
    );
  } finally {
    host.kill();
    await fx
      .kubectl(['delete', 'ags', 'bench', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 })
      .catch(() => undefined);
    await fx.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
