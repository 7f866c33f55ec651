// Two nodes with real processes and real links: one API server (`fluxctl serve
// --no-controllers --route-by-node`, listening on the host side of node-a's link), two node
// agents each in its own network namespace (node-a, node-b: joined to the host by a veth pair,
// their own addresses, state directories and TLS certificates from one cluster CA), and two
// `fluxctl controller --leader-elect --scheduler --route-by-node` replicas (one state directory,
// as a shared volume, so the crash-safe apply marker is seen by the replica that takes over),
// then two replicas each with a state directory of its own (the reference Deployment's
// emptyDir), where the one taking over sees only the apply's claim in the API.
// It checks: sandboxes spread over both nodes by the scheduler; a changeset on node-b's sandbox
// speculates and applies there, and drift there refuses the apply; the leader killed (kill -9)
// in the middle of an apply: the other replica takes over and marks it Failed exactly once, nothing
// written after the kill; the same with replicas that each have their own state directory;
// node-b's agent killed (kill -9): after the grace period its sandboxes get NodeLost, its
// warm-pool member is replaced on node-a, the user's sandbox waits; restarted, the agent
// heartbeats again and NodeLost turns False.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { RemoteRuntime } from '../../native/agent/client.js';
import { eventually } from '../support/wait.js';
import { EXT, pool, template } from './agentsandbox-helpers.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import { linkBytes, makeNodeNets, namedNetns, netnsOf, netnsSkipReason, type NodeNet } from './netns.js';
import { spawnFluxctl, type Proc } from './procs.js';
import { api, apiSpeculate, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';

const FLUX = '/apis/fluxvm.dev/v1alpha1';
const NODES = ['node-a', 'node-b'] as const;
type NodeName = (typeof NODES)[number];
/** Files the mid-apply changeset writes, and the pause after each (FLUXVM_TEST_CHANGESET_APPLY_DELAY_MS). */
const APPLY_FILES = 12;
const APPLY_DELAY_MS = 2000;
const GRACE = '20s';

/** Paths under `dir` whose base name is `name` (a bounded walk). */
function findNamed(dir: string, name: string, depth = 6): string[] {
  const out: string[] = [];
  const walk = (d: string, left: number) => {
    let ents: fs.Dirent[] = [];
    try {
      ents = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of ents) {
      if (e.name === name) out.push(path.join(d, e.name));
      if (e.isDirectory() && left > 0) walk(path.join(d, e.name), left - 1);
    }
  };
  walk(dir, depth);
  return out;
}

function openssl(args: string[], cwd: string) {
  execFileSync('openssl', args, { cwd, stdio: 'pipe' });
}

/** A cluster CA and, per node, a serving certificate for its namespace's address. */
function makeCerts(dir: string, nets: Record<NodeName, NodeNet>) {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl(
    ['req', '-x509', ...ec, '-days', '1', '-subj', '/CN=fluxvm-cluster-ca', '-keyout', 'ca.key', '-out', 'ca.pem'],
    dir,
  );
  for (const n of NODES) {
    openssl(['req', ...ec, '-subj', `/CN=${n}`, '-keyout', `${n}.key`, '-out', `${n}.csr`], dir);
    fs.writeFileSync(path.join(dir, `${n}.ext`), `subjectAltName=IP:${nets[n].nodeIp}\n`);
    openssl(
      ['x509', '-req', '-in', `${n}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '1'].concat([
        '-out',
        `${n}.pem`,
        '-extfile',
        `${n}.ext`,
      ]),
      dir,
    );
  }
}

describe('e2e: two nodes in network namespaces, two leader-elected controllers', function () {
  this.timeout(420_000);
  let tmp: string;
  let tokenFile: string;
  let caFile: string;
  let fx: Fluxctl;
  let removeNets: (() => void) | undefined;
  const nets = {} as Record<NodeName, NodeNet>;
  const agents = {} as Record<NodeName, { proc: Proc; url: string; state: string }>;
  const ctrls: Record<string, Proc> = {};
  const token = () => fs.readFileSync(tokenFile, 'utf8').trim();

  const startAgent = async (n: NodeName) => {
    const state = path.join(tmp, `state-${n}`);
    const proc = await spawnFluxctl(
      ['node-agent', '--node-name', n, '--listen', `${nets[n].nodeIp}:0`, '--token-file', tokenFile].concat([
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
      ]),
      /listening on (https:\/\/\S+)/,
      90_000,
      { prefix: nets[n].prefix },
    );
    agents[n] = { proc, url: proc.matched[1]!, state };
  };

  /** A replica; `stateDir` default: the shared one (a volume both mount). */
  const startController = (id: string, stateDir = path.join(tmp, 'controller')) =>
    spawnFluxctl(
      [
        'controller',
        '--kubeconfig',
        fx.kubeconfig,
        '--route-by-node',
        '--scheduler',
        '--node-grace-period',
        GRACE,
      ].concat([
        '--token-file',
        tokenFile,
        '--node-agent-ca-file',
        caFile,
        '--state-dir',
        stateDir,
        '--leader-elect',
        '--leader-election-identity',
        id,
        // Longer than a quick hand-over needs: at load 15 (three suites at once) a new leader,
        // starved with the API server, missed a 3 s renew deadline and exited mid-test.
        '--leader-elect-lease-duration',
        '12s',
        '--leader-elect-renew-deadline',
        '10s',
        '--leader-elect-retry-period',
        '1s',
      ]),
      /fluxvm controller \S+ against/,
      90_000,
      { env: { FLUXVM_TEST_CHANGESET_APPLY_DELAY_MS: String(APPLY_DELAY_MS) } },
    );

  const get = async (p: string) => (await api(fx, 'GET', p)).json;
  const sbx = (name: string) => get(`${FLUX}/namespaces/default/sandboxes/${name}`);
  const cs = (name: string) => get(`${FLUX}/namespaces/default/changesets/${name}`);
  const cond = (o: any, type: string) => o?.status?.conditions?.find((c: any) => c.type === type);
  const sh = async (name: string, script: string) => {
    const r = await api(fx, 'POST', `${FLUX}/namespaces/default/sandboxes/${name}/exec`, {
      body: { command: ['sh', '-c', script] },
    });
    expect(r.status, r.body.toString()).to.equal(200);
    return r.json as { exitCode: number; stdout: string; stderr: string };
  };
  const decide = async (name: string, spec: Record<string, unknown>) => {
    const r = await fx.request('PATCH', `${FLUX}/namespaces/default/changesets/${name}`, {
      raw: JSON.stringify({ spec }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(r.status, r.body.toString()).to.equal(200);
  };
  const ready = async (name: string, timeoutMs = 120_000) =>
    eventually(
      async () => {
        const o = await sbx(name);
        return cond(o, 'Ready')?.status === 'True' && o.status?.phase === 'Running' ? o : undefined;
      },
      timeoutMs,
      `sandbox ${name} Running and Ready`,
    ).catch((e) => {
      throw new Error(`${e.message}\ncontrollers:\n${Object.values(ctrls).map((c) => c.logs().slice(-1500))}`);
    });
  const speculate = (sandbox: string, name: string, script: string) =>
    apiSpeculate(fx, sandbox, name, script).catch(async (e) => {
      throw new Error(
        `${e.message}\nstatus: ${JSON.stringify((await cs(name))?.status)}\ncontrollers:\n${Object.values(ctrls)
          .map((c) => c.logs().slice(-2500))
          .join('\n---\n')}`,
      );
    });
  const holder = async () =>
    (await get('/apis/coordination.k8s.io/v1/namespaces/fluxvm-system/leases/fluxvm-controller'))?.spec?.holderIdentity;
  const eventsOf = async (kind: string, name: string) =>
    ((await get(`/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=${name}`))?.items ?? []).filter(
      (e: any) => e.involvedObject?.kind === kind,
    );

  before(async function () {
    skipWith(this, sandboxSkipReason());
    skipWith(this, netnsSkipReason());
    try {
      execFileSync('openssl', ['version'], { stdio: 'pipe' });
    } catch {
      skipWith(this, 'no openssl: the node agents serve TLS with certificates the test makes with it');
    }
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-netns-'));
    const made = makeNodeNets([...NODES]);
    removeNets = made.remove;
    NODES.forEach((n, i) => (nets[n] = made.nets[i]!));
    tokenFile = path.join(tmp, 'token');
    fs.writeFileSync(tokenFile, `agent-token-${process.pid}-${Date.now()}\n`, { mode: 0o600 });
    makeCerts(tmp, nets);
    caFile = path.join(tmp, 'ca.pem');
    // The API server listens on the host side of node-a's link: both namespaces reach it over their
    // veth (node-b's through its own link and the host), the test and the controllers from the host.
    fx = await startFluxctl({
      args: ['--listen', `${nets['node-a'].hostIp}:0`, '--no-controllers', '--route-by-node'].concat([
        '--node-agent-token-file',
        tokenFile,
        '--node-agent-ca-file',
        caFile,
        '--quiet',
      ]),
      readyTimeoutMs: 120_000,
    });
    await kubectlOk(fx, ['create', 'namespace', 'fluxvm-system']);
    for (const n of NODES) await startAgent(n);
    ctrls['ctrl-1'] = await startController('ctrl-1');
    ctrls['ctrl-2'] = await startController('ctrl-2');
  });

  after(async function () {
    this.timeout(180_000);
    // A killed agent comes back first, so its sandboxes can be destroyed.
    for (const n of NODES)
      if (fx && agents[n] && (agents[n].proc.child.exitCode !== null || agents[n].proc.child.signalCode !== null))
        await startAgent(n).catch(() => undefined);
    if (fx) {
      const d = await fx.kubectl(
        ['delete', 'sandboxwarmpools,sandboxtemplates,cs,sbx', '--all', '--wait=true', '--timeout=90s'],
        {
          timeoutMs: 100_000,
        },
      );
      if (d.code !== 0) console.log(`      cleanup: ${d.stderr}`);
      for (const c of Object.values(ctrls)) await c.stop();
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    for (const a of Object.values(agents)) await a.proc.stop();
    removeNets?.();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  /**
   * An apply killed mid-way in `dir` of user-b: part of the change only, no file written later
   * than 1 s after the kill (a second apply could start only after the Lease expired), and exactly
   * one outcome Event, a Failed one, no Applied.
   */
  const interruptedOnce = async (dir: string, cs: string, killedAt: number) => {
    const count = Number((await sh('user-b', `grep -l new ${dir}/* | wc -l`)).stdout.trim());
    expect(count).to.be.below(APPLY_FILES);
    const late = await sh('user-b', `find ${dir} -type f -newermt @${(killedAt + 1).toFixed(3)} | wc -l`);
    expect(late.stdout.trim(), late.stderr).to.equal('0');
    const reasons = (await eventsOf('Changeset', cs)).map((e: any) => `${e.reason}x${e.count ?? 1}`);
    expect(
      reasons.filter((r: string) => r.startsWith('Failed')),
      reasons.join(','),
    ).to.deep.equal(['Failedx1']);
    expect(
      reasons.some((r: string) => r.startsWith('Applied')),
      reasons.join(','),
    ).to.equal(false);
  };
  it('each agent runs in its own network namespace and is reached across its link', async () => {
    for (const n of NODES) {
      expect(netnsOf(agents[n].proc.child.pid!), `${n}'s agent`).to.equal(namedNetns(nets[n].ns));
      expect(agents[n].url).to.match(new RegExp(`^https://${nets[n].nodeIp.replace(/\./g, '\\.')}:\\d+$`));
      const node = await eventually(
        async () => {
          const o = await get(`${FLUX}/nodes/${n}`);
          return cond(o, 'Ready')?.status === 'True' ? o : undefined;
        },
        60_000,
        `Node ${n} Ready`,
      );
      expect(node.status.addresses).to.deep.include({ type: 'AgentURL', address: agents[n].url });
    }
    expect(netnsOf(process.pid)).to.not.equal(namedNetns(nets['node-a'].ns));
    // The heartbeats cross node-b's own link: its host side receives bytes while the Lease is renewed.
    const before = linkBytes(nets['node-b'].hostIf).rx;
    const renewed = (await get('/apis/coordination.k8s.io/v1/namespaces/fluxvm-node-lease/leases/node-b')).spec
      .renewTime;
    await eventually(
      async () =>
        (await get('/apis/coordination.k8s.io/v1/namespaces/fluxvm-node-lease/leases/node-b')).spec.renewTime !==
        renewed,
      30_000,
      "node-b's next Lease renewal",
    );
    expect(linkBytes(nets['node-b'].hostIf).rx).to.be.greaterThan(before);
  });

  it('the scheduler spreads unbound sandboxes over both nodes; each runs where it is bound', async () => {
    for (const name of ['spread-1', 'spread-2'])
      await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml(name, { runtime: 'procbox' }));
    const placed = [];
    for (const name of ['spread-1', 'spread-2']) {
      const o = await ready(name);
      expect(o.status.nodeName).to.equal(o.spec.nodeName);
      placed.push(o.spec.nodeName);
    }
    expect(placed.sort()).to.deep.equal(['node-a', 'node-b']);
  });

  it('a changeset on node-b speculates and applies on node-b; drift there refuses the apply', async () => {
    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('user-b', { runtime: 'procbox', nodeName: 'node-b' }));
    const uid = (await ready('user-b')).metadata.uid;
    expect((await sh('user-b', 'echo v1 > /work/f; cat /work/f')).stdout).to.equal('v1\n');
    const spec1 = await speculate('user-b', 'cs-b1', 'echo v2 > /work/f; echo new > /work/g');
    expect(spec1.status.phase, JSON.stringify(spec1.status)).to.equal('Pending');
    expect(spec1.status.changes.modified).to.deep.equal(['/work/f']);
    expect(spec1.status.changes.added).to.deep.equal(['/work/g']);
    // Speculation did not touch the real sandbox.
    expect((await sh('user-b', 'cat /work/f')).stdout).to.equal('v1\n');
    await decide('cs-b1', { decision: 'Approve', apply: true });
    const applied = await eventually(
      async () => ((await cs('cs-b1'))?.status?.phase === 'Applied' ? true : undefined),
      60_000,
      'cs-b1 Applied',
    );
    expect(applied).to.equal(true);
    expect((await sh('user-b', 'cat /work/f /work/g')).stdout).to.equal('v2\nnew\n');
    // The write is on node-b's agent: its runtime holds the file; node-a's has no such instance.
    const ca = fs.readFileSync(caFile);
    const b = new RemoteRuntime({ url: agents['node-b'].url, token: token(), ca, node: 'node-b' });
    const a = new RemoteRuntime({ url: agents['node-a'].url, token: token(), ca, node: 'node-a' });
    try {
      expect((await b.readFile(uid, '/work/f')).toString()).to.equal('v2\n');
      expect((await a.list()).map((s) => s.id)).to.not.include(uid);
    } finally {
      await a.close();
      await b.close();
    }
    // Drift on node-b after the speculation: the apply is refused and nothing is written.
    const spec2 = await speculate('user-b', 'cs-b2', 'echo v3 > /work/f');
    expect(spec2.status.phase).to.equal('Pending');
    await sh('user-b', 'echo drift > /work/f');
    await decide('cs-b2', { decision: 'Approve', apply: true });
    const refused = await eventually(
      async () => {
        const o = await cs('cs-b2');
        return cond(o, 'Conflict')?.status === 'True' ? o : undefined;
      },
      60_000,
      'cs-b2 Conflict=True',
    );
    expect(refused.status.phase).to.equal('Approved');
    expect(cond(refused, 'Conflict').reason).to.equal('BaseDrifted');
    expect((await sh('user-b', 'cat /work/f')).stdout).to.equal('drift\n');
    await decide('cs-b2', { decision: 'Reject', apply: false });
  });

  it('the leader killed (kill -9) mid-apply: the other replica takes over and marks the apply Failed once; nothing is written after the kill', async () => {
    const files = Array.from({ length: APPLY_FILES }, (_, i) => `app/f${String(i).padStart(2, '0')}`);
    await sh('user-b', `mkdir -p /work/app && for f in ${files.join(' ')}; do echo old > /work/$f; done`);
    const spec = await speculate('user-b', 'cs-mid', `for f in ${files.join(' ')}; do echo new > /work/$f; done`);
    expect(spec.status.phase).to.equal('Pending');
    expect(spec.status.changes.modified).to.have.length(APPLY_FILES);
    const leaderId = await eventually(holder, 20_000, 'a controller holding the Lease');
    const leader = ctrls[leaderId]!;
    expect(leader, `leader ${leaderId}`).to.not.equal(undefined);
    await decide('cs-mid', { decision: 'Approve', apply: true });
    // Mid-apply: the sandbox is frozen while an apply writes (exec waits), so it is watched from
    // the host: the crash-safe marker in the replicas' shared state dir says `started`.
    const marker = () =>
      findNamed(path.join(tmp, 'controller'), 'apply.json')
        .map((f) => fs.readFileSync(f, 'utf8'))
        .some((t) => t.includes('"started"'));
    await eventually(
      async () => marker() && (await cs('cs-mid'))?.status?.phase === 'Applying',
      60_000,
      'cs-mid Applying with its marker started',
    );
    leader.child.kill('SIGKILL');
    await leader.exited;
    const killedAt = Date.now() / 1000;
    const other = Object.keys(ctrls).find((id) => id !== leaderId)!;
    await eventually(
      async () => ((await holder()) === other ? true : undefined),
      45_000,
      `${other} takes the Lease`,
    ).catch((e) => {
      const c = ctrls[other]!.child;
      throw new Error(
        `${e.message} (${other}: exit ${c.exitCode ?? c.signalCode ?? 'running'})\n${ctrls[other]!.logs().slice(-3000)}`,
      );
    });
    const final = await eventually(
      async () => {
        const o = await cs('cs-mid');
        return ['Applied', 'Failed'].includes(o?.status?.phase) ? o : undefined;
      },
      60_000,
      'cs-mid final',
    ).catch((e) => {
      throw new Error(`${e.message}\n${other}:\n${ctrls[other]!.logs().slice(-4000)}`);
    });
    expect(final.status.phase, JSON.stringify(final.status)).to.equal('Failed');
    expect(cond(final, 'Finished')).to.include({ status: 'True', reason: 'ApplyInterrupted' });
    // The dead leader's freeze is given back: the sandbox answers again. Part of the change is
    // there (the apply did not finish), and no file was written later than 1 s after the kill (a
    // second apply could start only after the 12 s Lease expired).
    // Exactly one outcome Event, a Failed one; no Applied.
    await interruptedOnce('/work/app', 'cs-mid', killedAt);
  });

  it('the leader killed mid-apply, the replica taking over has its OWN state directory (no shared volume): Failed once from the claim in the API, nothing written after the kill, the sandbox thawed, never applied twice', async () => {
    // The reference Deployment's topology: each replica an emptyDir. The replicas of the cases
    // above (one shared directory) are stopped; ctrl-3 leads with a directory of its own and
    // ctrl-4 waits with another: it cannot see ctrl-3's apply marker, only status.applyClaim.
    for (const id of Object.keys(ctrls)) await ctrls[id]!.stop();
    const dirs: Record<string, string> = {
      'ctrl-3': path.join(tmp, 'controller-3'),
      'ctrl-4': path.join(tmp, 'controller-4'),
    };
    ctrls['ctrl-3'] = await startController('ctrl-3', dirs['ctrl-3']);
    await eventually(async () => ((await holder()) === 'ctrl-3' ? true : undefined), 30_000, 'ctrl-3 takes the Lease');
    ctrls['ctrl-4'] = await startController('ctrl-4', dirs['ctrl-4']);
    const files = Array.from({ length: APPLY_FILES }, (_, i) => `app2/f${String(i).padStart(2, '0')}`);
    await sh('user-b', `mkdir -p /work/app2 && for f in ${files.join(' ')}; do echo old > /work/$f; done`);
    const spec = await speculate('user-b', 'cs-own', `for f in ${files.join(' ')}; do echo new > /work/$f; done`);
    expect(spec.status.phase).to.equal('Pending');
    const leaderId = await eventually(holder, 20_000, 'a controller holding the Lease');
    expect(leaderId, 'ctrl-3 leads (it staged the speculation in its own directory)').to.equal('ctrl-3');
    const leader = ctrls[leaderId]!;
    await decide('cs-own', { decision: 'Approve', apply: true });
    const marker = () =>
      findNamed(dirs['ctrl-3']!, 'apply.json')
        .map((f) => fs.readFileSync(f, 'utf8'))
        .some((t) => t.includes('"started"'));
    const claimed = await eventually(
      async () => {
        const o = await cs('cs-own');
        return marker() && o?.status?.phase === 'Applying' ? o : undefined;
      },
      60_000,
      'cs-own Applying with its marker started',
    );
    expect(claimed.status.applyClaim).to.include({ holder: leaderId, sandboxUID: (await sbx('user-b')).metadata.uid });
    leader.child.kill('SIGKILL');
    await leader.exited;
    const killedAt = Date.now() / 1000;
    await eventually(async () => ((await holder()) === 'ctrl-4' ? true : undefined), 45_000, 'ctrl-4 takes the Lease');
    const final = await eventually(
      async () => {
        const o = await cs('cs-own');
        return ['Applied', 'Failed'].includes(o?.status?.phase) ? o : undefined;
      },
      60_000,
      'cs-own final',
    ).catch(async (e) => {
      throw new Error(
        `${e.message}\nstatus: ${JSON.stringify((await cs('cs-own'))?.status)}\nctrl-4:\n${ctrls['ctrl-4']!.logs().slice(-4000)}`,
      );
    });
    expect(final.status.phase, JSON.stringify(final.status)).to.equal('Failed');
    expect(cond(final, 'Finished')).to.include({ status: 'True', reason: 'ApplyInterrupted' });
    expect(final.status.message).to.match(/another state directory/);
    // ctrl-4's directory never held a marker: the decision came from the API.
    expect(findNamed(dirs['ctrl-4']!, 'apply.json')).to.deep.equal([]);
    // Thawed (the exec answers), part of the change only, nothing written after the kill.
    await interruptedOnce('/work/app2', 'cs-own', killedAt);
  });

  it("node-b's agent killed (kill -9): NodeLost after the grace period, its pool member replaced on node-a, the user's sandbox waits", async () => {
    const t = await api(fx, 'POST', `${EXT}/namespaces/default/sandboxtemplates`, { body: template('tpl') });
    expect(t.status, t.body.toString()).to.equal(201);
    const p = await api(fx, 'POST', `${EXT}/namespaces/default/sandboxwarmpools`, { body: pool('wp', 'tpl', 4) });
    expect(p.status, p.body.toString()).to.equal(201);
    const members = async () =>
      ((await get(`${FLUX}/namespaces/default/sandboxes`)).items as any[]).filter(
        (s) => s.metadata.ownerReferences?.[0]?.kind === 'SandboxWarmPool',
      );
    await eventually(
      async () => {
        const m = (await members()).filter((s) => s.status?.phase === 'Running' && !s.metadata.deletionTimestamp);
        return m.length === 4 ? m : undefined;
      },
      120_000,
      'four Running pool members',
    ).catch(async (e) => {
      const m = (await members()).map((s) => ({ name: s.metadata.name, spec: s.spec, status: s.status }));
      const wp = (await get(`${EXT}/namespaces/default/sandboxwarmpools/wp`))?.status;
      const logs = Object.values(ctrls).map((c) => c.logs().slice(-2500));
      throw new Error(
        `${e.message}\nmembers: ${JSON.stringify(m).slice(0, 3000)}\npool: ${JSON.stringify(wp)}\n${logs}`,
      );
    });
    const onB = (await members()).filter((s) => s.spec.nodeName === 'node-b');
    expect(onB.length, 'pool members the scheduler put on node-b').to.be.greaterThan(0);
    const userUid = (await sbx('user-b')).metadata.uid;
    const agentB = agents['node-b'];
    agentB.proc.child.kill('SIGKILL');
    await agentB.proc.exited;
    const killedAt = Date.now();
    const lostNode = await eventually(
      async () => {
        const o = await get(`${FLUX}/nodes/node-b`);
        return cond(o, 'Ready')?.status === 'False' ? o : undefined;
      },
      60_000,
      'Node node-b Ready=False',
    );
    expect(cond(lostNode, 'Ready').reason).to.equal('HeartbeatLost');
    // Not before the grace period (20 s) from node-b's last renewal: its Lease's renewTime, final
    // since the kill, against the condition's transition (whole seconds: it happened in
    // [lastTransitionTime, +1 s)). (Measured from the kill instead, a heartbeat that a busy
    // machine sent late made the wait look short.)
    const lastRenew = Date.parse(
      (await get('/apis/coordination.k8s.io/v1/namespaces/fluxvm-node-lease/leases/node-b')).spec.renewTime,
    );
    const lostAt = Date.parse(cond(lostNode, 'Ready').lastTransitionTime);
    expect(lostAt + 1000 - lastRenew, 'ms from the last renewal to NodeLost').to.be.greaterThan(20_000);
    expect(killedAt).to.be.greaterThan(lastRenew);
    const user = await eventually(
      async () => {
        const o = await sbx('user-b');
        return cond(o, 'NodeLost')?.status === 'True' ? o : undefined;
      },
      60_000,
      'user-b NodeLost=True',
    );
    expect(cond(user, 'NodeLost').reason).to.equal('NodeLost');
    // The user's sandbox waits: same object, still bound to node-b, not deleted, not recreated.
    expect(user.metadata.uid).to.equal(userUid);
    expect(user.spec.nodeName).to.equal('node-b');
    expect(user.metadata.deletionTimestamp).to.equal(undefined);
    // Its Event (the recorder writes it after the condition).
    await eventually(
      async () => (await eventsOf('Sandbox', 'user-b')).some((e: any) => e.reason === 'NodeLost'),
      30_000,
      "user-b's NodeLost Event",
    );
    // The pool members on node-b are deleted (their finalizer waits for the agent) and replaced on node-a.
    const replaced = await eventually(
      async () => {
        const live = (await members()).filter((s) => !s.metadata.deletionTimestamp);
        const gone = onB.every((b) => !live.some((s) => s.metadata.uid === b.metadata.uid));
        const running = live.filter((s) => s.status?.phase === 'Running');
        return gone && running.length === 4 ? live : undefined;
      },
      120_000,
      "node-b's pool members replaced by four Running members",
    );
    for (const s of replaced) expect(s.spec.nodeName, s.metadata.name).to.equal('node-a');
    // The agent back (same namespace, state dir): the Node heartbeats, NodeLost turns False, the sandbox is kept.
    await startAgent('node-b');
    const back = await eventually(
      async () => {
        const o = await sbx('user-b');
        return cond(o, 'NodeLost')?.status === 'False' ? o : undefined;
      },
      60_000,
      'user-b NodeLost=False after the agent returns',
    );
    expect(cond(back, 'NodeLost').reason).to.equal('NodeReady');
    // The restarted agent listens on a new port: the exec goes there once its Node says so.
    await eventually(
      async () =>
        (await get(`${FLUX}/nodes/node-b`))?.status?.addresses?.some((a: any) => a.address === agents['node-b'].url),
      60_000,
      "node-b's new agent URL on its Node",
    );
    expect((await sh('user-b', 'cat /work/f')).stdout).to.equal('drift\n');
  });
});
