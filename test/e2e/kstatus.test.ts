// kstatus: what a GitOps tool reading kstatus (test/kstatus.ts, the published
// generic rules) sees for every kind against a real `fluxctl serve` (procbox): Current for a
// running or paused sandbox, a taken checkpoint, a reviewable or decided changeset (also when
// its command failed or timed out); InProgress while a source or a sandbox is awaited; Failed
// for what will not fix itself (unsupported source, expiry, a memory checkpoint on procbox, an
// apply refused for drift). Plus the spec rules that keep status honest: a spec field that is
// not realized on a running sandbox is a 422, and a changeset cannot be created decided.
import { expect } from 'chai';
import { kstatus, type KStatus } from '../kstatus.js';
import { startFluxctl, type Fluxctl } from './harness.js';
import {
  api,
  eventually,
  exec,
  kubectlOk,
  makeSandbox,
  sandboxSkipReason,
  sandboxYaml,
  skipWith,
} from './sandbox-helpers.js';

const CS = '/apis/fluxvm.dev/v1alpha1/namespaces/default/changesets';

describe('e2e: kstatus reads every kind correctly', function () {
  this.timeout(240_000);
  let fx: Fluxctl;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    await makeSandbox(fx, 'ks-run');
  });
  after(async () => {
    if (fx) expect(await fx.stop()).to.equal(0, fx.logs());
  });

  const get = async (kind: string, name: string) => JSON.parse(await kubectlOk(fx, ['get', kind, name, '-o', 'json']));

  /** Polls until kstatus says `want` (with `reason`, when given); returns the object. */
  async function until(kind: string, name: string, want: KStatus, reason?: string, ms = 60_000): Promise<any> {
    let last: unknown;
    return eventually(
      async () => {
        const o = await get(kind, name);
        const k = kstatus(o);
        last = { k, status: o.status };
        return k.status === want && (reason === undefined || k.reason === reason) ? o : undefined;
      },
      ms,
      `${kind}/${name} kstatus ${want}${reason ? ` (${reason})` : ''}; last: ${JSON.stringify(last)}`,
    ).catch((e) => {
      throw new Error(`${(e as Error).message}; last ${JSON.stringify(last)}`);
    });
  }

  async function createCs(name: string, spec: Record<string, unknown>) {
    const r = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name },
        spec: { sandboxRef: { name: 'ks-run' }, ...spec },
      },
    });
    return r;
  }

  it('Sandbox: Running is Current, paused is Current (Ready=True Paused), a git source is Failed, a missing fork parent is InProgress, expiry is Failed', async () => {
    const run = await until('sbx', 'ks-run', 'Current');
    expect(run.status.conditions.find((c: any) => c.type === 'Ready')).to.include({
      status: 'True',
      reason: 'Running',
      observedGeneration: run.metadata.generation,
    });

    await kubectlOk(fx, ['patch', 'sbx', 'ks-run', '--type=merge', '-p', '{"spec":{"paused":true}}']);
    const paused = await eventually(
      async () => {
        const o = await get('sbx', 'ks-run');
        return o.status.phase === 'Paused' && kstatus(o).status === 'Current' ? o : undefined;
      },
      30_000,
      'paused sandbox Current',
    );
    expect(paused.status.conditions.find((c: any) => c.type === 'Ready')).to.include({
      status: 'True',
      reason: 'Paused',
    });
    await kubectlOk(fx, ['patch', 'sbx', 'ks-run', '--type=merge', '-p', '{"spec":{"paused":false}}']);
    await eventually(async () => (await get('sbx', 'ks-run')).status.phase === 'Running', 30_000, 'resumed');

    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('ks-git', { workspace: { source: { git: { url: 'https://example.com/r.git' } } } }),
    );
    await until('sbx', 'ks-git', 'Failed', 'CloneFailed'); // no network: the clone cannot reach example.com

    await kubectlOk(
      fx,
      ['apply', '-f', '-'],
      sandboxYaml('ks-orphan', { workspace: { source: { sandboxRef: { name: 'ks-nobody' } } } }),
    );
    await until('sbx', 'ks-orphan', 'InProgress', 'SourceNotFound');

    await kubectlOk(fx, ['apply', '-f', '-'], sandboxYaml('ks-ttl', { ttlSeconds: 2 }));
    await until('sbx', 'ks-ttl', 'Failed', 'Expired');
  });

  it('Sandbox: a spec field that is not realized on a running sandbox (env, resources, network mode) is a 422 naming it', async () => {
    for (const [patch, field] of [
      ['{"spec":{"env":[{"name":"A","value":"1"}]}}', 'spec.env'],
      ['{"spec":{"resources":{"pids":99}}}', 'spec.resources'],
      ['{"spec":{"network":{"mode":"open"}}}', 'spec.network.mode'],
    ] as const) {
      const r = await fx.kubectl(['patch', 'sbx', 'ks-run', '--type=merge', '-p', patch]);
      expect(r.code, patch).to.not.equal(0);
      expect(r.stderr, patch).to.contain(`is invalid: ${field}`);
    }
    const o = await get('sbx', 'ks-run');
    expect(o.spec.env ?? []).to.deep.equal([]);
    expect(kstatus(o).status).to.equal('Current');
  });

  it('Checkpoint: a disk checkpoint is Current, one of a missing sandbox InProgress, a memory checkpoint on procbox Failed', async () => {
    const ck = (name: string, spec: Record<string, unknown>) =>
      JSON.stringify({ apiVersion: 'fluxvm.dev/v1alpha1', kind: 'Checkpoint', metadata: { name }, spec });
    await kubectlOk(fx, ['apply', '-f', '-'], ck('ks-disk', { sandboxRef: { name: 'ks-run' } }));
    const d = await until('checkpoint', 'ks-disk', 'Current');
    expect(d.status.readyToUse).to.equal(true);
    await kubectlOk(fx, ['apply', '-f', '-'], ck('ks-wait', { sandboxRef: { name: 'ks-nobody' } }));
    await until('checkpoint', 'ks-wait', 'InProgress', 'SandboxNotFound');
    await kubectlOk(fx, ['apply', '-f', '-'], ck('ks-mem', { sandboxRef: { name: 'ks-run' }, memory: true }));
    await until('checkpoint', 'ks-mem', 'Failed', 'MemoryCheckpointUnsupported');
  });

  it('Changeset: created decided is 422; waiting is InProgress; a failed or timed out command is Current and reviewable (Result column); decided is Current; drift refusal and expiry are Failed', async () => {
    for (const spec of [{ decision: 'Approve' }, { decision: 'Approve', apply: true }, { decision: 'Reject' }]) {
      const r = await createCs('ks-decided', { command: ['true'], ...spec });
      expect(r.status, JSON.stringify(spec)).to.equal(422);
      expect(r.json.reason).to.equal('Invalid');
      expect(r.json.details.causes.map((c: any) => c.field)).to.include('spec.decision');
    }
    expect((await api(fx, 'GET', `${CS}/ks-decided`)).status).to.equal(404);

    const w = await api(fx, 'POST', CS, {
      body: {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: 'ks-wait' },
        spec: { sandboxRef: { name: 'ks-nobody' }, command: ['true'], ttlSeconds: 3 },
      },
    });
    expect(w.status).to.equal(201);
    await until('cs', 'ks-wait', 'InProgress', 'SandboxNotReady');
    await until('cs', 'ks-wait', 'Failed', 'Expired');

    const created = await createCs('ks-fail', { command: ['sh', '-c', 'echo x > /work/x.txt; exit 3'] });
    expect(created.status).to.equal(201);
    // The object as created, before any controller pass: in progress, never Current (no status
    // at all would read Current under the kstatus rules).
    expect(kstatus(created.json)).to.deep.include({ status: 'InProgress' });
    const f = await until('cs', 'ks-fail', 'Current');
    expect(f.status.phase).to.equal('Pending');
    expect(f.status.result).to.equal('CommandFailed');
    expect(f.status.conditions.find((c: any) => c.type === 'Ready')).to.include({
      status: 'True',
      reason: 'CommandFailed',
      observedGeneration: f.metadata.generation,
    });
    expect(Date.parse(f.status.startedAt)).to.be.at.most(Date.parse(f.status.finishedAt));
    const table = await kubectlOk(fx, ['get', 'cs', 'ks-fail']);
    expect(table.split('\n')[0]).to.match(/\bRESULT\b/);
    expect(table.split('\n')[1]).to.match(/\bCommandFailed\b/);

    expect((await createCs('ks-slow', { command: ['sh', '-c', 'sleep 30'], timeoutSeconds: 1 })).status).to.equal(201);
    const t = await until('cs', 'ks-slow', 'Current');
    expect(t.status.result).to.equal('TimedOut');
    expect(t.status.conditions.find((c: any) => c.type === 'Ready').reason).to.equal('TimedOut');

    // Approve: Current again at the new generation.
    await kubectlOk(fx, ['patch', 'cs', 'ks-fail', '--type=merge', '-p', '{"spec":{"decision":"Approve"}}']);
    const a = await eventually(
      async () => {
        const o = await get('cs', 'ks-fail');
        return o.status.phase === 'Approved' && kstatus(o).status === 'Current' ? o : undefined;
      },
      30_000,
      'approved changeset Current',
    );
    expect(a.status.observedGeneration).to.equal(a.metadata.generation);

    // Apply refused for drift: Stalled (kstatus Failed) until someone acts.
    await exec(fx, 'ks-run', 'echo base > /work/d.txt');
    expect((await createCs('ks-drift', { command: ['sh', '-c', 'echo spec > /work/d.txt'] })).status).to.equal(201);
    await until('cs', 'ks-drift', 'Current');
    await exec(fx, 'ks-run', 'echo drift > /work/d.txt');
    await kubectlOk(fx, [
      'patch',
      'cs',
      'ks-drift',
      '--type=merge',
      '-p',
      '{"spec":{"decision":"Approve","apply":true}}',
    ]);
    const stalled = await until('cs', 'ks-drift', 'Failed', 'BaseDrifted');
    expect(stalled.status.phase).to.equal('Approved');
    expect((await exec(fx, 'ks-run', 'cat /work/d.txt')).stdout).to.equal('drift\n');
  });
});
