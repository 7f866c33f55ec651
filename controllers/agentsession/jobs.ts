// agentsessions/<name>/jobs (spec/agent-sessions.md "Background jobs") and exec?stream=true
// ("API": exec/stream). The routes and their bounds are controllers/common/jobs.ts; this file
// adds what a session puts around them, as for exec: the lifecycle gate, the process policy
// (deny/allow 403 ledgered job.refused; ask held for an Approval, 428), the budget (maxJobs,
// maxConcurrentJobs, maxComputeSeconds with the job's timeout at most what is left,
// maxOutputBytes capping what a job keeps per stream), Idempotency-Key on start, and the
// ledger: job.start, job.stdin (sizes only), job.kill, job.exit (once, when the server first
// sees the end: a read, list, stream, kill, the next start or the sweep of running jobs).
// The host's record of the jobs (jobbook.ts) keeps the list over a serve restart; the runtime
// is asked for their state on every listing.
import { randomBytes } from 'node:crypto';
import type { JobInfo, JobRuntime } from '../../native/jobs.js';
import { MAX_JOB_STDIN_WRITE } from '../../native/jobs.js';
import { RuntimeError } from '../../native/runtime.js';
import {
  respond,
  type SubresourceHandler,
  type SubresourceRequest,
} from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import {
  ended,
  jobNotFound,
  jobRoute,
  parseJobStart,
  readBoth,
  jobActionParams,
  requireJobs,
  streamJob,
  type JobStart,
} from '../common/jobs.js';
import { hostStreams, sseResponse } from '../common/sse.js';
import { argvOf, jsonBody, timeoutOf } from '../sandbox/request.js';
import { approvalNameOf, approvalWaitMs, type HeldRequest } from './approval-rules.js';
import { approvalGate, consumeApproval } from './approvals.js';
import {
  budgetError,
  GROUP,
  idempotencyKey,
  mirrorUsage,
  resolveSession,
  type AgentSessionSubresourceDeps,
  type SessionTarget,
} from './common.js';
import { JobBook, recordView, refreshed, type JobRecord } from './jobbook.js';
import { checkCommand } from './policy.js';

export interface SessionJobsDeps extends AgentSessionSubresourceDeps {
  /** The job half of the runtime (default: `runtime` when it has one). */
  jobs?: JobRuntime;
  /** How often running jobs are looked at for their end (job.exit). Default 2 s. */
  jobSweepMs?: number;
}

const KIND = 'AgentSession';
const EXEC_STREAM_DEFAULT_TIMEOUT_S = 300;

const displayCommand = (argv: string[]) =>
  argv[0] === 'sh' && argv[1] === '-c' && argv.length === 3 ? argv[2]! : argv;

/** What a session's jobs share in this process: the book and the sweeps of running jobs. */
class SessionJobs {
  readonly book: JobBook;
  private readonly sweeps = new Map<string, NodeJS.Timeout>();
  constructor(readonly d: SessionJobsDeps) {
    this.book = new JobBook(d.state.dir);
  }

  get jr(): JobRuntime {
    return requireJobs(this.d.jobs ?? this.d.runtime);
  }

  lock<T>(uid: string, fn: () => Promise<T>): Promise<T> {
    return this.d.state.locked(`${uid}/jobs`, fn);
  }

  /**
   * Under the jobs lock: the records refreshed from the runtime (`only`: just that job), ends
   * ledgered once (job.exit, the job's time added to computeMs), saved when anything changed.
   */
  async syncLocked(t: SessionTarget, only?: string, known?: JobInfo): Promise<JobRecord[]> {
    const recs = await this.book.load(t.uid);
    const want = recs.filter((r) => (only ? r.job === only : true) && (r.state === 'running' || !r.exitLedgered));
    if (!want.length || !t.sandboxId) return recs;
    let infos: Map<string, JobInfo>;
    if (known) infos = new Map([[known.id, known]]);
    else if (only)
      infos = new Map(
        (
          await this.jr.job(t.sandboxId, only).then(
            (j) => [j],
            (e) => (isNotFound(e) ? [] : Promise.reject(e)),
          )
        ).map((j) => [j.id, j]),
      );
    else infos = new Map((await this.jr.listJobs(t.sandboxId)).map((j) => [j.id, j]));
    let changed = false;
    let computeMs = 0;
    for (let i = 0; i < recs.length; i++) {
      const r = recs[i]!;
      if (!want.includes(r)) continue;
      const j = infos.get(r.job);
      const next: JobRecord = j
        ? refreshed(r, j)
        : { ...r, state: 'lost', endedAt: r.endedAt ?? new Date().toISOString() };
      if (next.state !== 'running' && !next.exitLedgered) {
        const durationMs = Math.max(
          0,
          Date.parse(next.endedAt ?? new Date().toISOString()) - Date.parse(next.startedAt),
        );
        await this.d.ledger.append(t.uid, 'job.exit', {
          job: next.job,
          state: next.state,
          ...(next.exitCode !== undefined ? { exitCode: next.exitCode } : {}),
          ...(next.signal ? { signal: next.signal } : {}),
          durationMs,
          stdoutBytes: next.stdoutBytes,
          stderrBytes: next.stderrBytes,
          droppedBytes: next.droppedBytes,
        });
        next.exitLedgered = true;
        computeMs += durationMs;
      }
      if (JSON.stringify(next) !== JSON.stringify(r)) {
        recs[i] = next;
        changed = true;
      }
    }
    if (changed) await this.book.save(t.uid, recs);
    if (computeMs) {
      const u = await this.d.state.updateUsage(t.uid, (x) => ({ ...x, computeMs: x.computeMs + computeMs }));
      mirrorUsage(this.d, t.s, u);
    }
    return recs;
  }

  sync(t: SessionTarget, only?: string, known?: JobInfo): Promise<JobRecord[]> {
    return this.lock(t.uid, () => this.syncLocked(t, only, known));
  }

  /** Looks at the session's running jobs every jobSweepMs until none runs (timer unref'd). */
  sweep(t: SessionTarget): void {
    if (this.sweeps.has(t.uid)) return;
    const tick = () => {
      void this.sync(t).then(
        (recs) => {
          if (recs.some((r) => r.state === 'running'))
            this.sweeps.set(t.uid, setTimeout(tick, this.d.jobSweepMs ?? 2000).unref());
          else this.sweeps.delete(t.uid);
        },
        () => this.sweeps.delete(t.uid), // the sandbox or session is gone: the next request looks again
      );
    };
    this.sweeps.set(t.uid, setTimeout(tick, this.d.jobSweepMs ?? 2000).unref());
  }

  /** The session's record of `job`, 404 when the session never started it. */
  async record(t: SessionTarget, job: string): Promise<JobRecord> {
    const r = (await this.book.load(t.uid)).find((x) => x.job === job);
    if (!r) throw errors.notFound('agentsessions/jobs', GROUP, job);
    return r;
  }
}

function isNotFound(e: unknown): boolean {
  return e instanceof RuntimeError && e.code === 'NotFound';
}

export interface StartOptions {
  via: JobRecord['via'];
  approvalName?: string;
  waitMs: number;
  signal?: AbortSignal;
  /** exec/stream: bytes written to the job's stdin (then end-of-file) right after it starts. */
  stdinData?: Buffer;
}

/** The refusal of a budget limit a job may not start under (ledgered budget.exceeded), or undefined. */
async function jobBudget(sj: SessionJobs, t: SessionTarget, spec: JobStart, recs: JobRecord[]): Promise<void> {
  const b = t.s.spec.budget;
  if (!b) return;
  const u = await sj.d.state.usage(t.uid);
  const running = recs.filter((r) => r.state === 'running');
  const now = Date.now();
  const computeMs = u.computeMs + running.reduce((n, r) => n + Math.max(0, now - Date.parse(r.startedAt)), 0);
  const over = (limit: string, max: number, used: number, unit = '') => ({ limit, max, used, unit });
  const refusal =
    b.maxJobs !== undefined && u.jobs >= b.maxJobs
      ? over('maxJobs', b.maxJobs, u.jobs)
      : b.maxConcurrentJobs !== undefined && running.length >= b.maxConcurrentJobs
        ? over('maxConcurrentJobs', b.maxConcurrentJobs, running.length)
        : b.maxComputeSeconds !== undefined && computeMs >= b.maxComputeSeconds * 1000
          ? over('maxComputeSeconds', b.maxComputeSeconds, Math.floor(computeMs / 1000), ' s')
          : undefined;
  if (refusal) {
    await sj.d.ledger.append(t.uid, 'budget.exceeded', {
      command: displayCommand(spec.argv),
      limit: refusal.limit,
      max: refusal.max,
      used: refusal.used,
    });
    throw budgetError(refusal.limit, refusal.max, refusal.used, refusal.unit);
  }
  if (b.maxComputeSeconds !== undefined && spec.timeoutSeconds !== undefined) {
    const left = Math.floor((b.maxComputeSeconds * 1000 - computeMs) / 1000);
    if (spec.timeoutSeconds > left) {
      throw errors.invalid(KIND, GROUP, t.s.metadata.name!, [
        {
          reason: 'FieldValueInvalid',
          field: 'timeoutSeconds',
          message: `Invalid value: ${spec.timeoutSeconds}: at most ${left}, the seconds left of budget.maxComputeSeconds ${b.maxComputeSeconds}`,
        },
      ]);
    }
  }
}

/**
 * Starts a job in the session: gate, policy, approval, budget, then the runtime, the record
 * and job.start, all under the session's jobs lock (two starts cannot pass a limit together).
 */
export async function startSessionJob(
  sj: SessionJobs,
  t: SessionTarget,
  spec: JobStart,
  o: StartOptions,
): Promise<JobRecord> {
  const d = sj.d;
  const name = t.s.metadata.name!;
  const command = displayCommand(spec.argv);
  const jr = sj.jr;
  const gate = async () => {
    const op = await d.state.inFlight(t.uid);
    if (op && op.op !== 'checkpoint' && op.op !== 'delete')
      throw errors.conflict(
        'agentsessions',
        GROUP,
        name,
        `a job start is refused while a ${op.op} of this session is in flight (since ${op.startedAt})`,
      );
  };
  await gate();
  const rules = t.s.spec.policy?.process ?? {};
  const verdict = checkCommand(spec.argv, rules);
  if (!verdict.allowed) {
    await d.ledger.append(t.uid, 'job.refused', { command, reason: verdict.why });
    const e = errors.forbidden(`job.refused: ${verdict.why}`);
    e.status.details = {
      name,
      group: GROUP,
      kind: 'agentsessions',
      causes: [
        {
          reason: 'job.refused',
          message: verdict.why,
          field: verdict.rule !== undefined ? 'spec.policy.process.deny' : 'spec.policy.process.allow',
        },
      ],
    };
    throw e;
  }
  // The approval covers the command and its parameters: the stdin pipe and output cap ride in
  // the digest's stdin field (approvals.ts has one parameter slot for what is not a timeout).
  const held: HeldRequest = {
    kind: 'job',
    argv: spec.argv,
    timeoutSeconds: spec.timeoutSeconds ?? 0,
    stdin: `job stdin=${spec.stdin} maxOutputBytes=${spec.maxOutputBytes} via=${o.via}${o.stdinData ? ` data=${o.stdinData.toString('base64')}` : ''}`,
    env: spec.env,
    cwd: spec.cwd,
    transport: o.via === 'exec/stream' ? 'stream' : 'json',
  };
  const ask = (rules.ask ?? []).length ? checkCommand(spec.argv, { deny: rules.ask }) : ({ allowed: true } as const);
  let approval: string | undefined;
  if (!ask.allowed) {
    approval = await approvalGate(
      d,
      t,
      held,
      { rule: ask.rule!, piece: ask.piece },
      { approvalName: o.approvalName, waitMs: o.waitMs, signal: o.signal },
    );
    await gate();
  }
  const budget = t.s.spec.budget;
  const cap =
    budget?.maxOutputBytes !== undefined ? Math.min(budget.maxOutputBytes, spec.maxOutputBytes) : spec.maxOutputBytes;
  const rec = await sj.lock(t.uid, async () => {
    // The running jobs' states matter only to a limit that counts them; otherwise the sweep refreshes them.
    const b = t.s.spec.budget;
    const recs =
      b?.maxConcurrentJobs !== undefined || b?.maxComputeSeconds !== undefined
        ? await sj.syncLocked(t)
        : await sj.book.load(t.uid);
    await jobBudget(sj, t, spec, recs);
    let consumed: Promise<unknown> = Promise.resolve();
    if (approval) consumed = (await consumeApproval(d, t, approval, held)).ledgered;
    const id = `job-${randomBytes(6).toString('hex')}`;
    const info = await jr.startJob(t.sandboxId, {
      id,
      argv: spec.argv,
      ...(spec.env ? { env: spec.env } : {}),
      ...(spec.cwd ? { cwd: spec.cwd } : {}),
      stdin: spec.stdin,
      maxOutputBytes: cap,
      ...(spec.timeoutSeconds !== undefined ? { timeoutMs: spec.timeoutSeconds * 1000 } : {}),
    });
    const r: JobRecord = refreshed(
      {
        job: id,
        command: spec.argv,
        stdin: spec.stdin,
        maxOutputBytes: cap,
        ...(spec.timeoutSeconds !== undefined ? { timeoutSeconds: spec.timeoutSeconds } : {}),
        startedAt: info.startedAt,
        via: o.via,
        ...(approval ? { approval } : {}),
        state: 'running',
        stdoutBytes: 0,
        stderrBytes: 0,
        droppedBytes: 0,
      },
      info,
    );
    recs.push(r);
    const usage = d.state.updateUsage(t.uid, (x) => ({ ...x, jobs: x.jobs + 1 }));
    await Promise.all([
      sj.book.save(t.uid, recs),
      usage,
      consumed,
      d.ledger.append(t.uid, 'job.start', {
        job: id,
        command,
        stdin: spec.stdin,
        maxOutputBytes: cap,
        ...(spec.timeoutSeconds !== undefined ? { timeoutSeconds: spec.timeoutSeconds } : {}),
        via: o.via,
        ...(approval ? { approval } : {}),
      }),
    ]);
    mirrorUsage(d, t.s, await usage);
    return r;
  });
  sj.sweep(t);
  return rec;
}

function clientGone(r: SubresourceRequest): AbortSignal {
  const ac = new AbortController();
  const res = r.reply?.raw;
  res?.once('close', () => {
    if (!res.writableFinished) ac.abort();
  });
  return ac.signal;
}

/** agentsessions/<name>/jobs and everything below it (see controllers/common/jobs.ts for the routes). */
export function sessionJobsHandler(d: SessionJobsDeps, sj = new SessionJobs(d)): SubresourceHandler {
  return {
    verbs: ['create', 'get', 'delete'],
    subpaths: true,
    async handle(r) {
      const route = jobRoute(r, 'agentsessions', r.name);
      if (route.action === 'list') {
        let t: SessionTarget;
        try {
          t = await resolveSession(d, r);
        } catch (e) {
          // A session that is not running keeps its list (the host's record, not refreshed).
          if (!(e instanceof Error) || (e as { code?: number }).code !== 409) throw e;
          t = await resolveSession(d, r, { running: false });
        }
        const recs = t.sandboxId ? await sj.sync(t) : await sj.book.load(t.uid);
        // Jobs running from before a restart get their job.exit from the sweep, as new ones do.
        if (t.sandboxId && recs.some((x) => x.state === 'running')) sj.sweep(t);
        return {
          kind: 'AgentSessionJobList',
          apiVersion: 'fluxvm.dev/v1alpha1',
          session: r.name,
          items: recs.map(recordView),
        };
      }
      if (route.action === 'start') {
        const body = jsonBody(r);
        const spec = parseJobStart(body, KIND, r.name);
        const o = {
          via: 'jobs' as const,
          approvalName: approvalNameOf(body.approvalName),
          waitMs: approvalWaitMs(body.approvalWaitSeconds, r.name),
          signal: clientGone(r),
        };
        const t = await resolveSession(d, r);
        const v = await d.state.idempotent(t.uid, r.name, idempotencyKey(r), 'jobs', body, async () =>
          recordView(await startSessionJob(sj, t, spec, o)),
        );
        return respond({ status: 201, headers: { 'content-type': 'application/json' }, body: JSON.stringify(v) });
      }
      const job = route.job!;
      // Bounds first: bad input changes nothing, whatever state the session is in.
      const { p, stdin, signal } = jobActionParams(r, route.action, KIND, r.name);
      const t = await resolveSession(d, r);
      const rec = await sj.record(t, job);
      const jr = sj.jr;
      const nf = (e: unknown) => Promise.reject(jobNotFound(e, 'agentsessions', job, r.name));
      switch (route.action) {
        case 'read': {
          const out = await readBoth(jr, t.sandboxId, job, p!, clientGone(r)).catch(nf);
          if (out.state !== 'running' && !rec.exitLedgered) await sj.sync(t, job);
          return out;
        }
        case 'stream': {
          const first = await jr.job(t.sandboxId, job).catch(nf);
          // The end is ledgered on the way (not before the answer: the stream does not wait for the jobs lock).
          if (ended(first) && !rec.exitLedgered)
            void sj
              .sync(t, job, first)
              .catch((e) => d.log?.error('job record refresh failed', { job, error: String(e) }));
          return sseResponse((sink) =>
            streamJob(
              jr,
              t.sandboxId,
              job,
              p!,
              sink,
              async (fin) => void (rec.exitLedgered ? undefined : await sj.sync(t, job, fin)),
            ),
          );
        }
        case 'stdin': {
          if (!rec.stdin)
            throw errors.conflict(
              'agentsessions/jobs',
              GROUP,
              job,
              'the job was started without stdin (start it with stdin: true)',
            );
          await jr.writeJobStdin(t.sandboxId, job, stdin!.data, { close: stdin!.close }).catch(nf);
          await d.ledger.append(t.uid, 'job.stdin', {
            job,
            bytes: stdin!.data.length,
            ...(stdin!.close ? { close: true } : {}),
          });
          return { job, bytes: stdin!.data.length, closed: stdin!.close };
        }
        case 'kill': {
          await jr.killJob(t.sandboxId, job, signal).catch(nf);
          await d.ledger.append(t.uid, 'job.kill', { job, signal });
          const recs = await sj.sync(t, job);
          return recordView(recs.find((x) => x.job === job) ?? rec);
        }
      }
      throw errors.methodNotAllowed('unsupported');
    },
  };
}

/**
 * exec?stream=true (and exec/stream): the command as a job (same body as exec: command | argv,
 * stdin? (a string, written then closed), env?, cwd?, timeoutSeconds? 1-3600 default 300,
 * approvalName?, approvalWaitSeconds?), answered as Server-Sent Events: `start` {job, ...},
 * then the job's stream (output, stderr, exit). A dropped client resumes with
 * jobs/JOB/stream and Last-Event-ID. A command held for approval answers 428 as JSON (before
 * the stream), as every refusal does.
 */
export async function streamedExec(d: SessionJobsDeps, sj: SessionJobs, r: SubresourceRequest): Promise<unknown> {
  const body = jsonBody(r);
  const argv = argvOf(body.command ?? body.argv, body.command !== undefined ? 'command' : 'argv');
  if (body.stdin !== undefined && typeof body.stdin !== 'string') throw errors.badRequest('stdin must be a string');
  const stdinData = body.stdin !== undefined ? Buffer.from(body.stdin as string, 'utf8') : undefined;
  if (stdinData && stdinData.length > MAX_JOB_STDIN_WRITE) {
    const e = errors.tooLarge(
      `stdin: a streamed exec takes at most ${MAX_JOB_STDIN_WRITE} bytes of stdin, got ${stdinData.length}`,
    );
    e.status.details = {
      name: r.name,
      group: GROUP,
      kind: KIND,
      causes: [
        { reason: 'FieldValueTooLong', field: 'stdin', message: `Too long: at most ${MAX_JOB_STDIN_WRITE} bytes` },
      ],
    };
    throw e;
  }
  const timeoutSeconds = timeoutOf(body.timeoutSeconds, EXEC_STREAM_DEFAULT_TIMEOUT_S) / 1000;
  const spec = parseJobStart(
    {
      argv,
      ...(body.env !== undefined ? { env: body.env } : {}),
      ...(body.cwd !== undefined ? { cwd: body.cwd } : {}),
      stdin: stdinData !== undefined,
      timeoutSeconds,
    },
    KIND,
    r.name,
  );
  const o: StartOptions = {
    via: 'exec/stream',
    approvalName: approvalNameOf(body.approvalName),
    waitMs: approvalWaitMs(body.approvalWaitSeconds, r.name),
    signal: clientGone(r),
    ...(stdinData ? { stdinData } : {}),
  };
  const t = await resolveSession(d, r);
  // A stream slot first: a 429 starts nothing (a race past this check still gets a job it can stream later).
  if (hostStreams.active >= hostStreams.max)
    throw errors.tooManyRequests(
      `too many streams open on this host (at most ${hostStreams.max}); close one or retry`,
      5,
    );
  const rec = await startSessionJob(sj, t, spec, o);
  const jr = sj.jr;
  if (stdinData) {
    await jr.writeJobStdin(t.sandboxId, rec.job, stdinData, { close: true });
    await d.ledger.append(t.uid, 'job.stdin', { job: rec.job, bytes: stdinData.length, close: true });
  }
  return sseResponse(async (sink) => {
    await sink.send({ event: 'start', id: '0:0', data: recordView(rec) });
    await streamJob(
      jr,
      t.sandboxId,
      rec.job,
      { offset: 0, stderrOffset: 0 },
      sink,
      async (fin) => void (await sj.sync(t, rec.job, fin)),
    );
  });
}

/** The handlers of the session's jobs: `jobs` and the streamed exec (hooked into exec by subresources.ts). */
export function sessionJobHandlers(d: SessionJobsDeps): {
  jobs: SubresourceHandler;
  execStream: (r: SubresourceRequest) => Promise<unknown>;
  execStreamHandler: SubresourceHandler;
} {
  const sj = new SessionJobs(d);
  const execStream = (r: SubresourceRequest) => streamedExec(d, sj, r);
  return {
    jobs: sessionJobsHandler(d, sj),
    execStream,
    execStreamHandler: {
      verbs: ['create'],
      async handle(r) {
        if (r.method !== 'POST') throw errors.methodNotAllowed(`exec/stream takes POST, not ${r.method}`);
        return execStream(r);
      },
    },
  };
}
