// The review console's performance targets: the first render of a changeset page
// with a 2,000-line diff <= 300 ms in headless chromium; the JavaScript bundle <= 300 KiB
// gzipped; a new changeset visible in an open list <= 1 s after it becomes Pending.
// A real `fluxctl serve` (procbox, HTTPS), Debian's chromium through playwright-core.
//   npx tsx bench/console.ts [--runs 5] [--checkout DIR] [--baseline DIR]
// --checkout DIR: measure another checkout of the project (its serve through tsx, its console
// built there) instead of this one. --baseline DIR: also serve a second checkout (e.g. a `git
// archive` of an older commit with node_modules linked) and load its diff page in turn with this
// one's, page for page (A/B alternating in one run on one host), medians of each.
// Numbers, per run, medians printed:
//   diff page: navigation start (page.goto of the changeset's URL in a new tab, signed in) -> the
//              performance mark fluxvm:diff-rendered, which the page sets in the effect that runs
//              after the frame that painted the diff's first 100 rows (the first screenful and
//              more; the rest and the highlighting follow). It includes the document, the scripts,
//              the session check, the changeset and diff GETs and the render. And the render part
//              alone: the diff response's end -> the mark. Two ways each run:
//              cold: a new browser context (empty HTTP cache, the session cookie copied in);
//              warm: the signed-in context, so the content-named chunks come from the cache as
//              they do for a reviewer who has opened the console before. chromium trusts serve's
//              certificate by its public key (--ignore-certificate-errors-spki-list): with
//              Playwright's ignoreHTTPSErrors instead it caches nothing (a certificate-error origin);
//   from list: the changesets list open in the warm context, a click on the changeset's link ->
//              the same mark (the reviewer's path inside the app: route change, API calls, render);
//   list:      the Pending event on a watch of the API (this process) -> the row showing Pending
//              in the page (a MutationObserver's Date.now(); same host clock);
//   floor:     in the same browser, alternating with the warm loads: a page with the console's own
//              headers (CONSOLE page headers: CSP, COOP, ...), a stylesheet and one module whose first
//              statement sets a mark, served by a plain node https server with serve's own
//              certificate: navigation -> that mark. And the same page without
//              Cross-Origin-Opener-Policy: the difference is what COOP costs (a new renderer
//              process, made after the response, for the browsing context group switch).
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { REPO, startFluxctl } from '../test/e2e/harness.js';
import { api, makeSandbox } from '../test/e2e/sandbox-helpers.js';
import { buildConsole, CHROMIUM, chromiumSkipReason, signIn } from '../test/e2e/console-browser.js';
import { execFileSync } from 'node:child_process';
import { createHash, X509Certificate } from 'node:crypto';
import tls from 'node:tls';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { PAGE_HEADERS } from '../cmd/fluxctl/console-serve.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const RUNS = arg('runs', 5);
const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const opt = (name: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const BIG = `i=0; while [ $i -lt 2000 ]; do echo "def f$i(x): return x + $i  # line $i"; i=$((i+1)); done > /work/big.py`;

/** serve's leaf certificate's public key hash (SPKI SHA-256, base64): chromium trusts it by that. */
async function spkiOf(url: string): Promise<string> {
  const u = new URL(url);
  const der: Buffer = await new Promise((res, rej) => {
    const s = tls.connect({ host: u.hostname, port: Number(u.port), rejectUnauthorized: false }, () => {
      res(s.getPeerCertificate().raw);
      s.end();
    });
    s.on('error', rej);
  });
  const spki = new X509Certificate(der).publicKey.export({ type: 'spki', format: 'der' });
  return createHash('sha256').update(spki).digest('base64');
}

/** A serve of a checkout (undefined: this one) with the 2,000-line changeset. */
async function target(dir: string | undefined) {
  if (dir) execFileSync(process.execPath, [path.join(dir, 'console', 'build.mjs')], { stdio: 'pipe' });
  const fx = await startFluxctl(
    dir
      ? { command: [process.execPath, '--import', 'tsx', path.join(dir, 'cmd', 'fluxctl', 'main.ts')], cwd: dir }
      : {},
  );
  await makeSandbox(fx, 'bench');
  const r = await api(fx, 'POST', CS, {
    body: {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name: 'big' },
      spec: { sandboxRef: { name: 'bench' }, command: ['sh', '-c', BIG] },
    },
  });
  if (r.status !== 201) throw new Error(r.body.toString());
  for (let t = 0; (await api(fx, 'GET', `${CS}/big`)).json.status?.phase !== 'Pending'; t++) {
    if (t > 600) throw new Error('big never Pending');
    await new Promise((res) => setTimeout(res, 100));
  }
  return fx;
}

/** A context that keeps its HTTP cache (no ignoreHTTPSErrors: the certificate is trusted by SPKI), signed in. */
async function signedIn(browser: Browser, fx: { url: string; token?: string }) {
  const ctx = await browser.newContext({ colorScheme: 'light', viewport: { width: 1280, height: 860 } });
  await (await signIn(ctx, fx.url, fx.token!)).close();
  return ctx;
}

/** A cold load: a new context (empty cache) with the signed-in context's cookies. */
async function coldLoad(browser: Browser, warm: BrowserContext, url: string) {
  const ctx = await browser.newContext({ colorScheme: 'light', viewport: { width: 1280, height: 860 } });
  await ctx.addCookies(await warm.cookies());
  try {
    return await loadDiffPage(ctx, url);
  } finally {
    await ctx.close();
  }
}

/**
 * The reviewer's path inside the app: the changesets list is open (a warm context), a click on the
 * changeset's link -> the mark fluxvm:diff-rendered (the route change, its API calls and the render;
 * no page load). Reported beside the deep link, which adds the page and script loads of a new tab.
 */
async function clickFromList(ctx: BrowserContext, url: string): Promise<number> {
  const page = await ctx.newPage();
  try {
    await page.goto(`${url}/console/#/changesets`);
    const link = page.locator('a[href="#/changesets/default/big"]');
    await link.waitFor({ timeout: 30_000 });
    await page.evaluate(() => performance.mark('bench:click'));
    await link.click();
    await untilMark(page);
    await page.locator('table.diff.unified tr').nth(2000).waitFor({ timeout: 30_000 });
    // No named function inside: tsx would wrap it with a helper the page does not have.
    return await page.evaluate(
      () =>
        (performance.getEntriesByName('fluxvm:diff-rendered')[0]?.startTime ?? NaN) -
        (performance.getEntriesByName('bench:click')[0]?.startTime ?? NaN),
    );
  } finally {
    await page.close();
  }
}

/**
 * Waits for the mark fluxvm:diff-rendered from the page's main world, looking every 50 ms. Not a
 * locator: Playwright's first locator call in a page evaluates its selector engine there (a
 * 330 KB script, ~35 ms of the page's main thread), which would land inside the measured window
 * (seen in a trace). Its evaluations before the mark are a few hundred bytes each.
 */
async function untilMark(page: Page): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const has = await page.evaluate(() => performance.getEntriesByName('fluxvm:diff-rendered').length > 0);
    if (has) return;
    if (Date.now() > deadline) throw new Error('no mark fluxvm:diff-rendered within 30 s');
    await new Promise((res) => setTimeout(res, 50));
  }
}

/**
 * The floor pages: the console's page headers (with and without COOP), a stylesheet, and one
 * module whose first statement sets the mark `floor`; the assets cached (immutable) as the
 * console's are. Served with serve's own key and certificate (chromium trusts its SPKI).
 */
async function floorServer(stateDir: string): Promise<{ url: string; close: () => void }> {
  const page = (coop: boolean) =>
    `<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="stylesheet" href="/${coop ? 'coop' : 'open'}/a.css"><script type="module" src="/${coop ? 'coop' : 'open'}/m.js"></script></head><body><div id="app"></div></body></html>`;
  const srv = https.createServer(
    {
      key: fs.readFileSync(path.join(stateDir, 'serving.key')),
      cert: fs.readFileSync(path.join(stateDir, 'serving.crt')),
    },
    (req, res) => {
      const [, which, file] = (req.url ?? '').split('/');
      const coop = which === 'coop';
      if (!file) {
        for (const [k, v] of Object.entries(PAGE_HEADERS))
          if (coop || k !== 'cross-origin-opener-policy') res.setHeader(k, v);
        res.setHeader('content-type', 'text/html; charset=utf-8');
        return res.end(page(coop));
      }
      res.setHeader('cache-control', 'public, max-age=31536000, immutable');
      res.setHeader('content-type', file.endsWith('.css') ? 'text/css' : 'text/javascript');
      res.end(file.endsWith('.css') ? 'body { font-family: sans-serif; }' : "performance.mark('floor');");
    },
  );
  await new Promise<void>((res) => srv.listen(0, '127.0.0.1', () => res()));
  return { url: `https://127.0.0.1:${(srv.address() as { port: number }).port}`, close: () => srv.close() };
}

/** One load of a floor page: navigation -> its module's first statement. */
async function loadFloor(ctx: BrowserContext, url: string): Promise<number> {
  const page = await ctx.newPage();
  try {
    await page.goto(url, { waitUntil: 'commit' });
    for (let t = Date.now(); ;) {
      const at = await page.evaluate(() => performance.getEntriesByName('floor')[0]?.startTime);
      if (at !== undefined) return at;
      if (Date.now() - t > 30_000) throw new Error(`no mark floor at ${url}`);
      await new Promise((res) => setTimeout(res, 50));
    }
  } finally {
    await page.close();
  }
}

/** One load of the diff page: navigation -> the mark fluxvm:diff-rendered, and the diff response's end -> the mark. */
async function loadDiffPage(ctx: BrowserContext, url: string): Promise<{ total: number; render: number }> {
  const page = await ctx.newPage();
  await page.goto(`${url}/console/#/changesets/default/big`, { waitUntil: 'commit' });
  await untilMark(page);
  await page.locator('table.diff.unified tr').nth(2000).waitFor({ timeout: 30_000 });
  const m = await page.evaluate(() => {
    const now = performance.getEntriesByName('fluxvm:diff-rendered')[0]?.startTime ?? performance.now();
    const d = performance.getEntriesByType('resource').find((e) => e.name.endsWith('/big/diff')) as
      PerformanceResourceTiming | undefined;
    return { now, diffEnd: d?.responseEnd ?? 0 };
  });
  await page.close();
  return { total: m.now, render: m.now - m.diffEnd };
}

async function main() {
  const skip = chromiumSkipReason();
  if (skip) {
    console.log(`## console\n\nskipped: ${skip}\n`);
    return;
  }
  const dir = opt('checkout');
  const baseDir = opt('baseline');
  if (!dir) buildConsole();
  const baseFx = baseDir ? await target(baseDir) : undefined;
  const fx = await target(dir);
  const spki = [await spkiOf(fx.url), ...(baseFx ? [await spkiOf(baseFx.url)] : [])];
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', `--ignore-certificate-errors-spki-list=${spki.join(',')}`],
  });
  const ctx = await signedIn(browser, fx);
  const floor = await floorServer(fx.stateDir);
  const base = baseFx ? { fx: baseFx, ctx: await signedIn(browser, baseFx) } : undefined;
  const assets = path.join(dir ?? REPO, 'dist', 'console', 'assets');
  let raw = 0;
  let gz = 0;
  for (const f of fs.readdirSync(assets).filter((n) => n.endsWith('.js'))) {
    const b = fs.readFileSync(path.join(assets, f));
    raw += b.length;
    gz += zlib.gzipSync(b, { level: 9 }).length;
  }
  const js = { length: raw };
  try {
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

    // 1. The 2,000-line diff page (a new Python file of 2,000 lines), cold and warm, alternating with the baseline's.
    type Series = { total: number[]; render: number[] };
    const series = () => ({ cold: { total: [], render: [] } as Series, warm: { total: [], render: [] } as Series });
    const mine = series();
    const theirs = series();
    const clicks: { mine: number[]; theirs: number[] } = { mine: [], theirs: [] };
    const loads: string[] = [];
    const floors: { coop: number[]; open: number[] } = { coop: [], open: [] };
    for (let i = 0; i < RUNS; i++) {
      floors.coop.push(await loadFloor(ctx, `${floor.url}/coop/`));
      floors.open.push(await loadFloor(ctx, `${floor.url}/open/`));
      const order = i % 2 === 0 ? ['new', 'base'] : ['base', 'new'];
      for (const which of order) {
        if (which === 'base' && !base) continue;
        const t = which === 'base' ? base! : { fx, ctx };
        const into = which === 'base' ? theirs : mine;
        const cold = await coldLoad(browser, t.ctx, t.fx.url);
        const warm = await loadDiffPage(t.ctx, t.fx.url);
        into.cold.total.push(cold.total);
        into.cold.render.push(cold.render);
        into.warm.total.push(warm.total);
        into.warm.render.push(warm.render);
        (which === 'base' ? clicks.theirs : clicks.mine).push(await clickFromList(t.ctx, t.fx.url));
      }
      loads.push(os.loadavg()[0]!.toFixed(1));
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
    for (let i = 0; i < (process.argv.includes('--no-list') ? 0 : RUNS); i++) {
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
    console.log(
      `chromium headless, ${RUNS} runs, medians; load now ${load} (1-min load after each run: ${loads.join(', ')}), ${os.cpus().length} cpus\n`,
    );
    const runs = (xs: number[]) => `${median(xs).toFixed(0)} ms (runs ${xs.map((x) => x.toFixed(0)).join(', ')})`;
    console.log('| what | measured | target |\n|---|---|---|');
    console.log(
      `| bundle: all JavaScript chunks gzipped | ${(gz / 1024).toFixed(1)} KiB (${(js.length / 1024).toFixed(0)} KiB raw) | <= 300 KiB |`,
    );
    for (const k of ['warm', 'cold'] as const) {
      const what = k === 'warm' ? 'warm (chunks cached)' : 'cold (empty cache)';
      console.log(
        `| 2,000-line diff page, ${what}: navigation -> diff's first rows painted (mark fluxvm:diff-rendered) | ${runs(mine[k].total)} | <= 300 ms |`,
      );
      console.log(`| of which: diff response -> rows rendered | ${runs(mine[k].render)} | |`);
      if (k === 'warm') {
        console.log(
          `| floor, same browser: a page with the console's headers and one module: navigation -> its first statement | ${runs(floors.coop)} | |`,
        );
        console.log(`| floor without Cross-Origin-Opener-Policy | ${runs(floors.open)} | |`);
      }
      if (base) {
        console.log(
          `| baseline (${baseDir}), ${what}, alternating: navigation -> diff painted | ${runs(theirs[k].total)} | |`,
        );
        console.log(`| baseline: diff response -> rows rendered | ${runs(theirs[k].render)} | |`);
      }
    }
    console.log(
      `| 2,000-line diff page from the open list (warm): click on the changeset -> diff's first rows painted | ${runs(clicks.mine)} | <= 300 ms |`,
    );
    if (base) console.log(`| baseline: click from the list -> diff painted | ${runs(clicks.theirs)} | |`);
    if (lag.length)
      console.log(
        `| new changeset: Pending on the API watch -> shown Pending in the open list | ${median(lag).toFixed(0)} ms (runs ${lag.join(', ')}) | <= 1000 ms |`,
      );
  } finally {
    floor.close();
    await browser.close();
    for (const t of [{ fx }, ...(baseFx ? [{ fx: baseFx }] : [])]) {
      await t.fx.kubectl(['delete', 'cs,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await t.fx.stop();
    }
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
