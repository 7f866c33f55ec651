// End to end: a Sandbox with network mode allowList behind `fluxctl serve`'s egress proxy,
// driven with the real kubectl. The "internet" is the test's own on loopback: a DNS server
// the proxy resolves with (--egress-resolver) and HTTP upstreams on 127.0.0.2, which the
// SSRF guard is told to allow (--egress-allow-cidr), and a network namespace with HTTP/HTTPS
// upstreams on 80/443 whose certificate (a test CA's, for tls.test) the proxy is told to
// trust (--egress-upstream-ca); nothing else is ever contacted.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  httpUpstream,
  netnsInternet,
  testCA,
  testDns,
  type NetnsInternet,
  type TestCA,
  type TestDns,
  type Upstream,
} from '../native/egress/fakenet.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  eventually,
  exec,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  sandboxYaml,
  skipWith,
} from './sandbox-helpers.js';
import { describedWith } from './event-waits.js';

describe('e2e: allowList egress through the serve egress proxy', function () {
  this.timeout(180_000);
  let fx: Fluxctl;
  let dns: TestDns;
  let api: Upstream;
  let ca: TestCA;
  let inet: NetnsInternet;
  let caDir = '';
  let uid = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    ca = testCA();
    try {
      inet = await netnsInternet('e2eg', ca.leaf('tls.test'));
    } catch (err) {
      ca.cleanup();
      skipWith(this, `cannot build the test network: ${(err as Error).message}`);
    }
    caDir = mkdtempSync(join(tmpdir(), 'egress-e2e-ca-'));
    writeFileSync(join(caDir, 'ca.crt'), ca.ca);
    api = await httpUpstream('127.0.0.2');
    // bad.test resolves to the same upstream, whose certificate names tls.test only.
    dns = await testDns('127.0.0.1', {
      'api.test': ['127.0.0.2'],
      'other.test': ['127.0.0.2'],
      'meta.test': ['169.254.169.254'],
      'tls.test': [inet.ip],
      'bad.test': [inet.ip],
    });
    fx = await startFluxctl({
      args: [
        '--egress-allow',
        `*.test:${api.port}`,
        '--egress-allow',
        'meta.test,tls.test,bad.test',
        '--egress-allow-cidr',
        `127.0.0.2/32,${inet.ip}/32`,
        '--egress-resolver',
        dns.server,
        '--egress-upstream-ca',
        join(caDir, 'ca.crt'),
      ],
    });
    uid = await makeSandbox(fx, 'egr', {
      network: { mode: 'allowList', allow: [`api.test:${api.port}`, 'meta.test'] },
    });
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    await api?.close();
    await dns?.close();
    inet?.close();
    ca?.cleanup();
    if (caDir) rmSync(caDir, { recursive: true, force: true });
  });

  /**
   * The secret is in no env, environ or file of `sbx`, no object, the state directory, the logs or the audit (which
   * names `grant`).
   */
  async function expectNowhere(secret: string, sbx: string, grant: string): Promise<void> {
    // The pattern is split in the command (the API audit records exec requests).
    const inside = await exec(fx, sbx, [
      'sh',
      '-c',
      `env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rls -- '${secret.slice(0, 6)}''${secret.slice(6)}' /work /tmp /etc /dev/shm 2>/dev/null; echo done`,
    ]);
    expect(inside.stdout).to.not.contain(secret);
    expect(inside.stdout).to.match(/done\n$/);
    for (const kind of ['grants', 'sandboxes', 'agentsessions', 'events'])
      expect(await kubectlOk(fx, ['get', kind, '-A', '-o', 'yaml']), kind).to.not.contain(secret);
    const grep = (() => {
      try {
        return execFileSync('grep', ['-rl', '--', secret, fx.stateDir], { encoding: 'utf8' });
      } catch (e) {
        return (e as { status?: number }).status === 1 ? '' : String(e);
      }
    })();
    expect(grep).to.equal('');
    expect(fx.logs()).to.not.contain(secret);
    expect(readFileSync(join(fx.stateDir, 'egress-audit.log'), 'utf8'))
      .to.contain(`"grant":"${grant}"`)
      .and.not.contain(secret);
  }

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
    const audit = readFileSync(join(fx.stateDir, 'egress-audit.log'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
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
    await eventually(
      async () => {
        const r = await fx.request('GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/egr');
        return r.json?.status?.observedGeneration === gen + 1;
      },
      10_000,
      'observedGeneration to reach the new generation',
    );
    const realizedMs = Date.now() - t0;
    const r = await exec(fx, 'egr', curl(`http://other.test:${api.port}/now`));
    expect(r.stdout).to.equal(`hello from other.test:${api.port} GET /now 200`);
    console.log(`      allow-list change realized in ${realizedMs} ms (PATCH sent to observedGeneration seen)`);
    expect(realizedMs).to.be.lessThan(1000);
    await describedWith(
      fx,
      ['sbx', 'egr'],
      /EgressPolicyApplied\s+.*allow-list in force: api\.test:\d+, other\.test:\d+/,
    );
  });

  it('refuses bad allow entries with 422 naming the field, and changes nothing', async () => {
    for (const [entry, field] of [
      ['10.0.0.1', 'spec.network.allow[0]'],
      ['a.*.test', 'spec.network.allow[0]'],
      ['10.0.0.0/8', 'spec.network.allow[0]'],
    ]) {
      const r = await fx.kubectl(['apply', '-f', '-'], {
        input: sandboxYaml('bad', { network: { mode: 'allowList', allow: [entry] } }),
      });
      expect(r.code, entry).to.not.equal(0);
      expect(r.stderr, entry).to.contain(field);
      expect(r.stderr, entry).to.match(/is invalid/);
    }
    const many = Array.from({ length: 129 }, (_, i) => `h${i}.test`);
    const r = await fx.kubectl([
      'patch',
      'sbx',
      'egr',
      '--type=merge',
      '-p',
      JSON.stringify({ spec: { network: { allow: many } } }),
    ]);
    expect(r.code).to.not.equal(0);
    expect(r.stderr).to.contain('spec.network.allow');
    const mode = await fx.kubectl([
      'patch',
      'sbx',
      'egr',
      '--type=merge',
      '-p',
      JSON.stringify({ spec: { network: { mode: 'open', allow: null } } }),
    ]);
    expect(mode.stderr).to.contain('network.mode is immutable');
    const got = await fx.kubectl(['get', 'sbx', 'bad']);
    expect(got.code).to.not.equal(0);
  });

  it('aggregates the decisions into EgressAllowed / EgressDenied Events on the Sandbox', async () => {
    const d = await eventually(
      async () => {
        const out = await kubectlOk(fx, ['describe', 'sbx', 'egr']);
        // The aggregates are drained every 10 s: the requests of the first test may land in two drains.
        return /EgressDenied\s+.*meta\.test denied/.test(out) && /EgressAllowed/.test(out) && out;
      },
      30_000,
      'egress Events',
    );
    expect(d).to.match(
      /Warning\s+EgressDenied\s+.*1 connection to meta\.test denied \(resolved to 169\.254\.169\.254/,
      d,
    );
    expect(d).to.match(/Normal\s+EgressAllowed\s+.*connections? to api\.test allowed \(rule api\.test\)/);
  });

  describe('Grants', () => {
    const SECRET = `s3cr3t-${process.pid}-e2e9f1`;
    const grant = (name: string, spec: Record<string, unknown>) =>
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Grant',
        metadata: { name },
        spec: { sandboxRef: { name: 'egr' }, hosts: ['api.test'], ...spec },
      });
    const phase = async (name: string) =>
      JSON.parse(await kubectlOk(fx, ['get', 'grant', name, '-o', 'json'])).status ?? {};

    before(async () => {
      await kubectlOk(fx, ['create', 'secret', 'generic', 'gh', `--from-literal=token=${SECRET}`]);
    });

    it('binds to the running sandbox and injects the header only to its host, methods and paths', async () => {
      await kubectlOk(
        fx,
        ['apply', '-f', '-'],
        grant('gh', { secretRef: { name: 'gh', key: 'token' }, methods: ['GET'], paths: ['/repos/*'] }),
      );
      await kubectlOk(fx, ['wait', 'grant/gh', '--for=jsonpath={.status.phase}=Bound', '--timeout=30s']);
      const st = await phase('gh');
      const addr = (await kubectlOk(fx, ['get', 'sbx', 'egr', '-o', 'jsonpath={.status.address}'])).trim();
      expect(st.boundAddress).to.equal(addr);
      expect(st.expiresAt).to.match(/Z$/);
      api.seen.length = 0;
      await exec(fx, 'egr', [
        'sh',
        '-c',
        [
          `curl -sS -H 'Authorization: Bearer forged' http://api.test:${api.port}/repos/x`,
          `curl -sS -X POST http://api.test:${api.port}/repos/x`,
          `curl -sS http://api.test:${api.port}/other`,
          `curl -sS http://other.test:${api.port}/repos/x`,
        ].join('; '),
      ]);
      expect(
        api.seen.map((s) => `${s.method} ${s.headers.host} ${s.url} ${s.headers.authorization ?? '-'}`),
      ).to.deep.equal([
        `GET api.test:${api.port} /repos/x Bearer ${SECRET}`,
        `POST api.test:${api.port} /repos/x -`,
        `GET api.test:${api.port} /other -`,
        `GET other.test:${api.port} /repos/x -`,
      ]);
    });

    it('stays Pending with a reason when the Secret or its key is missing, and injects nothing', async () => {
      await kubectlOk(
        fx,
        ['apply', '-f', '-'],
        grant('nosecret', { secretRef: { name: 'missing', key: 'token' }, hosts: ['other.test'] }),
      );
      await kubectlOk(
        fx,
        ['apply', '-f', '-'],
        grant('nokey', { secretRef: { name: 'gh', key: 'nope' }, hosts: ['other.test'] }),
      );
      await kubectlOk(fx, [
        'wait',
        'grant/nosecret',
        'grant/nokey',
        '--for=jsonpath={.status.phase}=Pending',
        '--timeout=30s',
      ]);
      const a = await phase('nosecret');
      const b = await phase('nokey');
      expect(a.conditions.find((c: any) => c.type === 'Ready')).to.include({
        status: 'False',
        reason: 'SecretNotFound',
      });
      expect(b.conditions.find((c: any) => c.type === 'Ready')).to.include({
        status: 'False',
        reason: 'SecretKeyNotFound',
      });
      api.seen.length = 0;
      await exec(fx, 'egr', ['sh', '-c', `curl -sS http://other.test:${api.port}/x`]);
      expect(api.seen[0].headers.authorization).to.equal(undefined);
    });

    it('the value is nowhere in the sandbox, the objects, the state directory, the logs or the audit', async () => {
      await expectNowhere(SECRET, 'egr', 'default/gh');
    });

    it('is not inherited by a fork child, and is revoked when its sandbox goes', async () => {
      await makeSandbox(fx, 'egr-child', {
        network: { mode: 'allowList', allow: [`api.test:${api.port}`, `other.test:${api.port}`] },
        workspace: { source: { sandboxRef: { name: 'egr' } } },
      });
      api.seen.length = 0;
      const r = await exec(fx, 'egr-child', ['sh', '-c', `curl -sS http://api.test:${api.port}/repos/x`]);
      expect(
        api.seen.map((s) => s.headers.authorization ?? '-'),
        `curl: exit ${r.exitCode}: ${r.stderr}`,
      ).to.deep.equal(['-']);
      await kubectlOk(fx, ['delete', 'sbx', 'egr', '--wait=true', '--timeout=60s']);
      await kubectlOk(fx, ['wait', 'grant/gh', '--for=jsonpath={.status.phase}=Revoked', '--timeout=30s']);
      expect((await phase('gh')).boundAddress).to.equal(undefined);
    });
  });
  describe('Grants over HTTPS (TLS interception) and sessionRef grants', () => {
    const SECRET = `tls-s3cr3t-${process.pid}-7c1d`;
    const grant = (name: string, target: Record<string, unknown>, spec: Record<string, unknown> = {}) =>
      JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Grant',
        metadata: { name },
        spec: {
          ...target,
          hosts: ['tls.test', 'bad.test'],
          secretRef: { name: 'tlsgh', key: 'token' },
          methods: ['GET'],
          paths: ['/repos/*'],
          ...spec,
        },
      });
    const audit = () =>
      readFileSync(join(fx.stateDir, 'egress-audit.log'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
    const seen = () => inet.seen.map((s) => `${s.method} ${s.url} ${s.headers.authorization ?? '-'}`);

    before(async () => {
      await kubectlOk(fx, ['create', 'secret', 'generic', 'tlsgh', `--from-literal=token=${SECRET}`]);
      await makeSandbox(fx, 'egs', { network: { mode: 'allowList', allow: ['tls.test', 'bad.test'] } });
    });

    it('injects the header into intercepted HTTPS (proxy settings and transparent) within its methods and paths; a bad upstream certificate fails with the reason audited', async () => {
      await kubectlOk(fx, ['apply', '-f', '-'], grant('tlsg', { sandboxRef: { name: 'egs' } }));
      await kubectlOk(fx, ['wait', 'grant/tlsg', '--for=jsonpath={.status.phase}=Bound', '--timeout=30s']);
      inet.seen.length = 0;
      // curl trusts only the sandbox's bundle (SSL_CERT_FILE: the host bundle + the sandbox CA), never the test CA.
      const r = await exec(fx, 'egs', [
        'sh',
        '-c',
        [
          `curl -sS -H 'Authorization: Bearer forged' https://tls.test/repos/x`,
          `curl -sS --noproxy '*' https://tls.test/repos/y`,
          `curl -sS -X POST -d x https://tls.test/repos/x`,
          `curl -sS https://tls.test/other`,
          `curl -sS -o /dev/null -w '%{http_code}\\n' https://bad.test/repos/x`,
        ].join('; '),
      ]);
      expect(r.stdout)
        .to.contain('hello from tls.test GET /repos/x')
        .and.contain('hello from tls.test GET /repos/y')
        .and.match(/\n502\n$/);
      expect(seen()).to.deep.equal([
        `GET /repos/x Bearer ${SECRET}`,
        `GET /repos/y Bearer ${SECRET}`,
        'POST /repos/x -',
        'GET /other -',
      ]);
      const mine = audit().filter((a) => a.kind === 'https');
      expect(mine.map((a) => `${a.method} ${a.host} ${a.path} ${a.status} ${a.grant ?? '-'}`)).to.deep.equal([
        'GET tls.test /repos/x 200 default/tlsg',
        'GET tls.test /repos/y 200 default/tlsg',
        'POST tls.test /repos/x 200 -',
        'GET tls.test /other 200 -',
        'GET bad.test /repos/x 502 default/tlsg',
      ]);
      expect(mine[4].reason).to.match(/^upstream TLS: ERR_TLS_CERT_ALTNAME_INVALID: .*tls\.test/);
      await expectNowhere(SECRET, 'egs', 'default/tlsg');
    });

    it('spec.network.http: methods and paths per host, enforced per request over HTTP and inside intercepted HTTPS; changed in place; bad entries 422', async () => {
      const sp = (http: unknown[]) => ({
        network: { mode: 'allowList', allow: ['tls.test', `api.test:${api.port}`], http },
      });
      await makeSandbox(
        fx,
        'egl7',
        sp([
          { host: 'tls.test', methods: ['GET'], paths: ['/repos/*'] },
          { host: 'api.test', methods: ['GET', 'HEAD'] },
        ]),
      );
      inet.seen.length = 0;
      api.seen.length = 0;
      const code = (args: string) => `curl -sS -o /dev/null -w '%{http_code}\\n' ${args}`;
      const r = await exec(fx, 'egl7', [
        'sh',
        '-c',
        [
          code('https://tls.test/repos/a'),
          code('-X POST -d x https://tls.test/repos/a'),
          code('https://tls.test/other'),
          code('--path-as-is https://tls.test/repos/../other'),
          code(`http://api.test:${api.port}/x`),
          code(`-X POST -d x http://api.test:${api.port}/x`),
        ].join('; '),
      ]);
      expect(r.stdout).to.equal('200\n403\n403\n403\n200\n403\n');
      expect(inet.seen.map((x) => `${x.method} ${x.url}`)).to.deep.equal(['GET /repos/a']);
      expect(api.seen.map((x) => `${x.method} ${x.url}`)).to.deep.equal(['GET /x']);
      // In place: POST allowed to api.test from the next request on.
      const gen = Number((await kubectlOk(fx, ['get', 'sbx', 'egl7', '-o', 'jsonpath={.metadata.generation}'])).trim());
      await kubectlOk(fx, [
        'patch',
        'sbx',
        'egl7',
        '--type=merge',
        '-p',
        JSON.stringify({
          spec: sp([
            { host: 'tls.test', methods: ['GET'], paths: ['/repos/*'] },
            { host: 'api.test', methods: ['GET', 'POST'] },
          ]),
        }),
      ]);
      await eventually(
        async () =>
          JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'egl7', '-o', 'json'])).status.observedGeneration === gen + 1,
        10_000,
        'observedGeneration',
      );
      expect(
        (await exec(fx, 'egl7', ['sh', '-c', code(`-X POST -d x http://api.test:${api.port}/x`)])).stdout,
      ).to.equal('200\n');
      // Bad input: 422 naming the field, nothing changed.
      for (const [spec, msg] of [
        [
          sp([{ host: 'nope.test', methods: ['GET'] }]),
          /spec\.network\.http: Invalid value: .*every http host must be an allow entry host/,
        ],
        [
          { network: { mode: 'none', http: [{ host: 'tls.test', methods: ['GET'] }] } },
          /spec\.network\.http: Invalid value: .*http is only valid with mode allowList/,
        ],
        [
          sp([{ host: 'tls.test', methods: ['TRACE'] }]),
          /spec\.network\.http\[0\]\.methods\[0\]: Unsupported value: "TRACE"/,
        ],
        [sp([{ host: 'tls.test', paths: ['repos'] }]), /spec\.network\.http\[0\]\.paths\[0\]/],
      ] as const) {
        const bad = await fx.kubectl(['apply', '-f', '-'], {
          input: sandboxYaml('egl7bad', spec as Record<string, unknown>),
        });
        expect(bad.code).to.equal(1);
        expect(bad.stderr).to.match(msg);
      }
      expect((await fx.kubectl(['get', 'sbx', 'egl7bad'])).stderr).to.match(/NotFound/);
      await kubectlOk(fx, ['delete', 'sbx', 'egl7', '--wait=true', '--timeout=60s']);
    });

    it('an AgentSession with method/path rules: compiled to the Sandbox network.http, httpPolicy true, enforced inside intercepted HTTPS', async () => {
      await kubectlOk(
        fx,
        ['apply', '-f', '-'],
        JSON.stringify({
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'AgentSession',
          metadata: { name: 'agl7' },
          spec: {
            agent: 'a',
            policy: {
              preset: 'offline',
              network: { default: 'deny', allow: [{ host: 'tls.test', methods: ['GET'], paths: ['/repos/*'] }] },
            },
          },
        }),
      );
      await kubectlOk(fx, ['wait', 'ags/agl7', '--for=condition=Ready', '--timeout=120s']);
      const s = JSON.parse(await kubectlOk(fx, ['get', 'ags', 'agl7', '-o', 'json']));
      expect(s.status.capabilities.httpPolicy).to.equal(true);
      expect(s.status.compiledPolicy.httpRules).to.deep.equal(['allow GET tls.test/repos/*']);
      expect(JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'agl7', '-o', 'jsonpath={.spec.network}']))).to.deep.equal({
        mode: 'allowList',
        allow: ['tls.test'],
        http: [{ host: 'tls.test', methods: ['GET'], paths: ['/repos/*'] }],
      });
      inet.seen.length = 0;
      const r = await fx.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/agl7/exec', {
        body: {
          command:
            "curl -sS -o /dev/null -w '%{http_code}\\n' https://tls.test/repos/z; curl -sS -o /dev/null -w '%{http_code}\\n' -X POST -d x https://tls.test/repos/z",
        },
        timeoutMs: 90_000,
      });
      expect(r.json.stdout).to.equal('200\n403\n');
      expect(inet.seen.map((x) => `${x.method} ${x.url}`)).to.deep.equal(['GET /repos/z']);
      await kubectlOk(fx, ['delete', 'ags', 'agl7', '--wait=true', '--timeout=60s']);
    });

    it('a sessionRef grant binds to the session sandbox with the session expiry, is not in a fork child, and is revoked when the session goes', async () => {
      const ses = {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name: 'egses' },
        spec: {
          agent: 'claude-code',
          ttlSeconds: 900,
          policy: { network: { default: 'deny', allow: [{ host: 'tls.test' }] } },
        },
      };
      await kubectlOk(fx, ['apply', '-f', '-'], JSON.stringify(ses));
      await kubectlOk(fx, ['wait', 'agentsession/egses', '--for=jsonpath={.status.phase}=Running', '--timeout=90s']);
      const s = JSON.parse(await kubectlOk(fx, ['get', 'agentsession', 'egses', '-o', 'json'])).status;
      const sbx = s.sandbox.name;
      await kubectlOk(fx, ['apply', '-f', '-'], grant('sesg', { sessionRef: { name: 'egses' } }));
      await kubectlOk(fx, ['wait', 'grant/sesg', '--for=jsonpath={.status.phase}=Bound', '--timeout=30s']);
      const g = JSON.parse(await kubectlOk(fx, ['get', 'grant', 'sesg', '-o', 'json'])).status;
      expect(g.boundAddress).to.equal(
        (await kubectlOk(fx, ['get', 'sbx', sbx, '-o', 'jsonpath={.status.address}'])).trim(),
      );
      // ttlSeconds 3600 (the default) is capped at the session's 900 s.
      expect(Date.parse(g.expiresAt)).to.equal(Date.parse(s.expiresAt));
      expect(g.message).to.contain('of session "egses"');
      const f = await fx.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions/egses/fork', {
        body: { count: 1 },
      });
      expect(f.status, JSON.stringify(f.json)).to.equal(200);
      await kubectlOk(fx, ['wait', 'agentsession/egses-1', '--for=jsonpath={.status.phase}=Running', '--timeout=90s']);
      const child = JSON.parse(await kubectlOk(fx, ['get', 'agentsession', 'egses-1', '-o', 'json'])).status.sandbox
        .name;
      inet.seen.length = 0;
      await exec(fx, sbx, ['sh', '-c', 'curl -sS https://tls.test/repos/parent']);
      // The child has no grant, so tls.test is not even intercepted there: a plain tunnel to the
      // upstream, whose test-CA certificate the child does not trust (-k: the request goes anyway).
      const c = await exec(fx, child, ['sh', '-c', 'curl -sS -k https://tls.test/repos/child']);
      expect(c.stdout).to.contain('hello from tls.test GET /repos/child');
      expect(seen()).to.deep.equal([`GET /repos/parent Bearer ${SECRET}`, 'GET /repos/child -']);
      const childUid = (await kubectlOk(fx, ['get', 'sbx', child, '-o', 'jsonpath={.metadata.uid}'])).trim();
      // (a tunnel is audited when it closes)
      const childAudit = await eventually(
        async () => {
          const l = audit().filter((a) => a.sandbox === childUid && a.host === 'tls.test');
          return l.length > 0 && l;
        },
        10_000,
        "the child's tunnel audit line",
      );
      expect(childAudit.map((a) => `${a.kind} ${a.decision} ${a.grant ?? '-'}`)).to.deep.equal(['connect allow -']);
      await expectNowhere(SECRET, sbx, 'default/sesg');
      await kubectlOk(fx, ['delete', 'agentsession', 'egses', '--wait=true', '--timeout=60s']);
      await kubectlOk(fx, ['wait', 'grant/sesg', '--for=jsonpath={.status.phase}=Revoked', '--timeout=30s']);
      expect(JSON.parse(await kubectlOk(fx, ['get', 'grant', 'sesg', '-o', 'json'])).status.boundAddress).to.equal(
        undefined,
      );
      await kubectlOk(fx, ['delete', 'agentsession', '--all', '--wait=true', '--timeout=60s']);
    });
  });
});
