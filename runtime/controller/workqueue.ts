// A rate-limited work queue with client-go semantics:
// - add(key) while key waits is a no-op (de-duplication);
// - a key handed out by get() is not handed out again until done(key); an add() meanwhile
//   marks it dirty and it is queued again at done() (never two workers on one key);
// - addAfter(key, ms) delays an add (the earliest pending deadline wins);
// - addRateLimited(key) delays by the rate limiter; forget(key) resets its backoff.
// run(handler, {concurrency, signal}) drives workers through p-queue.
import PQueue from 'p-queue';
import { realClock, type Clock, type TimerHandle } from './clock.js';
import type { QueueMetrics } from '../metrics/metrics.js';
import { defaultControllerRateLimiter, type RateLimiter } from './ratelimiter.js';

export interface WorkQueueOptions {
  clock?: Clock;
  rateLimiter?: RateLimiter<string>;
  /** client-go's workqueue metrics (depth, adds, retries, queue and work duration); default none. */
  metrics?: QueueMetrics;
}

export class WorkQueue {
  private readonly clock: Clock;
  private readonly limiter: RateLimiter<string>;
  // A FIFO with a head index: Array.shift() is O(n) on large arrays, which made a
  // 100k-key backlog quadratic.
  private queue: string[] = [];
  private head = 0;
  private readonly dirty = new Set<string>();
  private readonly processing = new Set<string>();
  private readonly waiting = new Map<string, { due: number; timer: TimerHandle }>();
  private getters: ((key: string | undefined) => void)[] = [];
  private shuttingDown = false;
  private readonly metrics?: QueueMetrics;
  /** When each queued key was added, and when each key handed out was taken (clock ms), for the metrics. */
  private readonly addedAt = new Map<string, number>();
  private readonly takenAt = new Map<string, number>();

  constructor(opts: WorkQueueOptions = {}) {
    this.clock = opts.clock ?? realClock;
    this.limiter = opts.rateLimiter ?? defaultControllerRateLimiter<string>(this.clock);
    this.metrics = opts.metrics;
    this.metrics?.depth(0);
  }

  /** Queues key unless it is already waiting. No-op after shutDown(). */
  add(key: string): void {
    if (this.shuttingDown || this.dirty.has(key)) return;
    this.metrics?.add();
    this.dirty.add(key);
    if (this.processing.has(key)) return;
    this.push(key);
  }

  /** Adds key after ms; if key already has an earlier pending deadline that one stands. */
  addAfter(key: string, ms: number): void {
    if (this.shuttingDown) return;
    if (ms <= 0) return this.add(key);
    const due = this.clock.now() + ms;
    const w = this.waiting.get(key);
    if (w && w.due <= due) return;
    w?.timer.cancel();
    const timer = this.clock.setTimeout(() => {
      this.waiting.delete(key);
      this.add(key);
    }, ms);
    this.waiting.set(key, { due, timer });
  }

  /** Adds key after the rate limiter's delay (counts one failure for key). */
  addRateLimited(key: string): void {
    this.metrics?.retry();
    this.addAfter(key, this.limiter.when(key));
  }

  /** Resets key's backoff; call after a successful pass. */
  forget(key: string): void {
    this.limiter.forget(key);
  }

  numRequeues(key: string): number {
    return this.limiter.numRequeues(key);
  }

  /** Keys ready to be handed out (not counting delayed or in-flight ones). */
  len(): number {
    return this.queue.length - this.head;
  }

  /** Nothing ready and nothing handed out (keys waiting for a delayed add are not counted). */
  idle(): boolean {
    return this.len() === 0 && this.processing.size === 0;
  }

  /** Next key, waiting if none is ready; undefined once the queue shuts down. */
  get(): Promise<string | undefined> {
    if (this.len() > 0) return Promise.resolve(this.take());
    if (this.shuttingDown) return Promise.resolve(undefined);
    return new Promise((resolve) => this.getters.push(resolve));
  }

  /** Marks key finished; if it was added meanwhile, it is queued again. Safe to call twice. */
  done(key: string): void {
    if (!this.processing.delete(key)) return;
    const taken = this.takenAt.get(key);
    this.takenAt.delete(key);
    if (this.metrics && taken !== undefined) this.metrics.worked((this.clock.now() - taken) / 1000);
    if (this.dirty.has(key) && !this.shuttingDown) this.push(key);
  }

  /** Stops handing out keys; pending get() calls resolve undefined; delayed adds are dropped. */
  shutDown(): void {
    this.shuttingDown = true;
    for (const w of this.waiting.values()) w.timer.cancel();
    this.waiting.clear();
    this.queue = [];
    this.head = 0;
    this.dirty.clear();
    this.addedAt.clear();
    this.metrics?.depth(0);
    for (const g of this.getters.splice(0)) g(undefined);
  }

  get isShuttingDown(): boolean {
    return this.shuttingDown;
  }

  /**
   * Processes keys with up to `concurrency` handlers at once until signal aborts, then shuts
   * the queue down and waits for in-flight handlers. The handler is responsible for forget /
   * addRateLimited; done(key) is called here after it settles (a rejection is swallowed, so
   * a handler should not throw).
   */
  async run(
    handler: (key: string) => Promise<void>,
    opts: { concurrency?: number; signal: AbortSignal },
  ): Promise<void> {
    const concurrency = Math.max(1, opts.concurrency ?? 1);
    const pq = new PQueue({ concurrency });
    const onAbort = () => this.shutDown();
    if (opts.signal.aborted) this.shutDown();
    opts.signal.addEventListener('abort', onAbort, { once: true });
    try {
      for (;;) {
        while (pq.pending + pq.size >= concurrency) await new Promise((r) => pq.once('next', r));
        const key = await this.get();
        if (key === undefined) break;
        void pq.add(async () => {
          // Each pass starts in a macrotask of its own. A write's commit fans out to the informers
          // in the same turn that resolves the writer's request; run from there, a pass's
          // synchronous start (its own writes' admission, a procbox create's fs calls) ran in the
          // same microtask drain, before Node's HTTP layer flushed that request's response (it
          // uncorks the socket in process.nextTick, after the drain): the client got its answer
          // 2-4 ms later. A pass waits one check phase instead.
          await new Promise<void>((r) => setImmediate(r));
          try {
            await handler(key);
          } catch {
            // handler errors are the handler's business (it logs and requeues)
          } finally {
            this.done(key);
          }
        });
      }
      await pq.onIdle();
    } finally {
      opts.signal.removeEventListener('abort', onAbort);
    }
  }

  private push(key: string): void {
    const g = this.getters.shift();
    if (g) {
      this.processing.add(key);
      this.dirty.delete(key);
      if (this.metrics) {
        this.metrics.queued(0);
        this.takenAt.set(key, this.clock.now());
      }
      g(key);
    } else {
      this.queue.push(key);
      if (this.metrics) {
        this.addedAt.set(key, this.clock.now());
        this.metrics.depth(this.len());
      }
    }
  }

  private take(): string {
    const key = this.queue[this.head++];
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
    this.processing.add(key);
    this.dirty.delete(key);
    if (this.metrics) {
      const now = this.clock.now();
      this.metrics.queued((now - (this.addedAt.get(key) ?? now)) / 1000);
      this.addedAt.delete(key);
      this.takenAt.set(key, now);
      this.metrics.depth(this.len());
    }
    return key;
  }
}
