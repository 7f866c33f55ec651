// File watch on procbox: a write inside the sandbox -> its event at the client of
// files/watch, over N writes (default 200), p50/p99. The writer is a shell inside the sandbox
// that creates file N when the host writes N on its stdin (the host's pipe hop is in the number);
// the client reads the Server-Sent Events body the subresource returns (controllers/common/
// filewatch.ts + sse.ts: watcher line -> coalescing (a lone event is not held) -> window -> SSE frame), in this
// process: the HTTP/TLS hop of the API server is not in the number.
//   npx tsx bench/filewatch.ts [--runs N]       (needs root: namespaces, cgroups)
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { FileWatches } from '../controllers/common/filewatch.js';
import { watchResponse } from '../controllers/agentsession/watch.js';
import { ProcboxRuntime } from '../native/procbox/procbox.js';
import { SubresourceResponse } from '../runtime/apiserver/http/subresources.js';
import { arg, median, percentile, section } from './lib.js';

const runs = arg('runs', 200);
const load0 = loadavg()[0]!;
const stateDir = mkdtempSync(join(tmpdir(), 'bench-watch-'));
const rt = new ProcboxRuntime({ stateDir });
await rt.start();
try {
  await rt.create({ id: 'w', resources: { memoryBytes: 256 << 20, pids: 256 } });
  await rt.exec('w', { argv: ['mkdir', '-p', '/work/w'] });
  const watches = new FileWatches(rt);
  const res = await watchResponse(watches, 'w', '/work/w', false, undefined);
  if (!(res instanceof SubresourceResponse)) throw new Error('not a stream');
  const body = res.body as Readable;
  body.setEncoding('utf8');
  const waiting = new Map<string, (t: number) => void>();
  let buf = '';
  let ready!: () => void;
  const isReady = new Promise<void>((r) => (ready = r));
  body.on('data', (s: string) => {
    const now = performance.now();
    buf += s;
    let i: number;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (block.startsWith('event: ready')) ready();
      const m = /^event: created\n[\s\S]*?"name":"(f\d+)"/.exec(block);
      if (m) waiting.get(m[1]!)?.(now);
    }
  });
  await isReady;
  const writer = await rt.execStream('w', { argv: ['sh', '-c', 'cd /work/w && while read n; do : > "f$n"; done'] });
  const lat: number[] = [];
  for (let n = 0; n < runs + 10; n++) {
    const name = `f${n}`;
    const seen = new Promise<number>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no event for ${name} within 5 s`)), 5000);
      waiting.set(name, (x) => (clearTimeout(t), resolve(x)));
    });
    const t0 = performance.now();
    writer.stdin.write(`${n}\n`);
    const t1 = await seen;
    waiting.delete(name);
    if (n >= 10) lat.push(t1 - t0); // the first 10 warm up
    await new Promise((r) => setTimeout(r, 10)); // separate writes: a burst would be one coalesced read
  }
  writer.stdin.end();
  writer.kill();
  body.destroy();
  watches.stopAll();
  const f = (x: number) => x.toFixed(2);
  section(`filewatch (procbox, ${runs} writes; load ${load0.toFixed(1)} before, ${loadavg()[0]!.toFixed(1)} after)`, [
    '| write in the sandbox -> event at the files/watch client | p50 | p99 | max | target |',
    '|---|---|---|---|---|',
    `| create of a file (ms) | ${f(median(lat))} | ${f(percentile(lat, 99))} | ${f(Math.max(...lat))} | p99 <= 20 ms |`,
    '',
    'Includes the host -> sandbox stdin hop of the writer; a lone event is not held by the 4 ms coalescing window (controllers/common/filewatch.ts); not the HTTP/TLS hop of the API server.',
  ]);
} finally {
  await rt.destroy('w').catch(() => undefined);
  await rt.close();
  rmSync(stateDir, { recursive: true, force: true });
}
