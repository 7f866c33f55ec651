// Idle standby in the split deployment: `fluxctl node-agent` (procbox),
// `fluxctl serve --no-controllers --node-agent` and `fluxctl controller --node-agent` as
// processes. The controller's Sandbox controller reaches the runtime only through the agent's
// client, which forwards standbyIfIdle and wake (native/agent/client.ts): an idle sandbox goes
// to phase Standby (its cgroup frozen by the kernel, a counter in it stops), an exec through the
// API server wakes it with its output, and the controller learns of that wake (the client's wake
// poll) so the sandbox goes on standby again once idle.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Fluxctl } from './harness.js';
import type { Proc } from './procs.js';
import { startSplit, stopSplit, type SplitTopology } from './split-topology.js';
import { api, exec, makeSandbox, sandboxSkipReason, skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';
import { COUNTER_LOOP, counter, kernelFrozen } from '../support/freezer.js';
import { createAndTimeStandby } from './idle-timing.js';

const SBX = '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes';

describe('e2e: idle standby in split mode (API server, controller, node agent as processes)', function () {
  this.timeout(300_000);
  let split: SplitTopology | undefined;
  let tmp: string;
  let agent: Proc | undefined;
  let ctrl: Proc | undefined;
  let fx: Fluxctl | undefined;
  let upSince = 0;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    split = await startSplit('fluxvm-split-standby-', 'node-s');
    ({ tmp, agent, ctrl, fx } = split);
    upSince = split.agentUpAt;
  });

  after(async () => {
    if (fx) await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
    await stopSplit(split);
  });

  const phase = async (name: string): Promise<any> => (await api(fx!, 'GET', `${SBX}/${name}`)).json;

  it('idle time counts from the Running of the sandbox, not from the start of the agent: Running first, Standby only idleSeconds after', async () => {
    const secs = 3;
    const t = await createAndTimeStandby(fx!, 'split-late-idler', secs, upSince, { runtime: 'procbox' });
    expect(t.phases, 'Running before Standby').to.include('Running');
    expect(t.phases.indexOf('Running')).to.be.lessThan(t.phases.indexOf('Standby'));
    // The create request precedes the Running, so standby before secs after it is too early.
    expect(t.standbyAfterMs, `Standby ${t.standbyAfterMs} ms after the create`).to.be.at.least(secs * 1000);
  });

  it('an idle sandbox goes to Standby (frozen on the agent); an exec through the API server wakes it; idle again, Standby again', async () => {
    const uid = await makeSandbox(fx!, 'split-idler', { runtime: 'procbox', idleSeconds: 1 });
    await exec(fx!, 'split-idler', `(${COUNTER_LOOP}) >/dev/null 2>&1 </dev/null &`);
    const rec = path.join(tmp, 'agent', 'runtime', 'procbox', 'sandboxes', uid, 'sandbox.json');
    const pid = JSON.parse(fs.readFileSync(rec, 'utf8')).pid as number;
    await eventually(() => counter(pid) > 2, 10_000, 'the counter loop to run');
    // Standby and frozen at once: the exec above may have woken a sandbox that went on standby
    // right after its create, so a status that says Standby alone may be stale.
    let last: any;
    await eventually(
      async () => {
        last = await phase('split-idler');
        return last?.status?.phase === 'Standby' && kernelFrozen(pid);
      },
      30_000,
      `phase Standby and frozen (last: ${JSON.stringify(last?.status?.conditions)})`,
    );
    const ready = last.status.conditions.find((c: any) => c.type === 'Ready');
    expect(ready).to.include({ status: 'True', reason: 'Standby' });
    const at = counter(pid);
    const t0 = Date.now();
    await eventually(() => Date.now() - t0 >= 500, 2000, 'the observation window');
    expect(counter(pid), 'the counter does not advance while frozen').to.equal(at);

    const r = await exec(fx!, 'split-idler', 'echo woken');
    expect(r.exitCode).to.equal(0);
    expect(r.stdout.trim()).to.equal('woken');
    expect(kernelFrozen(pid)).to.equal(false);
    await eventually(() => counter(pid) > at + 2, 10_000, 'the counter to advance after the wake');
    // Frozen again: only a controller that learned of the wake (through the agent's client) asks
    // for standby again; one that did not leaves status Standby over a running sandbox.
    await eventually(
      async () => (await phase('split-idler'))?.status?.phase === 'Standby' && kernelFrozen(pid),
      30_000,
      'on standby again (phase Standby and frozen)',
    );
  });
});
