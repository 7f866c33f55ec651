// The review console on the split API server (`fluxctl serve --no-controllers`, docs/scale-out.md:
// the API server process without controllers or a runtime): in Debian's chromium, sign in with the
// single-use link of `fluxctl console --print-url`, see a Changeset in the live list and open its
// page. The objects are only stored (no controller acts on them here); the point is that the
// console's sign-in, its API proxy as the user, and its pages work on that process.
import { expect } from 'chai';
import type { Browser } from 'playwright-core';
import { startFluxctl, type Fluxctl } from './harness.js';
import { kubectlOk } from './sandbox-helpers.js';
import { buildConsole, chromiumSkipReason, goto, launch, newContext } from './console-browser.js';

describe('e2e: the review console on the split API server (serve --no-controllers)', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  let browser: Browser;

  before(async function () {
    const skip = chromiumSkipReason();
    if (skip) return this.skip();
    buildConsole();
    fx = await startFluxctl({ args: ['--no-controllers'], readyTimeoutMs: 120_000 });
    browser = await launch();
  });
  after(async () => {
    await browser?.close();
    await fx?.stop();
  });

  it('signs in with the console link, lists a Changeset live and opens its page', async () => {
    const r = await fx.fluxctl(['console', '--print-url']);
    expect(r.code, r.stderr).to.equal(0);
    const link = r.stdout.trim();
    expect(link).to.match(new RegExp(`^${fx.url}/console/#signin=[A-Za-z0-9_-]{40,}$`));
    const ctx = await newContext(browser);
    const page = await ctx.newPage();
    await goto(page, link);
    await page.getByRole('navigation', { name: 'Main' }).waitFor({ timeout: 30_000 });
    // The list is live (list + watch through /console/api): an object made after the page opened shows.
    const list = page.getByRole('table', { name: 'changesets' });
    await list.waitFor();
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'split-cs' },
        spec: { sandboxRef: { name: 'nowhere' }, command: ['echo', 'split'] },
      }),
    );
    const row = list.locator('tr[data-name="split-cs"]');
    await row.waitFor({ timeout: 30_000 });
    await row.getByRole('link', { name: 'split-cs' }).click();
    await page.getByRole('heading', { name: /Changeset split-cs/ }).waitFor({ timeout: 30_000 });
    expect(await page.getByTestId('command').textContent()).to.equal('["echo","split"]');
    expect(await page.locator('header .user').textContent()).to.equal(
      (await fx.kubectl(['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'])).stdout.trim(),
    );
    await ctx.close();
  });
});
