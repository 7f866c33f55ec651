// A JobRuntime in memory for the handlers' tests (native/jobs.ts is the contract): jobs are
// driven by the test (emit bytes to a stream, end it), reads honour offsets, maxBytes, waitMs
// and the abort signal, stdin is recorded, a kill ends the job as `killed`.
import { EventEmitter } from 'node:events';
import type { JobInfo, JobReadRequest, JobReadResult, JobRequest, JobRuntime } from '../../../native/jobs.js';
import { RuntimeError } from '../../../native/runtime.js';

interface FakeJob {
  info: JobInfo;
  req: JobRequest;
  out: Buffer;
  err: Buffer;
  stdin: Buffer[];
  cap: number;
}

export class FakeJobs implements JobRuntime {
  readonly jobs = new Map<string, FakeJob>();
  readonly calls: string[] = [];
  private readonly ev = new EventEmitter();
  constructor() {
    this.ev.setMaxListeners(0);
  }

  private get(id: string, jobId: string): FakeJob {
    const j = this.jobs.get(`${id}/${jobId}`);
    if (!j) throw new RuntimeError('NotFound', `job ${jobId} not found`);
    return j;
  }

  async startJob(id: string, req: JobRequest): Promise<JobInfo> {
    this.calls.push(`start ${req.id}`);
    const info: JobInfo = {
      id: req.id,
      argv: req.argv,
      state: 'running',
      startedAt: new Date().toISOString(),
      stdoutBytes: 0,
      stderrBytes: 0,
      droppedBytes: 0,
      stdinOpen: !!req.stdin,
      engine: 'supervisor',
    };
    this.jobs.set(`${id}/${req.id}`, {
      info,
      req,
      out: Buffer.alloc(0),
      err: Buffer.alloc(0),
      stdin: [],
      cap: req.maxOutputBytes ?? 16 << 20,
    });
    return { ...info };
  }
  async listJobs(id: string): Promise<JobInfo[]> {
    return [...this.jobs.entries()].filter(([k]) => k.startsWith(`${id}/`)).map(([, j]) => ({ ...j.info }));
  }
  async job(id: string, jobId: string): Promise<JobInfo> {
    return { ...this.get(id, jobId).info };
  }
  async readJob(id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult> {
    const j = this.get(id, jobId);
    const buf = () => (req.stream === 'stdout' ? j.out : j.err);
    if (req.waitMs && buf().length <= req.offset && j.info.state === 'running' && !req.signal?.aborted) {
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(t);
          this.ev.off(`${id}/${jobId}`, done);
          req.signal?.removeEventListener('abort', done);
          resolve();
        };
        const t = setTimeout(done, req.waitMs);
        this.ev.on(`${id}/${jobId}`, done);
        req.signal?.addEventListener('abort', done, { once: true });
      });
    }
    const data = Buffer.from(buf().subarray(req.offset, req.offset + req.maxBytes));
    const nextOffset = req.offset + data.length;
    return { data, nextOffset, eof: j.info.state !== 'running' && nextOffset >= buf().length, job: { ...j.info } };
  }
  async writeJobStdin(id: string, jobId: string, data: Buffer, opts?: { close?: boolean }): Promise<void> {
    const j = this.get(id, jobId);
    if (j.info.state !== 'running' || !j.info.stdinOpen)
      throw new RuntimeError('Conflict', `job ${jobId} has no open stdin (state ${j.info.state})`);
    j.stdin.push(Buffer.from(data));
    if (opts?.close) j.info.stdinOpen = false;
  }
  async killJob(id: string, jobId: string, signal = 'SIGTERM'): Promise<void> {
    this.calls.push(`kill ${jobId} ${signal}`);
    const j = this.get(id, jobId);
    if (j.info.state === 'running') this.end(id, jobId, { state: 'killed', signal });
  }

  /** Test side: bytes written by the job to a stream (past the cap: dropped and counted). */
  emit(id: string, jobId: string, stream: 'stdout' | 'stderr', b: Buffer | string): void {
    const j = this.get(id, jobId);
    const bytes = Buffer.from(b);
    const have = stream === 'stdout' ? j.out : j.err;
    const room = Math.max(0, j.cap - have.length);
    const kept = bytes.subarray(0, room);
    j.info.droppedBytes += bytes.length - kept.length;
    if (stream === 'stdout') j.out = Buffer.concat([j.out, kept]);
    else j.err = Buffer.concat([j.err, kept]);
    j.info.stdoutBytes = j.out.length;
    j.info.stderrBytes = j.err.length;
    this.ev.emit(`${id}/${jobId}`);
  }
  /** Test side: the job ends. */
  end(
    id: string,
    jobId: string,
    how: { state?: JobInfo['state']; exitCode?: number; signal?: string } = { exitCode: 0 },
  ): void {
    const j = this.get(id, jobId);
    j.info.state = how.state ?? 'exited';
    if (how.exitCode !== undefined) j.info.exitCode = how.exitCode;
    if (how.signal) j.info.signal = how.signal;
    j.info.endedAt = new Date().toISOString();
    j.info.stdinOpen = false;
    this.ev.emit(`${id}/${jobId}`);
  }
}

export interface ParsedEvent {
  event: string;
  id?: string;
  data: any;
}

/** Reads Server-Sent Events from `body` until it ends or `stop(ev)` says so (then destroys it: the client leaves). */
export async function readEvents(
  body: NodeJS.ReadableStream & { destroy(): void },
  stop?: (ev: ParsedEvent, all: ParsedEvent[]) => boolean,
): Promise<ParsedEvent[]> {
  const out: ParsedEvent[] = [];
  let buf = '';
  for await (const chunk of body) {
    buf += chunk.toString();
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (block.startsWith(':')) continue;
      const ev: ParsedEvent = { event: 'message', data: undefined };
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) ev.event = line.slice(7);
        else if (line.startsWith('id: ')) ev.id = line.slice(4);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      ev.data = JSON.parse(data.join('\n'));
      out.push(ev);
      if (stop?.(ev, out)) {
        body.destroy();
        return out;
      }
    }
  }
  return out;
}
