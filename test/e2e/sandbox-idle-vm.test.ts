// End to end against a real `fluxctl serve`: idle standby and wake of a vm Sandbox (
// native/vm/idle.ts). A vm Sandbox with spec.idleSeconds goes to phase Standby once idle with the vm
// record saying standby (that QEMU is really paused is checked by test/native/vm/idle.test.ts: serve
// holds the QMP socket here); an exec wakes it and returns its output.
// Skipped without QEMU.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startFluxctl, type Fluxctl } from './harness.js';
import { api, exec, kubectlOk, sandboxSkipReason, sandboxYaml, skipWith } from './sandbox-helpers.js';
import { eventually } from '../support/wait.js';
import { qemuInstalled } from '../../native/vm/qemu.js';

/** The vm record's standby flag (native/vm/idle.ts writes it before QMP stop; serve holds the QMP socket). */
function standbyRecord(stateDir: string, uid: string): boolean {
  const meta = JSON.parse(readFileSync(join(stateDir, 'runtime', 'vm', 'vms', uid, 'vm.json'), 'utf8'));
  return meta.standby === true;
}

describe('e2e: idle standby and wake (vm)', function () {
  this.timeout(900_000);
  let fx: Fluxctl | undefined;

  before(async function () {
    skipWith(
      this,
      sandboxSkipReason() ??
        (qemuInstalled() ? undefined : 'qemu-system-x86_64 / qemu-img not installed (run hack/setup.sh)'),
    );
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
  });
  after(async () => {
    if (!fx) return;
    await fx.kubectl(['delete', 'sbx', '--all', '--wait=true', '--timeout=120s'], { timeoutMs: 130_000 });
    await fx.stop();
  });

  it('a vm Sandbox goes to Standby (the record says standby); an exec wakes it', async () => {
    await kubectlOk(fx!, ['apply', '-f', '-'], sandboxYaml('v', { runtime: 'vm', idleSeconds: 1 }));
    const w = await fx!.kubectl(['wait', 'sbx/v', '--for=condition=Ready', '--timeout=600s'], { timeoutMs: 620_000 });
    expect(w.code, w.stderr).to.equal(0);
    const uid = (await kubectlOk(fx!, ['get', 'sbx', 'v', '-o', 'jsonpath={.metadata.uid}'])).trim();
    const phase = async () =>
      (await api(fx!, 'GET', '/apis/fluxvm.dev/v1alpha1/namespaces/default/sandboxes/v')).json?.status?.phase;
    await eventually(async () => (await phase()) === 'Standby', 60_000, 'sandbox v to reach phase Standby');
    expect(standbyRecord(fx!.stateDir, uid)).to.equal(true);
    const r = await exec(fx!, 'v', ['echo', 'awake']);
    expect(r.stdout).to.equal('awake\n');
    expect(standbyRecord(fx!.stateDir, uid)).to.equal(false);
  });
});
