// Background jobs over the subresource hook, the parts sandboxes/jobs and agentsessions/jobs
// share (spec/agent-sessions.md "Background jobs"; the runtime's contract is native/jobs.ts):
//
//   POST   jobs                      start {command | argv, stdin?, maxOutputBytes?, timeoutSeconds?, env?, cwd?}
//   GET    jobs                      list
//   GET    jobs/JOB                  read ?offset=&stderrOffset=&waitMs=&maxBytes= (long poll <= 25 s)
//   GET    jobs/JOB/stream           Server-Sent Events (output, stderr, exit); id "<stdout>:<stderr>"
//   POST   jobs/JOB/stdin            {text | dataBase64, close?} or raw bytes (application/octet-stream, ?close=true)
//   DELETE jobs/JOB                  ?signal=TERM: the whole process tree
// The same routes answer with the job in the query (`jobs?job=JOB`, `jobs?job=JOB&stream=true`,
// `POST jobs?job=JOB` for stdin, `DELETE jobs?job=JOB`) for servers without subpaths.
//
// Every byte of a job's output is the sandbox's: it reaches the client as base64 (bytes exact),
// with a UTF-8 text copy only where the bytes are valid UTF-8. Every bound is checked here
// before the runtime is asked; bad input is a metav1.Status naming the field and changes nothing.
import { RuntimeError } from '../../native/runtime.js';
import {
  MAX_JOB_OUTPUT_BYTES,
  MAX_JOB_STDIN_WRITE,
  MAX_JOB_WAIT_MS,
  DEFAULT_JOB_OUTPUT_BYTES,
  type JobInfo,
  type JobReadResult,
  type JobRuntime,
} from '../../native/jobs.js';
import type { SubresourceRequest, SubresourceTarget } from '../../runtime/apiserver/http/subresources.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import type { StatusCause } from '../../runtime/meta/types.js';
import { toStatusError } from './errors.js';
import { lastEventId, type SseSink } from './sse.js';
import { validEnvEntry } from '../../native/env.js';

/** The longest a job may be given (timeoutSeconds): a day, the longest a session lives. */
export const MAX_JOB_TIMEOUT_SECONDS = 86_400;
/** Bytes one read returns per stream (maxBytes default and bound). */
export const DEFAULT_READ_BYTES = 1024 * 1024;
export const MAX_READ_BYTES = 4 * 1024 * 1024;
/** Bytes one stream event carries at most. */
export const EVENT_BYTES = 64 * 1024;
/** How long a stream's long poll waits per round (the runtime bound). */
const STREAM_WAIT_MS = MAX_JOB_WAIT_MS;

/** Signals a kill may send (without the SIG prefix, any case). */
export const JOB_SIGNALS = ['TERM', 'KILL', 'INT', 'HUP', 'QUIT', 'USR1', 'USR2', 'STOP', 'CONT'] as const;

/** The runtime's job half, when it has one (procbox and vm implement native/jobs.ts). */
export function jobRuntimeOf(rt: unknown): JobRuntime | undefined {
  const j = rt as Partial<JobRuntime> | undefined;
  return j && typeof j.startJob === 'function' && typeof j.readJob === 'function' ? (j as JobRuntime) : undefined;
}

/** 409 when the runtime has no jobs (the document: without the job supervisor the start is refused). */
export function requireJobs(rt: unknown): JobRuntime {
  const j = jobRuntimeOf(rt);
  if (!j)
    throw new StatusError(409, 'Conflict', 'background jobs are not available: this runtime has no job supervisor');
  return j;
}

export type JobAction = 'list' | 'start' | 'read' | 'stream' | 'stdin' | 'kill';

const JOB_ID = /^[a-z0-9][a-z0-9-]{0,62}$/;

/**
 * What a request on `jobs` asks for: the job (from the subpath or ?job=) and the action.
 * 404 for an unknown path, 405 for a method it does not take. Pure.
 */
export function jobRoute(
  r: Pick<SubresourceRequest, 'method' | 'query'> & { subpath?: string },
  plural: string,
  name: string,
): { action: JobAction; job?: string } {
  const parts = r.subpath ? r.subpath.split('/') : [];
  const q = r.query.job;
  const qjob = Array.isArray(q) ? q[0] : q;
  const job = parts[0] ?? (qjob === '' ? undefined : qjob);
  const tail = parts[1];
  if (parts.length > 2 || (tail !== undefined && tail !== 'stream' && tail !== 'stdin'))
    throw new StatusError(404, 'NotFound', 'the server could not find the requested resource');
  if (job !== undefined && !JOB_ID.test(job)) throw errors.notFound(`${plural}/jobs`, 'fluxvm.dev', job.slice(0, 80));
  const m = r.method;
  const bad = (allowed: string) =>
    errors.methodNotAllowed(
      `${plural}/${name}/jobs${job ? `/${job}${tail ? `/${tail}` : ''}` : ''} takes ${allowed}, not ${m}`,
    );
  if (job === undefined) {
    if (m === 'GET') return { action: 'list' };
    if (m === 'POST') return { action: 'start' };
    throw bad('GET (list) or POST (start)');
  }
  const streamQ = r.query.stream;
  const wantsStream =
    tail === 'stream' || (tail === undefined && (streamQ === 'true' || streamQ === '1' || streamQ === ''));
  if (wantsStream) {
    if (m !== 'GET') throw bad('GET');
    return { action: 'stream', job };
  }
  if (tail === 'stdin') {
    if (m !== 'POST') throw bad('POST');
    return { action: 'stdin', job };
  }
  if (m === 'GET') return { action: 'read', job };
  if (m === 'DELETE') return { action: 'kill', job };
  if (m === 'POST') return { action: 'stdin', job };
  throw bad('GET, POST (stdin) or DELETE (kill)');
}

export interface JobStart {
  argv: string[];
  stdin: boolean;
  maxOutputBytes: number;
  /** Seconds; undefined: no timeout. */
  timeoutSeconds?: number;
  env?: Record<string, string>;
  cwd?: string;
}

const invalid = (kind: string, name: string, causes: StatusCause[]) => errors.invalid(kind, 'fluxvm.dev', name, causes);

function intField(v: unknown, field: string, min: number, max: number, kind: string, name: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) {
    throw invalid(kind, name, [
      {
        reason: 'FieldValueInvalid',
        field,
        message: `Invalid value: ${JSON.stringify(v)}: must be an integer between ${min} and ${max}`,
      },
    ]);
  }
  return v;
}

/** The start body checked (422 naming the field). `kind` is the Kind the Status names (Sandbox, AgentSession). Pure. */
export function parseJobStart(body: Record<string, unknown>, kind: string, name: string): JobStart {
  const field = body.argv !== undefined && body.command === undefined ? 'argv' : 'command';
  const v = body.command ?? body.argv;
  let argv: string[];
  if (typeof v === 'string' && v !== '' && !v.includes('\0')) argv = ['sh', '-c', v];
  else if (Array.isArray(v) && v.length > 0 && v.every((a) => typeof a === 'string' && !a.includes('\0')))
    argv = v as string[];
  else
    throw invalid(kind, name, [
      {
        reason: v === undefined ? 'FieldValueRequired' : 'FieldValueInvalid',
        field,
        message:
          v === undefined
            ? 'Required value: a shell command string or an argv list'
            : 'Invalid value: a non-empty shell command string or a non-empty list of strings without NUL',
      },
    ]);
  if (body.stdin !== undefined && typeof body.stdin !== 'boolean')
    throw invalid(kind, name, [
      {
        reason: 'FieldValueInvalid',
        field: 'stdin',
        message: 'Invalid value: true gives the job a stdin pipe (write it through jobs/JOB/stdin)',
      },
    ]);
  const maxOutputBytes =
    body.maxOutputBytes === undefined
      ? DEFAULT_JOB_OUTPUT_BYTES
      : intField(body.maxOutputBytes, 'maxOutputBytes', 0, MAX_JOB_OUTPUT_BYTES, kind, name);
  const timeoutSeconds =
    body.timeoutSeconds === undefined
      ? undefined
      : intField(body.timeoutSeconds, 'timeoutSeconds', 1, MAX_JOB_TIMEOUT_SECONDS, kind, name);
  let env: Record<string, string> | undefined;
  if (body.env !== undefined) {
    const e = body.env;
    if (!e || typeof e !== 'object' || Array.isArray(e) || Object.entries(e).some(([k, x]) => !validEnvEntry(k, x))) {
      throw invalid(kind, name, [
        { reason: 'FieldValueInvalid', field: 'env', message: 'Invalid value: an object of NAME: value strings' },
      ]);
    }
    env = e as Record<string, string>;
  }
  if (
    body.cwd !== undefined &&
    (typeof body.cwd !== 'string' || !body.cwd.startsWith('/') || body.cwd.includes('\0'))
  ) {
    throw invalid(kind, name, [
      { reason: 'FieldValueInvalid', field: 'cwd', message: 'Invalid value: an absolute path' },
    ]);
  }
  return {
    argv,
    stdin: body.stdin === true,
    maxOutputBytes,
    ...(timeoutSeconds !== undefined ? { timeoutSeconds } : {}),
    ...(env ? { env } : {}),
    ...(body.cwd !== undefined ? { cwd: body.cwd as string } : {}),
  };
}

/**
 * A stdin write: `{text | dataBase64, close?}` as JSON, or the raw body (application/octet-stream,
 * ?close=). 413 past 48 KiB naming the field. Pure.
 */
export function parseStdin(
  r: Pick<SubresourceRequest, 'body' | 'headers' | 'query'>,
  kind: string,
  name: string,
): { data: Buffer; close: boolean; field: string } {
  const ct = String(r.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  const tooBig = (field: string, n: number) => {
    const e = errors.tooLarge(
      `${field}: a stdin write carries at most ${MAX_JOB_STDIN_WRITE} bytes, got ${n}; split it`,
    );
    e.status.details = {
      name,
      group: 'fluxvm.dev',
      kind,
      causes: [
        { reason: 'FieldValueTooLong', field, message: `Too long: at most ${MAX_JOB_STDIN_WRITE} bytes, got ${n}` },
      ],
    };
    return e;
  };
  if (ct === 'application/octet-stream') {
    const data = r.body ?? Buffer.alloc(0);
    if (data.length > MAX_JOB_STDIN_WRITE) throw tooBig('body', data.length);
    const c = Array.isArray(r.query.close) ? r.query.close[0] : r.query.close;
    if (c !== undefined && !['true', 'false', '1', '0', ''].includes(c))
      throw invalid(kind, name, [
        { reason: 'FieldValueInvalid', field: 'close', message: 'Invalid value: true or false' },
      ]);
    return { data, close: c === 'true' || c === '1' || c === '', field: 'body' };
  }
  let b: unknown;
  try {
    b = r.body && r.body.length ? JSON.parse(r.body.toString('utf8')) : {};
  } catch (e) {
    throw errors.badRequest(`the request body is not valid JSON: ${(e as Error).message}`);
  }
  if (!b || typeof b !== 'object' || Array.isArray(b))
    throw errors.badRequest('the request body must be a JSON object');
  const o = b as Record<string, unknown>;
  if (o.text !== undefined && o.dataBase64 !== undefined)
    throw invalid(kind, name, [
      { reason: 'FieldValueForbidden', field: 'dataBase64', message: 'Forbidden: give text or dataBase64, not both' },
    ]);
  if (o.close !== undefined && typeof o.close !== 'boolean')
    throw invalid(kind, name, [{ reason: 'FieldValueInvalid', field: 'close', message: 'Invalid value: a boolean' }]);
  let data = Buffer.alloc(0);
  let field = 'text';
  if (o.text !== undefined) {
    if (typeof o.text !== 'string')
      throw invalid(kind, name, [{ reason: 'FieldValueInvalid', field: 'text', message: 'Invalid value: a string' }]);
    data = Buffer.from(o.text, 'utf8');
  } else if (o.dataBase64 !== undefined) {
    field = 'dataBase64';
    if (
      typeof o.dataBase64 !== 'string' ||
      !/^[A-Za-z0-9+/]*={0,2}$/.test(o.dataBase64) ||
      o.dataBase64.length % 4 !== 0
    ) {
      throw invalid(kind, name, [
        { reason: 'FieldValueInvalid', field, message: 'Invalid value: standard base64 (padded)' },
      ]);
    }
    data = Buffer.from(o.dataBase64, 'base64');
  } else if (o.close !== true) {
    throw invalid(kind, name, [
      { reason: 'FieldValueRequired', field: 'text', message: 'Required value: text or dataBase64 (or close: true)' },
    ]);
  }
  if (data.length > MAX_JOB_STDIN_WRITE) throw tooBig(field, data.length);
  return { data, close: o.close === true, field };
}

/** A kill's ?signal= (TERM by default) as the runtime names it ('SIGTERM'); 422 naming signal otherwise. Pure. */
export function parseSignal(v: string | undefined, kind: string, name: string): string {
  if (v === undefined || v === '') return 'SIGTERM';
  const s = v.toUpperCase().replace(/^SIG/, '');
  if (!(JOB_SIGNALS as readonly string[]).includes(s)) {
    throw invalid(kind, name, [
      {
        reason: 'FieldValueNotSupported',
        field: 'signal',
        message: `Unsupported value: ${JSON.stringify(v.slice(0, 40))}: supported values: ${JOB_SIGNALS.join(', ')}`,
      },
    ]);
  }
  return `SIG${s}`;
}

export interface ReadParams {
  offset: number;
  stderrOffset: number;
  waitMs: number;
  maxBytes: number;
}

function qInt(
  r: Pick<SubresourceTarget, 'query'>,
  key: string,
  def: number,
  max: number,
  kind: string,
  name: string,
): number {
  const q = r.query[key];
  const v = Array.isArray(q) ? q[0] : q;
  if (v === undefined || v === '') return def;
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n) || n > max) {
    throw invalid(kind, name, [
      {
        reason: 'FieldValueInvalid',
        field: key,
        message: `Invalid value: ${JSON.stringify(v.slice(0, 40))}: must be an integer between 0 and ${max}`,
      },
    ]);
  }
  return n;
}

/**
 * The cursor and wait of a read or stream: ?offset=&stderrOffset=&waitMs=&maxBytes=, and for a
 * stream a Last-Event-ID "<stdout>:<stderr>" (it wins over the query: the client resumes after
 * the last event it saw). 422 naming the field. Pure.
 */
export function readParams(
  r: Pick<SubresourceTarget, 'query' | 'headers'>,
  kind: string,
  name: string,
  stream = false,
): ReadParams {
  const p: ReadParams = {
    offset: qInt(r, 'offset', 0, Number.MAX_SAFE_INTEGER, kind, name),
    stderrOffset: qInt(r, 'stderrOffset', 0, Number.MAX_SAFE_INTEGER, kind, name),
    waitMs: qInt(r, 'waitMs', 0, MAX_JOB_WAIT_MS, kind, name),
    maxBytes: qInt(r, 'maxBytes', DEFAULT_READ_BYTES, MAX_READ_BYTES, kind, name),
  };
  if (p.maxBytes === 0)
    throw invalid(kind, name, [
      {
        reason: 'FieldValueInvalid',
        field: 'maxBytes',
        message: `Invalid value: 0: must be an integer between 1 and ${MAX_READ_BYTES}`,
      },
    ]);
  if (stream) {
    const id = lastEventId(r);
    if (id !== undefined) {
      const m = /^(\d{1,15}):(\d{1,15})$/.exec(id);
      if (!m)
        throw invalid(kind, name, [
          {
            reason: 'FieldValueInvalid',
            field: 'Last-Event-ID',
            message: `Invalid value: ${JSON.stringify(id.slice(0, 40))}: the id of an event of this stream ("<stdout>:<stderr>")`,
          },
        ]);
      p.offset = Number(m[1]);
      p.stderrOffset = Number(m[2]);
    }
  }
  return p;
}

/** The JSON of a job (the document's fields, camelCase). Pure. */
export function jobView(j: JobInfo, extra: Record<string, unknown> = {}) {
  return {
    job: j.id,
    command: j.argv,
    state: j.state,
    ...(j.exitCode !== undefined ? { exitCode: j.exitCode } : {}),
    ...(j.signal ? { signal: j.signal } : {}),
    startedAt: j.startedAt,
    ...(j.endedAt ? { endedAt: j.endedAt } : {}),
    stdoutBytes: j.stdoutBytes,
    stderrBytes: j.stderrBytes,
    droppedBytes: j.droppedBytes,
    stdinOpen: j.stdinOpen,
    engine: j.engine,
    ...extra,
  };
}

/** Bytes as the document sends them: base64 always, a UTF-8 copy when they are valid UTF-8. Pure. */
export function bytesFields(b: Buffer, prefix: 'output' | 'stderr'): Record<string, string> {
  const text = b.toString('utf8');
  const exact = Buffer.from(text, 'utf8').equals(b);
  return { [`${prefix}Base64`]: b.toString('base64'), ...(exact ? { [prefix]: text } : {}) };
}

/** Whether a job state is final. */
export const ended = (j: JobInfo) => j.state !== 'running';

/**
 * One read of both streams (GET jobs/JOB): with waitMs, holds until either stream has bytes
 * past its offset or the job ends (whichever first; the other wait is aborted), then reads
 * both without waiting, so the answer is one consistent cut.
 */
export async function readBoth(jr: JobRuntime, id: string, job: string, p: ReadParams, signal?: AbortSignal) {
  if (p.waitMs > 0) {
    const ac = new AbortController();
    const stop = () => ac.abort();
    signal?.addEventListener('abort', stop, { once: true });
    try {
      const waits = [
        jr.readJob(id, job, { stream: 'stdout', offset: p.offset, maxBytes: 1, waitMs: p.waitMs, signal: ac.signal }),
        jr.readJob(id, job, {
          stream: 'stderr',
          offset: p.stderrOffset,
          maxBytes: 1,
          waitMs: p.waitMs,
          signal: ac.signal,
        }),
      ];
      waits.forEach((w) => w.catch(() => undefined));
      await Promise.race(waits);
    } finally {
      ac.abort();
      signal?.removeEventListener('abort', stop);
    }
  }
  const [out, err] = await Promise.all([
    jr.readJob(id, job, { stream: 'stdout', offset: p.offset, maxBytes: p.maxBytes }),
    jr.readJob(id, job, { stream: 'stderr', offset: p.stderrOffset, maxBytes: p.maxBytes }),
  ]);
  const info = out.job.state !== 'running' ? out.job : err.job;
  return {
    ...jobView(info),
    offset: p.offset,
    nextOffset: out.nextOffset,
    ...bytesFields(out.data, 'output'),
    stderrOffset: p.stderrOffset,
    stderrNextOffset: err.nextOffset,
    ...bytesFields(err.data, 'stderr'),
    more: out.nextOffset < info.stdoutBytes || err.nextOffset < info.stderrBytes,
    truncated: info.droppedBytes > 0,
    eof: out.eof && err.eof,
  };
}

/** The terminal event of a job stream (exit). */
export function exitData(j: JobInfo) {
  return {
    job: j.id,
    state: j.state,
    ...(j.exitCode !== undefined ? { exitCode: j.exitCode } : {}),
    ...(j.signal ? { signal: j.signal } : {}),
    droppedBytes: j.droppedBytes,
    stdoutBytes: j.stdoutBytes,
    stderrBytes: j.stderrBytes,
  };
}

/**
 * Feeds `sink` with a job's output from `from`: `output` and `stderr` events (each one read of
 * one stream, at most EVENT_BYTES, `{offset, nextOffset, outputBase64, output?}`) whose id is
 * "<stdout next>:<stderr next>" after it, then one `exit` event with the same id. Two long
 * polls (one per stream) pace it, not a timer; events go out one at a time, so an id always
 * covers exactly the bytes sent before it: resuming after it repeats and misses nothing.
 * `onEnd` is told the final JobInfo before the exit event is sent.
 */
export async function streamJob(
  jr: JobRuntime,
  id: string,
  job: string,
  from: { offset: number; stderrOffset: number },
  sink: SseSink,
  onEnd?: (j: JobInfo) => Promise<void> | void,
): Promise<void> {
  const cur = { stdout: from.offset, stderr: from.stderrOffset };
  let chain: Promise<void> = Promise.resolve();
  let last: JobInfo | undefined;
  // One sender at a time: the cursor moves and the event is queued together.
  const emit = (stream: 'stdout' | 'stderr', r: JobReadResult) => {
    const next = chain.then(() => {
      const offset = cur[stream];
      cur[stream] = r.nextOffset;
      return sink.send({
        event: stream === 'stdout' ? 'output' : 'stderr',
        id: `${cur.stdout}:${cur.stderr}`,
        data: { offset, nextOffset: r.nextOffset, ...bytesFields(r.data, stream === 'stdout' ? 'output' : 'stderr') },
      });
    });
    chain = next.catch(() => undefined);
    return next;
  };
  const pump = async (stream: 'stdout' | 'stderr') => {
    let offset = cur[stream];
    for (;;) {
      if (sink.signal.aborted) return;
      const r = await jr.readJob(id, job, {
        stream,
        offset,
        maxBytes: EVENT_BYTES,
        waitMs: STREAM_WAIT_MS,
        signal: sink.signal,
      });
      last = r.job;
      if (r.data.length) {
        await emit(stream, r);
        offset = r.nextOffset;
      }
      if (r.eof) return;
    }
  };
  await Promise.all([pump('stdout'), pump('stderr')]);
  if (sink.signal.aborted) return;
  await chain;
  const fin = last && ended(last) ? last : await jr.job(id, job);
  await onEnd?.(fin);
  await sink.send({ event: 'exit', id: `${cur.stdout}:${cur.stderr}`, data: exitData(fin) });
}

/**
 * A runtime error of a job call as its Status: NotFound is the 404 of `<plural>/jobs` JOB, the rest
 * as toStatusError maps them (Conflict: 409).
 */
export function jobNotFound(e: unknown, plural: string, job: string, name: string): StatusError {
  if (e instanceof RuntimeError && e.code === 'NotFound') return errors.notFound(`${plural}/jobs`, 'fluxvm.dev', job);
  return toStatusError(e, { resource: plural, group: 'fluxvm.dev', name });
}

/**
 * The per-action parameters of a job request, checked before anything is looked up (bad input
 * changes nothing, whatever state the sandbox or session is in): read/stream bounds, a stdin
 * write, a kill's signal. Shared by sandboxes/jobs and agentsessions/jobs.
 */
export function jobActionParams(
  r: Pick<SubresourceRequest, 'body' | 'headers' | 'query'>,
  action: JobAction,
  kind: string,
  name: string,
): {
  p: ReturnType<typeof readParams> | undefined;
  stdin: ReturnType<typeof parseStdin> | undefined;
  signal: string | undefined;
} {
  const p = action === 'read' || action === 'stream' ? readParams(r, kind, name, action === 'stream') : undefined;
  const stdin = action === 'stdin' ? parseStdin(r, kind, name) : undefined;
  const q = r.query.signal;
  const signal = action === 'kill' ? parseSignal(Array.isArray(q) ? q[0] : q, kind, name) : undefined;
  return { p, stdin, signal };
}
