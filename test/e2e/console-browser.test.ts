// End to end in a real browser: Debian's chromium driven by playwright-core against a
// real `fluxctl serve` (procbox sandboxes, HTTPS, --token-auth-file users, the egress proxy with
// the test's own DNS and upstream, test/native/egress/fakenet.ts). Users: approver
// (fluxvm-approver), viewer (fluxvm-view), editor (fluxvm-edit: runs the agent's commands), and
// the admin (kubeconfig token: the terminal). CONSOLE_SCREENSHOTS=1 writes the screenshots of
// docs/console/ (looked at before committing); otherwise they go to the test's temp dir.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import type { Browser, Page } from 'playwright-core';
import { httpUpstream, testDns, type TestDns, type Upstream } from '../native/egress/fakenet.js';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, kubectlOk, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { buildConsole, chromiumSkipReason, csrfOf, goto, launch, newContext, signIn } from './console-browser.js';

const TOKENS = {
  approver: 'approver-token-0123456789abcdef',
  viewer: 'viewer-token-0123456789abcdef',
  editor: 'editor-token-0123456789abcdef',
};
const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';
const SHOTS = process.env.CONSOLE_SCREENSHOTS ? path.join(REPO, 'docs', 'console') : undefined;

describe('e2e: the review console in chromium', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let browser: Browser;
  let dns: TestDns;
  let up: Upstream;
  let tmp: string;
  let upUrl: string;
  const shot = async (page: Page, name: string) => {
    const dir = SHOTS ?? path.join(tmp, 'shots');
    fs.mkdirSync(dir, { recursive: true });
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(dir, `${name}.png`), fullPage: name === 'changeset' });
  };
  const speculate = async (name: string, script: string) => {
    const r = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name },
        spec: { sandboxRef: { name: 'web' }, command: ['sh', '-c', script] },
      },
    });
    expect(r.status, r.body.toString()).to.equal(201);
  };
  const phaseOf = async (name: string) => (await api(fx, 'GET', `${CS}/${name}`)).json.status?.phase as string;

  before(async function () {
    skipWith(this, chromiumSkipReason() ?? sandboxSkipReason());
    buildConsole();
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-console-ui-'));
    up = await httpUpstream('127.0.0.2');
    dns = await testDns('127.0.0.1', { 'api.test': ['127.0.0.2'] });
    upUrl = `http://api.test:${up.port}`;
    const tokenFile = path.join(tmp, 'tokens.csv');
    fs.writeFileSync(
      tokenFile,
      Object.entries(TOKENS)
        .map(([u, t]) => `${t},${u},uid-${u}`)
        .join('\n') + '\n',
    );
    fx = await startFluxctl({
      args: [
        '--token-auth-file',
        tokenFile,
        '--egress-allow',
        `api.test:${up.port}`,
        '--egress-allow-cidr',
        '127.0.0.2/32',
        '--egress-resolver',
        dns.server,
      ],
    });
    await kubectlOk(fx, ['create', 'rolebinding', 'a', '--clusterrole=fluxvm-approver', '--user=approver']);
    await kubectlOk(fx, ['create', 'rolebinding', 'v', '--clusterrole=fluxvm-view', '--user=viewer']);
    await kubectlOk(fx, ['create', 'rolebinding', 'e', '--clusterrole=fluxvm-edit', '--user=editor']);
    await makeSandbox(fx, 'web', { network: { mode: 'allowList', allow: [`api.test:${up.port}`] } });
    browser = await launch();
  });
  after(async () => {
    await browser?.close();
    if (fx) {
      await fx.kubectl(['delete', 'ags,cs', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    await up?.close();
    await dns?.close();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('sign in, see a speculated changeset appear live with its diff and a held POST, approve and apply it, see it Applied', async () => {
    const ctx = await newContext(browser);
    const login = await ctx.newPage();
    await goto(login, `${fx.url}/console/`);
    await login.getByLabel('API bearer token').waitFor();
    await shot(login, 'signin');
    await login.close();
    const page = await signIn(ctx, fx.url, TOKENS.approver);
    await page.getByRole('heading', { name: 'Changesets in default' }).waitFor();
    await speculate(
      'tidy',
      `printf 'def main():\\n    return 42\\n' > /work/app.py; curl -sS --max-time 5 -o /dev/null ${upUrl}/read; ` +
        `curl -sS --max-time 5 -o /dev/null -w 'post %{http_code}\\n' -X POST --data-binary 'hello' ${upUrl}/deploy`,
    );
    // The list is live (a watch): the row appears and reaches Pending without a reload.
    const row = page.locator('tr[data-name="tidy"]');
    await row.getByText('Pending').waitFor({ timeout: 60_000 });
    await shot(page, 'changesets');
    await row.getByRole('link', { name: 'tidy' }).click();
    await page.getByRole('heading', { name: /Changeset tidy/ }).waitFor();
    const held = page.getByRole('table', { name: 'Held (never sent)' });
    await held.getByText('/deploy').waitFor();
    expect(await held.textContent()).to.match(/POST.*api\.test.*\/deploy.*403/);
    await page.locator('section.file h3', { hasText: 'work/app.py' }).waitFor();
    expect(await page.locator('table.diff.unified').first().textContent()).to.contain('return 42');
    await page.locator('table.diff .hljs-keyword').first().waitFor(); // highlighted python (after the first paint)
    await page.getByLabel('Side by side').check();
    await page.locator('table.diff.split').first().waitFor();
    await shot(page, 'changeset');
    await page.getByLabel('Unified').check();
    await page.getByRole('button', { name: 'Approve' }).click();
    await page.locator('h1 .phase', { hasText: 'Approved' }).waitFor({ timeout: 60_000 });
    await page.getByRole('button', { name: 'Apply' }).click();
    await page.locator('h1 .phase', { hasText: 'Applied' }).waitFor({ timeout: 60_000 });
    expect(await phaseOf('tidy')).to.equal('Applied');
    expect(up.seen.filter((s) => s.url.endsWith('/deploy'))).to.deep.equal([]); // held: never sent
    await ctx.close();
  });

  it('a fluxvm-view user sees no Approve button, and a forged decision from the page is 403 (nothing changes)', async () => {
    await speculate('viewed', 'echo v > /work/v.txt');
    await eventually(async () => ((await phaseOf('viewed')) === 'Pending' ? true : undefined), 60_000, 'Pending');
    const ctx = await newContext(browser);
    const page = await signIn(ctx, fx.url, TOKENS.viewer);
    await goto(page, `${fx.url}/console/#/changesets/default/viewed`);
    await page.getByRole('heading', { name: /Changeset viewed/ }).waitFor();
    await page.getByText('deciding needs changesets/approval').waitFor();
    expect(await page.getByRole('button', { name: 'Approve' }).count()).to.equal(0);
    const csrf = await csrfOf(page);
    const code = await page.evaluate(
      async ([p, t]) =>
        (
          await fetch(`/console/api${p}/viewed/approval`, {
            method: 'PATCH',
            headers: { 'content-type': 'application/merge-patch+json', 'x-csrf-token': t },
            body: JSON.stringify({ spec: { decision: 'Approve', apply: true } }),
          })
        ).status,
      [CS, csrf] as const,
    );
    expect(code).to.equal(403);
    expect(await phaseOf('viewed')).to.equal('Pending');
    await ctx.close();
  });

  it('Apply refused for drift: the page shows the conflicting path and the way out', async () => {
    await exec(fx, 'web', ['sh', '-c', 'echo base > /work/drift.txt']);
    await speculate('drifted', 'echo speculated > /work/drift.txt');
    await eventually(async () => ((await phaseOf('drifted')) === 'Pending' ? true : undefined), 60_000, 'Pending');
    await exec(fx, 'web', ['sh', '-c', 'echo changed-meanwhile > /work/drift.txt']);
    const ctx = await newContext(browser);
    const page = await signIn(ctx, fx.url, TOKENS.approver);
    await goto(page, `${fx.url}/console/#/changesets/default/drifted`);
    await page.getByRole('heading', { name: /Changeset drifted/ }).waitFor();
    expect(await page.getByRole('button', { name: 'Apply' }).isDisabled()).to.equal(true); // approve first
    await page.getByRole('button', { name: 'Approve' }).click();
    await page.locator('h1 .phase', { hasText: 'Approved' }).waitFor({ timeout: 60_000 });
    await page.getByRole('button', { name: 'Apply' }).click();
    const refused = page.getByRole('alert', { name: 'Apply refused' });
    await refused.waitFor({ timeout: 60_000 });
    expect(await refused.textContent()).to.contain('/work/drift.txt');
    expect(await refused.textContent()).to.contain('speculate the command again');
    await shot(page, 'apply-refused');
    expect((await exec(fx, 'web', ['cat', '/work/drift.txt'])).stdout).to.equal('changed-meanwhile\n');
    await ctx.close();
  });

  it('an ESC / CR / bidi payload in a file name and in the output renders escaped (DOM text checked)', async () => {
    // printf in the sandbox writes the raw bytes: ESC [31m, CR, U+202E (RIGHT-TO-LEFT OVERRIDE).
    await speculate(
      'evil',
      `n=$(printf 'x\\033[31mred\\rA\\342\\200\\256gpj.exe'); echo data > "/work/$n"; printf 'out \\033[2Khidden\\rover \\342\\200\\256txt\\n'`,
    );
    await eventually(async () => ((await phaseOf('evil')) === 'Pending' ? true : undefined), 60_000, 'Pending');
    const ctx = await newContext(browser);
    const page = await signIn(ctx, fx.url, TOKENS.viewer);
    await goto(page, `${fx.url}/console/#/changesets/default/evil`);
    const out = page.getByTestId('stdout');
    await out.getByText('hidden').waitFor();
    const text = (await out.textContent())!;
    expect(text).to.equal('out ^[[2Khidden\\rover \\u202etxt\n');
    // The file name in the list of changes, and in the diff's note (the server refuses to stage
    // such a path and says so in the diff).
    const name = (await page.getByTestId('changed-path').first().textContent())!;
    expect(name).to.equal('/work/x^[[31mred\\rA\\u202egpj.exe');
    const note = (await page.locator('section.file .summary').first().textContent())!;
    expect(note).to.contain('Not staged: /work/x^[[31mred\\rA\\u202egpj.exe');
    const all = await page.evaluate(() => document.body.innerText + document.documentElement.outerHTML);
    for (const c of ['\u001b', '\r', '\u202e']) expect(all).to.not.contain(c);
    await shot(page, 'escaped');
    await ctx.close();
  });

  it('an approval decided from the queue releases a waiting `fluxctl agent exec --approval-wait`', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'held' },
        spec: { agent: 'claude-code', policy: { process: { ask: ['deploy *'] } } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/held', '--for=condition=Ready', '--timeout=90s']);
    const doc = yaml.load(fs.readFileSync(fx.kubeconfig, 'utf8')) as any;
    doc.users = [{ name: 'editor', user: { token: TOKENS.editor } }];
    doc.contexts[0].context.user = 'editor';
    const kc = path.join(tmp, 'editor.kubeconfig');
    fs.writeFileSync(kc, yaml.dump(doc), { mode: 0o600 });
    const [cmd, ...pre] = fluxctlCommand();
    const child = spawn(
      cmd!,
      [
        ...pre,
        'agent',
        'exec',
        'held',
        '--kubeconfig',
        kc,
        '--approval-wait',
        '110s',
        '--',
        'deploy() { echo deployed-$1; }; deploy prod',
      ],
      { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    const exited = new Promise<number>((res) => child.on('close', (c) => res(c ?? -1)));
    try {
      const ctx = await newContext(browser);
      const page = await signIn(ctx, fx.url, TOKENS.approver);
      await page.getByRole('link', { name: 'Approvals' }).click();
      const item = page.locator('li.approval.pending').first();
      await item.waitFor({ timeout: 90_000 });
      expect(await item.getByTestId('approval-command').textContent()).to.contain('deploy prod');
      await item.getByLabel('Note').fill('ok from the console');
      await shot(page, 'approvals');
      await item.getByRole('button', { name: 'Approve' }).click();
      await page.locator('li.approval.decided').getByText('Approved by approver').waitFor({ timeout: 30_000 });
      const code = await Promise.race([
        exited,
        new Promise<number>((_, rej) => setTimeout(() => rej(new Error(`exec still waiting: ${stderr}`)), 90_000)),
      ]);
      expect(code, stderr).to.equal(0);
      expect(stdout).to.contain('deployed-prod');
      await ctx.close();
    } finally {
      child.kill();
    }
  });

  it('the terminal (xterm.js over the session exec with a TTY) runs a command and follows a resize', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'term' },
        spec: { agent: 'claude-code' },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/term', '--for=condition=Ready', '--timeout=90s']);
    const ctx = await newContext(browser);
    const page = await signIn(ctx, fx.url, fx.token!);
    await goto(page, `${fx.url}/console/#/sessions/default/term`);
    await page.getByRole('button', { name: 'Open a terminal' }).click();
    await page.getByTestId('term-state').getByText('connected').waitFor({ timeout: 60_000 });
    const screen = () =>
      page.evaluate(() => {
        const t = (window as unknown as { fluxTerm: { buffer: { active: any }; cols: number; rows: number } }).fluxTerm;
        const b = t.buffer.active;
        const lines: string[] = [];
        for (let i = 0; i < b.length; i++) lines.push(b.getLine(i)?.translateToString(true) ?? '');
        return { text: lines.join('\n'), cols: t.cols, rows: t.rows };
      });
    // The shell's prompt first (what is typed before the shell reads is echoed by the tty, not lost,
    // but waiting keeps the screen in order), then the command.
    await eventually(async () => ((await screen()).text.trim() ? true : undefined), 30_000, 'the shell prompt');
    await page.locator('.term').click();
    await page.keyboard.type('echo hi-$((6*7)); stty size\n');
    let last = { text: '', cols: 0, rows: 0 };
    const first = await eventually(
      async () => {
        const s = (last = await screen());
        return /hi-42/.test(s.text) && new RegExp(`^${s.rows} ${s.cols}$`, 'm').test(s.text) ? s : undefined;
      },
      30_000,
      'the command output and the tty size in the terminal',
    ).catch((e: Error) => {
      throw new Error(`${e.message}; the screen (${last.rows}x${last.cols}):\n${last.text.trimEnd()}`);
    });
    // The timeline (events/stream through the console) shows the terminal's exec in the ledger.
    await page.locator('ol.timeline li').first().waitFor({ timeout: 30_000 });
    await shot(page, 'session');
    await page.setViewportSize({ width: 760, height: 860 });
    const resized = await eventually(
      async () => {
        const s = await screen();
        return s.cols !== first.cols ? s : undefined;
      },
      10_000,
      'xterm refit',
    );
    await page.keyboard.type('stty size\n');
    await eventually(
      async () => {
        const s = await screen();
        return new RegExp(`^${resized.rows} ${resized.cols}$`, 'm').test(s.text) ? true : undefined;
      },
      30_000,
      `the remote tty resized to ${resized.rows} ${resized.cols}`,
    );
    await ctx.close();
  });

  it('the sandbox page: limits, a read-only file browser with escaped names, checkpoints; and a phone-width dark view', async () => {
    await exec(fx, 'web', ['sh', '-c', `echo y > "/work/$(printf 'y\\033[31mred\\rA\\342\\200\\256gpj.exe')"`]);
    const ctx = await newContext(browser, { colorScheme: 'dark', width: 390, height: 844 });
    const page = await signIn(ctx, fx.url, TOKENS.viewer);
    await goto(page, `${fx.url}/console/#/sandboxes/default/web`);
    await page.getByRole('heading', { name: /Sandbox web/ }).waitFor();
    // A file whose name holds ESC, CR and U+202E, in the real workspace.
    await page.getByTestId('file-name').getByText('gpj.exe').waitFor({ timeout: 30_000 });
    const names = await page.getByTestId('file-name').allTextContents();
    expect(names).to.include('y^[[31mred\\rA\\u202egpj.exe');
    for (const c of ['\u001b', '\r', '\u202e']) expect(names.join('')).to.not.contain(c);
    expect(await page.getByRole('button', { name: /Upload|Delete|Save/ }).count()).to.equal(0);
    await shot(page, 'sandbox-phone-dark');
    await ctx.close();
  });

  it('rewind undo on the session page: the file is restored and the timeline shows the undo', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'rw' },
        spec: { agent: 'claude-code', rewind: { enabled: true } },
      }),
    );
    await kubectlOk(fx, ['wait', 'ags/rw', '--for=condition=Ready', '--timeout=120s']);
    const ags = (sub: string) => `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/rw/${sub}`;
    const sh = async (command: string) => {
      const r = await fx.request('POST', ags('exec'), { body: { command }, timeoutMs: 90_000 });
      expect(r.status, r.body.toString()).to.equal(200);
      return String(r.json.stdout ?? '');
    };
    // Point p-1 before the first write, p-2 before the second: undo to p-2 puts back "one".
    await sh('echo one > /work/f.txt');
    await sh('echo two > /work/f.txt');
    expect(await sh('cat /work/f.txt')).to.equal('two\n');
    const ctx = await newContext(browser);
    const page = await signIn(ctx, fx.url, fx.token!);
    page.on('dialog', (d) => void d.accept());
    await goto(page, `${fx.url}/console/#/sessions/default/rw`);
    const points = page.getByRole('table', { name: 'rewind points' });
    const row = points.getByRole('row').filter({ hasText: /^p-2/ });
    await row.waitFor({ timeout: 30_000 });
    await row.getByRole('button', { name: 'Undo to here' }).click();
    await page.getByRole('status').getByText('Rewound to p-2.').waitFor({ timeout: 60_000 });
    // The world: the file holds what it held at p-2, and the ledger has the undo.
    expect(await sh('cat /work/f.txt')).to.equal('one\n');
    const led = (await fx.request('GET', ags('ledger'))).json.entries as Array<{ kind: string; to?: string }>;
    expect(led.filter((e) => e.kind === 'rewind.undo').map((e) => e.to)).to.deep.equal(['p-2']);
    // The page: the timeline (events/stream) shows the undo entry, and p-2 and later are gone from the points.
    await page.locator('ol.timeline li.k-rewind-undo').filter({ hasText: 'to=p-2' }).waitFor({ timeout: 30_000 });
    await eventually(
      async () => ((await points.getByRole('row').filter({ hasText: /^p-2/ }).count()) === 0 ? true : undefined),
      30_000,
      'p-2 gone from the rewind points',
    );
    await ctx.close();
  });

  it('requests aborted without an answer (as a network change aborts them) are sent again: no page stuck on Loading…', async () => {
    await speculate('aborted', 'echo a > /work/aborted.txt');
    await eventually(async () => ((await phaseOf('aborted')) === 'Pending' ? true : undefined), 60_000, 'Pending');
    const ctx = await newContext(browser);
    // The first two session checks and the changeset page's first GET of its object fail as
    // Chromium fails a request when the host's network changes: no answer at all.
    const aborts = new Map<string, number>();
    const abortFirst = (k: string, re: RegExp, n: number) =>
      ctx.route(re, async (route) => {
        const seen = aborts.get(k) ?? 0;
        aborts.set(k, seen + 1);
        if (seen < n) await route.abort('addressunreachable');
        else await route.continue();
      });
    await abortFirst('whoami', /\/console\/auth\/whoami$/, 2);
    await abortFirst(
      'changeset',
      /\/console\/api\/apis\/fluxvm\.dev\/v1alpha1\/namespaces\/default\/changesets\/aborted$/,
      1,
    );
    const page = await signIn(ctx, fx.url, TOKENS.viewer);
    await goto(page, `${fx.url}/console/#/changesets/default/aborted`);
    await page.getByRole('heading', { name: /Changeset aborted/ }).waitFor({ timeout: 30_000 });
    // The aborted GET is sent again, and the page shows the changeset, not "Failed to fetch".
    await eventually(async () => ((aborts.get('changeset') ?? 0) >= 2 ? true : undefined), 10_000, 'the GET again');
    await page.getByRole('heading', { name: /Changeset aborted/ }).waitFor();
    expect(await page.getByRole('alert').count()).to.equal(0);
    expect(aborts.get('whoami')).to.equal(3);
    await ctx.close();
  });

  it('no console request works without the cookie; CSP blocks an injected inline script', async () => {
    const ctx = await newContext(browser);
    const page = await ctx.newPage();
    await goto(page, `${fx.url}/console/`);
    const anon = await page.evaluate(async (p) => (await fetch(`/console/api${p}`)).status, CS);
    expect(anon).to.equal(401);
    const violations: string[] = [];
    page.on('console', (m) => violations.push(m.text()));
    const ran = await page.evaluate(async () => {
      const seen = new Promise<string>((res) =>
        document.addEventListener('securitypolicyviolation', (e) => res(e.violatedDirective), { once: true }),
      );
      const s = document.createElement('script');
      s.textContent = 'window.__pwned = 1';
      document.body.appendChild(s);
      // Bounded: without the policy there is no violation event at all.
      const v = await Promise.race([seen, new Promise<string>((res) => setTimeout(() => res('no violation'), 5000))]);
      return { pwned: (window as unknown as { __pwned?: number }).__pwned, v };
    });
    expect(ran.pwned).to.equal(undefined);
    expect(ran.v).to.match(/^script-src/);
    await ctx.close();
  });
});
