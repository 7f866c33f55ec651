// The review console's performance targets (issue 26): the first render of a changeset page
// with a 2,000-line diff <= 300 ms in headless chromium; the JavaScript bundle <= 300 KiB
// gzipped; a new changeset visible in an open list <= 1 s after it becomes Pending.
// A real `fluxctl serve` (procbox, HTTPS), Debian's chromium through playwright-core.
//   npx tsx bench/console.ts [--runs 5]
// Numbers, per run, medians printed:
//   diff page: navigation start -> the 2,000 diff rows committed to the DOM (the page's
//              performance mark fluxvm:diff-rendered) (includes sign-in cookie,
//              script load, the changeset GET/watch and the diff GET), and the render part alone:
//              the diff response's end -> the rows in the DOM;
//   list:      the Pending event on a watch of the API (this process) -> the row showing Pending
//              in the page (a MutationObserver's Date.now(); same host clock).
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { REPO, startFluxctl } from '../test/e2e/harness.js';
import { api, makeSandbox } from '../test/e2e/sandbox-helpers.js';
import { buildConsole, chromiumSkipReason, launch, newContext, signIn } from '../test/e2e/console-browser.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const RUNS = arg('runs', 5);
const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main() {
  const skip = chromiumSkipReason();
  if (skip) {
    console.log(`## console\n\nskipped: ${skip}\n`);
    return;
  }
  buildConsole();
  const js = fs.readFileSync(path.join(REPO, 'dist', 'console', 'assets', 'app.js'));
  const gz = zlib.gzipSync(js, { level: 9 }).length;
  const fx = await startFluxctl();
  const browser = await launch();
  try {
    await makeSandbox(fx, 'bench');
    const speculate = async (name: string, script: string) => {
      const r = await api(fx, 'POST', CS, {
        body: {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'Changeset',
          metadata: { name },
          spec: { sandboxRef: { name: 'bench' }, command: ['sh', '-c', script] },
        },
      });
      if (r.status !== 201) throw new Error(r.body.toString());
    };
    // Watch the API for Pending (the reference time of the list measurement).
    const pendingAt = new Map<string, number>();
    const u = new URL(`${fx.url}${CS}?watch=1`);
    const watchReq = (u.protocol === 'https:' ? https : http).request(u, {
      ca: fx.ca,
      headers: { authorization: `Bearer ${fx.token}` },
    });
    watchReq.on('response', (res) => {
      let buf = '';
      res.on('data', (c: Buffer) => {
        buf += c.toString();
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const ev = JSON.parse(buf.slice(0, i)) as {
            object: { metadata: { name: string }; status?: { phase?: string } };
          };
          buf = buf.slice(i + 1);
          if (ev.object.status?.phase === 'Pending' && !pendingAt.has(ev.object.metadata.name))
            pendingAt.set(ev.object.metadata.name, Date.now());
        }
      });
    });
    watchReq.end();

    // 1. A 2,000-line diff (a new Python file of 2,000 lines).
    await speculate(
      'big',
      `i=0; while [ $i -lt 2000 ]; do echo "def f$i(x): return x + $i  # line $i"; i=$((i+1)); done > /work/big.py`,
    );
    for (let t = 0; !pendingAt.has('big'); t++) {
      if (t > 600) throw new Error('big never Pending');
      await new Promise((r) => setTimeout(r, 100));
    }
    const ctx = await newContext(browser);
    await (await signIn(ctx, fx.url, fx.token!)).close();
    const total: number[] = [];
    const render: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      const page = await ctx.newPage();
      await page.goto(`${fx.url}/console/#/changesets/default/big`);
      await page.locator('table.diff.unified tr').nth(2000).waitFor({ timeout: 30_000 });
      const m = await page.evaluate(() => {
        const now = performance.getEntriesByName('fluxvm:diff-rendered')[0]?.startTime ?? performance.now();
        const d = performance.getEntriesByType('resource').find((e) => e.name.endsWith('/big/diff')) as
          PerformanceResourceTiming | undefined;
        return { now, diffEnd: d?.responseEnd ?? 0 };
      });
      total.push(m.now);
      render.push(m.now - m.diffEnd);
      await page.close();
    }

    // 2. A new changeset in an open list.
    const page = await ctx.newPage();
    await page.goto(`${fx.url}/console/#/changesets`);
    await page.locator('tr[data-name="big"]').waitFor();
    await page.evaluate(() => {
      const w = window as unknown as { seenPending: Record<string, number> };
      w.seenPending = {};
      new MutationObserver(() => {
        for (const tr of document.querySelectorAll('tr[data-name]')) {
          const n = tr.getAttribute('data-name')!;
          if (!w.seenPending[n] && tr.textContent?.includes('Pending')) w.seenPending[n] = Date.now();
        }
      }).observe(document.body, { subtree: true, childList: true, characterData: true });
    });
    const lag: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      const name = `new-${i}`;
      await speculate(name, `echo ${i} > /work/n${i}.txt`);
      let seen: number | undefined;
      for (let t = 0; t < 600 && (seen === undefined || !pendingAt.has(name)); t++) {
        seen = await page.evaluate(
          (n) => (window as unknown as { seenPending: Record<string, number> }).seenPending[n],
          name,
        );
        if (seen === undefined || !pendingAt.has(name)) await new Promise((r) => setTimeout(r, 50));
      }
      if (seen === undefined) throw new Error(`${name} never shown Pending`);
      lag.push(seen - pendingAt.get(name)!);
    }
    watchReq.destroy();
    await ctx.close();
    const load = os
      .loadavg()
      .map((x) => x.toFixed(1))
      .join(' ');
    console.log(`## console\n`);
    console.log(`chromium headless, ${RUNS} runs, medians; load ${load}, ${os.cpus().length} cpus\n`);
    console.log('| what | measured | target |\n|---|---|---|');
    console.log(
      `| bundle app.js gzipped | ${(gz / 1024).toFixed(1)} KiB (${(js.length / 1024).toFixed(0)} KiB raw) | <= 300 KiB |`,
    );
    console.log(
      `| 2,000-line diff page: navigation -> diff committed to the DOM (first 200 rows; the rest follow in chunks) | ${median(total).toFixed(0)} ms (runs ${total.map((x) => x.toFixed(0)).join(', ')}) | <= 300 ms |`,
    );
    console.log(
      `| of which: diff response -> rows rendered | ${median(render).toFixed(0)} ms (runs ${render.map((x) => x.toFixed(0)).join(', ')}) | |`,
    );
    console.log(
      `| new changeset: Pending on the API watch -> shown Pending in the open list | ${median(lag).toFixed(0)} ms (runs ${lag.join(', ')}) | <= 1000 ms |`,
    );
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
