// Previews as links, end to end against a real `fluxctl serve` (procbox, HTTPS, --token-auth-file
// users) and Debian's chromium: agentsessions/NAME/previews gives a preview's URL again only to a
// user who may create previews of that session (editor: fluxvm-edit; a session token of that
// session granted `preview`), never to a viewer (fluxvm-view plus a Role to get the preview list,
// not to create previews), a token of the session without `preview`, or a token of another
// session. The session page links it (new tab, no opener, no referrer); the preview document
// runs in an opaque origin (CSP sandbox), never the console's.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Browser } from 'playwright-core';
import { httpRequest, startFluxctl, type Fluxctl } from './harness.js';
import { eventually, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { buildConsole, chromiumSkipReason, goto, launch, newContext, signIn } from './console-browser.js';

const TOKENS = { viewer: 'viewer-token-0123456789abcdef', editor: 'editor-token-0123456789abcdef' };
const PORT = 8123;
const agsPath = (name: string, sub?: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}${sub ? `/${sub}` : ''}`;
const session = (name: string) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline' } },
  });
// The page the sandbox serves: it writes its own origin into the DOM.
const SERVER = `require('http').createServer((q, s) => {
  s.writeHead(200, { 'content-type': 'text/html' });
  s.end('<!doctype html><title>pv</title><p id="o"></p><script>document.getElementById("o").textContent = self.origin</script>');
}).listen(${PORT}, '127.0.0.1');`;

describe('e2e: previews as links in the review console', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let browser: Browser;
  let tmp: string;
  let url = '';
  let token = '';

  before(async function () {
    skipWith(this, chromiumSkipReason() ?? sandboxSkipReason());
    buildConsole();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-console-pv-'));
    const tokenFile = path.join(tmp, 'tokens.csv');
    fs.writeFileSync(
      tokenFile,
      Object.entries(TOKENS)
        .map(([u, t]) => `${t},${u},uid-${u}\n`)
        .join(''),
    );
    fx = await startFluxctl({ args: ['--token-auth-file', tokenFile], readyTimeoutMs: 90_000 });
    await kubectlOk(fx, ['create', 'rolebinding', 'v', '--clusterrole=fluxvm-view', '--user=viewer']);
    // The viewer may also read the preview list (a Role of its own), but not create previews.
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: [
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'Role',
            metadata: { name: 'preview-list', namespace: 'default' },
            rules: [{ apiGroups: ['fluxvm.dev'], resources: ['agentsessions/previews'], verbs: ['get'] }],
          },
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'RoleBinding',
            metadata: { name: 'preview-list', namespace: 'default' },
            roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'preview-list' },
            subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'viewer' }],
          },
        ],
      }),
    );
    await kubectlOk(fx, ['create', 'rolebinding', 'e', '--clusterrole=fluxvm-edit', '--user=editor']);
    await kubectlOk(fx, ['apply', '-f', '-'], [session('pv'), session('other')].join('\n'));
    for (const n of ['pv', 'other'])
      await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=90s']);
    const w = await fx.request('POST', agsPath('pv', 'exec'), {
      body: {
        command: ['sh', '-c', `cat > /tmp/srv.js && (nohup node /tmp/srv.js >/tmp/srv.log 2>&1 </dev/null &)`],
        stdin: SERVER,
      },
      timeoutMs: 90_000,
    });
    expect(w.status, w.body.toString()).to.equal(200);
    const r = await fx.request('POST', agsPath('pv', 'previews'), { body: { port: PORT, ttlSeconds: 600 } });
    expect(r.status, r.body.toString()).to.equal(201);
    url = r.json.url as string;
    token = /\/preview\/([0-9a-f]{64})\/$/.exec(url)![1]!;
    browser = await launch();
  });
  after(async () => {
    await browser?.close();
    if (fx) {
      await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  const list = async (tok: string | undefined, name = 'pv') =>
    fx.request('GET', agsPath(name, 'previews'), tok ? { token: tok } : {});
  const mintToken = async (name: string, ops: string[]) => {
    const r = await fx.request('POST', agsPath(name, 'token'), { body: { ops } });
    expect(r.status, r.body.toString()).to.equal(201);
    return r.json.status.token as string;
  };

  it('the API: the URL again to the admin, an editor and a session token with preview; not to a viewer or other tokens', async () => {
    for (const who of [undefined, TOKENS.editor, await mintToken('pv', ['read', 'preview'])]) {
      const r = await list(who);
      expect(r.status, r.body.toString()).to.equal(200);
      expect(r.headers['cache-control']).to.equal('no-store');
      expect(r.json.items).to.have.length(1);
      expect(r.json.items[0]).to.include({ port: PORT, url, path: `/preview/${token}/` });
    }
    // The attack: users who may read the list but not mint a preview get it without the URL.
    for (const who of [TOKENS.viewer, await mintToken('pv', ['read'])]) {
      const r = await list(who);
      expect(r.status, r.body.toString()).to.equal(200);
      expect(r.json.items.map((i: { port: number }) => i.port)).to.deep.equal([PORT]);
      expect(r.json.items[0]).to.not.have.any.keys('url', 'path');
      expect(r.body.toString()).to.not.include(token);
    }
    // A token of another session, even with preview: not this session's list at all.
    const r = await list(await mintToken('other', ['read', 'preview']));
    expect(r.status).to.equal(403);
    expect(r.body.toString()).to.not.include(token);
  });

  it('the session page links the preview (new tab, noopener noreferrer); it opens in an opaque origin; a viewer gets no link', async () => {
    const ctx = await newContext(browser);
    const page = await signIn(ctx, fx.url, TOKENS.editor);
    await goto(page, `${fx.url}/console/#/sessions/default/pv`);
    const link = page.getByRole('region', { name: 'Previews' }).getByRole('link', { name: `port ${PORT}` });
    await link.waitFor({ timeout: 30_000 });
    expect(await link.getAttribute('href')).to.equal(url);
    expect(await link.getAttribute('target')).to.equal('_blank');
    expect((await link.getAttribute('rel'))!.split(' ').sort()).to.deep.equal(['noopener', 'noreferrer']);
    await eventually(async () => ((await fetchStatus()) === 200 ? true : undefined), 30_000, 'the server in pv');
    const [tab] = await Promise.all([ctx.waitForEvent('page'), link.click()]);
    await tab.locator('#o').waitFor({ timeout: 30_000 });
    // The sandbox's page runs in an opaque origin (CSP sandbox), not the console's, with no opener.
    expect(await tab.locator('#o').textContent()).to.equal('null');
    expect(new URL(tab.url()).pathname).to.equal(`/preview/${token}/`);
    expect(await tab.evaluate(() => window.opener === null)).to.equal(true);
    await ctx.close();

    const vctx = await newContext(browser);
    const vpage = await signIn(vctx, fx.url, TOKENS.viewer);
    await goto(vpage, `${fx.url}/console/#/sessions/default/pv`);
    const region = vpage.getByRole('region', { name: 'Previews' });
    await region.getByText(`port ${PORT}`).waitFor({ timeout: 30_000 });
    expect(await region.getByRole('link').count()).to.equal(0);
    expect(await vpage.content()).to.not.include(token);
    await vctx.close();
  });

  const fetchStatus = async () => (await httpRequest(url, 'GET', { ca: fx.ca, token: null })).status;
});
