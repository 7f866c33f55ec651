// The deployments other than embedded, end to end with real processes:
// - split: `fluxctl serve --no-controllers --node-agent` (API + subresources), `fluxctl
//   node-agent` (procbox), and two `fluxctl controller --leader-elect` against the API server's
//   kubeconfig: a Sandbox applied with kubectl becomes Ready on the agent's node, `fluxctl
//   sandbox exec` reaches it, only one controller leads, and killing it hands over the Lease.
// - aggregated: `fluxctl serve --aggregated` with openssl-made certificates: X-Remote-User /
//   X-Remote-Group are trusted only from a front-proxy certificate with an allowed CN.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { RemoteRuntime } from '../../native/agent/client.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { spawnFluxctl, type Proc } from './procs.js';
import { eventually, kubectlOk, openGate, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';

describe('e2e: split deployment (API server, node agent, leader-elected controllers)', function () {
  this.timeout(180_000);
  let tmp: string;
  let tokenFile: string;
  let agent: Proc;
  let fx: Fluxctl;
  let agentUrl: string;
  const ctrls: Record<string, Proc> = {};
  /** Controllers that exited because they lost the Lease (exit code 3, checked in the test). */
  const lostLease = new Set<string>();

  const controller = (id: string) =>
    spawnFluxctl(
      [
        'controller',
        '--kubeconfig',
        fx.kubeconfig,
        '--leader-elect',
        '--leader-election-identity',
        id,
        // Shorter than the defaults (15 s, 10 s, 2 s) for a quicker hand-over, but long enough that
        // a leader on a machine at load 15 (three suites at once; a new leader's first reconciles
        // and the API server both starved) does not miss its renew deadline in the middle of a
        // test: a 3 s deadline was missed there, 14 s after the term began.
        '--leader-elect-lease-duration',
        '12s',
        '--leader-elect-renew-deadline',
        '10s',
        '--leader-elect-retry-period',
        '1s',
        '--node-agent',
        agentUrl,
        '--token-file',
        tokenFile,
        '--state-dir',
        path.join(tmp, id),
      ],
      /fluxvm controller \S+ against/,
    );

  const holder = async () =>
    (
      await fx.kubectl([
        'get',
        'lease',
        '-n',
        'fluxvm-system',
        'fluxvm-controller',
        '-o',
        'jsonpath={.spec.holderIdentity}',
      ])
    ).stdout.trim();

  before(async function () {
    skipWith(this, sandboxSkipReason());
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-modes-'));
    tokenFile = path.join(tmp, 'token');
    fs.writeFileSync(tokenFile, `agent-token-${process.pid}-${Date.now()}\n`, { mode: 0o600 });
    agent = await spawnFluxctl(
      [
        'node-agent',
        '--node-name',
        'node-a',
        '--listen',
        '127.0.0.1:0',
        '--token-file',
        tokenFile,
        '--state-dir',
        path.join(tmp, 'agent'),
        '--warm-pool',
        '0',
        '--no-vm',
      ],
      /listening on (http:\/\/\S+)/,
    );
    agentUrl = agent.matched[1]!;
    fx = await startFluxctl({
      args: ['--no-controllers', '--node-agent', agentUrl, '--node-agent-token-file', tokenFile, '--quiet'],
    });
    await kubectlOk(fx, ['create', 'namespace', 'fluxvm-system']);
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      // The survivor stops gracefully (releasing the Lease); the killed one is already gone.
      for (const [id, c] of Object.entries(ctrls)) {
        const killed = c.child.signalCode === 'SIGKILL';
        const code = await c.stop();
        if (!killed && !lostLease.has(id)) expect(code).to.equal(0, c.logs());
      }
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    if (agent) expect(await agent.stop()).to.equal(0, agent.logs());
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('the API server alone reconciles nothing; of two controllers exactly one leads and reconciles', async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('early'));
    // A fixed wait on purpose: a window in which no controller may write (there is none to wait for).
    await new Promise((r) => setTimeout(r, 1500));
    // Only what the registry sets at create (Reconciling=True, reason Created): no controller wrote.
    const early = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'early', '-o', 'json'])).status ?? {};
    expect(Object.keys(early)).to.deep.equal(['conditions']);
    expect(early.conditions.map((c: any) => `${c.type}=${c.status}/${c.reason}`)).to.deep.equal([
      'Reconciling=True/Created',
    ]);
    ctrls.a = await controller('ctrl-a');
    ctrls.b = await controller('ctrl-b');
    const h = await eventually(async () => (await holder()) || undefined, 20_000, 'a lease holder');
    expect(['ctrl-a', 'ctrl-b']).to.include(h);
    const leader = h === 'ctrl-a' ? ctrls.a! : ctrls.b!;
    const standby = h === 'ctrl-a' ? ctrls.b! : ctrls.a!;
    await eventually(async () => leader.logs().includes('became leader'), 10_000, 'the leader log');
    expect(standby.logs()).to.not.contain('became leader');
    await kubectlOk(fx, ['wait', 'sbx/early', '--for=condition=Ready', '--timeout=60s']);
    expect(standby.logs()).to.not.contain('controller started');
    expect(leader.logs()).to.contain('controller started');
  });

  it('a Sandbox applied with kubectl becomes Ready on the agent; fluxctl sandbox exec reaches it', async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('demo'));
    await kubectlOk(fx, ['wait', 'sbx/demo', '--for=condition=Ready', '--timeout=60s']);
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'demo', '-o', 'json']));
    expect(sbx.status).to.include({ phase: 'Running', nodeName: 'node-a' });
    // The instance lives in the node agent's runtime.
    const rt = new RemoteRuntime({ url: agentUrl, token: fs.readFileSync(tokenFile, 'utf8').trim() });
    await rt.start();
    try {
      const ids = (await rt.list()).map((s) => s.id);
      expect(ids.some((id) => id.includes(sbx.metadata.uid))).to.equal(true, ids.join(','));
    } finally {
      await rt.close();
    }
    const r = await fx.fluxctl(['sandbox', 'exec', 'demo', '--', 'sh', '-c', 'tr a-z A-Z; echo err >&2; exit 4'], {
      input: 'via the agent\n',
    });
    expect(r.stdout, JSON.stringify(r)).to.equal('VIA THE AGENT\n');
    expect(r.stderr).to.contain('err');
    expect(r.code).to.equal(4);
    const put = await fx.fluxctl(['sandbox', 'exec', 'demo', '--', 'sh', '-c', 'echo kept > /work/f; cat /work/f']);
    expect(put.stdout).to.equal('kept\n');
  });

  it("a speculation's output reaches status.progress while it runs (the controller's own process, the node agent's streaming exec)", async () => {
    const body = {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Changeset',
      metadata: { name: 'split-prog' },
      spec: {
        sandboxRef: { name: 'demo' },
        command: [
          'sh',
          '-c',
          'echo split-first; while [ ! -e /work/.gate-split ]; do sleep 0.2; done; echo split-second',
        ],
      },
    };
    expect(
      (await fx.request('POST', '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets', { body })).status,
    ).to.equal(201);
    const running = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'split-prog', '-o', 'json']));
        return o.status?.progress?.outputTail?.includes('split-first') ? o : undefined;
      },
      60_000,
      'the first line in status.progress',
    );
    expect(running.status.phase).to.equal('Running');
    openGate('.gate-split');
    const done = await eventually(
      async () => {
        const o = JSON.parse(await kubectlOk(fx, ['get', 'cs', 'split-prog', '-o', 'json']));
        return o.status?.phase === 'Pending' ? o : undefined;
      },
      60_000,
      'the speculation to end',
    );
    expect(done.status.progress).to.deep.include({ outputTail: ['split-first', 'split-second'], outputLines: 2 });
    expect(done.status.stdout).to.equal('split-first\nsplit-second\n');
  });

  it('killing the leader hands the Lease to the other controller, which reconciles', async () => {
    const h = await holder();
    const leader = h === 'ctrl-a' ? ctrls.a! : ctrls.b!;
    const other = h === 'ctrl-a' ? 'ctrl-b' : 'ctrl-a';
    await leader.stop('SIGKILL');
    await eventually(async () => (await holder()) === other, 45_000, `${other} to take the Lease`);
    await eventually(
      async () => ctrls[other === 'ctrl-a' ? 'a' : 'b']!.logs().includes('became leader'),
      10_000,
      'the new leader log',
    );
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('after'));
    await kubectlOk(fx, ['wait', 'sbx/after', '--for=condition=Ready', '--timeout=60s']);
    const r = await fx.fluxctl(['sandbox', 'exec', 'after', '--', 'echo', 'new leader']);
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('new leader\n');
  });

  it('a leader stopped (kill -STOP) past its lease is replaced, and on SIGCONT exits at once without acting', async () => {
    const h = await holder();
    const key = h === 'ctrl-a' ? 'a' : 'b';
    const frozen = ctrls[key]!;
    let woke = '';
    ctrls.c = await controller('ctrl-c');
    frozen.child.kill('SIGSTOP');
    try {
      await eventually(
        async () => (await holder()) === 'ctrl-c',
        45_000,
        'ctrl-c to take the Lease from the stopped leader',
      );
      // Work for the new leader while the old one is frozen: only ctrl-c may act on it.
      await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('while-frozen'));
      await kubectlOk(fx, ['wait', 'sbx/while-frozen', '--for=condition=Ready', '--timeout=60s']);
    } finally {
      woke = new Date().toISOString().replace(/Z$/, '000Z');
      frozen.child.kill('SIGCONT');
    }
    lostLease.add(key);
    const code = await Promise.race([
      frozen.exited,
      new Promise<string>((r) => setTimeout(() => r('still running'), 10_000)),
    ]);
    expect(code).to.equal(3, frozen.logs());
    expect(frozen.logs()).to.contain('lost the leader election Lease; exiting');
    const log = frozen.logs();
    const tail = log.slice(log.lastIndexOf('lost leadership'));
    // Nothing reconciled after the loss: the exit is the next thing the process does.
    expect(tail).to.not.match(/"msg":"reconcile|Started|Running/);
    expect(await holder()).to.equal('ctrl-c');
    // The API server's audit log (the user agent names the candidate): the frozen leader wrote
    // before it was stopped, and nothing at all once it woke (the fence refuses a controller's
    // write and the elector's renew alike when the renew deadline has passed by its clock).
    const writes = fs
      .readFileSync(path.join(fx.stateDir, 'audit.log'), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l))
      .filter((e) => e.userAgent === `fluxvm-controller/${h}` && !['get', 'list', 'watch'].includes(e.verb));
    expect(writes.length).to.be.greaterThan(0, 'the audit log names the leader by its user agent');
    const late = writes.filter((e) => e.requestReceivedTimestamp >= woke);
    const lateWrites = late.map((e) => `${e.verb} ${e.requestURI} ${e.responseStatus.code}`);
    expect(lateWrites, `writes after the wake: ${JSON.stringify(lateWrites)}`).to.deep.equal([]);
  });
});

function openssl(args: string[], cwd: string) {
  execFileSync('openssl', args, { cwd, stdio: 'pipe' });
}

/** A CA (ca.pem/ca.key) and leaf certificates it signs, made with the openssl CLI. */
function makeCA(dir: string, name: string) {
  openssl(
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '1',
      '-subj',
      `/CN=${name}`,
      '-keyout',
      `${name}.key`,
      '-out',
      `${name}.pem`,
    ],
    dir,
  );
  return (leaf: string, subj: string, ext?: string) => {
    openssl(
      ['req', '-newkey', 'rsa:2048', '-nodes', '-subj', subj, '-keyout', `${leaf}.key`, '-out', `${leaf}.csr`],
      dir,
    );
    const extArgs = ext ? ['-extfile', path.join(dir, `${leaf}.ext`)] : [];
    if (ext) fs.writeFileSync(path.join(dir, `${leaf}.ext`), ext);
    openssl(
      [
        'x509',
        '-req',
        '-in',
        `${leaf}.csr`,
        '-CA',
        `${name}.pem`,
        '-CAkey',
        `${name}.key`,
        '-CAcreateserial',
        '-days',
        '1',
        '-out',
        `${leaf}.pem`,
        ...extArgs,
      ],
      dir,
    );
  };
}

describe('e2e: aggregated mode (fluxctl serve --aggregated)', function () {
  this.timeout(60_000);
  let dir: string;
  let srv: Proc;
  let url: string;
  const file = (n: string) => fs.readFileSync(path.join(dir, n));

  before(async function () {
    try {
      execFileSync('openssl', ['version'], { stdio: 'pipe' });
    } catch {
      skipWith(this, 'no openssl');
    }
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-agg-'));
    makeCA(dir, 'serving-ca')(
      'serving',
      '/CN=fluxvm-api.fluxvm-system.svc',
      'subjectAltName=IP:127.0.0.1,DNS:localhost\n',
    );
    const proxy = makeCA(dir, 'front-proxy-ca');
    proxy('front-proxy-client', '/CN=front-proxy-client');
    proxy('not-the-proxy', '/CN=someone-else');
    makeCA(dir, 'other-ca')('forged-proxy', '/CN=front-proxy-client');
    srv = await spawnFluxctl(
      [
        'serve',
        '--aggregated',
        '--no-controllers',
        '--quiet',
        '--state-dir',
        path.join(dir, 'state'),
        '--listen',
        '127.0.0.1:0',
        '--tls-cert',
        path.join(dir, 'serving.pem'),
        '--tls-key',
        path.join(dir, 'serving.key'),
        '--requestheader-client-ca-file',
        path.join(dir, 'front-proxy-ca.pem'),
        '--requestheader-allowed-names',
        'front-proxy-client',
      ],
      /listening on (https:\/\/\S+)/,
    );
    url = srv.matched[1]!;
  });
  after(async () => {
    if (srv) expect(await srv.stop()).to.equal(0, srv.logs());
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  function get(
    p: string,
    o: { cert?: string; headers?: Record<string, string | string[]> } = {},
  ): Promise<{ status: number; body: any }> {
    return new Promise((resolve, reject) => {
      const req = https.request(
        new URL(p, url),
        {
          ca: file('serving-ca.pem'),
          ...(o.cert ? { cert: file(`${o.cert}.pem`), key: file(`${o.cert}.key`) } : {}),
          headers: { accept: 'application/json', ...(o.headers ?? {}) },
        },
        (res) => {
          let text = '';
          res.on('data', (d) => (text += d));
          res.on('end', () => {
            let body: any = text;
            try {
              body = JSON.parse(text);
            } catch {
              // plain text (health)
            }
            resolve({ status: res.statusCode ?? 0, body });
          });
        },
      );
      req.on('error', reject);
      req.end();
    });
  }

  const list = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';

  it('serves HTTPS with the given certificate; health needs no credentials', async () => {
    const r = await get('/readyz');
    expect(r.status).to.equal(200);
  });

  it('trusts X-Remote-User / X-Remote-Group from a front-proxy certificate', async () => {
    const admin = await get(list, {
      cert: 'front-proxy-client',
      headers: { 'X-Remote-User': 'alice', 'X-Remote-Group': ['system:masters', 'system:authenticated'] },
    });
    expect(admin.status, JSON.stringify(admin.body)).to.equal(200);
    expect(admin.body.kind).to.equal('SandboxList');
    // Not a master: the denial names the user the headers asserted.
    const bob = await get(list, {
      cert: 'front-proxy-client',
      headers: { 'X-Remote-User': 'bob', 'X-Remote-Group': 'devs' },
    });
    expect(bob.status).to.equal(403);
    expect(bob.body.message).to.contain(
      'User "bob" cannot list resource "sandboxes" in API group "fluxvm.dev" in the namespace "default"',
    );
  });

  it('ignores the headers without the certificate, with a CN not allowed, or from another CA', async () => {
    const headers = { 'X-Remote-User': 'alice', 'X-Remote-Group': 'system:masters' };
    for (const cert of [undefined, 'not-the-proxy', 'forged-proxy']) {
      const r = await get(list, { cert, headers });
      expect(r.status, String(cert)).to.equal(403);
      expect(r.body.message, String(cert)).to.contain('User "system:anonymous" cannot list resource "sandboxes"');
    }
  });
});
