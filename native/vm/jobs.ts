// Background jobs on vm (native/jobs.ts): the guest agent supervises them (agent/jobs.c: spools
// under /var/lib/fluxvm-jobs/<job>/ in the guest, process group and cgroup, drain past the cap,
// timeout, tree signals, long polls answered by the agent). The host keeps each job's metadata
// in the VM's directory (<vm>/jobs/<job>.json: argv, start time, cap, whether a kill was asked),
// so a restarted server lists them and refreshes their state from the guest, which kept running
// them. Every reply of the guest is checked field by field and every length it gives is bounded
// by what was asked: the guest is hostile (native/vm/README.md).
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import {
  MAX_JOB_OUTPUT_BYTES,
  MAX_JOB_STDIN_WRITE,
  MAX_JOB_WAIT_MS,
  type JobInfo,
  type JobReadRequest,
  type JobReadResult,
  type JobRequest,
} from '../jobs.js';
import { RuntimeError } from '../runtime.js';
import { checkJobId, checkJobRequest, JOB_ID } from '../jobcheck.js';
import type { AgentClient } from './agent-client.js';
import type { GuestConfine } from './confine.js';
import { AgentProtocolError, type Header } from './agent-frames.js';

/** The most bytes one read asks the guest for (the agent's cap too). */
export const MAX_VM_JOB_READ = 4 << 20;
const SIGNALS = osConstants.signals as Record<string, number>;
const SIGNAMES = new Map<number, string>(Object.entries(SIGNALS).map(([k, v]) => [v, k]));

/** What the VM backend gives this module. */
export interface VmJobHost {
  agentFor(id: string): Promise<AgentClient>;
  vmDir(id: string): string;
}

interface Meta {
  id: string;
  argv: string[];
  startedAt: string;
  maxOutputBytes: number;
  stdin: boolean;
  killRequested?: boolean;
}

interface GuestJob {
  state: 'running' | 'ended';
  exitCode: number;
  signal: number;
  timedOut: boolean;
  stdinOpen: boolean;
  stdoutBytes: number;
  stderrBytes: number;
  droppedBytes: number;
  endedMs: number;
}

function metaPath(h: VmJobHost, id: string, jobId: string): string {
  checkJobId(jobId);
  return join(h.vmDir(id), 'jobs', `${jobId}.json`);
}

function readMeta(p: string): Meta | undefined {
  try {
    return JSON.parse(readFileSync(p, 'utf8')) as Meta;
  } catch {
    return undefined;
  }
}

function writeMeta(p: string, m: Meta): void {
  writeFileSync(`${p}.tmp`, JSON.stringify(m), { mode: 0o600 });
  renameSync(`${p}.tmp`, p);
}

const int = (v: unknown, lo: number, hi: number) =>
  typeof v === 'number' && Number.isSafeInteger(v) && v >= lo && v <= hi;

/** The job fields of a guest reply, every one checked; a reply that fails is a protocol violation. Pure. */
export function guestJob(h: Header): GuestJob {
  const ok =
    (h.state === 'running' || h.state === 'ended') &&
    int(h.exitCode, -1, 255) &&
    int(h.signal, 0, 64) &&
    typeof h.timedOut === 'boolean' &&
    typeof h.stdinOpen === 'boolean' &&
    int(h.stdoutBytes, 0, MAX_JOB_OUTPUT_BYTES) &&
    int(h.stderrBytes, 0, MAX_JOB_OUTPUT_BYTES) &&
    int(h.droppedBytes, 0, Number.MAX_SAFE_INTEGER) &&
    int(h.endedMs, 0, 8.64e15);
  if (!ok) throw new AgentProtocolError('a job reply with a missing or out-of-range field');
  return h as unknown as GuestJob;
}

function infoOf(m: Meta, g: GuestJob | undefined): JobInfo {
  const base = { id: m.id, argv: m.argv, startedAt: m.startedAt, engine: 'supervisor' as const };
  if (!g) return { ...base, state: 'lost', stdoutBytes: 0, stderrBytes: 0, droppedBytes: 0, stdinOpen: false };
  const sizes = {
    stdoutBytes: Math.min(g.stdoutBytes, m.maxOutputBytes),
    stderrBytes: Math.min(g.stderrBytes, m.maxOutputBytes),
    droppedBytes: g.droppedBytes,
  };
  if (g.state === 'running') return { ...base, ...sizes, state: 'running', stdinOpen: g.stdinOpen };
  const ended = { ...base, ...sizes, stdinOpen: false, endedAt: new Date(g.endedMs).toISOString() };
  const how = g.signal > 0 ? { signal: SIGNAMES.get(g.signal) ?? String(g.signal) } : { exitCode: g.exitCode };
  if (g.timedOut) return { ...ended, ...how, state: 'timed_out' };
  if (m.killRequested) return { ...ended, ...how, state: 'killed' };
  return { ...ended, ...how, state: g.signal > 0 ? 'signaled' : 'exited' };
}

/** A call to the agent; a broken reply closes the channel (the VM is failed by its owner). */
async function call(
  agent: AgentClient,
  op: string,
  args: Record<string, unknown>,
  payload?: Buffer,
  timeoutMs = 30_000,
): Promise<{ g: GuestJob; payload: Buffer }> {
  const r = await agent.call(op, args, payload, timeoutMs);
  try {
    return { g: guestJob(r.h), payload: r.payload };
  } catch (e) {
    throw agent.violate(e as AgentProtocolError);
  }
}

/** The guest's view of a job, or undefined when the guest does not know it (a restored or rebooted guest). */
async function refresh(agent: AgentClient, jobId: string): Promise<GuestJob | undefined> {
  try {
    return (await call(agent, 'jobinfo', { job: jobId })).g;
  } catch (e) {
    if (e instanceof RuntimeError && e.code === 'NotFound') return undefined;
    throw e;
  }
}

function load(h: VmJobHost, id: string, jobId: string): { path: string; meta: Meta } {
  const path = metaPath(h, id, jobId);
  const meta = readMeta(path);
  if (!meta) throw new RuntimeError('NotFound', `job ${jobId} not found in sandbox ${id}`);
  return { path, meta };
}

const locks = new Map<string, Promise<unknown>>();
function locked<T>(key: string, fn: () => Promise<T>): Promise<T> {
  const prev = locks.get(key) ?? Promise.resolve();
  const next = prev.then(fn, fn);
  const tail = next.catch(() => undefined);
  locks.set(key, tail);
  void tail.then(() => locks.get(key) === tail && locks.delete(key));
  return next;
}

/** `req.confine`: the VM's confinement (VmHost.execReq), applied to the job as to an exec (agent/confine.c). */
export async function startJob(
  h: VmJobHost,
  id: string,
  req: JobRequest & { confine?: GuestConfine },
): Promise<JobInfo> {
  const max = checkJobRequest(req);
  const path = metaPath(h, id, req.id);
  const agent = await h.agentFor(id);
  return locked(`${id}/${req.id}`, async () => {
    const existing = readMeta(path);
    if (existing) return infoOf(existing, await refresh(agent, req.id));
    mkdirSync(join(h.vmDir(id), 'jobs'), { recursive: true, mode: 0o700 });
    const meta: Meta = {
      id: req.id,
      argv: [...req.argv],
      startedAt: new Date().toISOString(),
      maxOutputBytes: max,
      stdin: !!req.stdin,
    };
    writeMeta(path, meta);
    try {
      const { g } = await call(agent, 'jobstart', {
        job: req.id,
        argv: req.argv,
        env: req.env ?? {},
        cwd: req.cwd ?? '/',
        stdin: !!req.stdin,
        maxOutputBytes: max,
        ...(req.timeoutMs ? { timeoutMs: req.timeoutMs } : {}),
        ...(req.confine ? { confine: req.confine } : {}),
      });
      return infoOf(meta, g);
    } catch (e) {
      rmSync(path, { force: true });
      throw e;
    }
  });
}

export async function listJobs(h: VmJobHost, id: string): Promise<JobInfo[]> {
  const agent = await h.agentFor(id);
  let names: string[] = [];
  try {
    names = readdirSync(join(h.vmDir(id), 'jobs')).filter((n) => n.endsWith('.json'));
  } catch {
    return [];
  }
  const out: JobInfo[] = [];
  for (const n of names) {
    const jobId = n.slice(0, -5);
    if (!JOB_ID.test(jobId)) continue;
    const meta = readMeta(join(h.vmDir(id), 'jobs', n));
    if (meta) out.push(infoOf(meta, await refresh(agent, jobId)));
  }
  return out.sort((a, b) => (a.startedAt < b.startedAt ? -1 : a.startedAt > b.startedAt ? 1 : a.id < b.id ? -1 : 1));
}

export async function job(h: VmJobHost, id: string, jobId: string): Promise<JobInfo> {
  const agent = await h.agentFor(id);
  const { meta } = load(h, id, jobId);
  return infoOf(meta, await refresh(agent, jobId));
}

export async function readJob(h: VmJobHost, id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult> {
  const agent = await h.agentFor(id);
  const { meta } = load(h, id, jobId);
  if (req.stream !== 'stdout' && req.stream !== 'stderr')
    throw new RuntimeError('InvalidArgument', 'stream must be stdout or stderr');
  if (!Number.isSafeInteger(req.offset) || req.offset < 0)
    throw new RuntimeError('InvalidArgument', 'offset must be a non-negative integer');
  if (!Number.isSafeInteger(req.maxBytes) || req.maxBytes < 1)
    throw new RuntimeError('InvalidArgument', 'maxBytes must be a positive integer');
  const waitMs = req.signal?.aborted ? 0 : Math.min(Math.max(0, Math.floor(req.waitMs ?? 0)), MAX_JOB_WAIT_MS);
  const want = Math.min(req.maxBytes, MAX_VM_JOB_READ);
  const asked = call(
    agent,
    'jobread',
    { job: jobId, stream: req.stream, offset: req.offset, maxBytes: want, waitMs },
    undefined,
    waitMs + 30_000,
  ).then(
    ({ g, payload }) => {
      if (payload.length > want) throw agent.violate(`a job read of at most ${want} bytes answered ${payload.length}`);
      const info = infoOf(meta, g);
      const size = req.stream === 'stdout' ? info.stdoutBytes : info.stderrBytes;
      const data = payload.subarray(0, Math.max(0, Math.min(payload.length, size - req.offset)));
      const next = req.offset + data.length;
      return { data, nextOffset: next, eof: info.state !== 'running' && next >= size, job: info };
    },
    async (e: unknown) => {
      if (e instanceof RuntimeError && e.code === 'NotFound')
        return { data: Buffer.alloc(0), nextOffset: req.offset, eof: true, job: infoOf(meta, undefined) };
      throw e;
    },
  );
  if (!req.signal || waitMs === 0) return asked;
  // An abort answers at once with what is known (the agent's wait ends on its own, at most 25 s later).
  const signal = req.signal;
  return new Promise<JobReadResult>((resolve, reject) => {
    const onAbort = () => {
      void job(h, id, jobId).then(
        (info) => resolve({ data: Buffer.alloc(0), nextOffset: req.offset, eof: false, job: info }),
        reject,
      );
    };
    signal.addEventListener('abort', onAbort, { once: true });
    asked.then(
      (r) => (signal.removeEventListener('abort', onAbort), resolve(r)),
      (e: unknown) => (signal.removeEventListener('abort', onAbort), reject(e as Error)),
    );
  });
}

export async function writeJobStdin(
  h: VmJobHost,
  id: string,
  jobId: string,
  data: Buffer,
  opts?: { close?: boolean },
): Promise<void> {
  const agent = await h.agentFor(id);
  const { meta } = load(h, id, jobId);
  if (!Buffer.isBuffer(data) || data.length > MAX_JOB_STDIN_WRITE)
    throw new RuntimeError('InvalidArgument', `a stdin write carries at most ${MAX_JOB_STDIN_WRITE} bytes`);
  if (!meta.stdin) throw new RuntimeError('Conflict', `job ${jobId} was started without stdin`);
  await locked(`stdin:${id}/${jobId}`, async () => {
    await call(agent, 'jobstdin', { job: jobId, eof: !!opts?.close }, data);
  });
}

export async function killJob(h: VmJobHost, id: string, jobId: string, signal = 'SIGTERM'): Promise<void> {
  const agent = await h.agentFor(id);
  const { path, meta } = load(h, id, jobId);
  const name = typeof signal === 'string' && !signal.startsWith('SIG') ? `SIG${signal}` : signal;
  const num = typeof name === 'string' ? SIGNALS[name] : undefined;
  if (num === undefined || num === 0) throw new RuntimeError('InvalidArgument', `unknown signal ${String(signal)}`);
  const g = await refresh(agent, jobId);
  if (!g || g.state !== 'running') return;
  if (!meta.killRequested) writeMeta(path, { ...meta, killRequested: true });
  await call(agent, 'jobkill', { job: jobId, signal: num });
}
