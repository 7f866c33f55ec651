// An AgentSession's I/O beyond one exec: background jobs (start, list, read, stream, stdin,
// kill) and large files (uploads resumed from where the server is; ranged downloads verified by
// sha256 and resumed from the bytes already read).
import { createHash } from 'node:crypto';
import type { Answer, FluxClient } from './client.js';
import { errorOf, FluxError, statusOf, TooManyRequestsError } from './errors.js';
import { Files, type Signal } from './files.js';
import { argv, type Command } from './sandbox.js';
import { followSse } from './sse.js';

export interface Job {
  job: string;
  state?: string;
  exitCode?: number;
  signal?: string;
  startedAt?: string;
  command?: string[];
  [field: string]: unknown;
}

export interface JobRead extends Job {
  outputBase64?: string;
  stderrBase64?: string;
  nextOffset?: number;
  stderrNextOffset?: number;
  more?: boolean;
}

/** One piece of a job's stream: output, stderr (bytes), or its end. */
export type JobChunk =
  | { type: 'stdout' | 'stderr'; data: Buffer; id?: string }
  | { type: 'exit'; exitCode?: number; signal?: string; state: string };

export interface JobStartOptions extends Signal {
  /** Keep stdin open (write it with stdin()). */
  stdin?: boolean;
  maxOutputBytes?: number;
  timeoutSeconds?: number;
  env?: Record<string, string>;
  cwd?: string;
  approvalName?: string;
  idempotencyKey?: string;
}

export class Jobs {
  constructor(
    private readonly c: FluxClient,
    private readonly base: string,
  ) {}

  /** Starts a background job; resolves with its record ({job, state, ...}). */
  start(cmd: Command, o: JobStartOptions = {}): Promise<Job> {
    return this.c.json<Job>('POST', this.base, {
      body: {
        command: argv(cmd),
        ...(o.stdin ? { stdin: true } : {}),
        ...(o.maxOutputBytes !== undefined ? { maxOutputBytes: o.maxOutputBytes } : {}),
        ...(o.timeoutSeconds !== undefined ? { timeoutSeconds: o.timeoutSeconds } : {}),
        ...(o.env ? { env: o.env } : {}),
        ...(o.cwd ? { cwd: o.cwd } : {}),
        ...(o.approvalName ? { approvalName: o.approvalName } : {}),
      },
      headers: o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {},
      signal: o.signal,
    });
  }

  async list(o: Signal = {}): Promise<Job[]> {
    return (await this.c.json<{ items?: Job[] }>('GET', this.base, { signal: o.signal })).items ?? [];
  }

  /** A page of a job's kept output from the offsets (base64 in the answer; see readAll). */
  read(job: string, o: Signal & { offset?: number; stderrOffset?: number } = {}): Promise<JobRead> {
    return this.c.json<JobRead>('GET', `${this.base}/${encodeURIComponent(job)}`, {
      query: { offset: o.offset ?? 0, stderrOffset: o.stderrOffset ?? 0 },
      signal: o.signal,
    });
  }

  /** Everything a job kept so far: its stdout and stderr. */
  async readAll(job: string, o: Signal = {}): Promise<{ stdout: Buffer; stderr: Buffer; job: JobRead }> {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let offset = 0;
    let stderrOffset = 0;
    for (;;) {
      const r = await this.read(job, { offset, stderrOffset, signal: o.signal });
      out.push(Buffer.from(r.outputBase64 ?? '', 'base64'));
      err.push(Buffer.from(r.stderrBase64 ?? '', 'base64'));
      const next = r.nextOffset ?? offset;
      const nextErr = r.stderrNextOffset ?? stderrOffset;
      if (!r.more || (next === offset && nextErr === stderrOffset))
        return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), job: r };
      offset = next;
      stderrOffset = nextErr;
    }
  }

  /**
   * A job's output as it comes, to its exit (the last chunk), resumed with Last-Event-ID after a
   * dropped connection: no byte twice or lost.
   */
  async *stream(job: string, o: Signal & { lastEventId?: string } = {}): AsyncGenerator<JobChunk> {
    for await (const ev of followSse(this.c, `${this.base}/${encodeURIComponent(job)}/stream`, {
      signal: o.signal,
      lastEventId: o.lastEventId,
      final: (e) => e.event === 'exit' || e.event === 'error',
    })) {
      const d = JSON.parse(ev.data) as Record<string, unknown>;
      if (ev.event === 'output')
        yield { type: 'stdout', data: Buffer.from(String(d.outputBase64 ?? ''), 'base64'), id: ev.id };
      else if (ev.event === 'stderr')
        yield { type: 'stderr', data: Buffer.from(String(d.stderrBase64 ?? ''), 'base64'), id: ev.id };
      else if (ev.event === 'exit')
        yield {
          type: 'exit',
          exitCode: d.exitCode as number | undefined,
          signal: d.signal as string | undefined,
          state: String(d.state ?? ''),
        };
      else if (ev.event === 'error')
        throw new FluxError({
          kind: 'Status',
          code: 500,
          reason: 'StreamError',
          message: String(d.message ?? 'the job stream failed'),
        });
    }
  }

  /** Writes to a job's stdin (started with stdin: true); `close` sends end-of-file after it. */
  async stdin(job: string, data: Buffer | string | undefined, o: Signal & { close?: boolean } = {}): Promise<void> {
    const b = data === undefined ? undefined : Buffer.from(data);
    await this.c.call('POST', `${this.base}/${encodeURIComponent(job)}/stdin`, {
      body: { ...(b?.length ? { dataBase64: b.toString('base64') } : {}), ...(o.close ? { close: true } : {}) },
      signal: o.signal,
    });
  }

  /** Signals a job's process tree (default TERM). */
  kill(job: string, o: Signal & { signal_?: string } = {}): Promise<Job> {
    return this.c.json<Job>('DELETE', `${this.base}/${encodeURIComponent(job)}`, {
      query: { signal: o.signal_ },
      signal: o.signal,
    });
  }
}

const CHUNK = 4 * 1024 * 1024;

export interface Upload {
  id: string;
  path: string;
  size: number;
  received: number;
  state?: string;
  sha256?: string;
}

export interface UploadDone {
  path: string;
  size: number;
  writtenSha256: string;
  [field: string]: unknown;
}

/** An upload cut off (the server unreachable): resume it with `upload(..., {uploadId})`. */
export class UploadInterruptedError extends Error {
  constructor(
    readonly uploadId: string,
    readonly received: number,
    cause: unknown,
  ) {
    super(`upload ${uploadId} interrupted at ${received} bytes: ${String((cause as Error)?.message ?? cause)}`);
    this.name = 'UploadInterruptedError';
  }
}

/** The files of an AgentSession: those of Files plus resumable upload and download. */
export class SessionFiles extends Files {
  /**
   * Uploads `data` to `path` in 4 MiB chunks (uploads subresource). A chunk that fails is
   * retried from where the server is; `uploadId` resumes an upload an earlier call opened.
   */
  async upload(
    path: string,
    data: Buffer,
    o: Signal & { uploadId?: string; mode?: number; chunkSize?: number; onProgress?: (received: number) => void } = {},
  ): Promise<UploadDone> {
    const base = `${this.base}/uploads`;
    const chunk = Math.min(o.chunkSize ?? CHUNK, CHUNK);
    let up: Upload;
    if (o.uploadId)
      up = await this.c.json<Upload>('GET', `${base}/${encodeURIComponent(o.uploadId)}`, { signal: o.signal });
    else
      up = await this.c.json<Upload>('POST', base, {
        body: {
          path,
          size: data.length,
          sha256: createHash('sha256').update(data).digest('hex'),
          ...(o.mode !== undefined ? { mode: o.mode.toString(8).padStart(4, '0') } : {}),
        },
        signal: o.signal,
      });
    if (up.size !== data.length || up.path !== path)
      throw new Error(`upload ${up.id} is ${up.size} bytes to ${up.path}, not ${data.length} bytes to ${path}`);
    let at = up.received;
    let failures = 0;
    while (at < data.length) {
      let a: Answer | Error;
      try {
        a = await this.c.send('PUT', `${base}/${up.id}`, {
          query: { offset: at },
          raw: data.subarray(at, Math.min(at + chunk, data.length)),
          contentType: 'application/offset+octet-stream',
          signal: o.signal,
        });
      } catch (e) {
        if (o.signal?.aborted) throw e;
        a = e instanceof Error ? e : new Error(String(e));
      }
      if (!(a instanceof Error) && a.status === 200) {
        at = (JSON.parse(a.body.toString('utf8')) as Upload).received;
        failures = 0;
        o.onProgress?.(at);
        continue;
      }
      if (!(a instanceof Error) && a.status === 409 && a.headers['upload-offset'] !== undefined) {
        at = Number(a.headers['upload-offset']); // the server is elsewhere: continue there
        continue;
      }
      if (!(a instanceof Error) && a.status < 500 && a.status !== 429 && a.status !== 409)
        throw errorOf(statusOf(a.status, a.body)); // refused for good
      if (++failures > 3) throw new UploadInterruptedError(up.id, at, a instanceof Error ? a : `HTTP ${a.status}`);
      // The chunk may have landed: ask where the upload is.
      try {
        at = (await this.c.json<Upload>('GET', `${base}/${up.id}`, { signal: o.signal })).received;
      } catch (e) {
        if (o.signal?.aborted || failures >= 3) throw new UploadInterruptedError(up.id, at, e);
      }
    }
    return this.c.json<UploadDone>('POST', `${base}/${up.id}/complete`, { signal: o.signal });
  }

  /** Open uploads of the session (to resume one after a restart). */
  async uploads(o: Signal = {}): Promise<Upload[]> {
    return (await this.c.json<{ items?: Upload[] }>('GET', `${this.base}/uploads`, { signal: o.signal })).items ?? [];
  }

  /**
   * Downloads a file of any size in 4 MiB ranged reads pinned to its ETag (a change midway is a
   * PreconditionFailedError), verified by sha256. `from` and `prefix` resume a download: the
   * bytes already read, whose length is where it continues.
   */
  async download(path: string, o: Signal & { prefix?: Buffer; chunkSize?: number } = {}): Promise<Buffer> {
    const p = `${this.base}/files/range`;
    const len = Math.min(o.chunkSize ?? CHUNK, CHUNK);
    const parts: Buffer[] = o.prefix ? [o.prefix] : [];
    let at = o.prefix?.length ?? 0;
    const first = await this.c.call('GET', p, {
      query: { path, offset: at, length: len, checksum: 'true' },
      headers: { Accept: '*/*' },
      signal: o.signal,
    });
    const size = Number(first.headers['x-file-size']);
    const sha256 = String(first.headers['x-file-sha256'] ?? '');
    const etag = String(first.headers.etag ?? '');
    let failures = 0;
    for (let r = first; ;) {
      parts.push(r.body);
      at += r.body.length;
      if (r.headers['x-file-eof'] === 'true' || r.body.length === 0 || at >= size) break;
      for (;;) {
        try {
          r = await this.c.call('GET', p, {
            query: { path, offset: at, length: len },
            headers: { Accept: '*/*', 'If-Match': etag },
            signal: o.signal,
          });
          failures = 0;
          break;
        } catch (e) {
          // A dropped connection: read the slice again from `at` (typed refusals are final).
          if (o.signal?.aborted || (e instanceof FluxError && !(e instanceof TooManyRequestsError)) || ++failures > 3)
            throw e;
        }
      }
    }
    const all = Buffer.concat(parts);
    const got = createHash('sha256').update(all).digest('hex');
    if (sha256 && got !== sha256)
      throw new Error(`checksum mismatch: ${path} has sha256 ${sha256}, the bytes read ${got}`);
    return all;
  }
}
