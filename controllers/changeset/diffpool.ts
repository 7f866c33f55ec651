// File diffs off the event loop: a small pool of worker threads running unidiff.ts's
// fileDiff, so a diff of big, adversarial files (both sides can be sandbox-written, 16 MiB
// each) never stalls the API server. Bounds, each with what happens past it:
// - workers: at most `workers` threads (default: one core less than the machine, 1 or 2),
//   started on demand, exiting after `idleMs` idle; unref'd while idle (a CLI can exit);
// - queue: at most `maxQueue` jobs wait for a worker; past it fileDiff throws DiffPoolBusy
//   (the diff subresource answers 429 TooManyRequests with Retry-After);
// - per job: the diff's own limits (DIFF_LIMITS: edit distance, lines, jsdiff timeout); a
//   heap cap per worker (resourceLimits, `heapMb`); and a deadline (`jobTimeoutMs`) after
//   which the worker is terminated. A job whose worker died or was killed gets the summary
//   section (`too many changes to show`, sizes and sha256, hashed here in 1 MiB steps);
//   the next job starts a new worker.
// Tiny inputs (`inlineLines` lines, 16 KiB) are diffed on the calling thread: cheaper than
// a message, and bounded by their size.
// Finished diffs are kept (`cacheChars` of text, least recently used out first) by a scope the
// caller names (the changeset: never shared between changesets, so no tenant learns through
// timing what another's diffs hold) and the sha256 of both sides: a reviewer's reload, or a
// second reviewer, gets the text without a worker. A summary made after a failure (a deadline,
// a worker's death, close) is not kept: the next request tries again.
import { createHash } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { Worker } from 'node:worker_threads';
import type { DiffJobMessage, DiffResultMessage } from './diff-worker.js';
import { DIFF_LIMITS, fileDiff, tooManyChanges, type DiffLimits, type FileSum } from './unidiff.js';

export interface DiffPoolOptions {
  /** Worker threads at most (default: availableParallelism() - 1, clamped to 1..2). */
  workers?: number;
  /** Jobs waiting for a worker at most (default 16); past it: DiffPoolBusy. */
  maxQueue?: number;
  /** A job still running after this is killed and gets the summary (default 30 s). */
  jobTimeoutMs?: number;
  /** Old-generation heap of each worker in MiB (default 256); past it the worker dies: summary. */
  heapMb?: number;
  /** An idle worker exits after this (default 30 s). */
  idleMs?: number;
  /** The diff's own limits (default DIFF_LIMITS). */
  limits?: DiffLimits;
  /** Inputs with at most this many lines (and 16 KiB) in total are diffed inline (default 128). */
  inlineLines?: number;
  /** Text of finished diffs kept for their scope's next request, in UTF-16 code units (default 8 Mi). */
  cacheChars?: number;
}

/** The queue is full: retry later. Nothing was computed. */
export class DiffPoolBusy extends Error {
  constructor(readonly queued: number) {
    super(`too many file diffs are being computed (${queued} waiting); retry later`);
  }
}

interface Job {
  id: number;
  path: string;
  before?: Uint8Array;
  after?: Uint8Array;
  /** `failed`: the summary made after a deadline, a worker's death or close (not kept). */
  resolve: (text: string, failed?: boolean) => void;
  reject: (e: Error) => void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  /** Terminated on purpose (idle, deadline, close): its exit is not a broken install. */
  killed?: boolean;
  job?: Job;
  timer?: NodeJS.Timeout;
}

/**
 * Starts one diff worker: diff-worker.js beside this file when compiled (dist/); under tsx
 * (this file is .ts) the plain-JS entry diff-worker-tsx.mjs, which loads diff-worker.ts.
 */
export function startDiffWorker(heapMb: number): Worker {
  const here = import.meta.url;
  const entry = here.endsWith('.ts') ? new URL('./diff-worker-tsx.mjs', here) : new URL('./diff-worker.js', here);
  return new Worker(entry, {
    resourceLimits: { maxOldGenerationSizeMb: heapMb, maxYoungGenerationSizeMb: 16, stackSizeMb: 4 },
  });
}

/** sha256 of b in 1 MiB steps, yielding to the event loop between them. */
async function sumAsync(b: Uint8Array | undefined): Promise<FileSum | undefined> {
  if (!b) return undefined;
  const h = createHash('sha256');
  for (let i = 0; i < b.length; i += 1 << 20) {
    h.update(b.subarray(i, i + (1 << 20)));
    await yieldToLoop();
  }
  return { size: b.length, sha256: h.digest('hex') };
}

function lineCount(b: Uint8Array | undefined): number {
  let n = 0;
  for (let i = b ? b.indexOf(10) : -1; i !== -1; i = b!.indexOf(10, i + 1)) n++;
  return n + 1;
}

export class DiffPool {
  private readonly max: number;
  private readonly maxQueue: number;
  private readonly jobTimeoutMs: number;
  private readonly heapMb: number;
  private readonly idleMs: number;
  private readonly limits: DiffLimits;
  private readonly inlineLines: number;
  private readonly slots = new Set<Slot>();
  private readonly queue: Job[] = [];
  private idleTimer?: NodeJS.Timeout;
  private nextId = 1;
  /** Set when a worker died before it loaded: jobs are then diffed inline (still bounded). */
  private broken = false;
  /** Finished diffs by scope, path and both sides' sha256, least recently used first. */
  private readonly kept = new Map<string, string>();
  private keptChars = 0;
  private readonly cacheChars: number;

  constructor(o: DiffPoolOptions = {}) {
    this.max = Math.max(1, o.workers ?? Math.min(2, Math.max(1, availableParallelism() - 1)));
    this.maxQueue = o.maxQueue ?? 16;
    this.jobTimeoutMs = o.jobTimeoutMs ?? 30_000;
    this.heapMb = o.heapMb ?? 256;
    this.idleMs = o.idleMs ?? 30_000;
    this.limits = o.limits ?? { ...DIFF_LIMITS };
    this.inlineLines = o.inlineLines ?? 128;
    this.cacheChars = o.cacheChars ?? 8 * 1024 * 1024;
  }

  /** Worker threads running now (busy or idle). */
  get size(): number {
    return this.slots.size;
  }

  /**
   * The diff section of one file (unidiff.ts's fileDiff format; the summary when a bound
   * was hit). Rejects with DiffPoolBusy when the queue is full (nothing done). Safe to call
   * concurrently; the buffers are copied, never changed. With `scope`, a diff of the same
   * path and sides asked before in that scope is answered from what was kept.
   */
  async fileDiff(
    path: string,
    before: Uint8Array | undefined,
    after: Uint8Array | undefined,
    scope?: string,
  ): Promise<string> {
    const bytes = (before?.length ?? 0) + (after?.length ?? 0);
    if (this.broken || (bytes <= 16384 && lineCount(before) + lineCount(after) <= this.inlineLines)) {
      return fileDiff(path, before, after, this.limits);
    }
    if (scope === undefined) return (await this.queued(path, before, after)).text;
    // Refused before any hashing when full, as without a scope: a flood of big diffs costs no
    // more than before, kept ones included.
    if (this.full()) throw new DiffPoolBusy(this.queue.length);
    const [b, a] = [await sumAsync(before), await sumAsync(after)];
    const key = JSON.stringify([scope, path, b?.sha256 ?? null, a?.sha256 ?? null]);
    const hit = this.kept.get(key);
    if (hit !== undefined) {
      this.kept.delete(key); // to the recent end
      this.kept.set(key, hit);
      return hit;
    }
    const { text, failed } = await this.queued(path, before, after);
    if (!failed) this.keep(key, text);
    return text;
  }

  private queued(
    path: string,
    before: Uint8Array | undefined,
    after: Uint8Array | undefined,
  ): Promise<{ text: string; failed: boolean }> {
    if (this.full()) return Promise.reject(new DiffPoolBusy(this.queue.length));
    return new Promise((resolve, reject) => {
      const done = (text: string, failed = false) => resolve({ text, failed });
      this.queue.push({ id: this.nextId++, path, before, after, resolve: done, reject });
      this.pump();
    });
  }

  /** No worker is free and maxQueue jobs wait. */
  private full(): boolean {
    return this.queue.length >= this.maxQueue && ![...this.slots].some((s) => s.ready && !s.job);
  }

  private keep(key: string, text: string): void {
    if (text.length > this.cacheChars) return;
    const was = this.kept.get(key); // two requests computed it at once
    if (was !== undefined) this.keptChars -= was.length;
    this.kept.delete(key);
    this.kept.set(key, text);
    this.keptChars += text.length;
    for (const [k, v] of this.kept) {
      if (this.keptChars <= this.cacheChars) break;
      this.kept.delete(k);
      this.keptChars -= v.length;
    }
  }

  /**
   * Terminates every worker; jobs running or waiting get the summary section. The pool stays
   * usable (the next fileDiff starts a worker). Idempotent.
   */
  async close(): Promise<void> {
    clearTimeout(this.idleTimer);
    for (const job of this.queue.splice(0)) void this.summarize(job);
    await Promise.all([...this.slots].map((s) => this.kill(s)));
  }

  private pump(): void {
    while (this.queue.length) {
      let slot = [...this.slots].find((s) => s.ready && !s.job);
      if (!slot) {
        const starting = [...this.slots].filter((s) => !s.ready).length;
        if (this.slots.size >= this.max || starting >= this.queue.length || this.broken) return;
        slot = this.spawn();
        if (!slot) {
          // Cannot start a thread at all: diff inline (bounded by the limits) rather than fail.
          for (const job of this.queue.splice(0)) job.resolve(fileDiff(job.path, job.before, job.after, this.limits));
          return;
        }
        if (!slot.ready) return;
      }
      this.run(slot, this.queue.shift()!);
    }
    this.armIdle();
  }

  private spawn(): Slot | undefined {
    let worker: Worker;
    try {
      worker = startDiffWorker(this.heapMb);
    } catch {
      this.broken = true;
      return undefined;
    }
    const slot: Slot = { worker, ready: false };
    this.slots.add(slot);
    worker.on('message', (m: DiffResultMessage) => {
      if ('ready' in m) {
        slot.ready = true;
        worker.unref();
        this.pump();
        return;
      }
      const job = slot.job;
      if (!job || job.id !== m.id) return;
      clearTimeout(slot.timer);
      slot.job = undefined;
      worker.unref();
      if ('text' in m) job.resolve(m.text);
      else void this.summarize(job);
      this.pump();
    });
    // 'error' (an uncaught throw, ERR_WORKER_OUT_OF_MEMORY) is always followed by 'exit'.
    worker.on('error', () => {});
    worker.on('exit', () => {
      this.slots.delete(slot);
      clearTimeout(slot.timer);
      if (!slot.ready && !slot.killed) {
        // It never loaded (a broken install): stop starting threads, diff inline from now on.
        this.broken = true;
        for (const job of this.queue.splice(0)) job.resolve(fileDiff(job.path, job.before, job.after, this.limits));
      }
      if (slot.job) void this.summarize(slot.job);
      this.pump();
    });
    return slot;
  }

  private run(slot: Slot, job: Job): void {
    slot.job = job;
    slot.worker.ref();
    clearTimeout(this.idleTimer);
    slot.timer = setTimeout(() => void this.kill(slot), this.jobTimeoutMs);
    // Exact-size copies, transferred: the caller keeps its buffers (for the summary).
    const before = job.before && new Uint8Array(job.before);
    const after = job.after && new Uint8Array(job.after);
    const msg: DiffJobMessage = { id: job.id, path: job.path, before, after, limits: this.limits };
    slot.worker.postMessage(
      msg,
      [before?.buffer, after?.buffer].filter((b): b is ArrayBuffer => b !== undefined),
    );
  }

  private async kill(slot: Slot): Promise<void> {
    slot.killed = true;
    await slot.worker.terminate();
  }

  private async summarize(job: Job): Promise<void> {
    try {
      job.resolve(tooManyChanges(job.path, await sumAsync(job.before), await sumAsync(job.after)), true);
    } catch (e) {
      job.reject(e as Error);
    }
  }

  /** Idle workers exit after idleMs (one timer for the pool). */
  private armIdle(): void {
    clearTimeout(this.idleTimer);
    if (![...this.slots].some((s) => !s.job)) return;
    this.idleTimer = setTimeout(() => {
      for (const s of this.slots) if (!s.job) void this.kill(s);
    }, this.idleMs);
    this.idleTimer.unref();
  }
}
