// The clock every time-dependent part of the controller machinery takes as a dependency, so
// tests drive time by hand (FakeClock) instead of sleeping.

export interface TimerHandle {
  cancel(): void;
}

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Runs fn once after ms milliseconds; cancel() before it fires prevents it (safe to call twice). */
  setTimeout(fn: () => void, ms: number): TimerHandle;
}

export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, Math.max(0, ms));
    // Timers must never keep a process alive on their own: stopping is the manager's job.
    t.unref?.();
    return { cancel: () => clearTimeout(t) };
  },
};

/** Resolves after ms on the given clock, or rejects with the signal's reason when aborted. */
export function sleep(clock: Clock, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason ?? new Error('aborted'));
    const onAbort = () => {
      h.cancel();
      reject(signal!.reason ?? new Error('aborted'));
    };
    const h = clock.setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * A clock that only moves when told to. Timers fire in due order during advance(); a timer
 * scheduled by a firing timer fires in the same advance() if it is due by then.
 */
export class FakeClock implements Clock {
  private t: number;
  private seq = 0;
  private timers: { due: number; seq: number; fn: () => void; cancelled: boolean }[] = [];

  constructor(start = Date.UTC(2026, 0, 1)) {
    this.t = start;
  }
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): TimerHandle {
    const timer = { due: this.t + Math.max(0, ms), seq: this.seq++, fn, cancelled: false };
    this.timers.push(timer);
    return { cancel: () => void (timer.cancelled = true) };
  }
  /** Number of timers not yet fired or cancelled. */
  pending(): number {
    return this.timers.filter((x) => !x.cancelled).length;
  }
  /** Moves time forward by ms, firing due timers in order; awaits microtasks between timers. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      await flushMicrotasks();
      this.timers = this.timers.filter((x) => !x.cancelled);
      this.timers.sort((a, b) => a.due - b.due || a.seq - b.seq);
      const next = this.timers[0];
      if (!next || next.due > end) break;
      this.timers.shift();
      this.t = Math.max(this.t, next.due);
      next.fn();
    }
    this.t = end;
    await flushMicrotasks();
  }
}

/** Lets pending promise callbacks run (a few macrotask turns, enough for chained awaits). */
export async function flushMicrotasks(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
}
