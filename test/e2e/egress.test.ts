// End to end: a Sandbox with network mode allowList behind `fluxctl serve`'s egress proxy,
// driven with the real kubectl. The "internet" is the test's own on loopback: a DNS server
// the proxy resolves with (--egress-resolver) and HTTP upstreams on 127.0.0.2, which the
// SSRF guard is told to allow (--egress-allow-cidr); nothing else is ever contacted.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { httpUpstream, testDns, type TestDns, type Upstream } from '../native/egress/fakenet.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { eventually, exec, kubectlOk, makeSandbox, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';

describe('e2e: allowList egress through the serve egress proxy', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  let dns: TestDns;
  let api: Upstream;
  let uid = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    api = await httpUpstream('127.0.0.2');
    dns = await testDns('127.0.0.1', { 'api.test': ['127.0.0.2'], 'other.test': ['127.0.0.2'], 'meta.test': ['169.254.169.254'] });
    fx = await startFluxctl({
      args: ['--egress-allow', `*.test:${api.port}`, '--egress-allow', 'meta.test', '--egress-allow-cidr', '127.0.0.2/32', '--egress-resolver', dns.server],
    });
    uid = await makeSandbox(fx, 'egr', { network: { mode: 'allowList', allow: [`api.test:${api.port}`, 'meta.test'] } });
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    await api?.close();
    await dns?.close();
  });

  const curl = (url: string) => ['sh', '-c', `curl -sS --max-time 5 -w ' %{http_code}' ${url}`];

  it('reports allowList as enforced and reaches the allowed host by name; another host, an IP literal and the metadata address are refused', async () => {
    const st = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'egr', '-o', 'json'])).status;
    expect(st.capabilities.networkModes).to.include('allowList');
    expect(st.address).to.match(/^10\.213\./);
    const ok = await exec(fx, 'egr', curl(`http://api.test:${api.port}/hello`));
    expect(ok.stdout).to.equal(`hello from api.test:${api.port} GET /hello 200`);
    const other = await exec(fx, 'egr', curl(`http://other.test:${api.port}/`));
    expect(other.stdout).to.match(/ 403$/);
    const ip = await exec(fx, 'egr', curl(`http://127.0.0.2:${api.port}/`));
    expect(ip.stdout).to.match(/ 403$/);
    const meta = await exec(fx, 'egr', curl('http://meta.test/latest/meta-data/'));
    expect(meta.stdout).to.match(/ 403$/);
    expect(api.seen.map((s) => s.url)).to.deep.equal(['/hello']);
    // The audit names the sandbox by its uid (the runtime id), the resolved address and the reasons.
    const audit = readFileSync(join(fx.stateDir, 'egress-audit.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const mine = audit.filter((a) => a.sandbox === uid && a.kind === 'http');
    expect(mine.map((a) => `${a.host} ${a.decision} ${a.reason ?? ''}`)).to.deep.equal([
      'api.test allow ',
      'other.test deny host or port not in the allow-list',
      '127.0.0.2 deny an IP literal: allow rules name hosts',
      'meta.test deny resolved to 169.254.169.254: a loopback, private, link-local, metadata or reserved address',
    ]);
    expect(mine[0]).to.include({ address: '127.0.0.2', status: 200, client: st.address });
  });

  it('a changed spec.network.allow is in force within 1 s, and status.observedGeneration says so', async () => {
    const gen = Number((await kubectlOk(fx, ['get', 'sbx', 'egr', '-o', 'jsonpath={.metadata.generation}'])).trim());
    const t0 = Date.now();
    const p = await fx.request('PATCH', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/egr', {
      body: { spec: { network: { allow: [`api.test:${api.port}`, `other.test:${api.port}`] } } },
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(p.status, JSON.stringify(p.json)).to.equal(200);
    await eventually(async () => {
      const r = await fx.request('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/egr');
      return r.json?.status?.observedGeneration === gen + 1;
    }, 10_000, 'observedGeneration to reach the new generation');
    const realizedMs = Date.now() - t0;
    const r = await exec(fx, 'egr', curl(`http://other.test:${api.port}/now`));
    expect(r.stdout).to.equal(`hello from other.test:${api.port} GET /now 200`);
    console.log(`      allow-list change realized in ${realizedMs} ms (PATCH sent to observedGeneration seen)`);
    expect(realizedMs).to.be.lessThan(1000);
    const d = await kubectlOk(fx, ['describe', 'sbx', 'egr']);
    expect(d).to.match(/EgressPolicyApplied\s+.*allow-list in force: api\.test:\d+, other\.test:\d+/);
  });

  it('refuses bad allow entries with 422 naming the field, and changes nothing', async () => {
    for (const [entry, field] of [['10.0.0.1', 'spec.network.allow[0]'], ['a.*.test', 'spec.network.allow[0]'], ['10.0.0.0/8', 'spec.network.allow[0]']]) {
      const r = await fx.kubectl(['apply', '-f', '-'], { input: sandboxYaml('bad', { network: { mode: 'allowList', allow: [entry] } }) });
      expect(r.code, entry).to.not.equal(0);
      expect(r.stderr, entry).to.contain(field);
      expect(r.stderr, entry).to.match(/is invalid/);
    }
    const many = Array.from({ length: 129 }, (_, i) => `h${i}.test`);
    const r = await fx.kubectl(['patch', 'sbx', 'egr', '--type=merge', '-p', JSON.stringify({ spec: { network: { allow: many } } })]);
    expect(r.code).to.not.equal(0);
    expect(r.stderr).to.contain('spec.network.allow');
    const mode = await fx.kubectl(['patch', 'sbx', 'egr', '--type=merge', '-p', JSON.stringify({ spec: { network: { mode: 'open', allow: null } } })]);
    expect(mode.stderr).to.contain('network.mode is immutable');
    const got = await fx.kubectl(['get', 'sbx', 'bad']);
    expect(got.code).to.not.equal(0);
  });

  it('aggregates the decisions into EgressAllowed / EgressDenied Events on the Sandbox', async () => {
    const d = await eventually(async () => {
      const out = await kubectlOk(fx, ['describe', 'sbx', 'egr']);
      return /EgressDenied/.test(out) && /EgressAllowed/.test(out) && out;
    }, 30_000, 'egress Events');
    expect(d).to.match(/Warning\s+EgressDenied\s+.*1 connection to meta\.test denied \(resolved to 169\.254\.169\.254/);
    expect(d).to.match(/Normal\s+EgressAllowed\s+.*connections? to api\.test allowed \(rule api\.test\)/);
  });

  describe('Grants', () => {
    const SECRET = `s3cr3t-${process.pid}-e2e9f1`;
    const grant = (name: string, spec: Record<string, unknown>) =>
      JSON.stringify({ apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Grant', metadata: { name }, spec: { sandboxRef: { name: 'egr' }, hosts: ['api.test'], ...spec } });
    const phase = async (name: string) => JSON.parse(await kubectlOk(fx, ['get', 'grant', name, '-o', 'json'])).status ?? {};

    before(async () => {
      await kubectlOk(fx, ['create', 'secret', 'generic', 'gh', `--from-literal=token=${SECRET}`]);
    });

    it('binds to the running sandbox and injects the header only to its host, methods and paths', async () => {
      await kubectlOk(fx, ['apply', '-f', '-'], grant('gh', { secretRef: { name: 'gh', key: 'token' }, methods: ['GET'], paths: ['/repos/*'] }));
      await kubectlOk(fx, ['wait', 'grant/gh', '--for=jsonpath={.status.phase}=Bound', '--timeout=30s']);
      const st = await phase('gh');
      const addr = (await kubectlOk(fx, ['get', 'sbx', 'egr', '-o', 'jsonpath={.status.address}'])).trim();
      expect(st.boundAddress).to.equal(addr);
      expect(st.expiresAt).to.match(/Z$/);
      api.seen.length = 0;
      await exec(fx, 'egr', ['sh', '-c', [
        `curl -sS -H 'Authorization: Bearer forged' http://api.test:${api.port}/repos/x`,
        `curl -sS -X POST http://api.test:${api.port}/repos/x`,
        `curl -sS http://api.test:${api.port}/other`,
        `curl -sS http://other.test:${api.port}/repos/x`,
      ].join('; ')]);
      expect(api.seen.map((s) => `${s.method} ${s.headers.host} ${s.url} ${s.headers.authorization ?? '-'}`)).to.deep.equal([
        `GET api.test:${api.port} /repos/x Bearer ${SECRET}`,
        `POST api.test:${api.port} /repos/x -`,
        `GET api.test:${api.port} /other -`,
        `GET other.test:${api.port} /repos/x -`,
      ]);
    });

    it('stays Pending with a reason when the Secret or its key is missing, and injects nothing', async () => {
      await kubectlOk(fx, ['apply', '-f', '-'], grant('nosecret', { secretRef: { name: 'missing', key: 'token' }, hosts: ['other.test'] }));
      await kubectlOk(fx, ['apply', '-f', '-'], grant('nokey', { secretRef: { name: 'gh', key: 'nope' }, hosts: ['other.test'] }));
      await kubectlOk(fx, ['wait', 'grant/nosecret', 'grant/nokey', '--for=jsonpath={.status.phase}=Pending', '--timeout=30s']);
      const a = await phase('nosecret');
      const b = await phase('nokey');
      expect(a.conditions.find((c: any) => c.type === 'Ready')).to.include({ status: 'False', reason: 'SecretNotFound' });
      expect(b.conditions.find((c: any) => c.type === 'Ready')).to.include({ status: 'False', reason: 'SecretKeyNotFound' });
      api.seen.length = 0;
      await exec(fx, 'egr', ['sh', '-c', `curl -sS http://other.test:${api.port}/x`]);
      expect(api.seen[0].headers.authorization).to.equal(undefined);
    });

    it('the value is nowhere in the sandbox, the objects, the state directory, the logs or the audit', async () => {
      // The pattern is split in the command (the API audit records exec requests).
      const inside = await exec(fx, 'egr', ['sh', '-c', `env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rls -- '${SECRET.slice(0, 6)}''${SECRET.slice(6)}' /work /tmp /etc /dev/shm 2>/dev/null; echo done`]);
      expect(inside.stdout).to.not.contain(SECRET);
      expect(inside.stdout).to.match(/done\n$/);
      for (const kind of ['grants', 'sandboxes', 'events']) expect(await kubectlOk(fx, ['get', kind, '-A', '-o', 'yaml']), kind).to.not.contain(SECRET);
      const grep = (() => {
        try {
          return execFileSync('grep', ['-rl', '--', SECRET, fx.stateDir], { encoding: 'utf8' });
        } catch (e) {
          return (e as { status?: number }).status === 1 ? '' : String(e);
        }
      })();
      expect(grep).to.equal('');
      expect(fx.logs()).to.not.contain(SECRET);
      expect(readFileSync(join(fx.stateDir, 'egress-audit.log'), 'utf8')).to.contain('"grant":"default/gh"').and.not.contain(SECRET);
    });

    it('is not inherited by a fork child, and is revoked when its sandbox goes', async () => {
      await makeSandbox(fx, 'egr-child', { network: { mode: 'allowList', allow: [`api.test:${api.port}`, `other.test:${api.port}`] }, workspace: { source: { sandboxRef: { name: 'egr' } } } });
      api.seen.length = 0;
      await exec(fx, 'egr-child', ['sh', '-c', `curl -sS http://api.test:${api.port}/repos/x`]);
      expect(api.seen.map((s) => s.headers.authorization ?? '-')).to.deep.equal(['-']);
      await kubectlOk(fx, ['delete', 'sbx', 'egr', '--wait=true', '--timeout=60s']);
      await kubectlOk(fx, ['wait', 'grant/gh', '--for=jsonpath={.status.phase}=Revoked', '--timeout=30s']);
      expect((await phase('gh')).boundAddress).to.equal(undefined);
    });
  });
});
