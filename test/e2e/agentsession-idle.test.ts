// End to end against a real `fluxctl serve` (procbox): AgentSession spec.idleSeconds (idle
// standby). The field is carried to the session's Sandbox (spec.idleSeconds), so an idle session's
// sandbox goes to Standby (the kernel says its cgroup is frozen) and an exec through the session
// wakes it and returns its output; a change of the session's field reaches the Sandbox; the
// field's edges (1 and 604800 pass, 0 and 604801 are 422 naming spec.idleSeconds).
import { expect } from 'chai';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, kubectlOk, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';
import { kernelFrozen } from '../support/freezer.js';

const AGS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/agentsessions';
const SBX = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';

const session = (name: string, idleSeconds?: number) => ({
  apiVersion: 'fluxvm.dev/v1alpha1',
  kind: 'AgentSession',
  metadata: { name },
  spec: { agent: 'claude-code', policy: { preset: 'offline' }, ...(idleSeconds !== undefined ? { idleSeconds } : {}) },
});

/** The init pid of the procbox sandbox with uid `uid`, from the runtime's record in the state dir. */
function sandboxPid(stateDir: string, uid: string): number {
  const rec = JSON.parse(readFileSync(join(stateDir, 'runtime', 'procbox', 'sandboxes', uid, 'sandbox.json'), 'utf8'));
  return rec.pid as number;
}

async function sandboxOf(fx: Fluxctl, name: string): Promise<any> {
  return (await api(fx, 'GET', `${SBX}/${name}`)).json;
}

describe('e2e: AgentSession idleSeconds (procbox)', function () {
  this.timeout(300_000);
  let fx: Fluxctl | undefined;
  let stateDir = '';

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    stateDir = fx.stateDir;
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'ags,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      await fx.stop();
    }
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('spec.idleSeconds at its edges: 1 and 604800 pass, 0 and 604801 are 422 naming the field', async () => {
    for (const [v, ok] of [
      [1, true],
      [604800, true],
      [0, false],
      [604801, false],
    ] as const) {
      const r = await api(fx!, 'POST', `${AGS}?dryRun=All`, { body: session(`edge-${v}`, v) });
      if (ok) {
        expect(r.status, JSON.stringify(r.json)).to.equal(201);
        expect(r.json.spec.idleSeconds).to.equal(v);
      } else {
        expect(r.status, JSON.stringify(r.json)).to.equal(422);
        expect(r.json.reason).to.equal('Invalid');
        expect(r.json.details.causes.map((c: any) => c.field)).to.include('spec.idleSeconds');
      }
    }
    expect((await api(fx!, 'GET', `${AGS}/edge-1`)).status, 'dry run stores nothing').to.equal(404);
  });

  it("an idle session's sandbox goes to Standby; an exec through the session wakes it with its output", async () => {
    await kubectlOk(fx!, ['apply', '-f', '-'], JSON.stringify(session('idle', 1)));
    await kubectlOk(fx!, ['wait', 'ags/idle', '--for=condition=Ready', '--timeout=55s']);
    const first = await sandboxOf(fx!, 'idle');
    expect(first.spec.idleSeconds, "the session's field on its Sandbox").to.equal(1);
    let sbx: any;
    await eventually(
      async () => (sbx = await sandboxOf(fx!, 'idle')).status?.phase === 'Standby',
      30_000,
      `the session's sandbox to reach Standby (last: ${JSON.stringify(sbx?.status?.phase)})`,
    );
    const pid = sandboxPid(stateDir, sbx.metadata.uid);
    expect(kernelFrozen(pid), 'the kernel says the cgroup is frozen').to.equal(true);
    // The session stays Running while its sandbox sleeps.
    const ags = (await api(fx!, 'GET', `${AGS}/idle`)).json;
    expect(ags.status.phase).to.equal('Running');

    const r = await fx!.request('POST', `${AGS}/idle/exec`, { body: { command: ['sh', '-c', 'echo woken'] } });
    expect(r.status, r.body.toString()).to.equal(200);
    expect(r.json.exitCode).to.equal(0);
    expect(r.json.stdout).to.equal('woken\n');
    expect(kernelFrozen(pid), 'awake after the exec').to.equal(false);
    // Same sandbox (woken, not replaced).
    expect((await sandboxOf(fx!, 'idle')).metadata.uid).to.equal(sbx.metadata.uid);

    // A change of the session's field is carried to its Sandbox; removing it removes it.
    await kubectlOk(fx!, ['patch', 'ags', 'idle', '--type=merge', '-p', '{"spec":{"idleSeconds":600}}']);
    await eventually(
      async () => (await sandboxOf(fx!, 'idle')).spec.idleSeconds === 600,
      30_000,
      'the Sandbox to get idleSeconds 600',
    );
    await kubectlOk(fx!, ['patch', 'ags', 'idle', '--type=merge', '-p', '{"spec":{"idleSeconds":null}}']);
    await eventually(
      async () => (await sandboxOf(fx!, 'idle')).spec.idleSeconds === undefined,
      30_000,
      'the Sandbox to lose idleSeconds',
    );
  });

  it('a session without idleSeconds gives a Sandbox without it', async () => {
    await kubectlOk(fx!, ['apply', '-f', '-'], JSON.stringify(session('awake')));
    await kubectlOk(fx!, ['wait', 'ags/awake', '--for=condition=Ready', '--timeout=55s']);
    expect((await sandboxOf(fx!, 'awake')).spec).to.not.have.property('idleSeconds');
  });
});
