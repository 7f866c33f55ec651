// Routing by node, end to end on one machine: one API server (`fluxctl serve --no-controllers
// --route-by-node`), one `fluxctl controller --route-by-node`, and TWO node agents (node-a,
// node-b: their own ports, state directories and TLS certificates signed by one cluster CA the
// API server and the controller verify them with). Each agent watches the Sandboxes bound to
// its node (--kubeconfig, field selector spec.nodeName) and reconciles them; the controller runs
// the other kinds through the agent of each sandbox's node. The test asserts where things are:
// a sandbox bound to node-a runs in node-a's agent and its files are in node-a's state dir;
// exec and files reach the right node; an agent refuses a request meant for the other node.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { RemoteRuntime } from '../../native/agent/client.js';
import { NODE_HEADER } from '../../native/agent/wire.js';
import { RuntimeError } from '../../native/runtime.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { spawnFluxctl, type Proc } from './procs.js';
import { kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';

function openssl(args: string[], cwd: string) {
  execFileSync('openssl', args, { cwd, stdio: 'pipe' });
}

/** Paths under `dir` whose base name is `name` (a bounded walk; unreadable directories skipped). */
function findNamed(dir: string, name: string, depth = 12): string[] {
  const out: string[] = [];
  const walk = (d: string, left: number) => {
    let ents: fs.Dirent[];
    try {
      ents = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of ents) {
      const p = path.join(d, e.name);
      if (e.name === name) out.push(p);
      if (e.isDirectory() && left > 0) walk(p, left - 1);
    }
  };
  walk(dir, depth);
  return out;
}

describe('e2e: two node agents, routing by Node', function () {
  this.timeout(300_000);
  let tmp: string;
  let tokenFile: string;
  let caFile: string;
  let fx: Fluxctl;
  const agents: Record<string, { proc: Proc; url: string; state: string }> = {};
  let ctrl: Proc | undefined;
  const token = () => fs.readFileSync(tokenFile, 'utf8').trim();
  const uids: Record<string, string> = {};

  const nodeObject = async (name: string, url: string) => {
    const base = '/apis/fluxvm.dev/v1alpha1/nodes';
    const c = await fx.request('POST', base, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Node',
        metadata: { name, labels: { 'test.fluxvm.dev/e2e': 'twonodes' } },
      },
    });
    // 409: the agent registered its Node itself (the node heartbeat, controllers/node/): keep it, set the address.
    expect([201, 409], c.body.toString()).to.include(c.status);
    const s = await fx.request('PATCH', `${base}/${name}/status`, {
      raw: JSON.stringify({ status: { addresses: [{ type: 'AgentURL', address: url }] } }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(s.status, s.body.toString()).to.equal(200);
  };

  before(async function () {
    skipWith(this, sandboxSkipReason());
    try {
      execFileSync('openssl', ['version'], { stdio: 'pipe' });
    } catch {
      skipWith(this, 'no openssl: the node agents serve TLS with certificates the test makes with it');
    }
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-twonodes-'));
    tokenFile = path.join(tmp, 'token');
    fs.writeFileSync(tokenFile, `agent-token-${process.pid}-${Date.now()}\n`, { mode: 0o600 });
    // The cluster CA, and a serving certificate per node agent (SAN 127.0.0.1) signed by it.
    openssl(
      ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1'].concat([
        '-subj',
        '/CN=fluxvm-cluster-ca',
        '-keyout',
        'ca.key',
        '-out',
        'ca.pem',
      ]),
      tmp,
    );
    caFile = path.join(tmp, 'ca.pem');
    for (const n of ['node-a', 'node-b']) {
      openssl(
        ['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${n}`].concat([
          '-keyout',
          `${n}.key`,
          '-out',
          `${n}.csr`,
        ]),
        tmp,
      );
      fs.writeFileSync(path.join(tmp, `${n}.ext`), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
      openssl(
        [
          'x509',
          '-req',
          '-in',
          `${n}.csr`,
          '-CA',
          'ca.pem',
          '-CAkey',
          'ca.key',
          '-CAcreateserial',
          '-days',
          '1',
        ].concat(['-out', `${n}.pem`, '-extfile', `${n}.ext`]),
        tmp,
      );
    }
    fx = await startFluxctl({
      args: [
        '--no-controllers',
        '--route-by-node',
        '--node-agent-token-file',
        tokenFile,
        '--node-agent-ca-file',
        caFile,
        '--quiet',
      ],
      readyTimeoutMs: 120_000,
    });
    for (const n of ['node-a', 'node-b']) {
      const state = path.join(tmp, `state-${n}`);
      const proc = await spawnFluxctl(
        [
          'node-agent',
          '--node-name',
          n,
          '--listen',
          '127.0.0.1:0',
          '--token-file',
          tokenFile,
          '--state-dir',
          state,
          '--tls-cert',
          path.join(tmp, `${n}.pem`),
          '--tls-key',
          path.join(tmp, `${n}.key`),
          '--kubeconfig',
          fx.kubeconfig,
          '--warm-pool',
          '0',
          '--no-vm',
        ],
        /listening on (https:\/\/\S+)/,
        60_000,
      );
      agents[n] = { proc, url: proc.matched[1]!, state };
      await nodeObject(n, proc.matched[1]!);
    }
    ctrl = await spawnFluxctl(
      [
        'controller',
        '--kubeconfig',
        fx.kubeconfig,
        '--route-by-node',
        '--token-file',
        tokenFile,
        '--node-agent-ca-file',
        caFile,
        '--state-dir',
        path.join(tmp, 'controller'),
      ],
      /fluxvm controller \S+ against/,
      60_000,
    );
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      if (ctrl) expect(await ctrl.stop()).to.equal(0, ctrl.logs());
      for (const n of ['node-a', 'node-b']) await fx.kubectl(['delete', 'fnode', n, '--ignore-not-found']);
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    for (const a of Object.values(agents)) expect(await a.proc.stop()).to.equal(0, a.proc.logs());
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('a sandbox bound to node-a runs on node-a, one bound to node-b on node-b', async () => {
    for (const [name, node] of [
      ['on-a', 'node-a'],
      ['on-b', 'node-b'],
    ] as const) {
      await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml(name, { runtime: 'procbox', nodeName: node }));
    }
    for (const name of ['on-a', 'on-b']) {
      const w = await fx.kubectl(['wait', `sbx/${name}`, '--for=condition=Ready', '--timeout=150s'], {
        timeoutMs: 170_000,
      });
      if (w.code !== 0) {
        const st = await fx.kubectl(['get', 'sbx', name, '-o', 'jsonpath={.status}']);
        throw new Error(
          `${name} not Ready: ${w.stderr}\nstatus: ${st.stdout}\ncontroller:\n${ctrl?.logs().slice(-3000)}`,
        );
      }
    }
    for (const [name, node] of [
      ['on-a', 'node-a'],
      ['on-b', 'node-b'],
    ] as const) {
      const o = JSON.parse(await kubectlOk(fx, ['get', 'sbx', name, '-o', 'json']));
      uids[name] = o.metadata.uid;
      // Reconciled by its node's agent (kubelet-style): the status names that node.
      expect(o.status).to.include({ phase: 'Running', nodeName: node });
    }
    const held: Record<string, string[]> = {};
    for (const n of ['node-a', 'node-b']) {
      const rt = new RemoteRuntime({ url: agents[n]!.url, token: token(), ca: fs.readFileSync(caFile), node: n });
      await rt.start();
      try {
        held[n] = (await rt.list()).map((s) => s.id);
      } finally {
        await rt.close();
      }
    }
    expect(held['node-a']).to.include(uids['on-a']).and.not.include(uids['on-b']);
    expect(held['node-b']).to.include(uids['on-b']).and.not.include(uids['on-a']);
  });

  it('exec and files reach the node of the sandbox: its state and what a command writes are on that node only', async () => {
    for (const [name, node] of [
      ['on-a', 'node-a'],
      ['on-b', 'node-b'],
    ] as const) {
      const marker = `written-on-${name}`;
      const r = await fx.fluxctl([
        'sandbox',
        'exec',
        name,
        '--',
        'sh',
        '-c',
        `echo ${node} > /work/${marker}; cat /work/${marker}`,
      ]);
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stdout).to.equal(`${node}\n`);
      const f = await fx.request(
        'GET',
        `/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/${name}/files?path=/work/${marker}`,
      );
      expect(f.status, f.body.toString()).to.equal(200);
      expect(f.body.toString()).to.contain(node);
      const other = node === 'node-a' ? 'node-b' : 'node-a';
      // The instance's state (its procbox record directory, named by the Sandbox's uid) is in
      // this node's state dir, none in the other's.
      expect(findNamed(agents[node]!.state, uids[name]!).length, `${name}'s state under ${node}`).to.be.greaterThan(0);
      expect(findNamed(agents[other]!.state, uids[name]!), `${name}'s state under ${other}`).to.deep.equal([]);
      // The file is on this node's agent; the other node's agent has no such instance.
      const ca = fs.readFileSync(caFile);
      const here = new RemoteRuntime({ url: agents[node]!.url, token: token(), ca, node });
      const there = new RemoteRuntime({ url: agents[other]!.url, token: token(), ca, node: other });
      try {
        expect((await here.readFile(uids[name]!, `/work/${marker}`)).toString()).to.equal(`${node}\n`);
        // The other node's agent does not hold it and says which node does (not a bare NotFound).
        const miss = await there.readFile(uids[name]!, `/work/${marker}`).then(
          () => 'read',
          (e: RuntimeError) => `${e.code}: ${e.message}`,
        );
        expect(miss).to.match(
          new RegExp(`^Conflict: .*bound to node "${node}"; this is the node agent of node "${other}"`),
        );
      } finally {
        await here.close();
        await there.close();
      }
    }
  });

  it("a client meaning node-a refuses node-b's certificate; the agent refuses a request routed for the other node, and a create for a sandbox bound elsewhere (409)", async () => {
    const b = agents['node-b']!;
    const ca = fs.readFileSync(caFile);
    // Routed for node-a, sent to node-b's agent: the client refuses node-b's certificate (it is
    // not node-a's: native/agent/identity.ts), on calls and the exec stream.
    const misrouted = new RemoteRuntime({ url: b.url, token: token(), ca, node: 'node-a' });
    const codeOf = (p: Promise<unknown>) =>
      p.then(
        () => 'ok',
        (e: unknown) => (e instanceof RuntimeError ? `${e.code}: ${e.message}` : String(e)),
      );
    expect(await codeOf(misrouted.start())).to.match(/^Internal: .*not node "node-a"'s/);
    expect(await codeOf(misrouted.inspect(uids['on-a']!))).to.match(/^Internal: .*not node "node-a"'s/);
    expect(await codeOf(misrouted.execStream(uids['on-a']!, { argv: ['true'] }))).to.match(/not node "node-a"'s/);
    await misrouted.close();
    // And the agent refuses a request that names another node (a client without the pin): 409.
    const raw = (path: string, body?: string) =>
      new Promise<{ status: number; text: string }>((resolve, reject) => {
        const req = https.request(
          new URL(path, b.url),
          {
            method: body ? 'POST' : 'GET',
            ca,
            headers: {
              authorization: `Bearer ${token()}`,
              [NODE_HEADER]: 'node-a',
              'content-type': 'application/json',
            },
          },
          (res) => {
            let text = '';
            res.on('data', (d) => (text += d));
            res.on('end', () => resolve({ status: res.statusCode!, text }));
          },
        );
        req.on('error', reject);
        req.end(body);
      });
    const info = await raw('/v1/info');
    expect(info.status, info.text).to.equal(409);
    expect(info.text).to.match(/node agent of node \\?"node-b\\?".*routed for node \\?"node-a\\?"/);
    expect((await raw('/v1/call/inspect', JSON.stringify({ args: [uids['on-a']] }))).status).to.equal(409);
    // Without the header: creating node-a's sandbox on node-b is refused by node-b's own view of its sandboxes.
    const direct = new RemoteRuntime({ url: b.url, token: token(), ca, node: 'node-b' });
    await direct.start();
    try {
      expect(await codeOf(direct.create({ id: uids['on-a']! }))).to.match(
        /^Conflict: refused: runtime instance ".*" is not a Sandbox bound to node "node-b"/,
      );
      expect((await direct.list()).map((s) => s.id)).to.not.include(uids['on-a']);
      // A client that does not trust the cluster CA cannot talk to the agent at all.
      const untrusted = new RemoteRuntime({ url: b.url, token: token() });
      expect(await codeOf(untrusted.start())).to.match(/^Internal: .*unreachable/);
      await untrusted.close();
    } finally {
      await direct.close();
    }
  });
});
