// End to end against a real `fluxctl serve` (procbox, HTTPS, bearer tokens) with the real
// kubectl and fluxctl: session tokens. A token minted with `fluxctl agent token
// --kubeconfig-out` makes fluxctl and kubectl work for its one session and its ops only
// (403 elsewhere, kube's wording); bad requests are 422 naming the field, the 33rd live token
// a 409; revoked, expired (the session's own expiry caps it) and deleted-session tokens are
// 401; the token is in no file of the state dir (SQLite store, audit log, ledger, tokens
// file) nor in the server's log, and the audit log records the calls as the session user.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import yaml from 'js-yaml';
import { startFluxctl, type Fluxctl } from './harness.js';
import { Kubectl } from './kubectl.js';
import { fluxctlInProcess, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { filesUnder, textIfThere } from '../support/state-files.js';

const agsPath = (name: string, sub?: string) =>
  `/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/${name}${sub ? `/${sub}` : ''}`;
const session = (name: string, spec: Record<string, unknown> = {}) =>
  JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'AgentSession',
    metadata: { name },
    spec: { agent: 'claude-code', policy: { preset: 'offline' }, ...spec },
  });

describe('e2e: AgentSession tokens (kubectl and fluxctl with a session token)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let tmp: string;
  const minted: string[] = [];
  // Tokens of earlier cases the restart case checks again (each case mints its own as well).
  let execToken = '';
  let revokedToken = '';
  let ownState = '';
  const mint = async (name: string, body: Record<string, unknown>) => {
    const r = await fx.request('POST', agsPath(name, 'token'), { body });
    if (r.status === 201) minted.push(r.json.status.token);
    return r;
  };
  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 }); // a loaded 2-core host can take long to start it through tsx
    tmp = mkdtempSync(join(tmpdir(), 'fluxvm-tokens-e2e-'));
    await kubectlOk(fx, ['apply', '-f', '-'], [session('t1'), session('t2'), session('t3')].join('\n'));
    for (const n of ['t1', 't2', 't3'])
      await kubectlOk(fx, ['wait', `ags/${n}`, '--for=condition=Ready', '--timeout=55s']);
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'ags', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await fx.stop();
    rmSync(tmp, { recursive: true, force: true });
    if (ownState) rmSync(ownState, { recursive: true, force: true });
  });

  it('--kubeconfig-out: fluxctl agent exec and kubectl get agentsession work; other ops, sessions and kinds are 403', async () => {
    const file = join(tmp, 't1.kubeconfig');
    const m = await fluxctlInProcess(fx, [
      'agent',
      'token',
      't1',
      '--ops',
      'exec,read',
      '--ttl',
      '30m',
      '--label',
      'e2e',
      '--kubeconfig-out',
      file,
    ]);
    expect(m.code, m.stderr).to.equal(0);
    expect(m.stdout).to.match(/^token [0-9a-f]{12} \(exec,read, expires \S+\) written to /);
    expect(statSync(file).mode & 0o777).to.equal(0o600);
    const kc: any = yaml.load(readFileSync(file, 'utf8'));
    expect(kc.contexts[0].context.namespace).to.equal('default');
    const token: string = kc.users[0].user.token;
    expect(token).to.match(/^fxst_/);
    minted.push(token);
    execToken = token;

    // fluxctl, spawned (the real binary) and in process.
    const run = await fx.fluxctl(['agent', 'exec', 't1', '--', 'echo from-token'], {
      env: { KUBECONFIG: file },
      timeoutMs: 120_000,
    });
    expect(run.code, run.stderr).to.equal(0);
    expect(run.stdout).to.equal('from-token\n');
    const as = (args: string[]) => fluxctlInProcess(fx, args, file);
    const streamed = await as(['agent', 'exec', 't1', '--stream', '--', 'sh', '-c', 'echo over-ws; exit 3']);
    expect(streamed).to.include({ code: 3, stdout: 'over-ws\n' });
    const ckpt = await as(['agent', 'checkpoint', 't1', '--tag', 'c1']);
    expect(ckpt.code).to.equal(1);
    expect(ckpt.stderr).to.match(
      /Error from server \(Forbidden\): agentsessions\.fluxvm\.dev "t1" is forbidden: User "system:agentsession:default:t1" cannot create resource "agentsessions\/checkpoint" in API group "fluxvm\.dev" in the namespace "default": the session token was not granted checkpoint/,
    );
    const other = await as(['agent', 'exec', 't2', '--', 'true']);
    expect(other.stderr).to.match(
      /Error from server \(Forbidden\): agentsessions\.fluxvm\.dev "t2" is forbidden: User "system:agentsession:default:t1" cannot create resource "agentsessions\/exec"/,
    );
    for (const args of [
      ['agent', 'restore', 't1', 'c1'],
      ['agent', 'fork', 't1'],
      ['agent', 'token', 't1', '--ops', 'read'],
      ['agent', 'tokens', 't1'],
      ['agent', 'rm', 't1'],
      ['agent', 'ls'],
    ]) {
      const r = await as(args);
      expect(r.code, args.join(' ')).to.equal(1);
      expect(r.stderr, args.join(' ')).to.match(/Error from server \(Forbidden\)/);
    }

    // kubectl with the same kubeconfig.
    const k = new Kubectl(fx.url, 'kubectl', file);
    try {
      const got = await k.run(['get', 'agentsession', 't1'], { timeoutMs: 60_000 });
      expect(got.code, got.stderr).to.equal(0);
      expect(got.stdout).to.match(/^t1\s+claude-code\s+Running/m);
      const sbx = await k.run(['get', 'sandboxes'], { timeoutMs: 60_000 });
      expect(sbx.code).to.not.equal(0);
      expect(sbx.stderr).to.include(
        'Error from server (Forbidden): sandboxes.fluxvm.dev is forbidden: User "system:agentsession:default:t1" cannot list resource "sandboxes" in API group "fluxvm.dev" in the namespace "default"',
      );
      const t2 = await k.run(['get', 'agentsession', 't2'], { timeoutMs: 60_000 });
      expect(t2.stderr).to.match(/Error from server \(Forbidden\): agentsessions\.fluxvm\.dev "t2" is forbidden/);
      const secrets = await k.run(['get', 'secrets'], { timeoutMs: 60_000 });
      expect(secrets.stderr).to.match(/Error from server \(Forbidden\): secrets is forbidden/);
      const who = await k.run(['auth', 'whoami', '-o', 'json'], { timeoutMs: 60_000 });
      expect(who.code, who.stderr).to.equal(0);
      expect(JSON.parse(who.stdout).status.userInfo).to.include({ username: 'system:agentsession:default:t1' });
      expect(
        (await k.run(['auth', 'can-i', 'create', 'agentsessions', '--subresource=exec'], { timeoutMs: 60_000 })).stdout,
      ).to.match(/^no - a session token reaches only agentsessions\/t1/); // no name: not its session
      expect(
        (
          await k.run(['auth', 'can-i', 'create', 'agentsessions/t1', '--subresource=exec'], { timeoutMs: 60_000 })
        ).stdout.trim(),
      ).to.equal('yes');
      expect(
        (
          await k.run(['auth', 'can-i', 'create', 'agentsessions/t1', '--subresource=checkpoint'], {
            timeoutMs: 60_000,
          })
        ).stdout,
      ).to.match(/^no - the session token was not granted checkpoint/);
      const list = await k.run(['auth', 'can-i', '--list'], { timeoutMs: 60_000 });
      expect(list.code, list.stderr).to.equal(0);
      expect(list.stdout, list.stdout).to.match(/^agentsessions\.fluxvm\.dev\/exec\s+\[\]\s+\[t1\]\s+\[get create\]/m);
      expect(list.stdout).to.not.match(/sandboxes|checkpoint|token/);
    } finally {
      k.cleanup();
    }
  });

  it('bad input is 422 naming the field and changes nothing; 32 live tokens pass, the 33rd is 409; tokens lists them without secrets', async () => {
    const before = (await fx.request('GET', agsPath('t2', 'token'))).json.items.length;
    const bad = await mint('t2', { ops: ['exec', 'rm'] });
    expect(bad.status).to.equal(422);
    expect(bad.json).to.include({ reason: 'Invalid' });
    expect(bad.json.details.causes.map((c: any) => c.field)).to.deep.equal(['spec.ops[1]']);
    const ng = await mint('t2', { ops: ['fork'] });
    expect(ng.status).to.equal(422);
    expect(ng.json.message).to.include('spec.ops[0]: Forbidden: "fork" is not grantable to a session token');
    for (const ttlSeconds of [59, 86401]) {
      const r = await mint('t2', { ops: ['read'], ttlSeconds });
      expect(r.status).to.equal(422);
      expect(r.json.details.causes.map((c: any) => c.field)).to.deep.equal(['spec.ttlSeconds']);
    }
    expect((await fx.request('GET', agsPath('t2', 'token'))).json.items).to.have.length(before);
    const first = await mint('t2', { ops: ['read'], label: `n${before}` });
    expect(first.status).to.equal(201);
    expect(first.headers['cache-control']).to.equal('no-store');
    for (let i = before + 1; i < 32; i++)
      expect((await mint('t2', { ops: ['read'], label: `n${i}` })).status).to.equal(201);
    const over = await mint('t2', { ops: ['read'] });
    expect(over.status).to.equal(409);
    expect(over.json.message).to.include('the session has 32 live tokens, the limit is 32');
    const list = await fluxctlInProcess(fx, ['agent', 'tokens', 't2', '-o', 'json']);
    expect(list.code, list.stderr).to.equal(0);
    const items = JSON.parse(list.stdout).items;
    expect(items).to.have.length(32);
    expect(Object.keys(items[0]).sort()).to.deep.equal([
      'creationTimestamp',
      'expirationTimestamp',
      'id',
      'label',
      'ops',
    ]);
    expect(list.stdout).to.not.match(/fxst_/);
    const un = await fluxctlInProcess(fx, ['agent', 'untoken', 't2', items[0].id]);
    expect(un.stdout).to.equal(`token "${items[0].id}" of agentsession t2 revoked\n`);
    expect((await mint('t2', { ops: ['read'] })).status).to.equal(201);
    const table = await fluxctlInProcess(fx, ['agent', 'tokens', 't2']);
    expect(table.stdout).to.match(/^ID\s+LABEL\s+OPS\s+EXPIRES$/m);
    expect((await fx.request('DELETE', agsPath('t2', 'token') + '?id=000000000000')).status).to.equal(404);
  });

  it('revoked: 401 at once; a deleted session: its tokens 401; ledgered as token.mint / token.revoke without the secret', async () => {
    const printed = await fluxctlInProcess(fx, ['agent', 'token', 't1', '--ops', 'read']);
    expect(printed.code, printed.stderr).to.equal(0);
    const token = printed.stdout.trim();
    expect(token).to.match(/^fxst_[A-Za-z0-9_-]{43}$/);
    minted.push(token);
    revokedToken = token;
    expect((await fx.request('GET', agsPath('t1'), { token })).status).to.equal(200);
    expect((await fx.request('GET', agsPath('t1', 'ledger'), { token })).status).to.equal(200);
    const id = JSON.parse((await fluxctlInProcess(fx, ['agent', 'tokens', 't1', '-o', 'json'])).stdout).items.find(
      (t: any) => t.ops.join() === 'read',
    ).id;
    expect((await fluxctlInProcess(fx, ['agent', 'untoken', 't1', id])).code).to.equal(0);
    const gone = await fx.request('GET', agsPath('t1'), { token });
    expect(gone.status).to.equal(401);
    expect(gone.json).to.include({ reason: 'Unauthorized' });
    const ledger = (await fx.request('GET', agsPath('t1', 'ledger'))).json.entries;
    const mintEntry = ledger.find((e: any) => e.kind === 'token.mint' && e.id === id);
    expect(mintEntry).to.include({ label: '' });
    expect(mintEntry.ops).to.deep.equal(['read']);
    expect(ledger.find((e: any) => e.kind === 'token.revoke' && e.id === id)).to.not.equal(undefined);

    const t3 = (await mint('t3', { ops: ['read', 'exec'] })).json.status.token as string;
    expect(
      (await fx.request('POST', agsPath('t3', 'exec'), { token: t3, body: { command: 'true' }, timeoutMs: 90_000 }))
        .status,
    ).to.equal(200);
    const uid = (await kubectlOk(fx, ['get', 'ags', 't3', '-o', 'jsonpath={.metadata.uid}'])).trim();
    const file = join(fx.stateDir, 'agentsessions', uid, 'tokens.json');
    expect(existsSync(file), file).to.equal(true);
    await kubectlOk(fx, ['delete', 'ags', 't3', '--wait=true', '--timeout=60s']);
    expect(existsSync(file), 'the finalizer removed the session dir and its tokens').to.equal(false);
    expect((await fx.request('GET', agsPath('t3'), { token: t3 })).status).to.equal(401);
    expect(
      (await fx.request('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/t1', { token: t3 })).status,
    ).to.equal(401);
  });

  it('expired: a token is capped at the session expiry and is 401 once the session is Expired', async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], session('t4', { ttlSeconds: 15 }));
    const r = await mint('t4', { ops: ['read'], ttlSeconds: 3600 });
    expect(r.status, JSON.stringify(r.json)).to.equal(201);
    const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 't4', '-o', 'json']));
    expect(Date.parse(r.json.status.expirationTimestamp)).to.equal(Date.parse(s.metadata.creationTimestamp) + 15_000);
    const token = r.json.status.token;
    await kubectlOk(fx, ['wait', 'ags/t4', '--for=jsonpath={.status.phase}=Expired', '--timeout=60s']);
    expect((await fx.request('GET', agsPath('t4'), { token })).status).to.equal(401);
    const late = await mint('t4', { ops: ['read'] });
    expect(late.status).to.equal(409);
    expect(late.json.message).to.include('the session is Expired: no token can be minted');
  });

  it('no token is in the store, the audit log, a ledger or tokens file, or the server log; the audit log names the session user', async () => {
    expect(minted.length).to.be.greaterThan(30);
    // Sandbox disk images are sparse and huge (a quota'd workspace): the token never went into a sandbox.
    const files = filesUnder(fx.stateDir)
      .filter(({ f, size }) => !f.endsWith('kubeconfig') && size < 64 * 1024 * 1024)
      .map(({ f }) => f);
    expect(files.some((f) => f.endsWith('fluxvm.db'))).to.equal(true);
    expect(files.some((f) => f.endsWith('tokens.json'))).to.equal(true);
    const haystacks = [...files.map((f) => ({ f, text: textIfThere(f) })), { f: 'server log', text: fx.logs() }];
    for (const { f, text } of haystacks) {
      expect(text.includes('fxst_'), `${f} holds a token prefix`).to.equal(false);
      for (const t of minted) expect(text.includes(t.slice(5)), `${f} holds a token`).to.equal(false);
    }
    const audit = readFileSync(join(fx.stateDir, 'audit.log'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    const asSession = audit.filter((e) => e.user.username === 'system:agentsession:default:t1');
    expect(asSession.some((e) => e.objectRef?.subresource === 'exec' && e.responseStatus.code === 200)).to.equal(true);
    expect(asSession.some((e) => e.objectRef?.subresource === 'checkpoint' && e.responseStatus.code === 403)).to.equal(
      true,
    );
    expect(asSession[0].user.extra['authentication.kubernetes.io/credential-id'][0]).to.match(/^fxst:[0-9a-f]{12}$/);
  });

  it('a restart keeps the tokens (only their hashes were on disk): the exec token still runs a command, a revoked one stays 401', async () => {
    const execOnly = (await mint('t1', { ops: ['exec'] })).json.status.token as string;
    const revoked = (await mint('t1', { ops: ['read'] })).json.status;
    expect((await fx.request('DELETE', agsPath('t1', 'token') + `?id=${revoked.id}`)).status).to.equal(200);
    const stateDir = (ownState = fx.stateDir);
    await fx.stop({ keepState: true });
    fx = await startFluxctl({ stateDir, readyTimeoutMs: 90_000 });
    for (const token of [execToken, execOnly].filter(Boolean)) {
      const r = await fx.request('POST', agsPath('t1', 'exec'), {
        token,
        body: { command: 'echo again' },
        timeoutMs: 90_000,
      });
      expect(r.status, r.body.toString()).to.equal(200);
      expect(r.json.stdout).to.equal('again\n');
    }
    expect((await fx.request('GET', agsPath('t1'), { token: execOnly })).status).to.equal(403); // no read
    expect((await fx.request('GET', agsPath('t2'), { token: execToken })).status).to.equal(403);
    expect((await fx.request('GET', agsPath('t1'), { token: revoked.token })).status).to.equal(401);
    if (revokedToken) expect((await fx.request('GET', agsPath('t1'), { token: revokedToken })).status).to.equal(401);
  });
});
