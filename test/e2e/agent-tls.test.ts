// Agent TLS with real processes (docs/scale-out.md, "Agent TLS"): `fluxctl serve --no-controllers
// --route-by-node` (the API server) presents the client certificate the signer published and pins
// the agents to the cluster CA; `fluxctl controller --node-ca-secret` makes the CA Secret on its
// first start and signs; `fluxctl node-agent --tls-bootstrap --client-ca-file` with only the
// fluxvm-node-agent role makes its key, posts its request on its Node and serves exec over https
// once signed, taking calls with a client certificate of the CA only (mTLS, no bearer token).
// Also: a client pinned to the CA refuses a self-signed agent and another node's certificate; the
// signer refuses a request for another node's name or address naming the field; the CA key is in
// nothing the agent can read.
import { expect } from 'chai';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { makeServingRequest } from '../../controllers/node/certs.js';
import { RemoteRuntime } from '../../native/agent/client.js';
import { createAgentServer, type AgentServer } from '../../native/agent/server.js';
import type { Runtime } from '../../native/runtime.js';
import { placeholderCert } from '../../cmd/fluxctl/nodeagent-tls.js';
import { httpUpstream, testDns, type TestDns, type Upstream } from '../native/egress/fakenet.js';
import { agentTokenAuthFile, bindNodeAgent } from './agent-identity.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { spawnFluxctl, type Proc } from './procs.js';
import { exec, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';

const NODE = 'node-t';
const NS = 'fluxvm-system';

/** A Secret's data, decoded. */
async function secretData(fx: Fluxctl, name: string): Promise<Record<string, string> | undefined> {
  const r = await fx.kubectl(['get', 'secret', '-n', NS, name, '-o', 'json']);
  if (r.code !== 0) return undefined;
  const d = (JSON.parse(r.stdout) as { data?: Record<string, string> }).data ?? {};
  return Object.fromEntries(Object.entries(d).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]));
}

interface Cond {
  type: string;
  status: string;
  reason?: string;
  message?: string;
}

async function nodeJson(fx: Fluxctl, name: string, kubeconfig?: string): Promise<any> {
  const r = await fx.kubectl([...(kubeconfig ? ['--kubeconfig', kubeconfig] : []), 'get', 'fnode', name, '-o', 'json']);
  return r.code === 0 ? JSON.parse(r.stdout) : undefined;
}

describe('e2e: agent TLS: certificates from the signer, mTLS, pinned clients (split API server)', function () {
  this.timeout(300_000);
  let tmp: string;
  let fx: Fluxctl;
  let controller: Proc | undefined;
  let agent: Proc | undefined;
  let agentKubeconfig: string;
  let agentUrl: string;
  /** What the kubelet would mount: the signer's published Secrets. */
  let caFile: string;
  let clientCertFile: string;
  let clientKeyFile: string;
  /** The agent's egress "internet": a DNS server and an HTTP upstream on 127.0.0.2 (fakenet.ts). */
  let dns: TestDns;
  let up: Upstream;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    up = await httpUpstream('127.0.0.2');
    dns = await testDns('127.0.0.1', { 'inside.test': ['127.0.0.2'], 'outside.test': ['127.0.0.2'] });
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-agent-tls-'));
    caFile = path.join(tmp, 'mounted', 'ca.crt');
    clientCertFile = path.join(tmp, 'mounted', 'tls.crt');
    clientKeyFile = path.join(tmp, 'mounted', 'tls.key');
    const { apiToken, authFile } = agentTokenAuthFile(tmp);
    // mTLS only: no bearer token on the agent link. The CA and client files appear once the signer published them.
    fx = await startFluxctl({
      args: ['--no-controllers', '--route-by-node', '--node-agent-ca-file', caFile]
        .concat(['--node-agent-client-cert', clientCertFile, '--node-agent-client-key', clientKeyFile])
        .concat(['--token-auth-file', authFile, '--quiet']),
      readyTimeoutMs: 120_000,
    });
    agentKubeconfig = await bindNodeAgent(fx, tmp, apiToken);
    // The signer: makes the CA Secret on its first start (none exists) and publishes the public parts.
    expect(await secretData(fx, 'fluxvm-node-ca')).to.equal(undefined);
    controller = await spawnFluxctl(
      [
        'controller',
        '--kubeconfig',
        fx.kubeconfig,
        '--route-by-node',
        '--node-ca-secret',
        `${NS}/fluxvm-node-ca`,
      ].concat(['--state-dir', path.join(tmp, 'controller'), '--log-level', 'error']),
      /fluxvm controller /,
      120_000,
    );
    let client: Record<string, string> | undefined;
    let pub: Record<string, string> | undefined;
    await eventually(
      async () =>
        !!(client = await secretData(fx, 'fluxvm-node-agent-client')) &&
        !!(pub = await secretData(fx, 'fluxvm-node-ca-cert')),
      60_000,
      'the signer published the CA certificate and the API server client Secret',
    );
    fs.mkdirSync(path.dirname(caFile), { recursive: true });
    fs.writeFileSync(caFile, pub!['ca.crt']!);
    fs.writeFileSync(clientCertFile, client!['tls.crt']!);
    fs.writeFileSync(clientKeyFile, client!['tls.key']!, { mode: 0o600 });
    agent = await spawnFluxctl(
      ['node-agent', '--node-name', NODE, '--listen', '127.0.0.1:0', '--tls-bootstrap', '--client-ca-file', caFile]
        .concat(['--state-dir', path.join(tmp, 'agent'), '--kubeconfig', agentKubeconfig])
        .concat(['--warm-pool', '0', '--no-vm'])
        // The node's egress ceiling (the install's egress-allow node setting): inside.test only.
        .concat(['--egress-allow', `inside.test:${up.port}`, '--egress-allow-cidr', '127.0.0.2/32'])
        .concat(['--egress-resolver', dns.server]),
      /listening on (https:\/\/\S+)\nregistered as (https:\/\/\S+)[\s\S]*serving certificate issued/,
      120_000,
    );
    agentUrl = agent.matched[2]!;
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'fnode', '--all']);
    }
    if (agent) expect(await agent.stop()).to.equal(0, agent.logs());
    if (controller) await controller.stop();
    if (fx) expect(await fx.stop()).to.equal(0, fx.logs());
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
    await up?.close();
    await dns?.close();
  });

  it('the agent bootstraps its certificate through the API server and the signer, and serves exec over https (mTLS)', async () => {
    const n = await nodeJson(fx, NODE);
    const cond = (n.status.conditions as Cond[]).find((c) => c.type === 'ServingCertificate');
    expect(cond, JSON.stringify(n.status.conditions)).to.include({ status: 'True', reason: 'Issued' });
    const cert = new (await import('node:crypto')).X509Certificate(n.status.servingCertificate.certificate);
    expect(cert.subject).to.equal(`CN=system:fluxvm-node:${NODE}\nO=fluxvm:nodes`);
    expect(cert.subjectAltName).to.equal(`DNS:${NODE}, IP Address:127.0.0.1`);
    expect(cert.verify(new (await import('node:crypto')).X509Certificate(fs.readFileSync(caFile)).publicKey)).to.equal(
      true,
    );
    expect(agentUrl).to.match(/^https:\/\/127\.0\.0\.1:\d+$/);
    // The agent's key stays on its node, 0600.
    expect(fs.statSync(path.join(tmp, 'agent', 'pki', 'agent.key')).mode & 0o777).to.equal(0o600);
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('tls', { runtime: 'procbox', nodeName: NODE }));
    const w = await fx.kubectl(['wait', 'sbx/tls', '--for=condition=Ready', '--timeout=90s'], { timeoutMs: 100_000 });
    expect(w.code, `${w.stderr}\nagent:\n${agent!.logs().slice(-4000)}`).to.equal(0);
    // Through the API server, which reaches the agent over mTLS pinned to the CA and the node.
    const r = await exec(fx, 'tls', 'echo over-tls');
    expect(r.exitCode, JSON.stringify(r)).to.equal(0);
    expect(r.stdout).to.equal('over-tls\n');
  });

  it("the agent's egress ceiling filters: a sandbox on it reaches a host inside the ceiling, not one outside", async function () {
    if (process.getuid?.() !== 0) return skipWith(this, 'not root: the node agent starts no egress proxy');
    // The sandbox asks for both hosts; the node's ceiling (--egress-allow) allows one.
    const allow = [`inside.test:${up.port}`, `outside.test:${up.port}`];
    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('egress', { runtime: 'procbox', nodeName: NODE, network: { mode: 'allowList', allow } }),
    );
    const w = await fx.kubectl(['wait', 'sbx/egress', '--for=condition=Ready', '--timeout=90s'], {
      timeoutMs: 100_000,
    });
    expect(w.code, `${w.stderr}\nagent:\n${agent!.logs().slice(-4000)}`).to.equal(0);
    up.seen.length = 0;
    const curl = (host: string) => `curl -sS -o /dev/null -w '%{http_code}\\n' http://${host}:${up.port}/x`;
    const r = await exec(fx, 'egress', ['sh', '-c', `${curl('inside.test')}; ${curl('outside.test')}`]);
    expect(r.stdout, JSON.stringify(r)).to.equal('200\n403\n');
    // What arrived upstream: the request to the host inside the ceiling only.
    expect(up.seen.map((x) => x.headers.host)).to.deep.equal([`inside.test:${up.port}`]);
  });

  it('the agent takes no call without a client certificate of the CA (a token, no certificate, another CA: 401)', async () => {
    const ca = fs.readFileSync(caFile);
    const call = (extra: https.RequestOptions) =>
      new Promise<number>((resolve, reject) => {
        const req = https.request(
          new URL('/v1/info', agentUrl),
          { ca, headers: { authorization: 'Bearer anything' }, ...extra },
          (res) => (res.resume(), resolve(res.statusCode!)),
        );
        req.on('error', reject);
        req.end();
      });
    expect(await call({}), 'no client certificate').to.equal(401);
    const other = await placeholderCert(); // a certificate of no CA the agent trusts
    expect(await call({ cert: other.cert, key: other.key }), 'another CA').to.equal(401);
    expect(
      await call({ cert: fs.readFileSync(clientCertFile), key: fs.readFileSync(clientKeyFile) }),
      'the published client certificate',
    ).to.equal(200);
  });

  it("a client pinned to the CA refuses a self-signed agent and an agent with another node's certificate", async () => {
    const clientCert = { cert: fs.readFileSync(clientCertFile), key: fs.readFileSync(clientKeyFile) };
    const ca = fs.readFileSync(caFile);
    const refused = async (url: string, node: string) => {
      const rt = new RemoteRuntime({ url, ca, clientCert, node, callTimeoutMs: 10_000 });
      try {
        return await rt.start().then(
          () => undefined,
          (e: unknown) => (e as Error).message,
        );
      } finally {
        await rt.close();
      }
    };
    // The real agent, for the node it is: accepted.
    expect(await refused(agentUrl, NODE)).to.equal(undefined);
    // The same valid certificate, when another node's agent was meant: refused.
    expect(await refused(agentUrl, 'node-other')).to.match(/not node "node-other"'s/);
    // A self-signed agent (what an impostor can make): refused by the chain.
    const self = await placeholderCert();
    const srv: AgentServer = createAgentServer({
      runtime: { capabilities: () => ({ backend: 'procbox' }) } as unknown as Runtime,
      token: 'x',
      tls: self,
      nodeName: NODE,
    });
    const { url } = await srv.listen('127.0.0.1', 0);
    try {
      expect(await refused(url, NODE)).to.match(/self.signed|unable to verify|certificate/i);
    } finally {
      await srv.close();
    }
  });

  it("the signer refuses a request for another node's name or address, naming the field", async () => {
    const post = async (node: string, agentURL: string, req: { request: string }) => {
      // Written as an admin: the signer judges the request, whoever wrote it.
      await kubectlOk(
        fx,
        ['apply', '-f', '-'],
        JSON.stringify({ apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Node', metadata: { name: node }, spec: {} }),
      );
      await kubectlOk(fx, [
        'patch',
        'fnode',
        node,
        '--subresource=status',
        '--type=merge',
        '-p',
        JSON.stringify({
          status: {
            addresses: [{ type: 'AgentURL', address: agentURL }],
            servingCertificate: { request: req.request },
          },
        }),
      ]);
      let denied: Cond | undefined;
      await eventually(
        async () =>
          !!(denied = ((await nodeJson(fx, node))?.status?.conditions as Cond[] | undefined)?.find(
            (c) => c.type === 'ServingCertificate',
          )),
        60_000,
        `the signer answered ${node}'s request`,
      );
      const n = await nodeJson(fx, node);
      expect(n.status.servingCertificate.certificate, 'nothing signed').to.equal(undefined);
      return denied!;
    };
    // Another node's name: a request for node-t's name posted on node-x.
    const name = await post('node-x', 'https://127.0.0.1:1', await makeServingRequest(NODE, '127.0.0.1'));
    expect(name).to.include({ status: 'False', reason: 'Denied' });
    expect(name.message).to.include('status.servingCertificate.request').and.include(`system:fluxvm-node:${NODE}`);
    // Another address: node-y's own name, an IP its AgentURL does not name.
    const addr = await post('node-y', 'https://127.0.0.2:1', await makeServingRequest('node-y', '10.9.9.9'));
    expect(addr).to.include({ status: 'False', reason: 'Denied' });
    expect(addr.message).to.include('status.servingCertificate.request').and.include('"10.9.9.9"');
  });

  it('the CA key never leaves the signer: in no object the agent can read', async () => {
    const ca = await secretData(fx, 'fluxvm-node-ca');
    const key = ca!['tls.key']!;
    expect(key).to.include('PRIVATE KEY');
    const keyBody = key.split('\n').slice(1, -2).join('');
    // The agent may not read Secrets at all.
    for (const verb of ['get', 'list', 'watch']) {
      const r = await fx.kubectl(['--kubeconfig', agentKubeconfig, 'auth', 'can-i', verb, 'secrets', '-n', NS]);
      expect(r.stdout.trim(), `${verb} secrets`).to.equal('no');
    }
    const denied = await fx.kubectl(['--kubeconfig', agentKubeconfig, 'get', 'secret', '-n', NS, 'fluxvm-node-ca']);
    expect(denied.code).to.not.equal(0);
    expect(denied.stderr).to.match(/forbidden/i);
    // What it can read (its Nodes, sandboxes, checkpoints) holds no private key.
    for (const what of [
      ['fnode', NODE],
      ['sbx', '-A'],
      ['checkpoints', '-A'],
    ]) {
      const r = await fx.kubectl(['--kubeconfig', agentKubeconfig, 'get', ...what, '-o', 'json']);
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stdout).to.not.include('PRIVATE KEY');
      expect(r.stdout.replace(/\\n/g, '')).to.not.include(keyBody);
    }
    // The published Secrets carry the certificate and the API server's own key, never the CA's.
    const pub = await secretData(fx, 'fluxvm-node-ca-cert');
    expect(Object.keys(pub!)).to.deep.equal(['ca.crt']);
    const client = await secretData(fx, 'fluxvm-node-agent-client');
    expect(client!['tls.key']).to.not.equal(key);
    // Nor is it on the agent's disk.
    const files = fs.readdirSync(path.join(tmp, 'agent', 'pki'));
    for (const f of files)
      expect(fs.readFileSync(path.join(tmp, 'agent', 'pki', f), 'utf8').replace(/\n/g, '')).to.not.include(keyBody);
  });
});
