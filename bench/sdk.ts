// @fluxvm/sdk: what the SDK adds over the wire, and ComputeSDK-method TTI through it.
//   npx tsx bench/sdk.ts [--runs 300] [--tti 100]
// 1. exec `true` on one Running Sandbox: sandbox.exec(['true']) through the SDK vs the same POST
//    sandboxes/NAME/exec written by hand with node:https (a kept-alive agent, one connection),
//    interleaved in rounds of 10 so load changes hit both alike; median, p90, and the ratio of
//    the medians (the target: SDK <= 1.2x raw).
// 2. TTI the ComputeSDK way through the SDK's ComputeSDK provider (sdk/src/providers/
//    computesdk.ts): provider.sandbox.create() (POST, then Ready seen on a watch) then
//    runCommand('true') answered = one sample; --tti sequential samples (deleted after each,
//    untimed), 5% trimmed at each end; median, p95; beside the leaderboard's published best
//    (quoted, over the internet, not measured here) and bench/tti.ts (the raw client).
// A `fluxctl serve` child with a throwaway state dir, HTTPS with the admin token.
import https from 'node:https';
import os from 'node:os';
import { startFluxctl } from '../test/e2e/harness.js';
import { FluxClient, Sandbox } from '../sdk/src/index.js';
import { fluxvm } from '../sdk/src/providers/computesdk.js';
import { arg, median, percentile, section } from './lib.js';

const RUNS = arg('runs', 300);
const TTI = arg('tti', 100);
/** ComputeSDK's sandbox leaderboard, best published time to interactive (over the internet). */
const LEADERBOARD_MS = 42;
const ms = (x: number) => `${x.toFixed(2)} ms`;
const trimmed = (xs: number[], pct = 5) => {
  const s = [...xs].sort((a, b) => a - b);
  const k = Math.floor((s.length * pct) / 100);
  return s.slice(k, s.length - k);
};

const fx = await startFluxctl({ readyTimeoutMs: 120_000 });
const c = FluxClient.fromKubeconfig(fx.kubeconfig);
try {
  const sbx = await Sandbox.create(c, { runtime: 'procbox' }, { name: 'bench-sdk', timeoutMs: 120_000 });
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ca: fx.ca });
  const path = `/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/bench-sdk/exec`;
  const body = Buffer.from(JSON.stringify({ command: ['true'] }));
  const raw = () =>
    new Promise<void>((resolve, reject) => {
      const req = https.request(
        `${fx.url}${path}`,
        {
          method: 'POST',
          agent,
          headers: {
            authorization: `Bearer ${fx.token}`,
            'content-type': 'application/json',
            'content-length': String(body.length),
            accept: 'application/json',
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (d: Buffer) => chunks.push(d));
          res.on('end', () => {
            const j = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { exitCode?: number };
            if (res.statusCode !== 200 || j.exitCode !== 0) reject(new Error(`raw exec: ${res.statusCode}`));
            else resolve();
          });
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  const viaSdk = async () => {
    const r = await sbx.exec(['true']);
    if (r.exitCode !== 0) throw new Error(`sdk exec: ${r.exitCode}`);
  };
  for (let i = 0; i < 20; i++) (await raw(), await viaSdk()); // warm both connections
  const tRaw: number[] = [];
  const tSdk: number[] = [];
  for (let done = 0; done < RUNS; done += 10) {
    for (const [f, into] of [
      [raw, tRaw],
      [viaSdk, tSdk],
    ] as const)
      for (let i = 0; i < 10; i++) {
        const t0 = performance.now();
        await f();
        into.push(performance.now() - t0);
      }
  }
  agent.destroy();
  const ratio = median(tSdk) / median(tRaw);
  section('SDK exec `true` vs a raw HTTPS request', [
    `${RUNS} each, interleaved in rounds of 10, one kept-alive TLS connection each; load ${os.loadavg()[0]!.toFixed(1)} on ${os.cpus().length} cpus.`,
    '',
    '| client | median | p90 |',
    '|---|---|---|',
    `| raw node:https POST .../exec | ${ms(median(tRaw))} | ${ms(percentile(tRaw, 90))} |`,
    `| @fluxvm/sdk sandbox.exec(['true']) | ${ms(median(tSdk))} | ${ms(percentile(tSdk, 90))} |`,
    '',
    `SDK / raw (medians): **${ratio.toFixed(3)}x** (target <= 1.2x: ${ratio <= 1.2 ? 'met' : 'NOT met'}).`,
  ]);
  await sbx.delete();

  const provider = fluxvm({ client: c });
  const samples: number[] = [];
  for (let i = 0; i < TTI; i++) {
    const t0 = performance.now();
    const s = await provider.sandbox.create();
    const r = await s.runCommand('true');
    const t = performance.now() - t0;
    if (r.exitCode !== 0) throw new Error(`tti: first command exit ${r.exitCode}`);
    samples.push(t);
    await s.destroy();
  }
  const kept = trimmed(samples);
  section('TTI through the SDK, ComputeSDK method', [
    `${TTI} sequential: ComputeSDK provider.sandbox.create() (POST, Ready seen on a watch) -> runCommand('true') answered; ` +
      `5% trimmed at each end; procbox, network none; load ${os.loadavg()[0]!.toFixed(1)} on ${os.cpus().length} cpus.`,
    '',
    '| | median | p95 |',
    '|---|---|---|',
    `| FluxVM through @fluxvm/sdk's ComputeSDK provider | ${ms(median(kept))} | ${ms(percentile(kept, 95))} |`,
    `| leaderboard's published best (quoted, over the internet, not measured here) | ${LEADERBOARD_MS} ms | |`,
  ]);
} finally {
  c.close();
  await fx.stop();
}
