// The node agent on its own identity: `fluxctl serve --no-controllers
// --route-by-node` (the API server, with a static token for the agent's service account), and
// `fluxctl node-agent --kubeconfig` whose kubeconfig holds that token only: an identity bound to
// nothing but the built-in fluxvm-node-agent ClusterRole (the same rules as crds/install/rbac.yaml;
// test/deploy/manifests.test.ts holds them to the agent's code). With it, the agent registers its
// Node, renews its Lease, and drives a Sandbox bound to its node to Ready; exec through the API
// server reaches it; a delete finishes (the agent removes its finalizer). Nothing it did was
// forbidden (the agent logs every refused write). A plain call to the agent (no X-Fluxvm-Node) for
// the instance of a Sandbox bound to another node is refused naming that node.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { RemoteRuntime } from '../../native/agent/client.js';
import { RuntimeError } from '../../native/runtime.js';
import { agentKubeConfig, SERVICEACCOUNT_DIR } from '../../cmd/fluxctl/nodeagent-owner.js';
import { ClientNodeClient } from '../../runtime/client/clientnode.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import { agentTokenAuthFile, bindNodeAgent, SA_USER } from './agent-identity.js';
import { httpRequest, startFluxctl, type Fluxctl } from './harness.js';
import { spawnFluxctl, type Proc } from './procs.js';
import { exec, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

const NODE = 'node-r';

describe('e2e: a node agent with only the fluxvm-node-agent role (split API server)', function () {
  this.timeout(300_000);
  let tmp: string;
  let tokenFile: string;
  let fx: Fluxctl;
  let agent: Proc | undefined;
  /** The URL the agent registered (--advertise-address 127.0.0.1; it listens on 0.0.0.0). */
  let agentUrl: string;
  let listened: string;
  let metricsUrl: string;
  let apiToken: string;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-agent-rbac-'));
    tokenFile = path.join(tmp, 'agent-token');
    fs.writeFileSync(tokenFile, `agent-token-${process.pid}-${Date.now()}\n`, { mode: 0o600 });
    // The agent's API identity: a static token for its service account's user name and groups.
    let authFile: string;
    ({ apiToken, authFile } = agentTokenAuthFile(tmp));
    fx = await startFluxctl({
      args: [
        '--no-controllers',
        '--route-by-node',
        '--node-agent-token-file',
        tokenFile,
        '--token-auth-file',
        authFile,
        '--quiet',
      ],
      readyTimeoutMs: 120_000,
    });
    // What the install makes (crds/install/): the namespaces and the binding of the role.
    const agentKubeconfig = await bindNodeAgent(fx, tmp, apiToken);
    // The identity is what the test means: the agent's user, not an admin.
    const who = await fx.kubectl(['--kubeconfig', agentKubeconfig, 'auth', 'can-i', 'delete', 'sandboxes']);
    expect(who.stdout.trim(), who.stderr).to.equal('no');
    const lease = await fx.kubectl([
      '--kubeconfig',
      agentKubeconfig,
      'auth',
      'can-i',
      'update',
      'leases',
      '-n',
      'fluxvm-system',
    ]);
    expect(lease.stdout.trim(), 'the leader-election Lease is out of its reach').to.equal('no');
    agent = await spawnFluxctl(
      [
        'node-agent',
        '--node-name',
        NODE,
        // Listens on every address; registers the one given (in a pod: status.podIP).
        '--listen',
        '0.0.0.0:0',
        '--advertise-address',
        '127.0.0.1',
        '--metrics-listen',
        '127.0.0.1:0',
        '--egress-allow',
        'example.com',
        '--token-file',
        tokenFile,
        '--state-dir',
        path.join(tmp, 'agent'),
        '--kubeconfig',
        agentKubeconfig,
        '--warm-pool',
        '0',
        '--no-vm',
      ],
      /listening on (http:\/\/\S+)\nregistered as (http:\/\/\S+)\nmetrics on (http:\/\/\S+)\/metrics/,
      60_000,
    );
    listened = agent.matched[1]!;
    agentUrl = agent.matched[2]!;
    metricsUrl = agent.matched[3]!;
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'fnode', NODE, '--ignore-not-found']);
    }
    if (agent) expect(await agent.stop()).to.equal(0, agent.logs());
    if (fx) expect(await fx.stop()).to.equal(0, fx.logs());
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('registers its Node with the advertised address, drives a Sandbox bound to it to Ready, serves exec, finishes its delete; nothing forbidden', async () => {
    expect(new URL(listened).hostname).to.equal('0.0.0.0');
    expect(agentUrl).to.equal(`http://127.0.0.1:${new URL(listened).port}`);
    // The Node registered by the agent (nodes create, nodes/status) with its address.
    await eventually(
      async () => {
        const r = await fx.kubectl(['get', 'fnode', NODE, '-o', 'json']);
        if (r.code !== 0) return false;
        const n = JSON.parse(r.stdout);
        return (n.status?.addresses ?? []).some((a: any) => a.type === 'AgentURL' && a.address === agentUrl);
      },
      30_000,
      `Node ${NODE} registered with AgentURL ${agentUrl}`,
    );
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('mine', { runtime: 'procbox', nodeName: NODE }));
    const w = await fx.kubectl(['wait', 'sbx/mine', '--for=condition=Ready', '--timeout=90s'], { timeoutMs: 100_000 });
    expect(w.code, `${w.stderr}\nagent:\n${agent!.logs().slice(-4000)}`).to.equal(0);
    const sbx = JSON.parse(await kubectlOk(fx, ['get', 'sbx', 'mine', '-o', 'json']));
    expect(sbx.status).to.include({ phase: 'Running', nodeName: NODE });
    expect(sbx.metadata.finalizers ?? [], 'the agent set its finalizer').to.have.length.greaterThan(0);
    const r = await exec(fx, 'mine', 'echo from-$(hostname)');
    expect(r.exitCode).to.equal(0);
    expect(r.stdout).to.match(/^from-/);
    // The delete finishes: the agent destroys the instance and removes its finalizer.
    const d = await fx.kubectl(['delete', 'sbx', 'mine', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    expect(d.code, `${d.stderr}\nagent:\n${agent!.logs().slice(-4000)}`).to.equal(0);
    const rt = new RemoteRuntime({ url: agentUrl, token: fs.readFileSync(tokenFile, 'utf8').trim() });
    try {
      await rt.start();
      expect((await rt.list()).map((i) => i.id)).to.not.include(sbx.metadata.uid);
      // --egress-allow started the egress proxy: allowList sandboxes are supported on this node.
      expect(rt.capabilities('procbox').networkModes).to.include('allowList');
    } finally {
      await rt.close();
    }
    // /metrics: the agent's controller and runtime in one registry.
    const m = await httpRequest(`${metricsUrl}/metrics`, 'GET');
    expect(m.status).to.equal(200);
    const text = m.body.toString();
    expect(text).to.match(/controller_runtime_reconcile_total\{[^}]*controller="sandbox"/);
    expect(text).to.match(/fluxvm_runtime_operation_duration_seconds_count\{[^}]*operation="create"/);
    // Every call the agent made was allowed: a refused one is logged with its 403.
    expect(agent!.logs()).to.not.match(/forbidden|Forbidden|\b403\b/);
  });

  it('a plain call for the instance of a Sandbox bound to another node is refused naming that node (409)', async () => {
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('theirs', { runtime: 'procbox', nodeName: 'node-elsewhere' }),
    );
    const uid = (await kubectlOk(fx, ['get', 'sbx', 'theirs', '-o', 'jsonpath={.metadata.uid}'])).trim();
    const rt = new RemoteRuntime({ url: agentUrl, token: fs.readFileSync(tokenFile, 'utf8').trim() });
    try {
      await rt.start();
      const err = await rt.exec(uid, { argv: ['true'] }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).to.be.instanceOf(RuntimeError);
      expect((err as RuntimeError).code).to.equal('Conflict');
      expect((err as RuntimeError).message).to.include(`bound to node "node-elsewhere"`);
      expect((err as RuntimeError).message).to.include(`node agent of node "${NODE}"`);
      // An instance no Sandbox has stays the runtime's NotFound.
      const nf = await rt.inspect('no-such-instance').then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((nf as RuntimeError).code).to.equal('NotFound');
    } finally {
      await rt.close();
    }
    // Nobody runs it: the finalizer-less Sandbox is deleted at once.
    await kubectlOk(fx, ['delete', 'sbx', 'theirs', '--wait=false']);
  });

  it('in a pod without --kubeconfig: the in-cluster config (service account token and CA, KUBERNETES_SERVICE_HOST/PORT)', async () => {
    // A fake service account mount: the token of the agent's identity and the server's CA.
    const root = path.join(tmp, 'pod-root');
    const dir = `${root}${SERVICEACCOUNT_DIR}`;
    fs.mkdirSync(dir, { recursive: true });
    const admin = yaml.load(fs.readFileSync(fx.kubeconfig, 'utf8')) as {
      clusters: Array<{ cluster: { server: string; 'certificate-authority-data': string } }>;
    };
    const server = new URL(admin.clusters[0]!.cluster.server);
    fs.writeFileSync(
      path.join(dir, 'ca.crt'),
      Buffer.from(admin.clusters[0]!.cluster['certificate-authority-data'], 'base64'),
    );
    fs.writeFileSync(path.join(dir, 'token'), apiToken);
    fs.writeFileSync(path.join(dir, 'namespace'), 'fluxvm-system');
    const env = { KUBERNETES_SERVICE_HOST: server.hostname, KUBERNETES_SERVICE_PORT: server.port };
    // Outside a pod (no KUBERNETES_SERVICE_HOST): none, the agent runs without an API server.
    expect(agentKubeConfig({ inClusterRoot: root, env: {} })).to.equal(undefined);
    const kc = agentKubeConfig({ inClusterRoot: root, env })!;
    expect(kc.getCurrentCluster()!.server).to.equal(`https://${server.hostname}:${server.port}`);
    const client = new ClientNodeClient(kc, { userAgent: 'test' });
    const review = await client.create<KubeObject & { status?: { userInfo?: { username?: string } } }>(
      { group: 'authentication.k8s.io', version: 'v1', resource: 'selfsubjectreviews' },
      undefined,
      { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview', metadata: {} } as KubeObject & {
        status?: { userInfo?: { username?: string } };
      },
    );
    expect(review.status?.userInfo?.username).to.equal(SA_USER);
    const node = await client.get<KubeObject>(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'nodes' },
      undefined,
      NODE,
    );
    expect(node.metadata.name).to.equal(NODE);
    // The token file is read again (the kubelet rotates it): a revoked one is refused.
    fs.writeFileSync(path.join(dir, 'token'), 'not-a-token');
    const kc2 = agentKubeConfig({ inClusterRoot: root, env })!;
    const refused = await new ClientNodeClient(kc2, { userAgent: 'test' })
      .get({ group: 'fluxvm.dev', version: 'v1alpha1', resource: 'nodes' }, undefined, NODE)
      .then(
        () => 'ok',
        (e: { code?: number }) => e.code,
      );
    expect(refused).to.equal(401);
    // No token mounted: a clear error naming the file.
    fs.rmSync(path.join(dir, 'token'));
    expect(() => agentKubeConfig({ inClusterRoot: root, env })).to.throw(/no .*serviceaccount\/token/);
  });

  it('--egress-allow reaches the egress proxy: a ceiling it cannot parse stops the agent with the reason', async () => {
    const bad = await spawnFluxctl(
      [
        'node-agent',
        '--node-name',
        'node-bad',
        '--listen',
        '127.0.0.1:0',
        '--token-file',
        tokenFile,
        '--state-dir',
        path.join(tmp, 'agent-bad'),
        '--egress-allow',
        'http://no spaces/',
        '--warm-pool',
        '0',
        '--no-vm',
      ],
      /listening on/,
      60_000,
    ).then(
      () => undefined,
      (e: Error) => e.message,
    );
    expect(bad).to.match(/exited:[\s\S]*--egress-allow/);
  });
});
