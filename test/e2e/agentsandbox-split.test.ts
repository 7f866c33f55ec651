// A SandboxClaim bound at its create in the split deployment: `fluxctl node-agent` (procbox),
// `fluxctl serve --no-controllers --node-agent` and `fluxctl controller --node-agent` as
// processes. The create co-write (controllers/agentsandbox/bind.ts) runs in the API server
// process, which has no controllers: the POST's answer is already bound and Ready, the Sandbox
// (made and run by the controller and the agent) is owned by the claim, and a command runs in it
// through the API server and the agent.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { claim, EXT, FLUX, pool, readyPool, template } from './agentsandbox-helpers.js';
import type { Fluxctl } from './harness.js';
import type { Proc } from './procs.js';
import { startSplit, stopSplit, type SplitTopology } from './split-topology.js';
import { api, eventually, exec, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { kstatus } from '../kstatus.js';

const NS = `${EXT}/namespaces/default`;

describe('e2e: agent-sandbox claims bound at create in split mode (API server, controller, node agent)', function () {
  this.timeout(300_000);
  let split: SplitTopology | undefined;
  let tmp: string;
  let agent: Proc | undefined;
  let ctrl: Proc | undefined;
  let fx: Fluxctl | undefined;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    split = await startSplit('fluxvm-split-claim-', 'node-c');
    ({ tmp, agent, ctrl, fx } = split);
  });

  after(async () => {
    if (fx) {
      for (const r of ['sandboxclaims', 'sandboxwarmpools'])
        await fx.request('DELETE', `${NS}/${r}`, { timeoutMs: 120_000 }).catch(() => undefined);
      await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    }
    await stopSplit(split);
  });

  it("the POST's answer is bound and Ready; the claimed sandbox runs a command on the agent", async () => {
    expect((await api(fx!, 'POST', `${NS}/sandboxtemplates`, { body: template('t') })).status).to.equal(201);
    expect((await api(fx!, 'POST', `${NS}/sandboxwarmpools`, { body: pool('p', 't', 2) })).status).to.equal(201);
    await readyPool(fx!, 'default', 'p', 2);
    const r = await api(fx!, 'POST', `${NS}/sandboxclaims`, { body: claim('c1', 'p') });
    expect(r.status, JSON.stringify(r.json)).to.equal(201);
    const c = r.json;
    const name = c.status?.sandbox?.name as string;
    expect(name, `bound in the POST's answer: ${JSON.stringify(c.status)}`).to.be.a('string');
    expect(c.status.conditions.find((x: any) => x.type === 'Ready')).to.include({
      status: 'True',
      reason: 'SandboxReady',
    });
    expect(c.status.launchType).to.equal('warm');
    expect(kstatus(c)).to.deep.equal({ status: 'Current' });
    const s = (await api(fx!, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).json;
    expect(s.status.phase).to.equal('Running');
    expect(s.status.nodeName).to.equal('node-c');
    expect(s.metadata.ownerReferences).to.have.length(1);
    expect(s.metadata.ownerReferences[0]).to.include({ kind: 'SandboxClaim', uid: c.metadata.uid, controller: true });
    expect(s.metadata.labels).to.not.have.property('agents.x-k8s.io/warm-pool-sandbox');
    // The agents.x-k8s.io view moved in the same batch: written before the claim itself.
    const v = (await api(fx!, 'GET', `/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/${name}`)).json;
    expect(v.metadata.labels['agents.x-k8s.io/claim-uid']).to.equal(c.metadata.uid);
    expect(Number(v.metadata.resourceVersion)).to.be.lessThan(Number(c.metadata.resourceVersion));
    const out = await exec(fx!, name, 'echo claimed-on-the-agent');
    expect(out.exitCode, out.stderr).to.equal(0);
    expect(out.stdout.trim()).to.equal('claimed-on-the-agent');
    // The controller process refills the pool and leaves the claim as the API server bound it.
    await readyPool(fx!, 'default', 'p', 2);
    const again = (await api(fx!, 'GET', `${NS}/sandboxclaims/c1`)).json;
    expect(again.status.sandbox.name).to.equal(name);
    // Deleting the claim deletes its sandbox (the controller's garbage collector, the agent's runtime).
    expect((await api(fx!, 'DELETE', `${NS}/sandboxclaims/c1`)).status).to.be.oneOf([200, 202]);
    await eventually(
      async () => (await api(fx!, 'GET', `${FLUX}/namespaces/default/sandboxes/${name}`)).status === 404,
      120_000,
      `sandbox ${name} deleted with its claim`,
    );
  });
});
