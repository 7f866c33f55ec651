// Helpers for the review console's browser tests and bench (test/e2e/console-browser.test.ts,
// bench/console.ts): Debian's chromium driven by playwright-core, headless, against a real serve.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { launchIsolated } from './chromium-netns.js';
import { REPO } from './harness.js';

export const CHROMIUM = process.env.FLUXVM_CHROMIUM ?? '/usr/bin/chromium';

/** Why the browser tests cannot run here, or undefined. */
export function chromiumSkipReason(): string | undefined {
  if (!fs.existsSync(CHROMIUM)) return `no chromium at ${CHROMIUM} (hack/setup.sh installs Debian's chromium)`;
  return undefined;
}

/** Bundles the console into dist/console (esbuild, ~1 s), as `make build` does. */
export function buildConsole(): void {
  execFileSync(process.execPath, [path.join(REPO, 'console', 'build.mjs')], { stdio: 'pipe' });
}

/** Chromium, headless, in a network namespace of its own (chromium-netns.ts: no ERR_NETWORK_CHANGED). */
export async function launch(): Promise<Browser> {
  // --no-sandbox: the tests run as root, where chromium's own sandbox refuses to start.
  return launchIsolated(CHROMIUM, { headless: true, args: ['--no-sandbox', '--disable-gpu'] });
}

/** A new browser profile (no cookies) that trusts serve's self-signed certificate. */
export function newContext(b: Browser, o: { colorScheme?: 'light' | 'dark'; width?: number; height?: number } = {}) {
  return b.newContext({
    ignoreHTTPSErrors: true,
    colorScheme: o.colorScheme ?? 'light',
    viewport: { width: o.width ?? 1280, height: o.height ?? 860 },
  });
}

/**
 * page.goto, sent again (3 tries) when Chromium aborts the navigation with
 * net::ERR_NETWORK_CHANGED: it does whenever its namespace's network interfaces change. launch()
 * gives it a namespace of its own; a browser launched otherwise (bench/) shares the host's, where
 * the suite's other files create and delete sandbox links all the time.
 */
export async function goto(page: Page, url: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await page.goto(url);
      return;
    } catch (e) {
      // (the same abort is sometimes reported as an interruption by Chromium's error page)
      const aborted = /net::ERR_NETWORK_CHANGED|interrupted by another navigation to "chrome-error:/.test(String(e));
      if (attempt >= 3 || !aborted) throw e;
    }
  }
}

/** Signs in on the page with a pasted token; resolves once the app shell is shown. */
export async function signIn(ctx: BrowserContext, url: string, token: string): Promise<Page> {
  const page = await ctx.newPage();
  await goto(page, `${url}/console/`);
  const field = page.getByLabel('API bearer token');
  // The app retries its own requests; a module script of the page itself that Chromium aborted
  // (a network change again) leaves an empty page, and only a reload helps there.
  await field.waitFor({ timeout: 15_000 }).catch(async () => {
    await page.reload();
    await field.waitFor({ timeout: 30_000 });
  });
  await field.fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('navigation', { name: 'Main' }).waitFor();
  return page;
}

/** The text of the session's CSRF token as the page holds it (for forged-request tests). */
export async function csrfOf(page: Page): Promise<string> {
  return page.evaluate(async () => {
    const r = await fetch('/console/auth/whoami', { credentials: 'same-origin' });
    return ((await r.json()) as { csrf: string }).csrf;
  });
}
