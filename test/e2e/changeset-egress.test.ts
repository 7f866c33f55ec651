// End to end: speculation with contained and measured side effects. A procbox
// Sandbox with an allow-list behind `fluxctl serve`'s egress proxy; the "internet" is the
// test's own (test/native/egress/fakenet.ts: a DNS server the proxy resolves with and an HTTP
// upstream on 127.0.0.2 that counts every request it receives). Changesets run with
// spec.egress readOnly (the default), none and sandbox; the report is read back from status,
// from `fluxctl changeset diff` and from a sandboxes/dryrun answer.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  httpsUpstream,
  httpUpstream,
  testCA,
  testDns,
  type TestCA,
  type TestDns,
  type Upstream,
} from '../native/egress/fakenet.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  apiSpeculate,
  exec,
  fluxctlInProcess,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  skipWith,
  subPath,
} from './sandbox-helpers.js';
import { eventsUntil } from './event-waits.js';

describe('e2e: speculation egress (spec.egress, measured status.sideEffects)', function () {
  this.timeout(240_000);
  let fx: Fluxctl;
  let dns: TestDns;
  let up: Upstream;
  let tlsUp: Upstream;
  let ca: TestCA;
  let url = '';
  let tlsUrl = '';
  let tmp = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    ca = testCA();
    up = await httpUpstream('127.0.0.2');
    tlsUp = await httpsUpstream('127.0.0.2', ca.leaf('api.test'));
    dns = await testDns('127.0.0.1', { 'api.test': ['127.0.0.2'] });
    url = `http://api.test:${up.port}`;
    tlsUrl = `https://api.test:${tlsUp.port}`;
    tmp = mkdtempSync(join(tmpdir(), 'cs-egress-'));
    const caFile = join(tmp, 'upstream-ca.pem');
    writeFileSync(caFile, ca.ca);
    fx = await startFluxctl({
      args: [
        '--egress-allow',
        `api.test:${up.port},api.test:${tlsUp.port}`,
        '--egress-allow-cidr',
        '127.0.0.2/32',
        '--egress-resolver',
        dns.server,
        // The proxy verifies the test upstream's certificate against the test CA.
        '--egress-upstream-ca',
        caFile,
      ],
    });
    await makeSandbox(fx, 'spx', {
      network: { mode: 'allowList', allow: [`api.test:${up.port}`, `api.test:${tlsUp.port}`] },
    });
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'cs', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    await up?.close();
    await tlsUp?.close();
    await dns?.close();
    ca?.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  /** A GET, then a POST with a 12-byte body, each printing its HTTP status; then a file change. */
  const readThenWrite = (tag: string) =>
    `curl -sS --max-time 5 -o /dev/null -w 'get %{http_code}\\n' ${url}/read-${tag}; ` +
    `curl -sS --max-time 5 -o /dev/null -w 'post %{http_code}\\n' -X POST --data-binary 'hello-body!!' ${url}/write-${tag}; ` +
    `echo ${tag} > /work/${tag}.txt`;
  const seen = (tag: string) => up.seen.filter((s) => s.url.endsWith(`-${tag}`)).map((s) => `${s.method} ${s.url}`);

  it('readOnly (the default with an allow-list): the GET goes out and is listed in contacted; the POST is answered 403, held, listed, and never reaches the upstream', async () => {
    const cs = await apiSpeculate(fx, 'spx', 'ro', readThenWrite('ro'));
    expect(cs.status.phase, JSON.stringify(cs.status)).to.equal('Pending');
    expect(cs.status.stdout).to.equal('get 200\npost 403\n');
    const se = cs.status.sideEffects;
    expect(se).to.deep.include({
      egress: 'readOnly',
      network: 'allowList',
      measured: true,
      nonReplayable: false,
      destinations: [`api.test:${up.port}`, `api.test:${tlsUp.port}`],
      contactedDropped: 0,
      heldDropped: 0,
    });
    expect(se.contacted).to.deep.equal([
      {
        kind: 'http',
        host: 'api.test',
        port: up.port,
        address: '127.0.0.2',
        method: 'GET',
        path: '/read-ro',
        status: 200,
        bytesOut: 0,
        bytesIn: se.contacted[0].bytesIn,
        decision: 'allow',
      },
    ]);
    expect(se.contacted[0].bytesIn).to.be.greaterThan(0);
    expect(se.held).to.have.length(1);
    expect(se.held[0]).to.deep.include({
      kind: 'http',
      host: 'api.test',
      port: up.port,
      method: 'POST',
      path: '/write-ro',
      status: 403,
      bytesOut: 12,
      bytesIn: 0,
      decision: 'hold',
    });
    // The upstream counts requests: only the GET arrived.
    expect(seen('ro')).to.deep.equal(['GET /read-ro']);
    // The Created Event says so in one line.
    const ev = await eventsUntil(
      fx,
      'involvedObject.name=ro,reason=Created',
      (items) => items.length > 0,
      'a Created Event',
    );
    expect(ev[0]?.message).to.match(/egress readOnly \(network allowList\): 1 went out, 1 held$/);
  });

  it('readOnly over HTTPS: the copy trusts its own CA, the proxy intercepts TLS and sees the method: the GET goes out, the POST is held and never reaches the upstream', async () => {
    const script = `curl -sS --max-time 5 -o /dev/null -w 'get %{http_code}\\n' ${tlsUrl}/read-tls; curl -sS --max-time 5 -o /dev/null -w 'post %{http_code}\\n' -X POST --data-binary 'tls-body' ${tlsUrl}/write-tls`;
    const cs = await apiSpeculate(fx, 'spx', 'rotls', script);
    expect(cs.status.stdout, cs.status.stderr).to.equal('get 200\npost 403\n');
    const se = cs.status.sideEffects;
    expect(se.contacted.map((e: any) => `${e.kind} ${e.decision} ${e.method} ${e.path} ${e.status}`)).to.deep.equal([
      'https allow GET /read-tls 200',
    ]);
    expect(
      se.held.map((e: any) => `${e.kind} ${e.decision} ${e.method} ${e.path} ${e.status} ${e.bytesOut}`),
    ).to.deep.equal(['https hold POST /write-tls 403 8']);
    expect(se.nonReplayable).to.equal(false);
    expect(tlsUp.seen.map((s) => `${s.method} ${s.url}`)).to.deep.equal(['GET /read-tls']);
  });

  it('fluxctl changeset diff prints the held and contacted lists under the file diff', async () => {
    const r = await fluxctlInProcess(fx, ['changeset', 'diff', 'ro', '--color', 'never']);
    expect(r.code, r.stderr).to.equal(0);
    const fileDiff = r.stdout.indexOf('+++ b/work/ro.txt');
    const held = r.stdout.indexOf('held (1, answered 403 and never sent):\n  hold  POST http://api.test:');
    const contacted = r.stdout.indexOf('contacted (1):\n  allow GET http://api.test:');
    expect(fileDiff, r.stdout).to.be.greaterThan(-1);
    expect(held, r.stdout).to.be.greaterThan(fileDiff);
    expect(contacted, r.stdout).to.be.greaterThan(held);
    expect(r.stdout).to.include(`/write-ro -> 403 (127.0.0.2, 12 bytes out, 0 in): readOnly: POST held\n`);
    expect(r.stdout).to.include('side effects: egress readOnly (network allowList)');
  });

  it('the approved changeset applies its files and does not re-run the network call', async () => {
    const before = up.seen.length;
    const p = await fx.request('PATCH', '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets/ro/approval', {
      raw: JSON.stringify({ spec: { decision: 'Approve', apply: true } }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(p.status, p.body.toString()).to.equal(200);
    await kubectlOk(fx, ['wait', 'cs/ro', '--for=jsonpath={.status.phase}=Applied', '--timeout=60s']);
    expect((await exec(fx, 'spx', ['cat', '/work/ro.txt'])).stdout).to.equal('ro\n');
    expect(up.seen.length, 'apply replays files only').to.equal(before);
  });

  it('none: the copy has no network at all (connect fails), the upstream sees nothing and sideEffects says so', async () => {
    const cs = await apiSpeculate(
      fx,
      'spx',
      'nonet',
      `curl -sS --max-time 5 ${url}/read-nonet; echo "curl exit $?"; env | grep -ci proxy; echo x > /work/nonet.txt`,
      { egress: 'none' },
    );
    expect(cs.status.phase, JSON.stringify(cs.status)).to.equal('Pending');
    // No proxy variables, no route: curl cannot even resolve or connect.
    expect(cs.status.stdout).to.match(/curl exit (6|7)\n0\n$/);
    expect(cs.status.sideEffects).to.deep.include({
      egress: 'none',
      network: 'none',
      measured: true,
      nonReplayable: false,
      contacted: [],
      held: [],
    });
    expect(cs.status.sideEffects.notes).to.deep.equal(['no network in the copy (egress none): nothing could go out']);
    expect(seen('nonet')).to.deep.equal([]);
  });

  it('sandbox: the POST really goes out, is listed as contacted, and nonReplayable is true', async () => {
    const cs = await apiSpeculate(fx, 'spx', 'live', readThenWrite('live'), { egress: 'sandbox' });
    expect(cs.status.stdout).to.equal('get 200\npost 200\n');
    const se = cs.status.sideEffects;
    expect(se).to.deep.include({
      egress: 'sandbox',
      network: 'allowList',
      measured: true,
      nonReplayable: true,
      held: [],
    });
    expect(se.contacted.map((e: any) => `${e.decision} ${e.method} ${e.path} ${e.status} ${e.bytesOut}`)).to.deep.equal(
      ['allow GET /read-live 200 0', 'allow POST /write-live 200 12'],
    );
    expect(seen('live')).to.deep.equal(['GET /read-live', 'POST /write-live']);
    expect(up.seen.find((s) => s.url === '/write-live')?.body).to.equal('hello-body!!');
    // kubectl get -o wide shows the mode and whether anything non-replayable went out.
    const wide = await kubectlOk(fx, ['get', 'cs', 'live', 'ro', '-o', 'wide']);
    expect(wide).to.match(/EGRESS\s+NONREPLAYABLE/);
    expect(wide).to.match(/\nlive\s.*\ssandbox\s+true\s/);
    expect(wide).to.match(/\nro\s.*\sreadOnly\s+false\s/);
  });

  it('a dry-run gets the same report (readOnly by default: the POST held, never sent)', async () => {
    const r = await api(fx, 'POST', subPath('default', 'spx', 'dryrun'), {
      body: { command: ['sh', '-c', readThenWrite('dry')] },
    });
    expect(r.status, r.body.toString()).to.equal(200);
    expect(r.json.stdout).to.equal('get 200\npost 403\n');
    expect(r.json.sideEffects).to.deep.include({
      egress: 'readOnly',
      network: 'allowList',
      measured: true,
      nonReplayable: false,
    });
    expect(r.json.sideEffects.held.map((e: any) => `${e.method} ${e.path} ${e.bytesOut}`)).to.deep.equal([
      'POST /write-dry 12',
    ]);
    expect(seen('dry')).to.deep.equal(['GET /read-dry']);
    const cli = await fluxctlInProcess(fx, [
      'sandbox',
      'dry-run',
      'spx',
      '--egress',
      'readOnly',
      '--',
      'sh',
      '-c',
      readThenWrite('drycli'),
    ]);
    expect(cli.code, cli.stderr).to.equal(0);
    expect(cli.stdout).to.include('side effects: egress readOnly (network allowList)');
    expect(cli.stdout).to.match(
      /held \(1, answered 403 and never sent\):\n  hold  POST http:\/\/api\.test:\d+\/write-drycli -> 403/,
    );
    expect(seen('drycli')).to.deep.equal(['GET /read-drycli']);
    const bad = await api(fx, 'POST', subPath('default', 'spx', 'dryrun'), {
      body: { command: ['true'], egress: 'everything' },
    });
    expect(bad.status).to.equal(400);
    expect(bad.json.message).to.match(/egress: must be one of none, readOnly, sandbox/);
  });

  it('spec.egress: an unknown mode is a 422 naming the field; it is immutable after create; nothing changes', async () => {
    const bad = await fx.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'badmode' },
        spec: { sandboxRef: { name: 'spx' }, command: ['true'], egress: 'open' },
      }),
    });
    expect(bad.code).to.not.equal(0);
    expect(bad.stderr).to.match(/spec\.egress: Unsupported value: "open"/);
    expect((await fx.kubectl(['get', 'cs', 'badmode'])).code).to.not.equal(0);
    for (const [patch, msg] of [
      [{ spec: { egress: 'sandbox' } }, /egress is immutable/],
      [{ spec: { egress: null } }, /egress cannot be added or removed after creation/],
    ] as const) {
      const r = await fx.kubectl(['patch', 'cs', 'nonet', '--type=merge', '-p', JSON.stringify(patch)]);
      expect(r.code, JSON.stringify(patch)).to.not.equal(0);
      expect(r.stderr).to.match(msg);
    }
    const add = await fx.kubectl([
      'patch',
      'cs',
      'live',
      '--type=merge',
      '-p',
      JSON.stringify({ spec: { egress: 'none' } }),
    ]);
    expect(add.stderr).to.match(/egress is immutable/);
    expect((await kubectlOk(fx, ['get', 'cs', 'nonet', '-o', 'jsonpath={.spec.egress}'])).trim()).to.equal('none');
  });

  it('an open sandbox: none by default; readOnly fails the changeset (the proxy cannot hold what does not pass it); sandbox is open and not measured', async () => {
    await makeSandbox(fx, 'opn', { network: { mode: 'open' } });
    const def = await apiSpeculate(fx, 'opn', 'opn-def', `curl -sS --max-time 3 ${url}/x; echo "exit $?"`);
    expect(def.status.sideEffects).to.deep.include({
      egress: 'none',
      network: 'none',
      measured: true,
      nonReplayable: false,
    });
    expect(def.status.stdout).to.match(/exit (6|7)\n$/);
    const ro = await apiSpeculate(fx, 'opn', 'opn-ro', 'true', { egress: 'readOnly' });
    expect(ro.status.phase).to.equal('Failed');
    expect(ro.status.message).to.match(/readOnly needs a sandbox with network.mode allowList/);
    expect(ro.status.exitCode, 'nothing ran').to.equal(undefined);
    const live = await apiSpeculate(fx, 'opn', 'opn-live', 'true', { egress: 'sandbox' });
    expect(live.status.sideEffects).to.deep.include({
      egress: 'sandbox',
      network: 'open',
      measured: false,
      nonReplayable: true,
    });
  });

  // A vm sandbox with an allow-list: test/e2e/vm-sandbox.test.ts (its serve has the VM
  // template already; a readOnly Changeset there holds a POST and lists the GET).
});
