// Volumes in split mode, end to end as processes: an API server (`fluxctl serve --no-controllers
// --route-by-node`), `fluxctl controller --route-by-node --scheduler` and one node agent with
// --kubeconfig (TLS from a test CA). The agent is the node: it runs the Volume controller of the
// volumes bound to it (field selector spec.nodeName) and mounts them for its sandboxes. The
// scheduler binds an unbound volume to the node of its first sandbox. A sandbox pinned to a node
// other than its volume's is refused (Failed, VolumeOnOtherNode); one naming volumes on two
// nodes is unschedulable with the reason. The controller's state directory never holds a volume.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { volumesUnsupported } from '../../native/volumes/volumes.js';
import { eventually } from '../support/wait.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { spawnFluxctl, type Proc } from './procs.js';
import { exec, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';

const NODE = 'node-v';
const volumeYaml = (name: string, spec: Record<string, unknown>) =>
  JSON.stringify({ apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Volume', metadata: { name }, spec });

describe('e2e: volumes through the node agent (split mode, route by node)', function () {
  this.timeout(300_000);
  let tmp: string;
  let fx: Fluxctl | undefined;
  let agent: Proc | undefined;
  let ctrl: Proc | undefined;
  const openssl = (args: string[]) => execFileSync('openssl', args, { cwd: tmp, stdio: 'pipe' });
  const json = async (kind: string, name: string) =>
    JSON.parse(await kubectlOk(fx!, ['get', kind, name, '-o', 'json'])) as any;

  before(async function () {
    skipWith(this, sandboxSkipReason() ?? volumesUnsupported());
    try {
      execFileSync('openssl', ['version'], { stdio: 'pipe' });
    } catch {
      skipWith(this, 'no openssl: the node agent serves TLS with a certificate the test makes with it');
    }
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-split-volume-'));
    const tokenFile = path.join(tmp, 'token');
    fs.writeFileSync(tokenFile, `agent-token-${process.pid}-${Date.now()}\n`, { mode: 0o600 });
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
    openssl([
      'req',
      '-x509',
      ...ec,
      '-days',
      '1',
      '-subj',
      '/CN=fluxvm-test-ca',
      '-keyout',
      'ca.key',
      '-out',
      'ca.pem',
    ]);
    openssl(['req', ...ec, '-subj', `/CN=${NODE}`, '-keyout', 'agent.key', '-out', 'agent.csr']);
    fs.writeFileSync(path.join(tmp, 'agent.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
    openssl(
      ['x509', '-req', '-in', 'agent.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '1'].concat(
        ['-out', 'agent.pem', '-extfile', 'agent.ext'],
      ),
    );
    const caFile = path.join(tmp, 'ca.pem');
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
    agent = await spawnFluxctl(
      ['node-agent', '--node-name', NODE, '--listen', '127.0.0.1:0', '--token-file', tokenFile]
        .concat(['--state-dir', path.join(tmp, 'agent'), '--tls-cert', path.join(tmp, 'agent.pem')])
        .concat([
          '--tls-key',
          path.join(tmp, 'agent.key'),
          '--kubeconfig',
          fx.kubeconfig,
          '--warm-pool',
          '0',
          '--no-vm',
        ]),
      /listening on (https:\/\/\S+)/,
      60_000,
    );
    const base = '/apis/fluxvm.dev/v1alpha1/nodes';
    const c = await fx.request('POST', base, {
      body: { apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Node', metadata: { name: NODE } },
    });
    expect([201, 409], c.body.toString()).to.include(c.status);
    const s = await fx.request('PATCH', `${base}/${NODE}/status`, {
      raw: JSON.stringify({ status: { addresses: [{ type: 'AgentURL', address: agent.matched[1]! }] } }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(s.status, s.body.toString()).to.equal(200);
    ctrl = await spawnFluxctl(
      ['controller', '--kubeconfig', fx.kubeconfig, '--route-by-node', '--scheduler', '--token-file', tokenFile].concat(
        ['--node-agent-ca-file', caFile, '--state-dir', path.join(tmp, 'controller')],
      ),
      /fluxvm controller \S+ against/,
      60_000,
    );
  });

  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.kubectl(['delete', 'volumes', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    }
    if (ctrl) expect(await ctrl.stop()).to.equal(0, ctrl.logs());
    if (fx) await fx.kubectl(['delete', 'fnode', NODE, '--ignore-not-found']);
    if (fx) expect(await fx.stop()).to.equal(0, fx.logs());
    if (agent) expect(await agent.stop()).to.equal(0, agent.logs());
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  const ready = async (name: string) => {
    const w = await fx!.kubectl(['wait', `sbx/${name}`, '--for=condition=Ready', '--timeout=120s'], {
      timeoutMs: 130_000,
    });
    if (w.code !== 0)
      throw new Error(
        `${name} not Ready: ${JSON.stringify((await json('sbx', name)).status)}\nagent:\n${agent?.logs().slice(-3000)}\ncontroller:\n${ctrl?.logs().slice(-2000)}`,
      );
  };

  it("an unbound volume is bound to its first sandbox's node and made by that node's agent; written by one sandbox, read by the next", async () => {
    await kubectlOk(fx!, ['apply', '-f', '-'], volumeYaml('shared', { size: '16Mi' }));
    await kubectlOk(
      fx!,
      ['apply', '-f', '-'],
      sandboxYaml('writer', {
        runtime: 'procbox',
        volumes: [{ volumeRef: { name: 'shared' }, mountPath: '/data' }],
      }),
    );
    await ready('writer');
    const v = await json('volume', 'shared');
    expect(v.spec.nodeName, 'bound by the scheduler').to.equal(NODE);
    expect(v.status).to.include({ phase: 'Ready', nodeName: NODE });
    expect((await json('sbx', 'writer')).status.nodeName).to.equal(NODE);
    // Made on the node (the agent's state directory), not by the controller.
    expect(fs.existsSync(path.join(tmp, 'agent', 'volumes', `${v.metadata.uid}.img`))).to.equal(true);
    expect(fs.existsSync(path.join(tmp, 'controller', 'volumes'))).to.equal(false);
    const w = await exec(fx!, 'writer', 'echo through-the-agent > /data/msg && cat /data/msg');
    expect(w.exitCode, w.stderr).to.equal(0);
    await kubectlOk(fx!, ['delete', 'sbx', 'writer', '--wait=true', '--timeout=60s']);
    await kubectlOk(
      fx!,
      ['apply', '-f', '-'],
      sandboxYaml('reader', {
        runtime: 'procbox',
        volumes: [{ volumeRef: { name: 'shared' }, mountPath: '/srv/in', readOnly: true }],
      }),
    );
    await ready('reader');
    const r = await exec(fx!, 'reader', 'cat /srv/in/msg; echo x > /srv/in/other; echo rc=$?');
    expect(r.stdout).to.equal('through-the-agent\nrc=2\n');
  });

  it('a sandbox pinned to another node than its volume is refused (VolumeOnOtherNode); volumes on two nodes are unschedulable', async () => {
    await kubectlOk(fx!, ['apply', '-f', '-'], volumeYaml('elsewhere', { size: '16Mi', nodeName: 'node-far' }));
    await kubectlOk(
      fx!,
      ['apply', '-f', '-'],
      sandboxYaml('pinned', {
        runtime: 'procbox',
        nodeName: NODE,
        volumes: [{ volumeRef: { name: 'elsewhere' }, mountPath: '/data' }],
      }),
    );
    let st: any;
    await eventually(
      async () => (st = (await json('sbx', 'pinned')).status)?.phase === 'Failed',
      60_000,
      'pinned Failed (VolumeOnOtherNode)',
    );
    expect(JSON.stringify(st.conditions)).to.include('VolumeOnOtherNode');
    await kubectlOk(
      fx!,
      ['apply', '-f', '-'],
      sandboxYaml('split-brain', {
        runtime: 'procbox',
        volumes: [
          { volumeRef: { name: 'shared' }, mountPath: '/a' },
          { volumeRef: { name: 'elsewhere' }, mountPath: '/b' },
        ],
      }),
    );
    await eventually(
      async () => {
        st = (await json('sbx', 'split-brain')).status;
        return (st?.conditions ?? []).some((c: any) => c.type === 'Scheduled' && c.status === 'False');
      },
      60_000,
      'split-brain unschedulable (Scheduled=False)',
    );
    const sc = st.conditions.find((c: any) => c.type === 'Scheduled');
    expect(sc.message).to.match(/volumes are on different nodes.*"shared" on node-v.*"elsewhere" on node-far/);
    expect((await json('sbx', 'split-brain')).spec.nodeName).to.equal(undefined);
    // node-far has no agent: nothing made the volume anywhere here.
    expect((await json('volume', 'elsewhere')).status?.phase).to.not.equal('Ready');
  });

  it('deleting the volume waits for its sandbox, then the agent removes it from the node', async () => {
    const uid = (await json('volume', 'shared')).metadata.uid;
    await kubectlOk(fx!, ['delete', 'volume', 'shared', '--wait=false']);
    await eventually(
      async () => (await json('volume', 'shared')).status?.phase === 'Terminating',
      30_000,
      'shared Terminating while reader and split-brain name it',
    );
    await kubectlOk(fx!, ['delete', 'sbx', 'reader', 'split-brain', '--wait=true', '--timeout=60s']);
    await kubectlOk(fx!, ['wait', 'volume/shared', '--for=delete', '--timeout=60s']);
    expect(fs.existsSync(path.join(tmp, 'agent', 'volumes', `${uid}.img`))).to.equal(false);
  });
});
