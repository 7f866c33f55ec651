// @fluxvm/sdk against a real `fluxctl serve` (procbox, HTTPS, the admin token of its kubeconfig):
// every method once, typed errors carrying the metav1.Status, an events stream resumed after the
// connection was destroyed mid-stream (every ledger entry exactly once), AbortSignal cancelling an
// exec and a watch (the server's watch count goes back), no polling in Changeset.wait.
import { expect } from 'chai';
import fs from 'node:fs';
import { startFluxctl, type Fluxctl } from '../e2e/harness.js';
import { sandboxSkipReason, skipWith } from '../e2e/sandbox-helpers.js';
import { eventually } from '../support/wait.js';
import {
  AgentSession,
  AlreadyExistsError,
  ApprovalRequiredError,
  Changeset,
  FluxClient,
  FluxError,
  ForbiddenError,
  InvalidError,
  NotFoundError,
  Sandbox,
  UnauthorizedError,
  UploadInterruptedError,
  type SessionEvent,
} from '../../sdk/src/index.js';

/** Destroys every socket of the client's agent (the connection drops under an open stream). */
function dropConnections(c: FluxClient): number {
  let n = 0;
  for (const list of Object.values(c.agent.sockets)) for (const s of list ?? []) (s.destroy(), n++);
  return n;
}

describe('sdk: @fluxvm/sdk against serve (procbox)', function () {
  this.timeout(600_000);
  let fx: Fluxctl;
  let c: FluxClient;
  let sbx: Sandbox;
  let s: AgentSession;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl({ readyTimeoutMs: 90_000 });
    c = FluxClient.fromKubeconfig(fx.kubeconfig);
    [sbx, s] = await Promise.all([
      Sandbox.create(c, { runtime: 'procbox' }, { name: 'sdk1', timeoutMs: 90_000 }),
      AgentSession.create(
        c,
        { agent: 'sdk-test', policy: { preset: 'offline', process: { ask: ['deploy *'] } } },
        { name: 'sdks1', timeoutMs: 90_000 },
      ),
    ]);
  });
  after(async () => {
    if (!fx) return;
    c?.close();
    await fx.kubectl(['delete', 'ags,sbx,cs', '--all', '--wait=true', '--timeout=90s'], { timeoutMs: 100_000 });
    await fx.stop();
  });

  it('client from {server, token, ca} as from the kubeconfig; Sandbox get/list/exec/files/delete', async () => {
    const c2 = new FluxClient({ server: fx.url, token: fx.token, ca: fx.ca });
    try {
      const got = await Sandbox.get(c2, 'sdk1');
      expect(got.object.metadata.uid).to.equal(sbx.object.metadata.uid);
      expect((await Sandbox.list(c2)).map((x) => x.name)).to.include('sdk1');
    } finally {
      c2.close();
    }
    const r = await sbx.exec(['sh', '-c', 'echo out; echo err >&2; exit 3']);
    expect(r).to.include({ exitCode: 3, stdout: 'out\n', stderr: 'err\n' });
    expect((await sbx.exec('cat', { stdin: 'piped' })).stdout).to.equal('piped');
    expect((await sbx.refresh()).status?.phase).to.equal('Running');
    await sbx.files.write('/work/d/a.txt', 'hello\n', { mode: 0o600 });
    expect((await sbx.files.read('/work/d/a.txt')).toString()).to.equal('hello\n');
    expect((await sbx.files.list('/work/d')).map((e) => e.name)).to.deep.equal(['a.txt']);
    const st = await sbx.files.stat('/work/d/a.txt');
    expect(st).to.include({ type: 'file', size: 6, mode: 0o600 });
    expect((await sbx.exec('cat /work/d/a.txt')).stdout).to.equal('hello\n');
    await sbx.files.delete('/work/d', { recursive: true });
    expect((await sbx.exec('test -e /work/d; echo $?')).stdout).to.equal('1\n');
    // delete: the object goes (create/delete of a second one, waited on by a watch).
    const tmp = await Sandbox.create(c, {}, { generateName: 'sdkdel-', timeoutMs: 90_000 });
    await Sandbox.delete(c, tmp.name);
    await eventually(async () => (await Sandbox.list(c)).every((x) => x.name !== tmp.name), 60_000, 'deleted');
  });

  it('speculate -> Changeset: wait (a watch), diff, approve, apply writes the sandbox; reject', async () => {
    await sbx.files.write('/work/app.txt', 'v1\n');
    const cs = await sbx.speculate('echo v2 > /work/app.txt; echo new > /work/new.txt', { name: 'sdkcs1' });
    const done = await cs.wait({ timeoutMs: 120_000 });
    expect(done.status?.phase).to.equal('Pending');
    const diff = await cs.diff();
    expect(diff).to.include('-v1').and.include('+v2').and.include('+new');
    // Nothing written before the apply.
    expect((await sbx.files.read('/work/app.txt')).toString()).to.equal('v1\n');
    expect((await cs.approve()).spec.decision).to.equal('Approve');
    const applied = await cs.apply({ timeoutMs: 120_000 });
    expect(applied.status?.phase).to.equal('Applied');
    expect((await sbx.files.read('/work/app.txt')).toString()).to.equal('v2\n');
    expect((await sbx.files.read('/work/new.txt')).toString()).to.equal('new\n');
    const cs2 = await sbx.speculate(['sh', '-c', 'echo v3 > /work/app.txt'], { name: 'sdkcs2' });
    await cs2.wait({ timeoutMs: 120_000 });
    await cs2.reject();
    expect(
      (await cs2.wait({ until: (x) => x.status?.phase === 'Rejected', timeoutMs: 60_000 })).status?.phase,
    ).to.equal('Rejected');
    expect((await Changeset.get(c, 'sdkcs2')).phase).to.equal('Rejected');
    expect((await sbx.files.read('/work/app.txt')).toString()).to.equal('v2\n');
  });

  it('errors are typed classes carrying the metav1.Status: NotFound, AlreadyExists, Invalid, Unauthorized, Forbidden, ApprovalRequired', async () => {
    const nf = await Sandbox.get(c, 'nope').catch((e: unknown) => e);
    expect(nf).to.be.instanceOf(NotFoundError).and.instanceOf(FluxError);
    expect((nf as NotFoundError).status).to.include({ kind: 'Status', code: 404, reason: 'NotFound' });
    const dup = await Sandbox.create(c, {}, { name: 'sdk1', wait: false }).catch((e: unknown) => e);
    expect(dup).to.be.instanceOf(AlreadyExistsError);
    expect((dup as AlreadyExistsError).code).to.equal(409);
    const bad = await Sandbox.create(c, { runtime: 'bogus' as 'vm' }, { name: 'sdkbad', wait: false }).catch(
      (e: unknown) => e,
    );
    expect(bad).to.be.instanceOf(InvalidError);
    expect(JSON.stringify((bad as InvalidError).status.details?.causes)).to.include('runtime');
    const anon = new FluxClient({ server: fx.url, token: 'wrong', ca: fx.ca });
    const un = await Sandbox.list(anon).catch((e: unknown) => e);
    anon.close();
    expect(un).to.be.instanceOf(UnauthorizedError);
    // A session token limited to read: exec is refused.
    const reader = new FluxClient({ server: fx.url, token: await s.token(['read']), ca: fx.ca });
    try {
      const viaToken = await AgentSession.get(reader, 'sdks1');
      const fb = await viaToken.exec('true').catch((e: unknown) => e);
      expect(fb).to.be.instanceOf(ForbiddenError);
      expect((fb as ForbiddenError).status.code).to.equal(403);
    } finally {
      reader.close();
    }
    // A held command: 428 typed, naming the Approval; approved, the retry runs once.
    const held = await s.exec('deploy now').catch((e: unknown) => e);
    expect(held).to.be.instanceOf(ApprovalRequiredError);
    const name = (held as ApprovalRequiredError).approvalName!;
    expect((await s.approvals.waitPending({ timeoutMs: 30_000 })).metadata.name).to.equal(name);
    expect((await s.approvals.list()).map((a) => a.metadata.name)).to.include(name);
    await s.approvals.approve(name, { note: 'sdk test' });
    const ran = await s.exec('deploy now', { approvalName: name }).catch((e: unknown) => e);
    // `deploy` is no program in the sandbox: it ran (127), it was not refused.
    expect((ran as { exitCode: number }).exitCode).to.equal(127);
    const held2 = (await s.exec('deploy again').catch((e: unknown) => e)) as ApprovalRequiredError;
    expect((await s.approvals.deny(held2.approvalName!)).status?.conditions?.[0]?.type).to.equal('Denied');
  });

  it('AgentSession: get/list, exec, jobs (start, list, stream, stdin, read, kill), ledger, artifacts, token', async () => {
    expect((await AgentSession.list(c)).map((x) => x.name)).to.include('sdks1');
    expect((await AgentSession.get(c, 'sdks1')).object.metadata.uid).to.equal(s.object.metadata.uid);
    expect((await s.exec('echo hi')).stdout).to.equal('hi\n');
    const job = await s.jobs.start('cat; echo done >&2', { stdin: true });
    expect((await s.jobs.list()).map((j) => j.job)).to.include(job.job);
    await s.jobs.stdin(job.job, 'line1\n');
    await s.jobs.stdin(job.job, 'line2\n', { close: true });
    let out = '';
    let err = '';
    let exit: number | undefined;
    for await (const ch of s.jobs.stream(job.job)) {
      if (ch.type === 'exit') exit = ch.exitCode;
      else if (ch.type === 'stdout') out += ch.data.toString();
      else err += ch.data.toString();
    }
    expect({ out, err, exit }).to.deep.equal({ out: 'line1\nline2\n', err: 'done\n', exit: 0 });
    expect((await s.jobs.readAll(job.job)).stdout.toString()).to.equal('line1\nline2\n');
    const long = await s.jobs.start(['sleep', '600']);
    await s.jobs.kill(long.job);
    const killed = await eventually(
      async () => (await s.jobs.list()).find((j) => j.job === long.job && j.state !== 'running'),
      30_000,
      'killed job',
    );
    expect(killed.signal ?? killed.state).to.match(/TERM|KILL|killed|signaled/i);
    const led = await s.ledger({ afterEntry: 0 });
    expect(led.entries.map((e) => e.kind))
      .to.include('exec')
      .and.include('job.start');
    expect(await s.artifacts()).to.have.property('usage');
  });

  it('files: upload resumed from where the server is (uploadId), download of a large file verified and resumed from a prefix', async () => {
    const data = Buffer.alloc(9 * 1024 * 1024 + 17);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 11)) & 0xff;
    // The first call is cut off after its first chunk (abort), the second resumes the same upload.
    const ac = new AbortController();
    const first = await s.files
      .upload('/work/big.bin', data, { chunkSize: 1024 * 1024, signal: ac.signal, onProgress: () => ac.abort() })
      .catch((e: unknown) => e);
    expect((first as Error).name).to.equal('AbortError');
    const open = (await s.files.uploads()).find((u) => u.path === '/work/big.bin' && u.state === 'Open');
    expect(open, 'an open upload').to.not.equal(undefined);
    expect(open!.received).to.equal(1024 * 1024);
    const done = await s.files.upload('/work/big.bin', data, { uploadId: open!.id });
    expect(done.size).to.equal(data.length);
    expect((await s.exec('sha256sum /work/big.bin')).stdout.split(' ')[0]).to.equal(done.writtenSha256);
    const back = await s.files.download('/work/big.bin');
    expect(back.equals(data)).to.equal(true);
    const resumed = await s.files.download('/work/big.bin', { prefix: data.subarray(0, 5 * 1024 * 1024) });
    expect(resumed.equals(data)).to.equal(true);
    expect(() => undefined).to.not.throw(UploadInterruptedError);
    await s.files.write('/work/small.txt', 'x');
    expect((await s.files.read('/work/small.txt')).toString()).to.equal('x');
    expect((await s.files.stat('/work/small.txt')).size).to.equal(1);
    expect((await s.files.list('/work')).map((e) => e.name)).to.include('small.txt');
    await s.files.delete('/work/small.txt');
    await s.files.delete('/work/big.bin');
  });

  it('watch, git, checkpoint/restore, fork/promote, previews', async () => {
    await s.exec('mkdir -p /work/w');
    const ac = new AbortController();
    const seen: string[] = [];
    const watching = (async () => {
      for await (const ev of s.watch('/work/w', { signal: ac.signal })) {
        if (ev.type === 'ready') await s.files.write('/work/w/f.txt', 'x');
        else if (ev.type === 'created' || ev.type === 'renamed') {
          // The write lands as a temporary file renamed into place (crash-safe write).
          seen.push(`${ev.type} ${String(ev.data.name)}`);
          if (ev.data.name === 'f.txt') return;
        }
      }
    })();
    await watching;
    ac.abort();
    expect(seen[seen.length - 1]).to.match(/^(created|renamed) f\.txt$/);

    await s.exec('cd /work && git init -q -b main && printf "a\\n" > a.txt');
    expect(JSON.stringify((await s.git.status()).entries)).to.include('a.txt');
    const commit = await s.git.commit('first');
    expect(commit.commit).to.match(/^[0-9a-f]{40}$/);
    expect(((await s.git.log({ n: 1 })).commits as { message: string }[])[0]!.message).to.match(/first/);
    await s.exec('printf "b\\n" >> /work/a.txt');
    expect(String((await s.git.diff()).diff)).to.include('+b');
    expect((await s.git.branch('feature')).branch).to.equal('feature');
    expect(await s.git.remote('push').catch((e: unknown) => e)).to.be.instanceOf(ApprovalRequiredError);

    await s.files.write('/work/ck.txt', 'before');
    await s.checkpoint({ tag: 'sdk-ck' });
    await s.files.write('/work/ck.txt', 'after');
    await s.restore('sdk-ck');
    expect((await s.files.read('/work/ck.txt')).toString()).to.equal('before');

    await s.fork({ count: 1 });
    const child = await AgentSession.get(c, 'sdks1-1');
    await child.waitReady({ timeoutMs: 90_000 });
    await child.files.write('/work/from-child.txt', 'child');
    const plan = await child.promote({ dryRun: true });
    expect(JSON.stringify(plan)).to.include('from-child.txt');
    await child.promote({ planId: String(plan.planId) });
    expect((await s.files.read('/work/from-child.txt')).toString()).to.equal('child');
    await child.delete();

    const p = await s.previews.create(8000, { ttlSeconds: 60 });
    expect(p.url).to.match(/\/preview\/[0-9a-f]{64}\/$/);
    expect((await s.previews.list()).map((x) => x.id)).to.deep.equal([p.id]);
    await s.previews.revoke(p.id);
    expect(await s.previews.list()).to.deep.equal([]);
  });

  it('rewind: points taken before each exec, list, pin/unpin, undo one step restores the workspace, config, branch, bisect', async () => {
    const rw = await AgentSession.create(
      c,
      { agent: 'sdk-test', policy: { preset: 'offline' }, rewind: { enabled: true } },
      { name: 'sdkrw', timeoutMs: 90_000 },
    );
    await rw.exec('echo a > /work/r.txt');
    await rw.exec('echo b > /work/r.txt');
    const l = await rw.rewind.list();
    expect(l.points.length).to.be.greaterThanOrEqual(2);
    const newest = String(l.points[l.points.length - 1]!.tag);
    expect((await rw.rewind.pin(newest)).pinned).to.equal(true);
    expect((await rw.rewind.unpin(newest)).pinned).to.equal(false);
    await rw.rewind.undo({ steps: 1 });
    expect((await rw.files.read('/work/r.txt')).toString()).to.equal('a\n');
    expect(JSON.stringify(await rw.rewind.config({ maxPoints: 5 }))).to.include('"maxPoints":5');
    expect((await rw.refresh()).spec.rewind?.maxPoints).to.equal(5);
    const first = String((await rw.rewind.list()).points[0]!.tag);
    const br = await rw.rewind.branch(first, { count: 1 });
    expect(JSON.stringify(br.children)).to.include('sdkrw-');
    const bis = await rw.rewind.bisect('test ! -e /work/r.txt', { good: first, bad: 'now' });
    expect(bis).to.have.property('firstBadStep');
    await rw.delete();
  });

  it('events(): a stream whose connection is destroyed mid-stream resumes with Last-Event-ID, every entry exactly once', async () => {
    const start = (await s.ledger({ afterEntry: 0, limit: 10_000 })).lastEntry;
    // The stream on a client of its own: only its socket is destroyed, not the writer's.
    const sc = FluxClient.fromKubeconfig(fx.kubeconfig);
    const reader = await AgentSession.get(sc, 'sdks1');
    const got: SessionEvent[] = [];
    const ac = new AbortController();
    let dropped = 0;
    const reading = (async () => {
      for await (const ev of reader.events({ since: start, signal: ac.signal })) {
        if (ev.type !== 'ledger') continue; // core/v1 Events of the session interleave
        got.push(ev);
        if (got.length === 2) dropped = dropConnections(sc); // the socket under the stream, mid-stream
        if (got.length === 6) return;
      }
    })();
    for (let i = 0; i < 6; i++) await s.exec(`echo ${i}`);
    await reading;
    ac.abort();
    sc.close();
    expect(dropped).to.be.greaterThan(0);
    const ids = got.map((e) => (e.data as { entry: number }).entry);
    expect(ids).to.deep.equal([1, 2, 3, 4, 5, 6].map((i) => start + i));
    expect(got.map((e) => (e.data as { kind: string }).kind)).to.deep.equal(Array(6).fill('exec'));
  });

  it('AbortSignal cancels: an exec (rejects at once) and a Changeset.wait (its watch on the server closes)', async () => {
    const ac = new AbortController();
    const t0 = Date.now();
    setTimeout(() => ac.abort(), 300);
    const e = await sbx.exec('sleep 30', { signal: ac.signal }).catch((x: unknown) => x);
    expect((e as Error).name).to.equal('AbortError');
    expect(Date.now() - t0).to.be.lessThan(10_000);
    const before = await fx.watchCount();
    const cs = await sbx.speculate('sleep 60', { name: 'sdkcs3' });
    const ac2 = new AbortController();
    const waiting = cs.wait({ signal: ac2.signal }).catch((x: unknown) => x);
    await fx.waitForWatches(before, { client: waiting });
    ac2.abort();
    expect(((await waiting) as Error).name).to.equal('AbortError');
    await eventually(async () => (await fx.watchCount()) <= before, 30_000, 'the watch closed on the server');
    await cs.delete();
  });
});
