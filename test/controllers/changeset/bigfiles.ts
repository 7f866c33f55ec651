// Test inputs and measures for the bounded diff: package-lock-like files, the
// peak RSS growth of a process, the event loop's delay.
import { readFileSync, writeFileSync } from 'node:fs';
import { performance as perf } from 'node:perf_hooks';

/** `n` package-lock-like lines (about 100 bytes each); another `tag` changes every line. */
export function lockFile(n: number, tag: string): Buffer {
  const lines: string[] = [];
  for (let i = 0; i < n; i++)
    lines.push(
      `    "node_modules/pkg-${i}": { "version": "1.0.${i}", "integrity": "sha512-${tag}${(i * 2654435761) % 1e9}" },\n`,
    );
  return Buffer.from(lines.join(''));
}

const kib = (pid: number | 'self', field: 'VmHWM' | 'VmRSS') =>
  Number(new RegExp(`${field}:\\s+(\\d+)`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);

/**
 * The peak resident memory of a process (all its threads) from now on: resets the kernel's
 * high-water mark (clear_refs 5) and reads VmHWM against the RSS at the reset.
 */
export class PeakRss {
  private readonly base: number;
  constructor(private readonly pid: number | 'self' = 'self') {
    writeFileSync(`/proc/${pid}/clear_refs`, '5');
    this.base = kib(pid, 'VmRSS');
  }
  /** Growth of the peak over the RSS at the start, in MiB. */
  growthMiB(): number {
    return (kib(this.pid, 'VmHWM') - this.base) / 1024;
  }
}

/** Why PeakRss cannot work here (undefined when it can). */
export function peakRssSkipReason(): string | undefined {
  try {
    writeFileSync('/proc/self/clear_refs', '5');
    kib('self', 'VmHWM');
    return undefined;
  } catch (e) {
    return `cannot reset the peak RSS through /proc/self/clear_refs: ${(e as Error).message}`;
  }
}

/**
 * How the event loop fared while `fn` ran, sampled by a 10 ms ticker: `maxDelayMs` is the longest
 * gap between ticks beyond 10 ms (wall clock: it also counts the time the host did not run this
 * process), `maxBusyMs` the longest time the loop spent running code between two ticks (the
 * loop's active time from `performance.eventLoopUtilization`; time the loop waited in its poll
 * counts as idle, even when the host was too busy to wake it). A synchronous diff of a second
 * shows as a second in both; a loaded host inflates only the first. After `fn` settles, the next
 * tick is awaited so a block at the very end is counted too.
 */
export async function withLoopDelay<T>(
  fn: () => Promise<T>,
): Promise<{ result: T; maxDelayMs: number; maxBusyMs: number }> {
  let last = performance.now();
  let lastElu = perf.eventLoopUtilization();
  let max = 0;
  let maxBusy = 0;
  let onTick: (() => void) | undefined;
  const ticker = setInterval(() => {
    const now = performance.now();
    const elu = perf.eventLoopUtilization();
    max = Math.max(max, now - last - 10);
    maxBusy = Math.max(maxBusy, elu.active - lastElu.active);
    last = now;
    lastElu = elu;
    onTick?.();
  }, 10);
  try {
    const result = await fn();
    await new Promise<void>((r) => (onTick = r));
    return { result, maxDelayMs: max, maxBusyMs: maxBusy };
  } finally {
    clearInterval(ticker);
  }
}
