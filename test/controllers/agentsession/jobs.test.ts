// agentsessions/<name>/jobs and exec?stream=true (controllers/agentsession/jobs.ts) with the real
// registry, controllers and a procbox session, and a fake JobRuntime (test/controllers/common/
// fake-jobs.ts) so the handlers' own work is what is checked: bounds at their edges (bad input
// changes nothing: no runtime call, no ledger entry), policy, approvals, budgets, the ledger
// (job.start, job.stdin sizes only, job.kill, job.exit once), Idempotency-Key, the list kept
// over a new handler (a serve restart), the stream limit, exec?stream=true events.
import { expect } from 'chai';
import type { Readable } from 'node:stream';
import { sessionJobHandlers } from '../../../controllers/agentsession/jobs.js';
import { hostStreams } from '../../../controllers/common/sse.js';
import { MAX_JOB_OUTPUT_BYTES, MAX_JOB_STDIN_WRITE } from '../../../native/jobs.js';
import type { SubresourceHandler, SubresourceResponse } from '../../../runtime/apiserver/http/subresources.js';
import { allKinds } from '../../../apis/registry.js';
import { agentSessionsGVR } from '../../../controllers/agentsession/index.js';
import { sandboxesGVR } from '../../../controllers/common/kinds.js';
import { eventually } from '../../support/wait.js';
import { skipWith } from '../../skip.js';
import { FakeJobs, readEvents } from '../common/fake-jobs.js';
import { makeEnv, skipReason, type Env } from './env.js';

type Call = {
  method?: 'GET' | 'POST' | 'DELETE';
  subpath?: string;
  query?: Record<string, string>;
  headers?: Record<string, string>;
  body?: unknown;
};

describe('controllers/agentsession jobs (fake JobRuntime)', function () {
  this.timeout(90_000);
  let env: Env;
  let fake: FakeJobs;
  let h: ReturnType<typeof sessionJobHandlers>;
  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
  });
  beforeEach(() => {
    fake = new FakeJobs();
    h = sessionJobHandlers({
      client: env.client,
      runtime: env.rt,
      ledger: env.ledger,
      state: env.state,
      jobs: fake,
      jobSweepMs: 30,
    });
  });
  after(async () => env?.close());

  const req = (handler: SubresourceHandler, name: string, c: Call): Promise<any> =>
    Promise.resolve(
      handler.handle!({
        gvr: agentSessionsGVR,
        kind: allKinds.find((k) => k.plural === 'agentsessions')!,
        namespace: 'default',
        name,
        subresource: 'jobs',
        ...(c.subpath ? { subpath: c.subpath } : {}),
        query: c.query ?? {},
        headers: { 'content-type': 'application/json', ...(c.headers ?? {}) },
        ctx: {} as any,
        method: c.method ?? (c.body === undefined ? 'GET' : 'POST'),
        body: c.body === undefined ? undefined : Buffer.from(JSON.stringify(c.body)),
        req: undefined as any,
        reply: undefined as any,
      }),
    );
  const jobs = (name: string, c: Call) =>
    req(h.jobs, name, c).then((v) =>
      v && typeof v === 'object' && 'body' in v && Buffer.isBuffer((v as SubresourceResponse).body)
        ? JSON.parse(String((v as SubresourceResponse).body))
        : v,
    );
  const refused = async (p: Promise<unknown>) => {
    try {
      await p;
    } catch (e) {
      return (e as any).status;
    }
    throw new Error('expected a refusal');
  };
  const running = async (name: string, spec: Record<string, unknown> = {}) => {
    const s = await env.session(name, spec);
    await env.until(name, (o) => o.status?.phase === 'Running');
    const sbx = await env.client.get(sandboxesGVR, 'default', name);
    return { uid: s.metadata.uid!, sbx: sbx.metadata.uid! };
  };
  const kinds = async (uid: string) => (await env.ledger.read(uid)).map((e) => e.kind);

  it('start, read, stdin (sizes only in the ledger), kill: job.start, job.stdin, job.kill, job.exit once; the list is kept by a new handler (serve restart)', async () => {
    const { uid, sbx } = await running('jb');
    const j = await jobs('jb', { body: { command: 'cat', stdin: true, maxOutputBytes: 1024, timeoutSeconds: 60 } });
    expect(j).to.include({ state: 'running', stdin: true, maxOutputBytes: 1024, timeoutSeconds: 60, via: 'jobs' });
    expect(fake.jobs.get(`${sbx}/${j.job}`)!.req).to.deep.include({
      argv: ['sh', '-c', 'cat'],
      stdin: true,
      maxOutputBytes: 1024,
      timeoutMs: 60_000,
    });
    await jobs('jb', { subpath: `${j.job}/stdin`, body: { text: 'secret-words' } });
    fake.emit(sbx, j.job, 'stdout', 'secret-words');
    const r = await jobs('jb', { subpath: j.job, query: { waitMs: '1000' } });
    expect(r).to.include({ output: 'secret-words', nextOffset: 12, state: 'running' });
    const k = await jobs('jb', { method: 'DELETE', subpath: j.job, query: { signal: 'KILL' } });
    expect(k).to.include({ state: 'killed', signal: 'SIGKILL' });
    await jobs('jb', { method: 'GET' });
    const l = await env.ledger.read(uid);
    expect(l.map((e) => e.kind)).to.deep.equal(['session.create', 'job.start', 'job.stdin', 'job.kill', 'job.exit']);
    expect(l[2]).to.include({ job: j.job, bytes: 12 });
    expect(JSON.stringify(l)).to.not.include('secret-words');
    expect(l[4]).to.include({ job: j.job, state: 'killed', signal: 'SIGKILL', stdoutBytes: 12 });
    // stdin after the end: 409 (the runtime's Conflict).
    expect((await refused(jobs('jb', { subpath: `${j.job}/stdin`, body: { text: 'x' } }))).code).to.equal(409);
    // A new handler over the same state (a serve restart): the list is the host's record.
    const h2 = sessionJobHandlers({
      client: env.client,
      runtime: env.rt,
      ledger: env.ledger,
      state: env.state,
      jobs: fake,
    });
    const list = await req(h2.jobs, 'jb', {});
    expect(list.items.map((x: any) => [x.job, x.state])).to.deep.equal([[j.job, 'killed']]);
    expect(await kinds(uid)).to.have.length(5); // job.exit not ledgered twice
  });

  it('bounds at their edges change nothing: maxOutputBytes 256 MiB + 1, stdin 48 KiB + 1, waitMs 25001, signal, unknown job 404', async () => {
    const { uid } = await running('jbb');
    const ok = await jobs('jbb', { body: { command: 'cat', stdin: true, maxOutputBytes: MAX_JOB_OUTPUT_BYTES } });
    expect(ok.maxOutputBytes).to.equal(MAX_JOB_OUTPUT_BYTES);
    const before = [...fake.calls];
    const n = (await env.ledger.read(uid)).length;
    let st = await refused(jobs('jbb', { body: { command: 'cat', maxOutputBytes: MAX_JOB_OUTPUT_BYTES + 1 } }));
    expect(st).to.include({ code: 422 });
    expect(st.details.causes[0].field).to.equal('maxOutputBytes');
    await jobs('jbb', { subpath: `${ok.job}/stdin`, body: { text: 'a'.repeat(MAX_JOB_STDIN_WRITE) } });
    st = await refused(
      jobs('jbb', { subpath: `${ok.job}/stdin`, body: { text: 'a'.repeat(MAX_JOB_STDIN_WRITE + 1) } }),
    );
    expect(st).to.include({ code: 413 });
    expect(st.details.causes[0].field).to.equal('text');
    expect(
      (await refused(jobs('jbb', { subpath: ok.job, query: { waitMs: '25001' } }))).details.causes[0].field,
    ).to.equal('waitMs');
    expect(
      (await refused(jobs('jbb', { method: 'DELETE', subpath: ok.job, query: { signal: 'BOGUS' } }))).details.causes[0]
        .field,
    ).to.equal('signal');
    expect((await refused(jobs('jbb', { subpath: 'job-000000000000' }))).code).to.equal(404);
    expect(fake.calls).to.deep.equal(before);
    const after = await env.ledger.read(uid);
    expect(after.length).to.equal(n + 1); // the one accepted 48 KiB stdin write only
    expect(after[after.length - 1]).to.include({ kind: 'job.stdin', bytes: MAX_JOB_STDIN_WRITE });
  });

  it('policy: deny is 403 job.refused (ledgered, nothing started); ask is 428 naming an Approval, nothing started', async () => {
    const { uid } = await running('jbp', { policy: { process: { deny: ['rm *'], ask: ['deploy *'] } } });
    const st = await refused(jobs('jbp', { body: { command: 'rm -rf /work' } }));
    expect(st).to.include({ code: 403 });
    expect(st.message).to.match(/^job\.refused: "rm -rf \/work" matches policy\.process\.deny/);
    const held = await refused(jobs('jbp', { body: { command: 'deploy prod' } }));
    expect(held.code).to.equal(428);
    expect(fake.calls).to.deep.equal([]);
    expect(await kinds(uid)).to.deep.equal(['session.create', 'job.refused', 'approval.requested']);
  });

  it('budget: maxJobs at the limit passes, one past 403; maxConcurrentJobs counts running jobs; timeoutSeconds at most the compute seconds left', async () => {
    const { uid, sbx } = await running('jbg', { budget: { maxJobs: 3, maxConcurrentJobs: 2, maxComputeSeconds: 100 } });
    const a = await jobs('jbg', { body: { command: 'sleep 1' } });
    await jobs('jbg', { body: { command: 'sleep 1' } });
    let st = await refused(jobs('jbg', { body: { command: 'sleep 1' } }));
    expect(st).to.include({ code: 403, message: 'budget exceeded: budget.maxConcurrentJobs is 2, the session used 2' });
    fake.end(sbx, a.job, { exitCode: 0 });
    st = await refused(jobs('jbg', { body: { command: 'sleep 1', timeoutSeconds: 101 } }));
    expect(st).to.include({ code: 422 });
    expect(st.details.causes[0].field).to.equal('timeoutSeconds');
    await jobs('jbg', { body: { command: 'sleep 1', timeoutSeconds: 90 } });
    st = await refused(jobs('jbg', { body: { command: 'sleep 1' } }));
    expect(st).to.include({ code: 403, message: 'budget exceeded: budget.maxJobs is 3, the session used 3' });
    expect((await env.state.usage(uid)).jobs).to.equal(3);
    expect((await kinds(uid)).filter((k) => k === 'budget.exceeded')).to.have.length(2);
    expect(fake.calls.filter((c) => c.startsWith('start'))).to.have.length(3);
  });

  it('Idempotency-Key: a retry returns the first answer and starts nothing; another body with the key is 422', async () => {
    await running('jbi');
    const a = await jobs('jbi', { body: { command: 'sleep 5' }, headers: { 'idempotency-key': 'k1' } });
    const b = await jobs('jbi', { body: { command: 'sleep 5' }, headers: { 'idempotency-key': 'k1' } });
    expect(b.job).to.equal(a.job);
    expect(fake.calls.filter((c) => c.startsWith('start'))).to.have.length(1);
    const st = await refused(jobs('jbi', { body: { command: 'sleep 6' }, headers: { 'idempotency-key': 'k1' } }));
    expect(st.code).to.equal(422);
  });

  it('exec?stream=true: start, output, stderr, exit events; the exit is ledgered; stdin is written and closed', async () => {
    const { uid, sbx } = await running('jbe');
    const res = (await req(h.execStreamHandler, 'jbe', {
      body: { command: 'cat; echo err >&2', stdin: 'hello' },
    })) as SubresourceResponse;
    const body = res.body as Readable;
    const job = [...fake.jobs.keys()][0]!.split('/')[1]!;
    expect(fake.jobs.get(`${sbx}/${job}`)!.stdin.map(String)).to.deep.equal(['hello']);
    fake.emit(sbx, job, 'stdout', 'hello');
    fake.emit(sbx, job, 'stderr', 'err\n');
    fake.end(sbx, job, { exitCode: 3 });
    const evs = await readEvents(body);
    expect(evs.map((e) => e.event)).to.deep.equal(['start', 'output', 'stderr', 'exit']);
    expect(evs[0]!.data).to.include({ job, via: 'exec/stream' });
    expect(evs[3]!.data).to.include({ exitCode: 3, state: 'exited' });
    expect(evs[3]!.id).to.equal('5:4');
    await eventually(async () => (await kinds(uid)).includes('job.exit') || undefined, 5000, 'job.exit ledgered');
    expect(await kinds(uid)).to.deep.equal(['session.create', 'job.start', 'job.stdin', 'job.exit']);
  });

  it('the host-wide stream limit: 16 streams pass, the 17th is 429 (and an exec?stream=true past it starts nothing)', async () => {
    await running('jbs');
    const j = await jobs('jbs', { body: { command: 'sleep 100' } });
    const open: Readable[] = [];
    try {
      while (hostStreams.active < hostStreams.max) {
        const r = (await req(h.jobs, 'jbs', { subpath: `${j.job}/stream` })) as SubresourceResponse;
        open.push(r.body as Readable);
      }
      expect((await refused(req(h.jobs, 'jbs', { subpath: `${j.job}/stream` }))).code).to.equal(429);
      const starts = fake.calls.length;
      expect((await refused(req(h.execStreamHandler, 'jbs', { body: { command: 'true' } }))).code).to.equal(429);
      expect(fake.calls.length).to.equal(starts);
    } finally {
      for (const b of open) b.destroy();
    }
    await eventually(async () => hostStreams.active === 0 || undefined, 5000, 'streams released');
  });
});
