// Sandboxes through the API: a real `fluxctl serve` child process (procbox), driven
// over HTTPS with the admin token (the default serve), like kubectl/fluxctl would.
//   - apply-to-Ready latency: POST a Sandbox, then a watch sees Ready=True (p50, p90); applies
//     200 ms apart (serve keeps a warm pool of procbox inits, 4 by default, refilled between them)
//   - exec `true` round trip through the API (POST sandboxes/<n>/exec), beside the procbox
//     driver alone (rt.exec in this process) and beside `unshare -mpfiun true` spawned from Node
//   - fork of 32 children through the API: 32 Sandboxes with source.sandboxRef posted at once,
//     until all are Ready
// Requests go over one kept-alive TLS connection (an https.Agent with keepAlive and maxSockets 1,
// as kubectl keeps one); the watch has its own.
//   npx tsx bench/sandbox.ts [--runs 30] [--forks 32] [--no-fork] [--before DIR] [--warm-pool N]
// --before DIR: A/B; this tree and another checkout (e.g. `git archive <rev> | tar -x -C DIR`),
// both transpiled, each served by its own `fluxctl serve`; the applies and execs alternate
// between the two (the side going first swaps every round), and both sides' medians, server CPU
// per operation (/proc/<pid>/task/*/schedstat) and ratios are printed (the fork part is skipped).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { startFluxctl, REPO, type Fluxctl } from '../test/e2e/harness.js';
import { transpile } from './serve-js.js';
import { arg, cpuMs, jsonClient, median, percentile, section } from './lib.js';

const RUNS = arg('runs', 30);
const FORKS = arg('forks', 32);
const FORK = !process.argv.includes('--no-fork');
const BEFORE = strArg('before');
/** serve's --warm-pool; unset: serve's default. */
const WARM_POOL = strArg('warm-pool');
const BASE = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';

function strArg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
}

/** One server and its kept-alive connection. */
interface Side {
  name: string;
  fx: Fluxctl;
  agent: https.Agent;
  pid: number;
  jsDir?: string;
  apply: number[];
  exec: number[];
  applyCpu: number[];
  execCpu: number[];
}

/** A JSON POST over the side's kept-alive connection (bench/lib.ts jsonClient); throws on a non-2xx answer. */
function post(s: Side, p: string, body: unknown): Promise<any> {
  return jsonClient(s.fx, s.agent).call('POST', p, body);
}

/** Resolves when every named sandbox has reported Ready=True (one watch for all). */
function whenReady(fx: Fluxctl, names: Set<string>): { ready: Promise<void>; stop: () => void } {
  const ac = new AbortController();
  const ready = (async () => {
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = https.get(
        `${fx.url}${BASE}?watch=true`,
        { ca: fx.ca, headers: { authorization: `Bearer ${fx.token}` }, signal: ac.signal },
        resolve,
      );
      req.on('error', reject);
    });
    res.setEncoding('utf8');
    let buf = '';
    for await (const chunk of res) {
      buf += chunk as string;
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const ev = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        const o = ev.object;
        if (o?.status?.conditions?.some((c: any) => c.type === 'Ready' && c.status === 'True'))
          names.delete(o.metadata.name);
        if (o?.status?.phase === 'Failed') throw new Error(`${o.metadata.name} failed: ${o.status.message}`);
        if (names.size === 0) {
          ac.abort();
          return;
        }
      }
    }
    throw new Error('watch ended');
  })().catch((e) => {
    if (names.size !== 0) throw e;
  });
  return { ready, stop: () => ac.abort() };
}

const sbx = (name: string, spec: Record<string, unknown> = {}) => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'Sandbox',
  metadata: { name },
  spec,
});

function spawnWait(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: 'ignore' });
    p.on('error', reject);
    p.on('close', (c) => (c === 0 ? resolve() : reject(new Error(`${cmd} exited ${c}`))));
  });
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

/** Apply -> Ready of one sandbox on side s: [wall ms, server CPU ms]. */
async function applyOnce(s: Side, name: string): Promise<[number, number]> {
  const w = whenReady(s.fx, new Set([name]));
  await new Promise((r) => setTimeout(r, 5)); // the watch is open before the create
  const c0 = cpuMs(s.pid);
  const t = performance.now();
  await post(s, BASE, sbx(name));
  await w.ready;
  return [performance.now() - t, cpuMs(s.pid) - c0];
}

const ms = (x: number) => `${x.toFixed(2)} ms`;

async function start(name: string, dir?: string): Promise<Side> {
  let jsDir: string | undefined;
  let command: string[] | undefined;
  if (dir !== undefined) {
    const js = await transpile(dir);
    jsDir = js.dir;
    command = [process.execPath, js.entry];
  }
  const fx = await startFluxctl({
    args: ['--quiet', ...(WARM_POOL === undefined ? [] : ['--warm-pool', WARM_POOL])],
    ...(command ? { command } : {}),
  });
  const pid = fx.child.pid!;
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
  return { name, fx, agent, pid, jsDir, apply: [], exec: [], applyCpu: [], execCpu: [] };
}

async function stopSide(s: Side): Promise<void> {
  s.agent.destroy();
  await s.fx.stop();
  if (s.jsDir) fs.rmSync(s.jsDir, { recursive: true, force: true });
}

async function warm(s: Side): Promise<void> {
  // First create builds the generated /etc, JIT, ...; the exec sandbox is `warm`.
  const w = whenReady(s.fx, new Set(['warm']));
  await post(s, BASE, sbx('warm'));
  await w.ready;
  await post(s, `${BASE}/warm/exec`, { command: ['true'] });
}

/** Apply and exec rounds on each side in turn, the first side swapping every round. */
async function measure(sides: Side[]): Promise<void> {
  for (let i = 0; i < RUNS; i++) {
    for (const s of i % 2 ? [...sides].reverse() : sides) {
      const [a, ac] = await applyOnce(s, `a${i}`);
      s.apply.push(a);
      s.applyCpu.push(ac);
    }
    await new Promise((r) => setTimeout(r, 200)); // isolated applies: the warm pool refills between them
  }
  for (let i = 0; i < RUNS; i++) {
    for (const s of i % 2 ? [...sides].reverse() : sides) {
      const c0 = cpuMs(s.pid);
      s.exec.push(await timed(() => post(s, `${BASE}/warm/exec`, { command: ['true'] })));
      s.execCpu.push(cpuMs(s.pid) - c0);
    }
  }
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    section('sandbox (API)', ['Not run: procbox needs root.']);
    return;
  }
  const load0 = os.loadavg()[0];
  const sides: Side[] = [];
  const lines: string[] = [];
  try {
    if (BEFORE !== undefined) {
      sides.push(await start('this tree', REPO), await start('before', path.resolve(BEFORE)));
    } else sides.push(await start('this tree'));
    for (const s of sides) await warm(s);
    if (BEFORE !== undefined) {
      await measure(sides);
      const [a, b] = sides as [Side, Side];
      const row = (s: Side) =>
        `| ${s.name} | ${ms(median(s.apply))} | ${ms(median(s.applyCpu))} | ${ms(median(s.exec))} | ${ms(median(s.execCpu))} |`;
      lines.push(
        `${RUNS} rounds, the two servers (both transpiled) in turn, the first side swapping every round; one kept-alive TLS connection each. ` +
          `Server CPU from /proc/<pid>/task/*/schedstat. ${os.cpus().length} CPUs, load average ${load0.toFixed(1)} -> ${os.loadavg()[0].toFixed(1)}.`,
        '',
        '| side | apply -> Ready p50 | server CPU per apply | exec `true` p50 | server CPU per exec |',
        '|---|---:|---:|---:|---:|',
        row(a),
        row(b),
        '',
        `this / before: apply ${(median(a.apply) / median(b.apply)).toFixed(2)}, exec ${(median(a.exec) / median(b.exec)).toFixed(2)}`,
      );
      section('sandbox (API), this tree beside another checkout', lines);
      return;
    }
    const [s] = sides as [Side];
    // Apply to Ready.
    for (let i = 0; i < RUNS; i++) {
      s.apply.push((await applyOnce(s, `a${i}`))[0]);
      await new Promise((r) => setTimeout(r, 200)); // isolated applies: the warm pool refills between them
    }
    // Exec round trips, interleaved (API, driver, unshare in turn) so a busy host weighs on all three alike.
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-sbx-'));
    const rt = new ProcboxRuntime({ stateDir });
    await rt.start();
    await rt.create({ id: 'drv' });
    await rt.exec('drv', { argv: ['true'] });
    const drvExec: number[] = [];
    const unshare: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      s.exec.push(await timed(() => post(s, `${BASE}/warm/exec`, { command: ['true'] })));
      drvExec.push(await timed(() => rt.exec('drv', { argv: ['true'] })));
      unshare.push(await timed(() => spawnWait('unshare', ['-mpfiun', 'true'])));
    }
    await rt.destroy('drv');
    await rt.close();
    fs.rmSync(stateDir, { recursive: true, force: true });
    let forkMs = NaN;
    if (FORK) {
      // Fork of N through the API.
      await post(s, `${BASE}/warm/exec`, {
        command: ['sh', '-c', 'mkdir -p /work/src && for i in $(seq 1 100); do echo $i > /work/src/f$i; done'],
      });
      const names = new Set(Array.from({ length: FORKS }, (_, i) => `f${i}`));
      const w = whenReady(s.fx, new Set(names));
      await new Promise((r) => setTimeout(r, 5));
      const t0 = performance.now();
      const forker: Side = { ...s, agent: new https.Agent({ keepAlive: true, maxSockets: FORKS }) };
      await Promise.all(
        [...names].map((n) => post(forker, BASE, sbx(n, { workspace: { source: { sandboxRef: { name: 'warm' } } } }))),
      );
      await w.ready;
      forkMs = performance.now() - t0;
      forker.agent.destroy();
    }

    const a50 = median(s.apply);
    const apiExec = s.exec;
    lines.push(
      `${RUNS} runs each; a \`fluxctl serve\` child process with the procbox runtime, driven over HTTPS with the admin token over one kept-alive TLS connection (as kubectl keeps one). ${os.cpus().length} CPUs, load average ${load0.toFixed(2)} before, ${os.loadavg()[0].toFixed(2)} after.`,
      '',
      '| measurement | median | p90 | note |',
      '|---|---|---|---|',
      `| apply to Ready (POST Sandbox -> watch sees Ready=True) | ${ms(a50)} | ${ms(percentile(s.apply, 90))} | goal p50 <= 10 ms: ${a50 <= 10 ? 'met' : 'NOT met'} |`,
      `| exec \`true\` through the API (POST sandboxes/x/exec) | ${ms(median(apiExec))} | ${ms(percentile(apiExec, 90))} | ${(median(apiExec) / median(drvExec)).toFixed(2)}x driver, ${(median(apiExec) / median(unshare)).toFixed(2)}x unshare (goal <= 1.2x) |`,
      `| exec \`true\` via the procbox driver alone (rt.exec) | ${ms(median(drvExec))} | ${ms(percentile(drvExec, 90))} | ${(median(drvExec) / median(unshare)).toFixed(2)}x unshare |`,
      `| \`unshare -mpfiun true\` (Node spawn) | ${ms(median(unshare))} | ${ms(percentile(unshare, 90))} | |`,
      FORK
        ? `| fork of ${FORKS} through the API (POST ${FORKS} Sandboxes with sandboxRef -> all Ready) | ${ms(forkMs)} total | | ${ms(forkMs / FORKS)} per child |`
        : '| fork through the API | not run (--no-fork) | | |',
    );
  } finally {
    for (const s of sides) await stopSide(s);
  }
  section('sandbox (API)', lines);
}

await main();
