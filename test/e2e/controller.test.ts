// End to end with the real kubectl against `fluxctl serve --test-controller`: wait for a
// condition and for deletion, the observedGeneration rule, finalizers during deletion, and
// the controller's Events in describe.
import { expect } from 'chai';
import { startFluxctl, type Fluxctl } from './harness.js';
import { eventually } from '../support/wait.js';
import { haveKubectl } from './kubectl.js';
import { skipWith } from './sandbox-helpers.js';

function sandbox(name: string, opts: { finalizer?: boolean; hold?: boolean; paused?: boolean } = {}): string {
  return JSON.stringify({
    apiVersion: 'fluxvm.dev/v1alpha1',
    kind: 'Sandbox',
    metadata: {
      name,
      ...(opts.finalizer ? { finalizers: ['fluxvm.dev/test'] } : {}),
      ...(opts.hold ? { annotations: { 'fluxvm.dev/test-hold': 'true' } } : {}),
    },
    spec: { runtime: 'procbox', paused: !!opts.paused },
  });
}

describe('e2e: controller machinery through kubectl', function () {
  this.timeout(120_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, haveKubectl() ? undefined : 'no kubectl binary');
    fx = await startFluxctl({ args: ['--test-controller'] });
  });
  after(async () => {
    if (fx) expect(await fx.stop()).to.equal(0, fx.logs());
  });

  async function ok(args: string[], input?: string) {
    const r = await fx.kubectl(args, { input });
    expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).to.equal(0);
    return r;
  }

  it('kubectl wait --for=condition=Ready completes once the controller sets Ready', async () => {
    await ok(['apply', '-f', '-'], sandbox('ready1'));
    const r = await ok(['wait', 'sbx/ready1', '--for=condition=Ready', '--timeout=20s']);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/ready1 condition met\n');
    const g = await ok([
      'get',
      'sbx',
      'ready1',
      '-o',
      'jsonpath={.status.observedGeneration} {.status.conditions[0].observedGeneration}',
    ]);
    expect(g.stdout).to.equal('1 1');
  });

  it('a Ready condition with a stale observedGeneration does not satisfy wait', async () => {
    await ok(['apply', '-f', '-'], sandbox('stale1'));
    await ok(['wait', 'sbx/stale1', '--for=condition=Ready', '--timeout=20s']);
    // Hold the controller, then change the spec: generation 2, Ready still says generation 1.
    await ok(['annotate', 'sbx', 'stale1', 'fluxvm.dev/test-hold=true']);
    await ok(['patch', 'sbx', 'stale1', '--type', 'merge', '-p', '{"spec":{"paused":true}}']);
    const obj = JSON.parse((await ok(['get', 'sbx', 'stale1', '-o', 'json'])).stdout);
    expect(obj.metadata.generation).to.equal(2);
    expect(obj.status.conditions[0]).to.include({ type: 'Ready', status: 'True', observedGeneration: 1 });
    const stale = await fx.kubectl(['wait', 'sbx/stale1', '--for=condition=Ready', '--timeout=2s']);
    expect(stale.code).to.equal(1);
    expect(stale.stderr).to.contain('timed out waiting for the condition');
    // fluxctl's wait applies the same rule.
    const fstale = await fx.fluxctl(['wait', 'sbx/stale1', '--for=condition=Ready', '--timeout=1s']);
    expect(fstale.code).to.equal(1);
    // Release the controller: it observes generation 2 and wait completes.
    const waiting = fx.kubectl(['wait', 'sbx/stale1', '--for=condition=Ready', '--timeout=20s']);
    await ok(['annotate', 'sbx', 'stale1', 'fluxvm.dev/test-hold-']);
    const r = await waiting;
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/stale1 condition met\n');
  });

  it('kubectl delete of an object with a finalizer waits until the controller removes it', async () => {
    await ok(['apply', '-f', '-'], sandbox('fin1', { finalizer: true }));
    await ok(['wait', 'sbx/fin1', '--for=condition=Ready', '--timeout=20s']);
    const t0 = Date.now();
    const r = await ok(['delete', 'sbx', 'fin1', '--timeout=20s']);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev "fin1" deleted\n');
    const gone = await fx.kubectl(['get', 'sbx', 'fin1']);
    expect(gone.code).to.equal(1);
    expect(gone.stderr).to.contain('Error from server (NotFound): sandboxes.fluxvm.dev "fin1" not found');
    expect(Date.now() - t0).to.be.below(15_000);
  });

  it('deletion sets deletionTimestamp, refuses new finalizers, and --for=delete completes when the finalizer goes', async () => {
    await ok(['apply', '-f', '-'], sandbox('fin2', { finalizer: true, hold: true }));
    await ok(['delete', 'sbx', 'fin2', '--wait=false']);
    const obj = JSON.parse((await ok(['get', 'sbx', 'fin2', '-o', 'json'])).stdout);
    expect(obj.metadata.deletionTimestamp).to.be.a('string');
    expect(obj.metadata.finalizers).to.deep.equal(['fluxvm.dev/test']);
    const notYet = await fx.kubectl(['wait', 'sbx/fin2', '--for=delete', '--timeout=1s']);
    expect(notYet.code).to.equal(1);
    const add = await fx.kubectl([
      'patch',
      'sbx',
      'fin2',
      '--type',
      'json',
      '-p',
      '[{"op":"add","path":"/metadata/finalizers/-","value":"example.com/other"}]',
    ]);
    expect(add.code).to.equal(1);
    expect(add.stderr).to.match(/no new finalizers can be added if the object is being deleted/);
    const still = JSON.parse((await ok(['get', 'sbx', 'fin2', '-o', 'json'])).stdout);
    expect(still.metadata.finalizers).to.deep.equal(['fluxvm.dev/test']);
    const watches = await fx.watchCount();
    const waiting = fx.kubectl(['wait', 'sbx/fin2', '--for=delete', '--timeout=20s']);
    // Release the finalizer only once kubectl watches: wait is silent for an object already gone.
    await fx.waitForWatches(watches, { client: waiting });
    await ok(['annotate', 'sbx', 'fin2', 'fluxvm.dev/test-hold-']);
    const r = await waiting;
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stdout).to.equal('sandbox.fluxvm.dev/fin2 condition met\n');
  });

  it('kubectl describe shows the Events the controller recorded', async () => {
    await ok(['apply', '-f', '-'], sandbox('ev1'));
    await ok(['wait', 'sbx/ev1', '--for=condition=Ready', '--timeout=20s']);
    // The Event is written right after the status: poll briefly rather than race it.
    let r = await ok(['describe', 'sbx', 'ev1']);
    await eventually(
      async () => /Normal\s+Ready/.test((r = await ok(['describe', 'sbx', 'ev1'])).stdout),
      10_000,
      'the Ready event in describe sbx ev1',
    );
    expect(r.stdout).to.match(/Events:\n\s+Type\s+Reason\s+Age\s+From\s+Message\n/);
    expect(r.stdout).to.match(
      /Normal\s+Ready\s+\S+\s+fluxvm-test-sandbox-controller\s+sandbox is ready \(generation 1\)/,
    );
    const f = await fx.fluxctl(['describe', 'sbx', 'ev1']);
    expect(f.code, f.stderr).to.equal(0);
    expect(f.stdout).to.match(
      /Normal\s+Ready\s+\S+\s+fluxvm-test-sandbox-controller\s+sandbox is ready \(generation 1\)/,
    );
    expect(f.stdout).to.match(/Conditions:\n\s+Type\s+Status\s+Reason\s+Age\s+Message\n/);
  });
});
