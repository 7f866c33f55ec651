// The agentsessions subresources against the real registry, procbox and the controllers:
// exec (policy 403 exec.refused, budgets at their edges, output cut on a character boundary,
// the timeout from the seconds left, all ledgered), checkpoint/restore (only this session's),
// the lifecycle gate (409 naming the op, on disk, a dead holder -> interruptedOp + one
// lifecycle.interrupted), Idempotency-Key (replay, 422, 409), fork (1-32, budget, children
// from the current state), promote (plan, planId, conflicts, paths) and artifacts.
import { expect } from 'chai';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { skipWith } from '../../skip.js';
import type { AgentSession } from '../../../apis/zz_generated.types.js';
import { agentSessionsGVR } from '../../../controllers/agentsession/gvr.js';
import { mirrorUsage, type AgentSessionSubresourceDeps } from '../../../controllers/agentsession/common.js';
import { makeEnv, skipReason, type Env } from './env.js';

async function status(p: Promise<unknown>): Promise<any> {
  try {
    await p;
  } catch (e) {
    return (e as any).status ?? e;
  }
  throw new Error('expected a refusal');
}

describe('controllers/agentsession subresources', function () {
  this.timeout(90_000);
  let env: Env;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
  });
  after(async () => env?.close());

  const running = async (name: string, spec: Record<string, unknown> = {}) => {
    const s = await env.session(name, spec);
    await env.until(name, (o) => o.status?.phase === 'Running');
    return s.metadata.uid!;
  };
  const kinds = async (uid: string) => (await env.ledger.read(uid)).map((e) => e.kind);

  it('exec runs in the sandbox and is ledgered (command, exit code, duration), fsynced before the answer', async () => {
    const uid = await running('ex');
    const r = await env.call('exec', 'ex', { command: 'echo hi > /work/f; cat /work/f; exit 3' });
    expect(r).to.include({ exitCode: 3, stdout: 'hi\n', outputTruncated: false, timedOut: false });
    const l = await env.ledger.read(uid);
    expect(l[l.length - 1]).to.include({
      kind: 'exec',
      command: 'echo hi > /work/f; cat /work/f; exit 3',
      exitCode: 3,
      entry: r.ledgerEntry,
    });
    expect(l[l.length - 1]!.durationMs).to.be.a('number');
    // status.usage is a mirror written after the answer (the ledger and usage.json are the record): wait for it.
    await env.until('ex', (o) => o.status?.usage?.execs === 1);
  });

  it('the usage mirror is written once for steps that end together, with the newest usage', async () => {
    const uid = await running('mir');
    const s = (await env.get('mir')) as AgentSession;
    const seen: number[] = [];
    const w = env.client.watch<AgentSession>(
      agentSessionsGVR,
      'default',
      { resourceVersion: s.metadata.resourceVersion, fieldSelector: 'metadata.name=mir' },
      (ev) => {
        const n = ev.object.status?.usage?.execs;
        if (typeof n === 'number' && n !== seen.at(-1)) seen.push(n);
      },
    );
    try {
      // Five steps ending together: each counted in usage.json (the record the reconciler also
      // mirrors), then each mirrored as its step does after its answer.
      const us = [];
      for (let i = 0; i < 5; i++) us.push(await env.state.updateUsage(uid, (x) => ({ ...x, execs: x.execs + 1 })));
      const d = { client: env.client } as unknown as AgentSessionSubresourceDeps;
      for (const u of us) mirrorUsage(d, s, u);
      const want = us.at(-1)!.execs;
      await env.until('mir', (o) => o.status?.usage?.execs === want);
      // One write, the newest (before: five writes racing, any of them possibly the last).
      expect(seen).to.deep.equal([want]);
      // A step ending after that write (within its window) is mirrored too, by one more write.
      mirrorUsage(d, s, await env.state.updateUsage(uid, (x) => ({ ...x, execs: x.execs + 1 })));
      await env.until('mir', (o) => o.status?.usage?.execs === want + 1);
      expect(seen).to.deep.equal([want, want + 1]);
    } finally {
      w.stop();
    }
  });

  it('process policy: a denied piece is 403 exec.refused, ledgered, not run; allow needs every piece', async () => {
    const uid = await running('pol', {
      policy: { process: { allow: ['echo *', 'touch *'], deny: ['touch /work/secret*'] } },
    });
    const st = await status(env.call('exec', 'pol', { command: 'echo ok && touch /work/secret' }));
    expect(st).to.include({ code: 403, reason: 'Forbidden' });
    expect(st.message).to.match(
      /^exec\.refused: "touch \/work\/secret" matches policy\.process\.deny "touch \/work\/secret\*"/,
    );
    const st2 = await status(env.call('exec', 'pol', { command: 'echo ok | touch /work/x; id' }));
    expect(st2.message).to.match(/"id" matches no pattern of policy\.process\.allow/);
    expect((await env.call('exec', 'pol', { command: 'echo fine' })).stdout).to.equal('fine\n');
    const files = await env.call('exec', 'pol', { command: 'echo /work/*' });
    expect(files.stdout).to.equal('/work/*\n'); // neither touch ran
    expect(await kinds(uid)).to.deep.equal(['session.create', 'exec.refused', 'exec.refused', 'exec', 'exec']);
  });

  it('maxExecs: at the limit passes, one past is 403 naming the limit and the amount used', async () => {
    const uid = await running('bx', { budget: { maxExecs: 2 } });
    await env.call('exec', 'bx', { command: 'true' });
    await env.call('exec', 'bx', { command: 'true' });
    const st = await status(env.call('exec', 'bx', { command: 'true' }));
    expect(st).to.include({ code: 403, message: 'budget exceeded: budget.maxExecs is 2, the session used 2' });
    expect((await kinds(uid)).slice(-1)).to.deep.equal(['budget.exceeded']);
    expect((await env.state.usage(uid)).execs).to.equal(2);
    // usage.json is a cache: lost (power cut), the next process recounts the fsynced ledger.
    const { rmSync } = await import('node:fs');
    rmSync(join(env.state.sessionDir(uid), 'usage.json'));
    const { SessionState } = await import('../../../controllers/agentsession/state.js');
    const { usageFromLedger } = await import('../../../controllers/agentsession/ledger.js');
    const fresh = new SessionState(env.state.dir, Date.now, undefined, (u) => usageFromLedger(env.ledger, u));
    expect((await fresh.usage(uid)).execs).to.equal(2);
  });

  it('maxOutputBytes cuts each stream on a character boundary with dropped counts (answer and ledger)', async () => {
    const uid = await running('out', { budget: { maxOutputBytes: 5 } });
    // 'aé€' = 1 + 2 + 3 bytes: 5 bytes keep 'aé' (3 bytes), drop 3.
    const r = await env.call('exec', 'out', { command: "printf 'a\\303\\251\\342\\202\\254'; printf 12345 >&2" });
    expect(r).to.include({
      stdout: 'aé',
      stdoutDroppedBytes: 3,
      stderr: '12345',
      stderrDroppedBytes: 0,
      outputTruncated: true,
    });
    const l = await env.ledger.read(uid);
    expect(l[l.length - 1]).to.include({ outputTruncated: true, stdoutDroppedBytes: 3, stderrDroppedBytes: 0 });
  });

  it('maxExecSeconds: a command gets at most the seconds left as its timeout; when none is left, 403', async () => {
    await running('secs', { budget: { maxExecSeconds: 1 } });
    const r = await env.call('exec', 'secs', { command: 'sleep 5', timeoutSeconds: 60 });
    expect(r.timedOut).to.equal(true);
    expect(r.timeoutSeconds).to.equal(1);
    const st = await status(env.call('exec', 'secs', { command: 'true' }));
    expect(st.message).to.match(/^budget exceeded: budget\.maxExecSeconds is 1 s, the session used 1 s$/);
  });

  it('maxWorkspaceBytes: measured when a command starts; at or past it, 403 with the size', async () => {
    await running('ws', { budget: { maxWorkspaceBytes: 64 * 1024 } });
    await env.call('exec', 'ws', { command: 'head -c 200000 /dev/zero > /work/big' });
    const st = await status(env.call('exec', 'ws', { command: 'true' }));
    expect(st.code).to.equal(403);
    expect(st.message).to.match(
      /^budget exceeded: budget\.maxWorkspaceBytes is 65536 bytes, the session used \d+ bytes$/,
    );
  });

  it("checkpoint and restore in place; only this session's checkpoints (another's is 404)", async () => {
    const uid = await running('ck');
    await running('other');
    await env.call('exec', 'ck', { command: 'echo one > /work/v' });
    const ck = await env.call('checkpoint', 'ck', { tag: 'first' });
    expect(ck).to.include({ name: 'first', kind: 'disk' });
    await env.call('exec', 'ck', { command: 'echo two > /work/v; touch /work/later' });
    const oc = await env.call('checkpoint', 'other', { tag: 'theirs' });
    expect(oc.name).to.equal('theirs');
    expect(await status(env.call('restore', 'ck', { tag: 'theirs' }))).to.include({ code: 404, reason: 'NotFound' });
    expect(await status(env.call('checkpoint', 'ck', { tag: 'first' }))).to.include({
      code: 409,
      reason: 'AlreadyExists',
    });
    expect(await status(env.call('checkpoint', 'ck', { tag: 'Bad_Tag' }))).to.include({ code: 400 });
    expect(await status(env.call('checkpoint', 'ck', { memory: true }))).to.include({ code: 400 });
    await env.call('restore', 'ck', { tag: 'first' });
    expect((await env.call('exec', 'ck', { command: 'cat /work/v; ls /work' })).stdout).to.equal('one\nv\n');
    expect((await env.get('ck')).status!.checkpoints!.map((c: any) => c.name)).to.deep.equal(['first']);
    expect((await kinds(uid)).filter((k) => k === 'checkpoint' || k === 'restore')).to.deep.equal([
      'checkpoint',
      'restore',
    ]);
  });

  it('lifecycle gate: one op at a time (409 naming it), exec refused during restore, kept on disk; a dead holder is an interrupted op', async () => {
    const uid = await running('gate');
    const release = await env.state.begin(uid, 'gate', 'restore');
    const st = await status(env.call('checkpoint', 'gate', {}));
    expect(st).to.include({ code: 409 });
    expect(st.message).to.match(/a restore of this session is in flight since/);
    expect((await status(env.call('exec', 'gate', { command: 'true' }))).message).to.match(
      /exec is refused while a restore of this session is in flight/,
    );
    // A second process on the same state directory sees the marker (it is on disk, not only in memory).
    const { SessionState } = await import('../../../controllers/agentsession/state.js');
    const second = new SessionState(env.state.dir);
    expect((await second.inFlight(uid))?.op).to.equal('restore');
    await release();
    await env.call('exec', 'gate', { command: 'true' });
    // A marker left by a process that died (kill -9 mid-fork): reported, once, and the slot is free.
    writeFileSync(
      join(env.state.sessionDir(uid), 'op.json'),
      JSON.stringify({ op: 'fork', startedAt: '2026-01-01T00:00:00.000Z', pid: 2 ** 22 + 7, pidStart: 'x' }),
    );
    await env.client.patch(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'agentsessions' },
      'default',
      'gate',
      'merge',
      { metadata: { labels: { poke: '1' } } },
    );
    const s = await env.until('gate', (o) => !!o.status?.interruptedOp);
    expect(s.status!.interruptedOp).to.deep.equal({ op: 'fork', startedAt: '2026-01-01T00:00:00.000Z' });
    await env.client.patch(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'agentsessions' },
      'default',
      'gate',
      'merge',
      { metadata: { labels: { poke: '2' } } },
    );
    await env.call('exec', 'gate', { command: 'true' });
    expect((await kinds(uid)).filter((k) => k === 'lifecycle.interrupted')).to.have.length(1);
    await env.call('checkpoint', 'gate', {}); // completes: clears interruptedOp
    await env.client.patch(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'agentsessions' },
      'default',
      'gate',
      'merge',
      { metadata: { labels: { poke: '3' } } },
    );
    await env.until('gate', (o) => !o.status?.interruptedOp);
  });

  it('Idempotency-Key: the first 2xx is replayed, a different body is 422, a running key is 409', async () => {
    const uid = await running('idem');
    const h = { 'idempotency-key': 'k1' };
    const a = await env.call('exec', 'idem', { command: 'date +%N' }, { headers: h });
    const b = await env.call('exec', 'idem', { command: 'date +%N' }, { headers: h });
    expect(b).to.deep.equal(a);
    expect((await env.state.usage(uid)).execs).to.equal(1);
    expect(await status(env.call('exec', 'idem', { command: 'true' }, { headers: h }))).to.include({
      code: 422,
      reason: 'Invalid',
    });
    const slowCommand = 'touch /work/k2-started; sleep 1';
    const slow = env.call('exec', 'idem', { command: slowCommand }, { headers: { 'idempotency-key': 'k2' } });
    // The command runs (so its key is taken) once it has touched its marker.
    const sbxId = (await env.sandbox('idem'))!.metadata.uid!;
    for (let i = 0; ; i++) {
      if (
        await env.rt.stat(sbxId, '/work/k2-started').then(
          () => true,
          () => false,
        )
      )
        break;
      if (i > 2000) throw new Error('the first k2 exec never started (polled for 10 s)');
      await new Promise((r) => setTimeout(r, 5)); // polling the marker, not waiting a fixed time
    }
    expect(
      (await status(env.call('exec', 'idem', { command: slowCommand }, { headers: { 'idempotency-key': 'k2' } })))
        .message,
    ).to.match(/still running/);
    await slow;
    const c1 = await env.call('checkpoint', 'idem', { tag: 'c' }, { headers: { 'idempotency-key': 'ck' } });
    expect(await env.call('checkpoint', 'idem', { tag: 'c' }, { headers: { 'idempotency-key': 'ck' } })).to.deep.equal(
      c1,
    );
  });

  it('fork: count 1-32 (0 and 33 are 400), maxChildren, children from the current state with forkOf and the rest of the budget', async () => {
    const uid = await running('par', { budget: { maxChildren: 2, maxExecs: 10 } });
    await env.call('exec', 'par', { command: 'echo parent > /work/p' });
    for (const count of [0, 33, 1.5, 'x'])
      expect(await status(env.call('fork', 'par', { count })), String(count)).to.include({ code: 400 });
    expect(await status(env.call('fork', 'par', { count: 3 }))).to.include({
      code: 403,
      message: 'budget exceeded: budget.maxChildren is 2, the session used 0',
    });
    const f = await env.call('fork', 'par', { count: 2 });
    expect(f.children.map((c: any) => c.name)).to.deep.equal(['par-1', 'par-2']);
    for (const n of ['par-1', 'par-2']) {
      const c = await env.get(n);
      expect(c.status!.phase).to.equal('Running');
      expect(c.spec.forkOf).to.deep.equal({ name: 'par' });
      expect(c.spec.budget).to.deep.equal({ maxChildren: 0, maxExecs: 9 });
      expect((await env.call('exec', n, { command: 'cat /work/p' })).stdout).to.equal('parent\n');
    }
    await env.call('exec', 'par-1', { command: 'echo child > /work/p' });
    expect((await env.call('exec', 'par', { command: 'cat /work/p' })).stdout).to.equal('parent\n');
    expect(await status(env.call('fork', 'par', { count: 1 }))).to.include({ code: 403 });
    expect((await env.get('par')).status!.children!.map((c: any) => c.name)).to.deep.equal(['par-1', 'par-2']);
    expect(await kinds(uid)).to.include('fork');
    // count 32 at the edge is accepted by validation (budget decides): 32 > maxChildren is 403, not 400.
    expect(await status(env.call('fork', 'par', { count: 32 }))).to.include({ code: 403 });
  });

  it('fork identity: what procbox children get (preserve) is honoured and reported; unique, which procbox cannot give, is 422 naming identity and creates nothing', async () => {
    const uid = await running('idn');
    for (const [identity, msg] of [
      [
        'unique',
        /^AgentSessionFork\.fluxvm\.dev "idn" is invalid: identity: identity unique is not supported by the procbox backend: fork children keep the parent's hostname/,
      ],
      ['clone', /identity: Unsupported value: "clone": supported values: "bestEffort", "unique", "preserve"$/],
    ] as const) {
      const st = await status(env.call('fork', 'idn', { count: 1, identity }));
      expect(st, identity).to.include({ code: 422, reason: 'Invalid' });
      expect(st.message).to.match(msg);
      expect(st.details.causes).to.have.length(1);
      expect(st.details.causes[0]).to.include({ reason: 'FieldValueNotSupported', field: 'identity' });
    }
    expect(
      await env.get('idn-1').then(
        () => 'there',
        () => 'none',
      ),
    ).to.equal('none');
    expect(await kinds(uid)).to.deep.equal(['session.create']);
    expect(await env.call('fork', 'idn', { count: 1, identity: 'preserve' })).to.deep.equal({
      children: [{ name: 'idn-1' }],
      identity: 'preserve',
    });
    expect(await env.call('fork', 'idn', { count: 1 })).to.deep.equal({
      children: [{ name: 'idn-2' }],
      identity: 'preserve',
    });
    const forks = (await env.ledger.read(uid)).filter((e) => e.kind === 'fork');
    expect(forks.map((e) => e.identity)).to.deep.equal(['preserve', 'preserve']);
    // The children share the parent's hostname: what preserve says.
    expect((await env.call('exec', 'idn-1', { command: 'hostname' })).stdout).to.equal(
      (await env.call('exec', 'idn', { command: 'hostname' })).stdout,
    );
  });

  it('forkIdentity: vm children are unique (preserve refused), procbox children preserve (unique refused); bestEffort takes what the backend gives', async () => {
    const { forkIdentity } = await import('../../../controllers/agentsession/lifecycle.js');
    expect(forkIdentity('vm', 'bestEffort')).to.deep.equal({ identity: 'unique' });
    expect(forkIdentity('vm', 'unique')).to.deep.equal({ identity: 'unique' });
    expect(forkIdentity('vm', 'preserve'))
      .to.have.property('refused')
      .that.matches(
        /^identity preserve is not supported by the vm backend: every fork child boots with a new hostname, machine-id and RNG seed/,
      );
    expect(forkIdentity('procbox', 'bestEffort')).to.deep.equal({ identity: 'preserve' });
    expect(forkIdentity('procbox', 'preserve')).to.deep.equal({ identity: 'preserve' });
    expect(forkIdentity('procbox', 'unique')).to.have.property('refused');
  });

  it('promote: dry-run plan and planId, stale planId 409, conflicts refuse unless skipConflicts, paths outside 400, pre-promote checkpoint', async () => {
    await running('base');
    await env.call('exec', 'base', {
      command: 'mkdir -p /work/src; echo a > /work/src/a; echo b > /work/src/b; echo c > /work/c',
    });
    await env.call('fork', 'base', { count: 1 });
    await env.call('exec', 'base-1', {
      command: 'echo A > /work/src/a; echo new > /work/src/n; echo C > /work/c; rm /work/src/b',
    });
    await env.call('exec', 'base', { command: 'echo parent-c > /work/c' });
    const plan = await env.call('promote', 'base-1', { dryRun: true });
    expect(plan.apply).to.deep.equal([
      { path: '/work/src/a', op: 'modified' },
      { path: '/work/src/b', op: 'deleted' },
      { path: '/work/src/n', op: 'added' },
    ]);
    expect(plan.conflicts.map((c: any) => c.path)).to.deep.equal(['/work/c']);
    expect(plan.notCarried).to.include('memory');
    expect(await status(env.call('promote', 'base-1', { paths: ['/etc'] }))).to.include({ code: 400 });
    expect(await status(env.call('promote', 'base-1', { paths: ['/work/../etc'] }))).to.include({ code: 400 });
    expect((await status(env.call('promote', 'base-1', { planId: plan.planId }))).message).to.match(
      /1 conflicts \(\/work\/c\); nothing was changed/,
    );
    expect((await env.call('exec', 'base', { command: 'cat /work/src/a' })).stdout).to.equal('a\n');
    await env.call('exec', 'base-1', { command: 'echo AA > /work/src/a' });
    expect(
      (await status(env.call('promote', 'base-1', { planId: plan.planId, skipConflicts: true }))).message,
    ).to.match(/the plan changed since/);
    const fresh = await env.call('promote', 'base-1', { dryRun: true });
    const done = await env.call('promote', 'base-1', { planId: fresh.planId, skipConflicts: true });
    expect(done).to.include({ applied: 3 });
    expect(done.checkpoint).to.match(/^pre-promote-base-1-\d+$/);
    expect(
      (await env.call('exec', 'base', { command: 'cat /work/src/a /work/src/n /work/c; ls /work/src' })).stdout,
    ).to.equal('AA\nnew\nparent-c\na\nn\n');
    expect((await env.get('base')).status!.checkpoints!.map((c: any) => c.name)).to.include(done.checkpoint);
    const again = await env.call('promote', 'base-1', { dryRun: true });
    expect(again.apply).to.deep.equal([]);
    expect(again.alreadyApplied).to.deep.equal(['/work/src/a', '/work/src/b', '/work/src/n']);
  });

  it('promote into a parent whose workspace is readonly: 403 naming it, nothing written (no file, checkpoint or ledger entry); a filesystem.write path below it is promoted', async function () {
    if (!env.rt.capabilities().confinement?.paths)
      return skipWith(
        this,
        'procbox here has no Landlock per-path rules, so a readonly workspace cannot be created (strict)',
      );
    const puid = await running('rop', {
      workspace: { mode: 'readonly' },
      policy: { filesystem: { write: ['/work/out/**'] } },
    });
    // A child made by hand with spec.forkOf and a writable workspace (a fork's child would be readonly too).
    const cuid = await running('rop-c', { forkOf: { name: 'rop' } });
    await env.call('exec', 'rop-c', { command: 'echo x > /work/a.txt; mkdir -p /work/out; echo y > /work/out/r.txt' });
    const plan = await env.call('promote', 'rop-c', { dryRun: true });
    expect(plan.apply.map((a: any) => a.path)).to.deep.equal(['/work/a.txt', '/work/out/r.txt']);
    expect(plan.refused).to.match(
      /the workspace \/work of the parent session rop is read-only \(workspace\.mode readonly\): 1 of the 2 changes \(\/work\/a\.txt\)/,
    );
    const st = await status(env.call('promote', 'rop-c', { planId: plan.planId }));
    expect(st).to.include({ code: 403, reason: 'Forbidden' });
    expect(st.message).to.match(
      /^promote refused: the workspace \/work of the parent session rop is read-only .*nothing was changed$/,
    );
    // Only the write path, made (empty) when the read-only workspace was mounted.
    expect((await env.call('exec', 'rop', { command: 'ls -A /work; ls -A /work/out' })).stdout).to.equal('out\n');
    expect((await env.get('rop')).status!.checkpoints ?? []).to.deep.equal([]);
    expect(await kinds(puid)).to.not.include('promote');
    expect(await kinds(cuid)).to.not.include('promote.out');
    // Only the change below the parent's write path: allowed, as the files API allows it.
    const ok = await env.call('promote', 'rop-c', { paths: ['/work/out'] });
    expect(ok).to.include({ applied: 1 });
    expect(
      (await env.call('exec', 'rop', { command: 'cat /work/out/r.txt; test -e /work/a.txt || echo no-a' })).stdout,
    ).to.equal('y\nno-a\n');
  });

  it('artifacts: changes since the baseline, checkpoints, children, usage', async () => {
    await running('art');
    await env.call('exec', 'art', { command: 'echo x > /work/x' });
    const a = await env.call('artifacts', 'art');
    expect(a.changes).to.include({ unchanged: 0 });
    expect(a.changes.added).to.deep.equal(['/work/x']);
    expect(a.usage.execs).to.equal(1);
  });
});

describe('controllers/agentsession subresources: hostile input', function () {
  this.timeout(90_000);
  let env: Env;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
    await env.session('fz');
    await env.until('fz', (o) => o.status?.phase === 'Running');
  });
  after(async () => env?.close());

  it('random bodies, queries and methods on every subresource: only 4xx Status errors (or 2xx), never a 5xx or a non-Status throw', async () => {
    const bodies: unknown[] = [
      null,
      1,
      'x',
      [],
      {},
      { count: -1 },
      { count: 1e309 },
      { count: '2' },
      { tag: 'a'.repeat(64) },
      { tag: 42 },
      { command: [] },
      { command: [1] },
      { command: 'x\0y' },
      { command: 'true', timeoutSeconds: 0 },
      { command: 'true', timeoutSeconds: 3601 },
      { paths: '/work' },
      { paths: [1] },
      { dryRun: 'yes' },
      { planId: 5 },
      { identity: 'clone' },
      { memory: 'no' },
      { __proto__: { count: 2 } },
      { command: 'true', stdin: 5 },
      { command: 'true', cwd: 7 },
    ];
    const queries: Array<Record<string, string>> = [
      {},
      { afterEntry: '-1' },
      { afterEntry: 'x' },
      { afterEntry: '1e3' },
      { limit: '0' },
      { limit: '10001' },
      { watch: 'maybe' },
      { timeoutSeconds: '0' },
    ];
    const subs = ['exec', 'ledger', 'files', 'artifacts', 'checkpoint', 'restore', 'fork', 'promote', 'token'];
    let n = 0;
    for (const sub of subs) {
      for (const method of ['GET', 'POST', 'PUT', 'DELETE'] as const) {
        for (const body of [undefined, ...bodies]) {
          for (const query of method === 'GET' ? queries : [{}]) {
            for (const name of ['fz', 'missing']) {
              n++;
              try {
                await env.call(sub, name, body === undefined ? undefined : body, { method, query });
              } catch (e: any) {
                const code = e?.status?.code;
                const ok = typeof code === 'number' && code >= 400 && code < 500;
                expect(
                  ok,
                  `${method} ${sub} ${name} ${JSON.stringify(body)} ${JSON.stringify(query)}: ${e?.status ? JSON.stringify(e.status) : String(e)}`,
                ).to.equal(true);
              }
            }
          }
        }
      }
    }
    expect(n).to.be.greaterThan(500);
  });
});

describe('controllers/agentsession limits at their edges', function () {
  this.timeout(120_000);
  let env: Env;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
  });
  after(async () => env?.close());
  const dry = (name: string, spec: Record<string, unknown>) =>
    env.client.create(
      { group: 'fluxvm.dev', version: 'v1alpha1', resource: 'agentsessions' },
      'default',
      {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: { name, namespace: 'default' },
        spec: { agent: 'a', ...spec },
      },
      { dryRun: true } as any,
    );

  it('glob length 1024 accepted, 1025 refused; budget fields 0 accepted, -1 refused; fork count 1 and 32 pass validation', async () => {
    await dry('g1', { policy: { process: { deny: ['x'.repeat(1024)] } } });
    expect(await status(dry('g2', { policy: { process: { deny: ['x'.repeat(1025)] } } }))).to.include({ code: 422 });
    await dry('b0', { budget: { maxExecs: 0, maxOutputBytes: 0, maxChildren: 0 } });
    for (const f of [
      'maxExecs',
      'maxExecSeconds',
      'maxOutputBytes',
      'maxChildren',
      'maxWorkspaceBytes',
      'maxComputeSeconds',
    ]) {
      const st = await status(dry('bn', { budget: { [f]: -1 } }));
      expect(st.code, f).to.equal(422);
      expect(st.message, f).to.contain(`spec.budget.${f}`);
    }
    await env.session('edge', { budget: { maxExecs: 0, maxChildren: 32 } });
    await env.until('edge', (o) => o.status?.phase === 'Running');
    expect((await status(env.call('exec', 'edge', { command: 'true' }))).message).to.equal(
      'budget exceeded: budget.maxExecs is 0, the session used 0',
    );
    expect(await status(env.call('fork', 'edge', { count: 33 }))).to.include({ code: 400 });
    const one = await env.call('fork', 'edge', { count: 1 });
    expect(one.children).to.have.length(1);
  });

  it('promote moves at most 2000 changes: 2000 pass, 2001 are 400 (nothing written)', async () => {
    await env.session('big');
    await env.until('big', (o) => o.status?.phase === 'Running');
    await env.call('fork', 'big', { count: 1 });
    await env.call('exec', 'big-1', {
      command:
        'mkdir -p /work/a && cd /work/a && i=0; while [ $i -lt 2000 ]; do echo $i > f$i; i=$((i+1)); done; echo x > /work/one',
    });
    const st = await status(env.call('promote', 'big-1', {}));
    expect(st).to.include({ code: 400 });
    expect(st.message).to.match(/2001 changes, more than 2000/);
    expect((await env.call('exec', 'big', { command: 'ls /work | wc -l' })).stdout).to.equal('0\n');
    const ok = await env.call('promote', 'big-1', { paths: ['/work/a'] });
    expect(ok.applied).to.equal(2000);
    expect((await env.call('exec', 'big', { command: 'ls /work/a | wc -l; ls /work' })).stdout).to.equal('2000\na\n');
  });
});
