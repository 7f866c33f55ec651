// Fills every thread of libuv's pool (an open of a FIFO waits until a writer comes), so a test
// can tell the file I/O that runs on the event loop from what waits for the pool.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';

/** Blocks every thread of libuv's pool with FIFOs made in `dir`; release() frees them. */
export async function poolBlocked(dir: string): Promise<{ release(): Promise<void> }> {
  const n = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
  const fifos = Array.from({ length: n }, (_, i) => join(dir, `fifo${i}`));
  for (const f of fifos) execFileSync('mkfifo', [f]);
  const opens = fifos.map((f) => fsp.open(f, 'r'));
  // Each open holds a pool thread now; a probe queued behind them does not finish.
  const probe = fsp.stat(dir).then(() => 'ran');
  expect(await Promise.race([probe, new Promise((r) => setTimeout(() => r('blocked'), 200))])).to.equal('blocked');
  return {
    async release() {
      for (const f of fifos) closeSync(openSync(f, 'w')); // each open for write meets its reader
      for (const fh of await Promise.all(opens)) await fh.close();
      await probe;
    },
  };
}

/** 'done' if `p` settles within `ms`, else 'still waiting' (the timer is cleared either way). */
export async function within<T>(p: Promise<T>, ms: number): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p.then(() => 'done'),
      new Promise((r) => (timer = setTimeout(() => r('still waiting'), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
