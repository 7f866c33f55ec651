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
import v8 from 'node:v8';

const SERVER_HEAP_GROWING_PERCENT = 25;

/** Sets the server's heap growing factor, unless node's command line already chose one (a commander preAction hook). */
export function serverHeap(): void {
  if (process.execArgv.some((a) => /^--heap[-_]growing[-_]percent(=|$)/.test(a))) return;
  v8.setFlagsFromString(`--heap-growing-percent=${SERVER_HEAP_GROWING_PERCENT}`);
}
