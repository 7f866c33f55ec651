// End to end: claim-time configuration of a WARM sandbox through `fluxctl serve`:
// env, a Grant and a narrower allow-list land on the sandbox the pool had already started (same
// uid: a policy update, not a new sandbox). The "internet" is the test's own on loopback (a DNS
// server the proxy resolves with, an HTTP upstream on 127.0.0.2 the SSRF guard is told to allow);
// the upstream records what it received, so the injected header is seen where it arrives.
import { expect } from 'chai';
import { httpUpstream, testDns, type TestDns, type Upstream } from '../native/egress/fakenet.js';
import { boundClaim, claim, EXT, FLUX, pool, readyPool, template } from './agentsandbox-helpers.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, eventually, exec, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';

describe('e2e: agent-sandbox claim-time env, Grant and allow-list on a warm sandbox', function () {
  this.timeout(300_000);
  let fx: Fluxctl;
  let dns: TestDns;
  let up: Upstream;
  const SECRET = `claim-s3cr3t-${process.pid}-c27`;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    up = await httpUpstream('127.0.0.2');
    dns = await testDns('127.0.0.1', { 'api.test': ['127.0.0.2'], 'other.test': ['127.0.0.2'] });
    fx = await startFluxctl({
      args: [
        '--egress-allow',
        `*.test:${up.port}`,
        '--egress-allow-cidr',
        '127.0.0.2/32',
        '--egress-resolver',
        dns.server,
      ],
    });
    await kubectlOk(fx, ['create', 'secret', 'generic', 'gh', `--from-literal=token=${SECRET}`]);
  });

  after(async () => {
    if (fx) {
      await api(fx, 'DELETE', `${EXT}/namespaces/default/sandboxclaims`);
      await api(fx, 'DELETE', `${EXT}/namespaces/default/sandboxwarmpools`);
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    await up?.close();
    await dns?.close();
  });

  it('env, a Grant and a narrower allow-list apply to the warm sandbox: the upstream sees the injected header', async () => {
    const t = template(
      'net',
      {
        network: { mode: 'allowList', allow: [`api.test:${up.port}`, `other.test:${up.port}`] },
        envVarsInjectionPolicy: 'Allowed',
      },
      { env: [{ name: 'FROM_TEMPLATE', value: 't' }] },
    );
    expect((await api(fx, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, { body: t })).status).to.equal(201);
    expect(
      (await api(fx, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('np', 'net', 2) })).status,
    ).to.equal(201);
    await readyPool(fx, 'default', 'np', 2);
    const warm = (
      await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes?labelSelector=agents.x-k8s.io/warm-pool-sandbox=np`)
    ).json.items;
    const warmUids = new Map<string, string>(warm.map((s: any) => [s.metadata.name, s.metadata.uid]));
    // Before any claim, a warm sandbox reaches other.test (the template list).
    const before = await exec(fx, warm[0].metadata.name, [
      'sh',
      '-c',
      `curl -sS -o /dev/null -w '%{http_code}' http://other.test:${up.port}/`,
    ]);
    expect(before.stdout).to.equal('200');

    const c = claim('agent', 'np', {
      env: [{ name: 'CLAIM_VAR', value: 'from-claim' }],
      network: { allow: [`api.test:${up.port}`] },
      grants: [{ secretRef: { name: 'gh', key: 'token' }, hosts: ['api.test'] }],
    });
    expect((await api(fx, 'POST', `${EXT}/namespaces/default/sandboxclaims`, { body: c })).status).to.equal(201);
    const bound = await boundClaim(fx, 'default', 'agent');
    expect(bound.status.launchType).to.equal('warm');
    const name = bound.status.sandbox.name as string;
    const sbx = (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).json;
    expect(warmUids.get(name)).to.equal(sbx.metadata.uid); // the same sandbox, not a new one
    expect(sbx.spec.network.allow).to.deep.equal([`api.test:${up.port}`]);
    expect(bound.status.sandbox.podIPs).to.deep.equal([sbx.status.address]);

    up.seen.length = 0;
    const out = await exec(fx, name, [
      'sh',
      '-c',
      [
        'echo "$CLAIM_VAR $FROM_TEMPLATE"',
        `curl -sS -o /dev/null -w '%{http_code}\\n' http://api.test:${up.port}/user`,
        `curl -sS -o /dev/null -w '%{http_code}\\n' http://other.test:${up.port}/`,
      ].join('; '),
    ]);
    expect(out.stdout).to.equal('from-claim t\n200\n403\n');
    expect(up.seen.map((s) => `${s.headers.host} ${s.url} ${s.headers.authorization ?? '-'}`)).to.deep.equal([
      `api.test:${up.port} /user Bearer ${SECRET}`,
    ]);
    // The secret is not in the sandbox.
    const env = await exec(fx, name, ['sh', '-c', "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"]);
    expect(env.stdout).to.not.contain(SECRET);

    // Deleting the claim deletes the sandbox and the Grant.
    expect((await api(fx, 'DELETE', `${EXT}/namespaces/default/sandboxclaims/agent`)).status).to.equal(200);
    await eventually(
      async () =>
        (await api(fx, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).status === 404 &&
        (await api(fx, 'GET', `${FLUX}/namespaces/default/grants/agent-grant-0`)).status === 404,
      60_000,
      'sandbox and grant deleted with the claim',
    );
  });

  it('a claim allow-list wider than the template is refused (NetworkNotNarrower) and binds nothing', async () => {
    const c = claim('wide', 'np', { network: { allow: ['evil.test'] } });
    expect((await api(fx, 'POST', `${EXT}/namespaces/default/sandboxclaims`, { body: c })).status).to.equal(201);
    let st: any;
    await eventually(
      async () => {
        st = (await api(fx, 'GET', `${EXT}/namespaces/default/sandboxclaims/wide`)).json.status;
        return st?.conditions?.some((x: any) => x.type === 'Ready' && x.reason === 'NetworkNotNarrower');
      },
      60_000,
      'NetworkNotNarrower',
    );
    expect(st.sandbox).to.equal(undefined);
    expect(st.conditions.find((x: any) => x.type === 'Ready').message).to.contain(
      'evil.test not in the template allow-list',
    );
  });
});
