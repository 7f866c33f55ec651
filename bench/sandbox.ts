// Sandboxes through the API: a real `fluxctl serve` child process (procbox), driven
// over HTTPS with the admin token (the default serve), like kubectl/fluxctl would.
//   - apply-to-Ready latency: POST a Sandbox, then a watch sees Ready=True (p50, p90); applies
//     200 ms apart (serve keeps a warm pool of 2 procbox inits, refilled between them)
//   - exec `true` round trip through the API (POST sandboxes/<n>/exec), beside the procbox
//     driver alone (rt.exec in this process) and beside `unshare -mpfiun true` spawned from Node
//   - fork of 32 children through the API: 32 Sandboxes with source.sandboxRef posted at once,
//     until all are Ready
//   npx tsx bench/sandbox.ts [--runs 30] [--forks 32]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { startFluxctl, type Fluxctl } from '../test/e2e/harness.js';
import { arg, median, percentile, section } from './lib.js';

const RUNS = arg('runs', 30);
const FORKS = arg('forks', 32);
const BASE = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';

async function post(fx: Fluxctl, p: string, body: unknown): Promise<any> {
  const r = await fx.request('POST', p, { body });
  if (r.status < 200 || r.status > 299) throw new Error(`${p}: ${r.status} ${r.body.toString('utf8')}`);
  return r.json;
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

async function time(n: number, fn: (i: number) => Promise<unknown>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn(i);
    out.push(performance.now() - t);
  }
  return out;
}

const ms = (x: number) => `${x.toFixed(2)} ms`;

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    section('sandbox (API)', ['Not run: procbox needs root.']);
    return;
  }
  const fx = await startFluxctl({ args: ['--quiet'] });
  const lines: string[] = [];
  try {
    // Warm up (first create builds the generated /etc, JIT, ...).
    {
      const w = whenReady(fx, new Set(['warm']));
      await post(fx, BASE, sbx('warm'));
      await w.ready;
    }
    // Apply to Ready.
    const apply: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      const name = `a${i}`;
      const w = whenReady(fx, new Set([name]));
      await new Promise((r) => setTimeout(r, 5)); // the watch is open before the create
      const t = performance.now();
      await post(fx, BASE, sbx(name));
      await w.ready;
      apply.push(performance.now() - t);
      await new Promise((r) => setTimeout(r, 200)); // isolated applies: the warm pool refills between them
    }
    // Exec round trips, interleaved (API, driver, unshare in turn) so a busy host weighs on all three alike.
    const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-sbx-'));
    const rt = new ProcboxRuntime({ stateDir });
    await rt.start();
    await rt.create({ id: 'drv' });
    await rt.exec('drv', { argv: ['true'] });
    await post(fx, `${BASE}/warm/exec`, { command: ['true'] });
    const apiExec: number[] = [];
    const drvExec: number[] = [];
    const unshare: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      apiExec.push(...(await time(1, () => post(fx, `${BASE}/warm/exec`, { command: ['true'] }))));
      drvExec.push(...(await time(1, () => rt.exec('drv', { argv: ['true'] }))));
      unshare.push(...(await time(1, () => spawnWait('unshare', ['-mpfiun', 'true']))));
    }
    await rt.destroy('drv');
    await rt.close();
    fs.rmSync(stateDir, { recursive: true, force: true });
    // Fork of N through the API.
    await post(fx, `${BASE}/warm/exec`, {
      command: ['sh', '-c', 'mkdir -p /work/src && for i in $(seq 1 100); do echo $i > /work/src/f$i; done'],
    });
    const names = new Set(Array.from({ length: FORKS }, (_, i) => `f${i}`));
    const w = whenReady(fx, new Set(names));
    await new Promise((r) => setTimeout(r, 5));
    const t0 = performance.now();
    await Promise.all(
      [...names].map((n) => post(fx, BASE, sbx(n, { workspace: { source: { sandboxRef: { name: 'warm' } } } }))),
    );
    await w.ready;
    const forkMs = performance.now() - t0;

    const a50 = median(apply);
    lines.push(
      `${RUNS} runs each; a \`fluxctl serve\` child process with the procbox runtime, driven over HTTPS with the admin token, a new TLS connection per request (kubectl keeps one open: its exec is cheaper).`,
      '',
      '| measurement | median | p90 | note |',
      '|---|---|---|---|',
      `| apply to Ready (POST Sandbox -> watch sees Ready=True) | ${ms(a50)} | ${ms(percentile(apply, 90))} | goal p50 < 50 ms: ${a50 < 50 ? 'met' : 'NOT met'} |`,
      `| exec \`true\` through the API (POST sandboxes/x/exec) | ${ms(median(apiExec))} | ${ms(percentile(apiExec, 90))} | ${(median(apiExec) / median(drvExec)).toFixed(2)}x driver, ${(median(apiExec) / median(unshare)).toFixed(2)}x unshare |`,
      `| exec \`true\` via the procbox driver alone (rt.exec) | ${ms(median(drvExec))} | ${ms(percentile(drvExec, 90))} | ${(median(drvExec) / median(unshare)).toFixed(2)}x unshare |`,
      `| \`unshare -mpfiun true\` (Node spawn) | ${ms(median(unshare))} | ${ms(percentile(unshare, 90))} | |`,
      `| fork of ${FORKS} through the API (POST ${FORKS} Sandboxes with sandboxRef -> all Ready) | ${ms(forkMs)} total | | ${ms(forkMs / FORKS)} per child |`,
    );
  } finally {
    await fx.stop();
  }
  section('sandbox (API)', lines);
}

await main();
