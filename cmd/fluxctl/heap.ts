// The V8 heap setting of fluxctl's long-running servers (serve, controller, node-agent).
//
// V8 grows the old generation after each full GC to live size x a factor it picks from how fast
// the GC runs against the program (up to 4x). An API server holds its objects for good and its
// heap rarely shrinks back, so after a burst of writes the process keeps the pages the burst grew
// it to: `bench/apiserver.ts` (10,000 Grants with their statuses written) ends at 443-450 MiB
// resident with 166 MiB live. A fixed factor of 1.25 (`--heap-growing-percent=25`) ended at
// 347-358 MiB in the same alternating runs, with the server's CPU per create and its list times
// no worse (bench/RESULTS.md, `round-1206g`). V8 reads the flag at every full GC, so setting it
// at run time takes effect from the next one.
//
// V8 also counts the Buffers made since the last full GC (TLS records received, files read)
// against that limit, and starts marking once what is left is below the young generation's
// size. With 25% of serve's ~33 MiB heap (8 MiB) a steady stream of I/O kept a full GC running:
// 90-100 of them per GiB uploaded, 5 s of CPU on V8's threads and the uploads 1.5x slower
// (`round-1207d`). So the factor leaves at least HEAP_HEADROOM above the live heap: after each
// full GC the percent is set from the heap then in use (40 MiB / live, at most 150%), which is
// 25 from 160 MiB live on (the 10,000-object server keeps its 25%).
import { PerformanceObserver, constants } from 'node:perf_hooks';
import v8 from 'node:v8';

const SERVER_HEAP_GROWING_PERCENT = 25;
/** The least the old generation may grow past its live size before the next full GC starts. */
const HEAP_HEADROOM = 40 * 2 ** 20;
/** At most this: the percent set after one full GC applies to the live size at the next, which may have grown. */
const MAX_PERCENT = 150;

/** The growing percent for `live` bytes after a full GC: 25, or more to leave HEAP_HEADROOM. */
function growingPercent(live: number): number {
  const want = Math.ceil((HEAP_HEADROOM / Math.max(live, 1)) * 100);
  return Math.min(MAX_PERCENT, Math.max(SERVER_HEAP_GROWING_PERCENT, want));
}

let observer: PerformanceObserver | undefined;

/** Sets the server's heap growing factor, unless node's command line already chose one (a commander preAction hook). */
export function serverHeap(): void {
  if (process.execArgv.some((a) => /^--heap[-_]growing[-_]percent(=|$)/.test(a))) return;
  let current = growingPercent(v8.getHeapStatistics().used_heap_size);
  v8.setFlagsFromString(`--heap-growing-percent=${current}`);
  observer?.disconnect();
  observer = new PerformanceObserver((list) => {
    const major = list
      .getEntries()
      .some(
        (e) =>
          (e as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR,
      );
    if (!major) return;
    const next = growingPercent(v8.getHeapStatistics().used_heap_size);
    if (next === current) return;
    current = next;
    v8.setFlagsFromString(`--heap-growing-percent=${next}`);
  });
  observer.observe({ entryTypes: ['gc'] });
}
