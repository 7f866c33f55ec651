// End to end: the review console's sign-in and its API proxy against a real
// `fluxctl serve` (HTTPS, --token-auth-file users, RBAC), over plain HTTP requests: the cookie's
// attributes, RBAC applied per user through /console/api, no request without the cookie, CSRF
// and Origin checks, the single-use `fluxctl console --print-url` link, logout, the page's CSP.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import WebSocket from 'ws';
import { httpRequest, REPO, startFluxctl, type Fluxctl, type HttpResult } from './harness.js';
import { kubectlOk } from './sandbox-helpers.js';
import { buildConsole } from './console-browser.js';

const TOKENS = { approver: 'approver-token-0123456789abcdef', viewer: 'viewer-token-0123456789abcdef' };
const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';

describe('e2e: console sign-in and API proxy', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  let tmp: string;
  let origin: string;
  const call = (
    method: string,
    p: string,
    o: {
      cookie?: string;
      csrf?: string;
      body?: unknown;
      origin?: string | null;
      token?: string;
      contentType?: string;
    } = {},
  ): Promise<HttpResult> =>
    httpRequest(fx.url + p, method, {
      ca: fx.ca,
      token: o.token ?? null,
      headers: {
        ...(o.cookie ? { cookie: o.cookie } : {}),
        ...(o.csrf ? { 'x-csrf-token': o.csrf } : {}),
        ...(o.origin === null ? {} : { origin: o.origin ?? origin }),
        ...(o.contentType ? { 'content-type': o.contentType } : {}),
      },
      ...(o.body !== undefined ? { body: o.body } : {}),
    });
  const login = async (token: string) => {
    const r = await call('POST', '/console/auth/login', { body: { token } });
    expect(r.status, r.body.toString()).to.equal(200);
    const set = String(r.headers['set-cookie']);
    return { cookie: set.split(';')[0]!, csrf: r.json.csrf as string, setCookie: set, user: r.json.user };
  };

  before(async () => {
    buildConsole();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-console-'));
    const tokenFile = path.join(tmp, 'tokens.csv');
    fs.writeFileSync(tokenFile, `${TOKENS.approver},approver,uid-a\n${TOKENS.viewer},viewer,uid-v\n`);
    fx = await startFluxctl({ args: ['--test-controller', '--quiet', '--token-auth-file', tokenFile] });
    origin = fx.url;
    await kubectlOk(fx, ['create', 'rolebinding', 'a', '--clusterrole=fluxvm-approver', '--user=approver']);
    await kubectlOk(fx, ['create', 'rolebinding', 'v', '--clusterrole=fluxvm-view', '--user=viewer']);
  });
  after(async () => {
    if (fx) await fx.stop();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('a token is exchanged for an HttpOnly, Secure, SameSite=Strict cookie scoped to /console/; a bad token is 401 and sets none', async () => {
    const s = await login(TOKENS.viewer);
    expect(s.user.username).to.equal('viewer');
    expect(s.setCookie).to.match(/^fluxvm-console=[A-Za-z0-9_-]{40,};/);
    expect(s.setCookie).to.contain('Path=/console/;');
    for (const a of ['HttpOnly', 'Secure', 'SameSite=Strict']) expect(s.setCookie).to.contain(a);
    expect(s.setCookie).to.not.contain('/preview');
    const bad = await call('POST', '/console/auth/login', { body: { token: 'nope-not-a-token' } });
    expect(bad.status).to.equal(401);
    expect(bad.headers['set-cookie']).to.equal(undefined);
    // A login from another origin (login CSRF) is refused.
    const xs = await call('POST', '/console/auth/login', {
      body: { token: TOKENS.viewer },
      origin: 'https://evil.example',
    });
    expect(xs.status).to.equal(403);
  });

  it('every console API call is authorized as the signed-in user: the viewer lists, cannot decide (403, nothing changes); no cookie or a made-up one is 401', async () => {
    const v = await login(TOKENS.viewer);
    const list = await call('GET', `/console/api${CS}`, { cookie: v.cookie });
    expect(list.status, list.body.toString()).to.equal(200);
    expect(list.json.kind).to.equal('ChangesetList');
    expect(list.headers['content-security-policy']).to.contain('sandbox');
    const forged = await call('PATCH', `/console/api${CS}/any/approval`, {
      cookie: v.cookie,
      csrf: v.csrf,
      body: { spec: { decision: 'Approve' } },
      contentType: 'application/merge-patch+json',
    });
    expect(forged.status, forged.body.toString()).to.equal(403);
    expect(forged.json.message).to.contain('User "viewer" cannot patch resource "changesets/approval"');
    // The approver passes RBAC on the same call (404: no such changeset), so the 403 above was RBAC's.
    const a = await login(TOKENS.approver);
    const ok = await call('PATCH', `/console/api${CS}/any/approval`, {
      cookie: a.cookie,
      csrf: a.csrf,
      body: { spec: { decision: 'Approve' } },
      contentType: 'application/merge-patch+json',
    });
    expect(ok.status, ok.body.toString()).to.equal(404);
    // Secrets: the viewer's RBAC has none, the approver's neither; through the console as well.
    expect((await call('GET', '/console/api/api/v1/namespaces/default/secrets', { cookie: v.cookie })).status).to.equal(
      403,
    );
    for (const cookie of [undefined, 'fluxvm-console=made-up-value']) {
      const r = await call('GET', `/console/api${CS}`, { cookie });
      expect(r.status).to.equal(401);
    }
    // A bearer token sent to /console/api is not a console session (the proxy uses only the cookie's).
    expect((await call('GET', `/console/api${CS}`, { token: fx.token! })).status).to.equal(401);
    // Paths outside the API are not proxied.
    expect((await call('GET', '/console/api/metrics', { cookie: v.cookie })).status).to.equal(404);
  });

  it("state-changing calls need the session CSRF token (another session's does not do) and this origin", async () => {
    const a = await login(TOKENS.approver);
    const v = await login(TOKENS.viewer);
    const body = { spec: { decision: 'Approve' } };
    const patch = (o: { csrf?: string; origin?: string | null }) =>
      call('PATCH', `/console/api${CS}/any/approval`, {
        cookie: a.cookie,
        body,
        contentType: 'application/merge-patch+json',
        ...o,
      });
    expect((await patch({})).status).to.equal(403);
    expect((await patch({ csrf: v.csrf })).status).to.equal(403);
    expect((await patch({ csrf: a.csrf, origin: 'https://evil.example' })).status).to.equal(403);
    expect((await patch({ csrf: a.csrf, origin: null })).status).to.equal(403);
    expect((await patch({ csrf: a.csrf })).status).to.equal(404); // through to the API
  });

  it('the terminal WebSocket needs the cookie, this origin and the CSRF token (?csrf=) before anything reaches the API', async () => {
    const a = await login(TOKENS.approver);
    const path = `/console/api/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/none/exec?command=sh&tty=true`;
    let last = '';
    const status = (q: string, headers: Record<string, string>) =>
      new Promise<number>((resolve, reject) => {
        const ws = new WebSocket(`${fx.url.replace('https', 'wss')}${path}${q}`, ['v5.channel.k8s.io'], {
          ca: fx.ca,
          headers,
        });
        ws.on('unexpected-response', (_req, res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => {
            last = body;
            resolve(res.statusCode ?? 0);
          });
        });
        ws.on('open', () => (ws.close(), resolve(101)));
        ws.on('error', reject);
      });
    expect(await status('', { origin })).to.equal(401);
    expect(await status(`&csrf=${a.csrf}`, { origin: 'https://evil.example', cookie: a.cookie })).to.equal(403);
    expect(await status('', { origin, cookie: a.cookie })).to.equal(403);
    // With all three the request reaches the API, whose RBAC answers: fluxvm-approver cannot exec.
    expect(await status('', { origin, cookie: a.cookie })).to.equal(403);
    expect(last).to.contain('CSRF');
    expect(await status(`&csrf=${a.csrf}`, { origin, cookie: a.cookie })).to.equal(403);
    expect(last).to.contain('User \\"approver\\" cannot create resource \\"agentsessions/exec\\"');
    const v = await login(TOKENS.viewer);
    expect(await status(`&csrf=${a.csrf}`, { origin, cookie: v.cookie })).to.equal(403);
  });

  it('fluxctl console --print-url: a single-use link that signs the browser in; logout ends the session', async () => {
    const doc = yaml.load(fs.readFileSync(fx.kubeconfig, 'utf8')) as any;
    doc.users = [{ name: 'viewer', user: { token: TOKENS.viewer } }];
    doc.contexts[0].context.user = 'viewer';
    const kc = path.join(tmp, 'viewer.kubeconfig');
    fs.writeFileSync(kc, yaml.dump(doc), { mode: 0o600 });
    const r = await fx.fluxctl(['console', '--print-url', '--kubeconfig', kc]);
    expect(r.code, r.stderr).to.equal(0);
    const m = /^(https:\/\/127\.0\.0\.1:\d+)\/console\/#signin=([A-Za-z0-9_-]{40,})\n$/.exec(r.stdout);
    expect(m, r.stdout).to.not.equal(null);
    expect(m![1]).to.equal(fx.url);
    const first = await call('POST', '/console/auth/redeem', { body: { code: m![2] } });
    expect(first.status, first.body.toString()).to.equal(200);
    expect(first.json.user.username).to.equal('viewer');
    const again = await call('POST', '/console/auth/redeem', { body: { code: m![2] } });
    expect(again.status).to.equal(401);
    const cookie = String(first.headers['set-cookie']).split(';')[0]!;
    expect((await call('GET', '/console/auth/whoami', { cookie })).json.user.username).to.equal('viewer');
    // Links are minted only for a valid bearer token.
    expect((await call('POST', '/console/auth/links', { token: 'bad-token-xyz' })).status).to.equal(401);
    // Logout needs the CSRF token, then the cookie is dead.
    expect((await call('POST', '/console/auth/logout', { cookie, body: {} })).status).to.equal(403);
    const out = await call('POST', '/console/auth/logout', { cookie, csrf: first.json.csrf, body: {} });
    expect(out.status).to.equal(200);
    expect(String(out.headers['set-cookie'])).to.contain('Max-Age=0');
    expect((await call('GET', `/console/api${CS}`, { cookie })).status).to.equal(401);
  });

  it('the page: a strict CSP (scripts from self only, frame-ancestors none), no framing, no caching', async () => {
    const r = await call('GET', '/console/', { origin: null });
    expect(r.status).to.equal(200);
    const csp = String(r.headers['content-security-policy']);
    expect(csp).to.contain("script-src 'self'");
    expect(csp).to.not.match(/script-src[^;]*unsafe-inline/);
    expect(csp).to.contain("frame-ancestors 'none'");
    expect(r.headers['x-frame-options']).to.equal('DENY');
    expect(r.body.toString()).to.not.match(/<script(?![^>]*\bsrc=)[^>]*>/);
    // Its script and styles are the built bundle (dist/console/assets, content-named), not the sources.
    const html = r.body.toString();
    const app = /<script type="module" src="assets\/(app-[A-Z0-9]+\.js)"/.exec(html)?.[1];
    const css = /<link rel="stylesheet" href="assets\/(app-[A-Z0-9]+\.css)"/.exec(html)?.[1];
    expect(app, html).to.be.a('string');
    expect(css, html).to.be.a('string');
    const js = await call('GET', `/console/assets/${app}`, { origin: null });
    expect(js.status).to.equal(200);
    expect(js.headers['content-type']).to.equal('text/javascript; charset=utf-8');
    expect((await call('GET', `/console/assets/${css}`, { origin: null })).headers['content-type']).to.match(
      /^text\/css/,
    );
    expect((await call('GET', '/console/assets/..%2Fbuild.mjs', { origin: null })).status).to.equal(404);
  });

  it('caching: the page is never cached; every asset it names is content-named and immutable; others revalidate (ETag, 304)', async () => {
    const page = await call('GET', '/console/', { origin: null });
    expect(page.headers['cache-control']).to.equal('no-store');
    const assets = [...page.body.toString().matchAll(/(?:src|href)="assets\/([^"]+)"/g)].map((m) => m[1]!);
    expect(
      assets.filter((a) => /^chunk-[A-Z0-9]+\.js$/.test(a)),
      'index.html preloads the entry chunks',
    ).to.not.be.empty;
    expect(assets.map((a) => a.replace(/-[A-Z0-9]+\./, '-H.')).sort()).to.include.members([
      'app-H.css',
      'app-H.js',
      'boot-H.js',
    ]);
    for (const a of assets) {
      expect(a).to.match(/^(chunk|app|boot)-[A-Z0-9]+\.(js|css)$/);
      const r = await call('GET', `/console/assets/${a}`, { origin: null });
      expect(r.status).to.equal(200);
      expect(r.headers['cache-control']).to.equal('public, max-age=31536000, immutable');
    }
    // A file of the assets directory not named by its content: revalidated with its ETag.
    const loose = 'loose-file.js';
    const file = path.join(REPO, 'dist', 'console', 'assets', loose);
    fs.writeFileSync(file, 'export {};\n');
    try {
      await revalidated(loose);
    } finally {
      fs.rmSync(file, { force: true });
    }
  });

  const revalidated = async (loose: string) => {
    const js = await call('GET', `/console/assets/${loose}`, { origin: null });
    expect(js.headers['cache-control']).to.equal('no-cache');
    const etag = String(js.headers.etag);
    expect(etag).to.match(/^"[A-Za-z0-9_-]+"$/);
    const again = await httpRequest(`${fx.url}/console/assets/${loose}`, 'GET', {
      ca: fx.ca,
      token: null,
      headers: { 'if-none-match': etag },
    });
    expect(again.status).to.equal(304);
    expect(again.body.length).to.equal(0);
    const other = await httpRequest(`${fx.url}/console/assets/${loose}`, 'GET', {
      ca: fx.ca,
      token: null,
      headers: { 'if-none-match': '"not-it"' },
    });
    expect(other.status).to.equal(200);
    expect(other.body.equals(js.body)).to.equal(true);
  };
});
