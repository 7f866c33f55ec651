// The AgentSession reconciler against the real API registry, SQLite, the garbage collector,
// the Sandbox controller and procbox: the owned Sandbox, phases and conditions, capabilities
// from the runtime, the compiled policy, strict/bestEffort refusals (nothing half-created),
// expiry (sandbox deleted, record and ledger kept) and deletion through the collector.
import { expect } from 'chai';
import { agentSessionsGVR } from '../../../controllers/agentsession/index.js';
import { checkpointsGVR, sandboxesGVR } from '../../../controllers/common/kinds.js';
import { skipWith } from '../../skip.js';
import { makeEnv, skipReason, type Env } from './env.js';
import type { Checkpoint } from '../../../apis/zz_generated.types.js';
import { eventually } from '../../support/wait.js';

const cond = (o: any, type: string) => (o.status?.conditions ?? []).find((c: any) => c.type === type);
const EVENTS = { group: '', version: 'v1', resource: 'events' };

describe('controllers/agentsession reconciler', function () {
  this.timeout(60_000);
  let env: Env;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
  });
  after(async () => env?.close());

  it('creates and owns one Sandbox named after the session; Running with Ready, capabilities and the compiled policy', async () => {
    const s = await env.session('alpha');
    const run = await env.until('alpha', (o) => o.status?.phase === 'Running');
    const sbx = (await env.sandbox('alpha'))!;
    expect(sbx.metadata.ownerReferences).to.deep.equal([
      {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        name: 'alpha',
        uid: s.metadata.uid,
        controller: true,
        blockOwnerDeletion: true,
      },
    ]);
    expect(sbx.status?.phase).to.equal('Running');
    expect(sbx.spec.network).to.deep.equal({ mode: 'open' });
    expect(run.status!.sandbox).to.deep.equal({ name: 'alpha', uid: sbx.metadata.uid });
    expect(run.status!.observedGeneration).to.equal(run.metadata.generation);
    expect(cond(run, 'Ready')).to.include({ status: 'True', reason: 'Running' });
    expect(cond(run, 'Reconciling')).to.include({ status: 'False' });
    expect(cond(run, 'Stalled')).to.include({ status: 'False' });
    const caps = env.rt.capabilities();
    expect(run.status!.capabilities).to.include({
      backend: 'procbox',
      checkpoint: caps.diskCheckpoint,
      memoryCheckpoint: caps.memoryCheckpoint,
      fork: caps.fork,
      confinement: caps.confinement?.paths ?? false,
      execAllowlist: caps.confinement?.execAllowlist ?? false,
      httpPolicy: false,
    });
    expect(run.status!.compiledPolicy).to.deep.include({ offline: false, networkMode: 'open', allowHosts: [] });
    expect(Date.parse(run.status!.expiresAt) - Date.parse(run.metadata.creationTimestamp!)).to.equal(3600_000);
    const ledger = await env.ledger.read(s.metadata.uid!);
    expect(ledger.map((e) => e.kind)).to.deep.equal(['session.create']);
    expect(ledger[0]).to.include({ entry: 1, agent: 'test-agent', backend: 'procbox', sandbox: 'alpha' });
  });

  it('deleting the session deletes its Sandbox (garbage collector) and its state', async () => {
    const s = await env.session('beta');
    await env.until('beta', (o) => o.status?.phase === 'Running');
    const sbxUid = (await env.sandbox('beta'))!.metadata.uid!;
    await env.client.delete(agentSessionsGVR, 'default', 'beta');
    await env.untilGone(agentSessionsGVR, 'beta');
    await env.untilGone(sandboxesGVR, 'beta');
    expect((await env.rt.list()).map((i) => i.id)).to.not.include(sbxUid);
    expect(env.state.exists(s.metadata.uid!)).to.equal(false);
  });

  it('strict: an allow-list procbox cannot enforce fails the session with the reason and creates no Sandbox', async () => {
    await env.session('strict', { policy: { preset: 'developerSafe' } });
    const f = await env.until('strict', (o) => o.status?.phase === 'Failed');
    expect(cond(f, 'Stalled')).to.include({ status: 'True', reason: 'PolicyNotEnforceable' });
    expect(cond(f, 'Ready')).to.include({ status: 'False', reason: 'PolicyNotEnforceable' });
    expect(f.status!.message).to.match(/allow-list \(11 hosts\) cannot be enforced by the procbox backend/);
    expect(await env.sandbox('strict')).to.equal(undefined);
  });

  it('bestEffort: the same policy runs without network (fails closed) and says so', async () => {
    const s = await env.session('besteffort', {
      policy: { preset: 'developerSafe', network: { enforcement: 'bestEffort' } },
    });
    const r = await env.until('besteffort', (o) => o.status?.phase === 'Running');
    expect(r.status!.compiledPolicy).to.deep.include({ offline: true, networkMode: 'none' });
    expect((await env.sandbox('besteffort'))!.spec.network).to.deep.equal({ mode: 'none' });
    const kinds = (await env.ledger.read(s.metadata.uid!)).map((e) => e.kind);
    expect(kinds).to.deep.equal(['session.create', 'policy.unenforced']);
  });

  it('a readonly workspace and filesystem.write reach the Sandbox confinement; the kernel refuses writes below it', async function () {
    if (!env.rt.capabilities().confinement?.paths)
      return skipWith(
        this,
        'procbox here has no Landlock per-path rules (the refusal is table-tested in policy.test.ts)',
      );
    await env.session('ro', { workspace: { mode: 'readonly' }, policy: { filesystem: { write: ['/work/out/**'] } } });
    const r = await env.until('ro', (o) => o.status?.phase === 'Running');
    expect(r.status!.capabilities).to.include({ confinement: true });
    expect(r.status!.compiledPolicy!.filesystem).to.deep.equal({
      read: [],
      write: ['/work/out/**'],
      workspaceReadOnly: true,
    });
    const sbx = (await env.sandbox('ro'))!;
    expect(sbx.spec.confinement).to.deep.include({
      workspaceReadOnly: true,
      writePaths: ['/work/out/**'],
      enforcement: 'strict',
    });
    const w = await env.rt.exec(sbx.metadata.uid!, {
      argv: ['sh', '-c', 'echo x > /work/f; echo y > /tmp/f && cat /tmp/f'],
    });
    expect(w.stderr.toString()).to.match(/\/work\/f: (Permission denied|Read-only file system)/); // a read-only mount
    expect(w.stdout.toString()).to.equal('y\n');
  });

  it('process.enforce exec: the programs resolved in the sandbox at create, in status; the message says what stays a string rule', async function () {
    if (!env.rt.capabilities().confinement?.execAllowlist)
      return skipWith(this, 'procbox here has no Landlock (the refusal is table-tested in policy.test.ts)');
    const s = await env.session('enf', {
      policy: { process: { allow: ['python3 *', 'sh *'], deny: ['python3 -c*os.system*'], enforce: 'exec' } },
    });
    const r = await env.until('enf', (o) => o.status?.phase === 'Running');
    expect(r.status!.capabilities).to.include({ execAllowlist: true });
    const p = r.status!.compiledPolicy!.process!;
    expect(p.enforce).to.equal('exec');
    expect(p.executables!.map((e: any) => [e.name, e.path])).to.deep.equal([
      ['python3', '/usr/bin/python3'],
      ['sh', '/usr/bin/sh'],
    ]);
    expect(p.executables![0]!.realPath).to.match(/^\/usr\/bin\/python3\.\d+$/);
    expect(p.alwaysAllowed).to.include('/bin/sh');
    expect(p.alwaysAllowed!.some((x: string) => /ld-linux/.test(x))).to.equal(true);
    expect(r.status!.message).to.match(
      /enforce exec: the kernel lets only python3, sh start .*deny and argument patterns stay string rules/,
    );
    expect((await env.sandbox('enf'))!.spec.confinement.execAllow).to.deep.equal(['python3', 'sh']);
    const create = (await env.ledger.read(s.metadata.uid!)).find((e) => e.kind === 'session.create')!;
    expect(create.executables).to.have.length(2);
  });

  it('process.enforce exec naming a program the sandbox does not have: Failed with the reason, no Sandbox left', async function () {
    if (!env.rt.capabilities().confinement?.execAllowlist) return skipWith(this, 'procbox here has no Landlock');
    await env.session('enf-missing', { policy: { process: { allow: ['no-such-program-xyz *'], enforce: 'exec' } } });
    const f = await env.until('enf-missing', (o) => o.status?.phase === 'Failed');
    expect(cond(f, 'Stalled')).to.include({ status: 'True', reason: 'PolicyNotEnforceable' });
    expect(f.status!.message).to.match(
      /no-such-program-xyz is not an executable file in the sandbox \(bare names are looked up in \/usr\/local\/sbin:/,
    );
    await env.untilGone(sandboxesGVR, 'enf-missing');
  });

  it('a Sandbox of the same name that the session does not own is left alone: Failed SandboxNameTaken', async () => {
    await env.client.create(sandboxesGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Sandbox',
      metadata: { name: 'taken', namespace: 'default' },
      spec: {},
    });
    await env.session('taken');
    const f = await env.until('taken', (o) => o.status?.phase === 'Failed');
    expect(cond(f, 'Stalled')).to.include({ reason: 'SandboxNameTaken' });
    const sbx = (await env.sandbox('taken'))!;
    expect(sbx.metadata.deletionTimestamp).to.equal(undefined);
    expect(sbx.metadata.ownerReferences ?? []).to.deep.equal([]);
  });

  it('expires at ttlSeconds: phase Expired, the Sandbox deleted, the record and ledger kept', async () => {
    const s = await env.session('short', { ttlSeconds: 3 });
    // A loaded host may show the session first when it has expired, or expire it before its first
    // pass made the sandbox (then the ledger has no session.create: nothing was created).
    const first = await env.until('short', (o) => o.status?.phase === 'Running' || o.status?.phase === 'Expired');
    const e = await env.until('short', (o) => o.status?.phase === 'Expired', 15_000);
    expect(cond(e, 'Ready')).to.include({ status: 'False', reason: 'Expired' });
    await env.untilGone(sandboxesGVR, 'short');
    const kinds = (await env.ledger.read(s.metadata.uid!)).map((x) => x.kind);
    if (first.status?.phase === 'Running') expect(kinds).to.deep.equal(['session.create', 'session.expire']);
    else expect(kinds.filter((k) => k !== 'session.create')).to.deep.equal(['session.expire']);
    expect((await env.get('short')).status!.phase).to.equal('Expired');
  });

  it('ttl bounds at the schema edge: 1 and 2592000 accepted, 0 and 2592001 refused (422 naming spec.ttlSeconds)', async () => {
    for (const [ttl, ok] of [
      [1, true],
      [2592000, true],
      [0, false],
      [2592001, false],
    ] as const) {
      const p = env.client.create(
        agentSessionsGVR,
        'default',
        {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'AgentSession',
          metadata: { name: `ttl-${ttl}`, namespace: 'default' },
          spec: { agent: 'a', ttlSeconds: ttl },
        },
        { dryRun: true } as any,
      );
      if (ok) await p;
      else {
        const err: any = await p.then(
          () => undefined,
          (x) => x,
        );
        expect(err?.code, String(ttl)).to.equal(422);
        expect(err.message).to.match(/spec\.ttlSeconds/);
      }
    }
  });

  it('a Sandbox deleted under a running session is reported (Failed, Stalled SandboxLost, a Warning Event, ledgered), not re-created empty', async () => {
    const s = await env.session('lost');
    const run = await env.until('lost', (o) => o.status?.phase === 'Running' && !!o.status?.sandbox?.uid);
    const old = (await env.sandbox('lost'))!;
    expect(run.status!.sandbox).to.deep.equal({ name: 'lost', uid: old.metadata.uid });
    expect(
      (await env.rt.exec(old.metadata.uid!, { argv: ['sh', '-c', 'echo work > /work/agent-work'] })).exitCode,
    ).to.equal(0);
    await env.client.delete(sandboxesGVR, 'default', 'lost');
    const f = await env.until('lost', (o) => o.status?.phase === 'Failed');
    expect(cond(f, 'Stalled')).to.include({ status: 'True', reason: 'SandboxLost' });
    expect(cond(f, 'Ready')).to.include({ status: 'False', reason: 'SandboxLost' });
    expect(f.status!.message).to.match(
      /^the sandbox lost (\(uid [-0-9a-f]+\) the session ran in was deleted|of the session was deleted under it \(uid [-0-9a-f]+\)): its workspace and processes are gone, and the session is not given a new, empty sandbox/,
    );
    expect(f.status!.sandbox).to.deep.equal({ name: 'lost', uid: old.metadata.uid });
    await env.untilGone(sandboxesGVR, 'lost');
    // the recorder writes the Event after the status
    const ev: any = await eventually(
      async () =>
        (await env.client.list(EVENTS, 'default')).items.find(
          (x: any) =>
            x.involvedObject?.name === 'lost' &&
            x.involvedObject?.kind === 'AgentSession' &&
            x.reason === 'SandboxLost',
        ),
      5000,
      'a SandboxLost Event',
    );
    expect(ev).to.include({ type: 'Warning' });
    expect(ev.message).to.equal(f.status!.message);
    const led = await env.ledger.read(s.metadata.uid!);
    expect(led.map((e) => e.kind)).to.deep.equal(['session.create', 'session.fail']);
    expect(led[1]).to.include({ reason: 'SandboxLost' });
    // Another pass (a spec-less change wakes it) still creates nothing.
    await env.client.patch(agentSessionsGVR, 'default', 'lost', 'merge', { metadata: { labels: { poke: '1' } } });
    await env.until('lost', (o) => o.metadata.labels?.poke === '1' && o.status?.phase === 'Failed');
    expect(await env.sandbox('lost')).to.equal(undefined);
    expect((await env.rt.list()).map((i) => i.id)).to.not.include(old.metadata.uid);
  });

  it('forkOf.checkpointRef: the child starts from that Checkpoint of the parent, not from the parent as it is now', async () => {
    await env.session('ckp');
    await env.until('ckp', (o) => o.status?.phase === 'Running');
    const parent = (await env.sandbox('ckp'))!;
    const sh = async (id: string, c: string) => (await env.rt.exec(id, { argv: ['sh', '-c', c] })).stdout.toString();
    await sh(parent.metadata.uid!, 'echo v1 > /work/f');
    await env.client.create(checkpointsGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name: 'ckp-v1', namespace: 'default' },
      spec: { sandboxRef: { name: 'ckp' } },
    });
    const poll = async (what: string, f: () => Promise<boolean>) => {
      await eventually(f, 20_000, what);
    };
    await poll(
      'checkpoint ready',
      async () => !!(await env.client.get<Checkpoint>(checkpointsGVR, 'default', 'ckp-v1')).status?.readyToUse,
    );
    await sh(parent.metadata.uid!, 'echo v2 > /work/f; echo new > /work/g');
    await env.session('ckp-b', { forkOf: { name: 'ckp', checkpointRef: { name: 'ckp-v1' } } });
    const child = await env.until('ckp-b', (o) => o.status?.phase === 'Running');
    const csbx = (await env.sandbox('ckp-b'))!;
    expect(await sh(csbx.metadata.uid!, 'cat /work/f; ls /work')).to.equal('v1\nf\n');
    expect(csbx.spec.workspace.source).to.deep.equal({ checkpointRef: { name: 'ckp-v1' } });
    expect(await sh(parent.metadata.uid!, 'cat /work/f')).to.equal('v2\n');
    expect(child.status!.phase).to.equal('Running');
    // A Checkpoint of another sandbox is not the parent's: the child fails, no Sandbox.
    await env.session('ckp-other');
    await env.until('ckp-other', (o) => o.status?.phase === 'Running');
    await env.client.create(checkpointsGVR, 'default', {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Checkpoint',
      metadata: { name: 'other-ck', namespace: 'default' },
      spec: { sandboxRef: { name: 'ckp-other' } },
    });
    await env.session('ckp-bad', { forkOf: { name: 'ckp', checkpointRef: { name: 'other-ck' } } });
    const bad = await env.until('ckp-bad', (o) => o.status?.phase === 'Failed');
    expect(cond(bad, 'Stalled')).to.include({ status: 'True', reason: 'InvalidCheckpoint' });
    expect(bad.status!.message).to.equal(
      "forkOf.checkpointRef: checkpoint other-ck is of sandbox ckp-other, not of the parent session's sandbox ckp",
    );
    expect(await env.sandbox('ckp-bad')).to.equal(undefined);
  });

  it('spec.rewind at admission: enabled passes; maxPoints 1 and 1000 pass, 0 and 1001 are 422 naming the field', async () => {
    const create = (spec: Record<string, unknown>) =>
      env.client.create(
        agentSessionsGVR,
        'default',
        {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'AgentSession',
          metadata: { name: 'nyet', namespace: 'default' },
          spec: { agent: 'a', ...spec },
        },
        { dryRun: true } as any,
      );
    for (const maxPoints of [0, 1001]) {
      const err: any = await create({ rewind: { enabled: true, maxPoints } }).then(
        () => undefined,
        (x) => x,
      );
      expect(err?.code, String(maxPoints)).to.equal(422);
      expect(err.status.reason).to.equal('Invalid');
      expect(err.status.details.causes.map((c: any) => c.field)).to.deep.equal(['spec.rewind.maxPoints']);
    }
    // Rewind exists: enabled passes, at the ring's edges; the budget limits (the job limits too).
    await create({ rewind: { enabled: true, maxPoints: 1 } });
    await create({ rewind: { enabled: true, maxPoints: 1000, triggers: ['exec', 'fileWrite', 'git'] } });
    await create({
      rewind: { enabled: false },
      budget: { maxExecs: 1, maxChildren: 0, maxJobs: 1, maxConcurrentJobs: 2 },
    });
  });
});
