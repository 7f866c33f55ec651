// Where the first render of the 2,000-line changeset page goes: one real serve,
// Debian's chromium through playwright-core, and for each load the page's own timeline:
// navigation timing, every resource's start/first byte/end (Resource Timing), the long tasks,
// the marks the console sets (fluxvm:*), and Chromium's Performance.getMetrics over the CDP
// (script, layout, style time). Plus the diff and changeset GETs timed from node, straight to the
// API and through the console's proxy, to split server time from the browser's.
//   npx tsx bench/console-profile.ts [--runs 3] [--checkout DIR]
// --checkout DIR: serve (and its built console) from another checkout of the project, e.g. a
// `git archive` of an older commit with node_modules linked (its console built there first).
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { performance as perf } from 'node:perf_hooks';
import { startFluxctl } from '../test/e2e/harness.js';
import { api, makeSandbox } from '../test/e2e/sandbox-helpers.js';
import { buildConsole, chromiumSkipReason, launch, newContext, signIn } from '../test/e2e/console-browser.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const RUNS = arg('runs', 3);
const opt = (name: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
/** A serve of `dir` (another checkout), through tsx. */
export const checkoutCommand = (dir: string) => ({
  command: [process.execPath, '--import', 'tsx', path.join(dir, 'cmd', 'fluxctl', 'main.ts')],
  cwd: dir,
});
const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';
const load = () =>
  os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(' ');

/** The renderer main thread's top-level tasks by kind up to the mark fluxvm:diff-rendered. */
function summarizeTrace(buf: Buffer): void {
  type Ev = {
    name: string;
    ph: string;
    ts: number;
    dur?: number;
    tid: number;
    pid: number;
    args?: { data?: { url?: string } };
  };
  const evs = (JSON.parse(buf.toString('utf8')) as { traceEvents: Ev[] }).traceEvents;
  const mark = evs.find((e) => e.name === 'fluxvm:diff-rendered');
  const nav = evs.find((e) => e.name === 'navigationStart' || e.name === 'NavigationBodyLoader::StartLoadingBody');
  const main = mark ?? nav;
  if (!main) return console.log('  trace: no mark');
  const until = mark?.ts ?? Infinity;
  const from = evs.filter((e) => e.pid === main.pid && e.tid === main.tid && e.name === 'RunTask' && e.ts <= until);
  const t0 = nav?.ts ?? from[0]?.ts ?? 0;
  const kinds = new Map<string, number>();
  for (const e of evs) {
    if (e.pid !== main.pid || e.tid !== main.tid || e.ph !== 'X' || e.ts > until || e.ts < t0) continue;
    if (
      ![
        'EvaluateScript',
        'v8.compile',
        'v8.compileModule',
        'v8.evaluateModule',
        'FunctionCall',
        'Layout',
        'UpdateLayoutTree',
        'Paint',
        'ParseHTML',
        'TimerFire',
        'FireAnimationFrame',
        'v8.run',
        'ResourceReceivedData',
        'EventDispatch',
        'RunMicrotasks',
        'V8.GCScavenger',
        'MajorGC',
        'MinorGC',
      ].includes(e.name)
    )
      continue;
    kinds.set(e.name, (kinds.get(e.name) ?? 0) + (e.dur ?? 0) / 1000);
  }
  const busy = from.reduce((n, e) => n + (e.dur ?? 0) / 1000, 0);
  console.log(
    `  trace: main thread busy ${busy.toFixed(0)} ms in ${from.length} tasks before the mark (${((until - t0) / 1000).toFixed(0)} ms after navigation start)`,
  );
  console.log(
    `  trace: ${[...kinds]
      .sort((a, b) => b[1] - a[1])
      .map(([k, v]) => `${k} ${v.toFixed(0)}`)
      .join(', ')} ms`,
  );
}

async function main() {
  const skip = chromiumSkipReason();
  if (skip) return console.log(`skipped: ${skip}`);
  const dir = opt('checkout');
  if (dir) execFileSync(process.execPath, [path.join(dir, 'console', 'build.mjs')], { stdio: 'pipe' });
  else buildConsole();
  const fx = await startFluxctl(dir ? checkoutCommand(dir) : {});
  const browser = await launch();
  try {
    await makeSandbox(fx, 'bench');
    const r = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'big' },
        spec: {
          sandboxRef: { name: 'bench' },
          command: [
            'sh',
            '-c',
            `i=0; while [ $i -lt 2000 ]; do echo "def f$i(x): return x + $i  # line $i"; i=$((i+1)); done > /work/big.py`,
          ],
        },
      },
    });
    if (r.status !== 201) throw new Error(r.body.toString());
    for (let t = 0; (await api(fx, 'GET', `${CS}/big`)).json.status?.phase !== 'Pending'; t++) {
      if (t > 600) throw new Error('big never Pending');
      await new Promise((res) => setTimeout(res, 100));
    }
    // Server side, from node: the API straight, 5 times each.
    for (const p of [`${CS}/big`, `${CS}/big/diff`]) {
      const ts: number[] = [];
      for (let i = 0; i < 5; i++) {
        const t0 = perf.now();
        const res = await fx.request('GET', p);
        if (res.status !== 200) throw new Error(`${p}: ${res.status}`);
        ts.push(perf.now() - t0);
      }
      console.log(`node -> API GET ${p.split('/').slice(-2).join('/')}: ${ts.map((x) => x.toFixed(0)).join(', ')} ms`);
    }
    const ctx = await newContext(browser);
    await (await signIn(ctx, fx.url, fx.token!)).close();
    for (let i = 0; i < RUNS; i++) {
      const page = await ctx.newPage();
      const cdp = await ctx.newCDPSession(page);
      await cdp.send('Performance.enable');
      const trace = process.argv.includes('--trace') && i === RUNS - 1;
      if (trace) await browser.startTracing(page, { categories: ['devtools.timeline', 'v8.execute', 'blink'] });
      await page.goto(`${fx.url}/console/#/changesets/default/big`, { waitUntil: 'commit' });
      // The mark first, from the page's main world: a locator call now would evaluate Playwright's
      // selector engine in the page (~35 ms of its main thread) inside the window measured.
      await page.waitForFunction(() => performance.getEntriesByName('fluxvm:diff-rendered').length > 0, undefined, {
        polling: 50,
        timeout: 30_000,
      });
      await page.locator('table.diff.unified tr').nth(2000).waitFor({ timeout: 30_000 });
      if (trace) summarizeTrace(await browser.stopTracing());
      const t = await page.evaluate(() => {
        const nav = performance.getEntriesByType('navigation')[0] as PerformanceNavigationTiming;
        const res = (performance.getEntriesByType('resource') as PerformanceResourceTiming[]).map((e) => ({
          name: e.name.replace(location.origin, '').replace(/\/apis\/fluxvm.dev\/v1alpha1\/namespaces\/default/, '…'),
          start: e.startTime,
          ttfb: e.responseStart,
          end: e.responseEnd,
          bytes: e.transferSize,
        }));
        const marks = performance.getEntriesByType('mark').map((m) => ({ name: m.name, at: m.startTime }));
        return {
          nav: { ttfb: nav.responseStart, end: nav.responseEnd, dcl: nav.domContentLoadedEventEnd },
          res,
          marks,
        };
      });
      const m = (await cdp.send('Performance.getMetrics')).metrics;
      const metric = (n: string) => ((m.find((x) => x.name === n)?.value ?? 0) * 1000).toFixed(0);
      console.log(`\n### load ${i + 1} (load ${load()})`);
      console.log(
        `document: first byte ${t.nav.ttfb.toFixed(0)} ms, end ${t.nav.end.toFixed(0)}, DOMContentLoaded ${t.nav.dcl.toFixed(0)}`,
      );
      for (const e of t.res)
        console.log(
          `  ${e.start.toFixed(0).padStart(5)} -> first byte ${e.ttfb.toFixed(0).padStart(5)} -> end ${e.end.toFixed(0).padStart(5)}  ${e.bytes} B  ${e.name.slice(0, 110)}`,
        );
      for (const k of t.marks) console.log(`  mark ${k.name} at ${k.at.toFixed(0)} ms`);
      console.log(
        `  CDP: ScriptDuration ${metric('ScriptDuration')} ms, LayoutDuration ${metric('LayoutDuration')}, RecalcStyleDuration ${metric('RecalcStyleDuration')}, TaskDuration ${metric('TaskDuration')}`,
      );
      await page.close();
    }
    await ctx.close();
  } finally {
    await browser.close();
    await fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
