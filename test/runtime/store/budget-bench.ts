// The database size after a steady write load, with the default compaction settings (the
// watch log's 50,000-event cap, 30-minute age and 64 MiB size budget) and, for comparison,
// with the size budget lifted.
//   npx tsx test/runtime/store/budget-bench.ts [writes=100000] [objectBytes=1024] [dir]
// Prints one line per run: writes, objects, events kept, log bytes, file bytes (db + wal).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Store } from '../../../runtime/store/store.js';

const writes = Number(process.argv[2] ?? 100_000);
const objectBytes = Number(process.argv[3] ?? 1024);
const base = process.argv[4] ?? os.tmpdir();
const OBJECTS = 1000;

const fileBytes = (dir: string) =>
  fs
    .readdirSync(dir)
    .filter((f) => f.startsWith('fluxvm.db') && !f.includes('reserve'))
    .reduce((n, f) => n + fs.statSync(path.join(dir, f)).size, 0);
const mib = (n: number) => `${(n / 1024 / 1024).toFixed(1)} MiB`;

async function run(label: string, maxBytes: number | undefined): Promise<void> {
  const dir = fs.mkdtempSync(path.join(base, 'fluxvm-budget-bench-'));
  const store = new Store({ dir, compaction: { intervalMs: 0, ...(maxBytes ? { maxBytes } : {}) } });
  const key = (i: number) => ({ group: 'g', resource: 'things', namespace: 'default', name: `o${i}` });
  const body = (i: number, n: number) => ({
    apiVersion: 'g/v1',
    kind: 'Thing',
    metadata: { name: `o${i}` },
    spec: { n, pad: 'x'.repeat(objectBytes) },
  });
  const t0 = Date.now();
  let done = 0;
  for (let i = 0; i < OBJECTS && done < writes; i++, done++) store.create(key(i), body(i, 0) as never);
  // Batches of 100 concurrent updates (group commit), each to a different object.
  while (done < writes) {
    const batch: Promise<unknown>[] = [];
    for (let j = 0; j < 100 && done < writes; j++, done++) {
      const i = done % OBJECTS;
      batch.push(
        store.enqueueUpdate(key(i), body(i, done) as never, store.getLatest(key(i))!.metadata.resourceVersion),
      );
    }
    await Promise.all(batch);
    await new Promise((r) => setImmediate(r)); // lets the scheduled compaction run, as the server's event loop does
  }
  store.compact();
  const events = store.currentRV - store.compactedRV;
  const line = [
    label.padEnd(22),
    `${writes} writes of ${objectBytes} B objects (${OBJECTS} objects)`,
    `${events} events kept`,
    `log ${mib(store.eventLogBytes)}`,
    `file ${mib(fileBytes(dir))}`,
    `${((Date.now() - t0) / 1000).toFixed(1)} s`,
  ].join('  ');
  store.close();
  fs.rmSync(dir, { recursive: true, force: true });
  console.log(line);
}

await run('default settings', undefined);
await run('size budget lifted', 1024 ** 4);
