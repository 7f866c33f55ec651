// How the Sandbox controller reports a failed create and when it tries again: the failure's
// reason and the first line of its cause (what the Ready condition, the Stalled condition and
// the Event carry), and a per-sandbox exponential backoff, 1 s doubling up to 5 min (as
// kubelet backs off a crashing container), kept in memory (a restart of the controller starts
// over at 1 s). Pure apart from the map of attempts; table-tested.
import { RuntimeError } from '../../native/runtime.js';
import { isPermanentRuntimeError } from '../common/errors.js';

export const RETRY_BASE_MS = 1000;
export const RETRY_MAX_MS = 300_000;
/** A cause longer than this is cut (a condition message stays readable in `kubectl get`). */
export const MAX_CAUSE = 512;

/** Milliseconds before attempt `failures + 1`, after `failures` (>= 1) failures in a row. */
export function retryDelayMs(failures: number): number {
  return Math.min(RETRY_BASE_MS * 2 ** Math.max(0, failures - 1), RETRY_MAX_MS);
}

export interface Failure {
  /**
   * The condition and Event reason: the runtime's diagnosis (RuntimeError.reason, e.g. QemuFailed), else CreateFailed.
   */
  reason: string;
  /** The first non-empty line of the error's message, at most MAX_CAUSE characters. */
  cause: string;
  /** Bad input or unsupported: retrying cannot help (Failed, not retried). */
  permanent: boolean;
  /**
   * The runtime diagnosed it (a QEMU that cannot start, an image that cannot be built):
   * retrying the same way will not fix it until the host is fixed, so the sandbox is Stalled,
   * while it is still retried with backoff (to pick up that fix). Otherwise Reconciling.
   */
  stalled: boolean;
}

/** What `e` (a create's error) tells the user. Pure. */
export function describeFailure(e: unknown): Failure {
  const message = e instanceof Error ? e.message : String(e);
  const line =
    message
      .split('\n')
      .map((l) => l.trim())
      .find((l) => l !== '') ?? 'unknown error';
  const cause = line.length > MAX_CAUSE ? `${line.slice(0, MAX_CAUSE)}...` : line;
  const diagnosed = e instanceof RuntimeError && !!e.reason;
  const permanent = isPermanentRuntimeError(e);
  return {
    reason: diagnosed ? (e as RuntimeError).reason! : 'CreateFailed',
    cause,
    permanent,
    stalled: diagnosed && !permanent,
  };
}

/** Consecutive create failures per sandbox uid and when the next attempt is due. */
export class CreateRetries {
  private readonly failures = new Map<string, { count: number; nextAt: number }>();

  /** Counts a failure of `uid` at `now`; returns the attempt number that failed and the delay before the next. */
  fail(uid: string, now: number): { attempt: number; delayMs: number } {
    const count = (this.failures.get(uid)?.count ?? 0) + 1;
    const delayMs = retryDelayMs(count);
    this.failures.set(uid, { count, nextAt: now + delayMs });
    return { attempt: count, delayMs };
  }

  /** Milliseconds until `uid` may be created again (0: now); 0 for a sandbox that has not failed. */
  waitMs(uid: string, now: number): number {
    const f = this.failures.get(uid);
    return f ? Math.max(0, f.nextAt - now) : 0;
  }

  /** Whether a create of `uid` failed since it last succeeded. */
  has(uid: string): boolean {
    return this.failures.has(uid);
  }

  /** Forgets `uid` (it was created, or it is gone). Safe for an unknown uid. */
  clear(uid: string): void {
    this.failures.delete(uid);
  }
}
