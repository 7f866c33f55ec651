// Tracked background work of a reconciler (bounded work): an operation that may
// take seconds or minutes (a speculation, an apply, a VM create, fork, checkpoint, restore or
// teardown) runs here, by object uid, so the pass that starts it returns at once and the
// controller's workers stay free for the other objects. When the work settles, its key is
// enqueued again (the next pass reads what it wrote, or takes its outcome); an error it threw
// is handed to that pass, which throws it (a rate-limited retry, as if the pass itself had
// failed). A pass that finds work running for its uid does nothing but wait for that enqueue.
//
//   const work = new BackgroundWork<CheckpointInfo>((key) => controller.enqueue(key));
//   const out = work.take(uid);              // {ok, value} | {ok: false, error} | undefined
//   if (work.has(uid)) return done();        // its end enqueues the key
//   work.start(uid, key, () => runtime.checkpoint(...));
//
// drain() resolves once nothing runs; `drainOnStop` is the Runnable a folder adds to its
// manager so a graceful stop or a lost leadership term waits for the work in flight.
import type { Runnable } from './runnable.js';
import type { ObjectKey } from './reconciler.js';

/** How a work settled: its value, or what it threw. */
export type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

export class BackgroundWork<T = unknown> {
  private readonly running = new Map<string, Promise<void>>();
  private readonly outcomes = new Map<string, Settled<T>>();

  /**
   * `onSettled` is told the key of each work that settled (the controller's enqueue). With
   * `keepValues`, a value the work resolved with is kept for take() too (otherwise only errors).
   */
  constructor(
    private readonly onSettled: (key: ObjectKey) => void = () => undefined,
    private readonly opts: { keepValues?: boolean } = {},
  ) {}

  /** Starts `fn` for `uid` unless work for it runs already (then false). A kept outcome of `uid` is dropped. */
  start(uid: string, key: ObjectKey, fn: () => Promise<T>): boolean {
    if (this.running.has(uid)) return false;
    this.outcomes.delete(uid);
    const work = Promise.resolve()
      .then(fn)
      .then(
        (value) => void (this.opts.keepValues && this.outcomes.set(uid, { ok: true, value })),
        (error) => void this.outcomes.set(uid, { ok: false, error }),
      )
      .finally(() => {
        this.running.delete(uid);
        this.onSettled(key);
      });
    this.running.set(uid, work);
    return true;
  }

  has(uid: string): boolean {
    return this.running.has(uid);
  }

  get size(): number {
    return this.running.size;
  }

  /** The outcome of the last work of `uid`, once, or undefined (none kept, or still running). */
  take(uid: string): Settled<T> | undefined {
    if (this.running.has(uid)) return undefined;
    const o = this.outcomes.get(uid);
    this.outcomes.delete(uid);
    return o;
  }

  /** The error the last work of `uid` threw, once ({error}), or undefined (a kept value stays). */
  takeError(uid: string): { error: unknown } | undefined {
    const o = this.outcomes.get(uid);
    if (!o || o.ok) return undefined;
    this.outcomes.delete(uid);
    return { error: o.error };
  }

  /** Drops the kept outcome of `uid` (its object is gone). */
  forget(uid: string): void {
    this.outcomes.delete(uid);
  }

  /** Resolves once nothing runs (work started meanwhile included). Never rejects. */
  async drain(): Promise<void> {
    while (this.running.size) await Promise.all([...this.running.values()]);
  }
}

/**
 * A Runnable that waits for the manager's stop (or the end of a leadership term) and then for
 * `drain()`: added beside a controller, it makes the manager's stop wait for the controller's
 * background work in flight, so a graceful stop never leaves an operation half done.
 */
export function drainOnStop(name: string, drain: () => Promise<void>): Runnable {
  return {
    name,
    start: async (signal) => {
      if (!signal.aborted) await new Promise((r) => signal.addEventListener('abort', r, { once: true }));
      await drain();
    },
  };
}
