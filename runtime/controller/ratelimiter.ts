// Rate limiters for the work queue, with client-go's defaults: per-item exponential backoff
// (5 ms doubling, capped at 1000 s) combined with a global token bucket (10 qps, burst 100).
import type { Clock } from './clock.js';

export interface RateLimiter<K = string> {
  /** How long to wait before processing key again; counts one failure for key. */
  when(key: K): number;
  /** Stops tracking key (after a success). Safe to call for an unknown key. */
  forget(key: K): void;
  /** Failures counted for key since the last forget. */
  numRequeues(key: K): number;
}

/** baseMs * 2^failures, capped at maxMs. */
export class ExponentialFailureRateLimiter<K = string> implements RateLimiter<K> {
  private failures = new Map<K, number>();
  constructor(
    private readonly baseMs = 5,
    private readonly maxMs = 1000_000,
  ) {}
  when(key: K): number {
    const n = this.failures.get(key) ?? 0;
    this.failures.set(key, n + 1);
    // 2^n overflows to Infinity for large n, which Math.min handles.
    return Math.min(this.baseMs * Math.pow(2, n), this.maxMs);
  }
  forget(key: K): void {
    this.failures.delete(key);
  }
  numRequeues(key: K): number {
    return this.failures.get(key) ?? 0;
  }
}

/** A token bucket shared by all keys: `qps` tokens per second, up to `burst` saved. */
export class BucketRateLimiter<K = string> implements RateLimiter<K> {
  private tokens: number;
  private last: number;
  constructor(
    private readonly clock: Clock,
    private readonly qps = 10,
    private readonly burst = 100,
  ) {
    this.tokens = burst;
    this.last = clock.now();
  }
  when(_key: K): number {
    const now = this.clock.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) * this.qps) / 1000);
    this.last = now;
    // A reservation: the token is taken now, possibly going negative; the debt is the delay.
    this.tokens -= 1;
    return this.tokens >= 0 ? 0 : Math.ceil((-this.tokens / this.qps) * 1000);
  }
  forget(_key: K): void {}
  numRequeues(_key: K): number {
    return 0;
  }
}

/** The longest delay of several limiters (client-go MaxOfRateLimiter). */
export class MaxOfRateLimiter<K = string> implements RateLimiter<K> {
  private readonly limiters: RateLimiter<K>[];
  constructor(...limiters: RateLimiter<K>[]) {
    this.limiters = limiters;
  }
  when(key: K): number {
    let d = 0;
    for (const l of this.limiters) d = Math.max(d, l.when(key));
    return d;
  }
  forget(key: K): void {
    for (const l of this.limiters) l.forget(key);
  }
  numRequeues(key: K): number {
    let n = 0;
    for (const l of this.limiters) n = Math.max(n, l.numRequeues(key));
    return n;
  }
}

/** client-go's DefaultControllerRateLimiter. */
export function defaultControllerRateLimiter<K = string>(clock: Clock): RateLimiter<K> {
  return new MaxOfRateLimiter<K>(
    new ExponentialFailureRateLimiter<K>(5, 1000_000),
    new BucketRateLimiter<K>(clock, 10, 100),
  );
}
