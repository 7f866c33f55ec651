// Store throughput beside raw better-sqlite3 inserts of the same JSON, same settings
// (WAL, synchronous=FULL, one transaction per write).
// Run: npx tsx test/runtime/store/store-bench.ts [N] [dir]; a tmpfs dir (/dev/shm) takes fsync
// out of the picture and shows the CPU cost of each layer.
import Database from 'better-sqlite3';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Registry } from '../../../runtime/apiserver/registry.js';
import { Store } from '../../../runtime/store/store.js';
import { WIDGET, W } from '../apiserver/registry-fixtures.js';

const N = Number(process.argv[2] ?? 2000);
const BASE = process.argv[3] ?? os.tmpdir();
const doc = (i: number) => ({
  apiVersion: 'test.fluxvm.dev/v1',
  kind: 'Widget',
  metadata: { name: `w-${i}`, namespace: 'default', labels: { app: 'bench' } },
  spec: { color: 'red', image: 'alpine:3.20', cpus: 1, command: ['sh', '-c', 'sleep 1'] },
});

function tmp(): string {
  return fs.mkdtempSync(path.join(BASE, 'fluxvm-bench-'));
}

function rate(label: string, ms: number): number {
  const r = Math.round((N / ms) * 1000);
  console.log(`${label.padEnd(44)} ${String(r).padStart(7)} /s  (${N} in ${ms.toFixed(0)} ms)`);
  return r;
}

{
  const dir = tmp();
  const db = new Database(path.join(dir, 'raw.db'));
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.exec('CREATE TABLE o (k TEXT PRIMARY KEY, data TEXT NOT NULL)');
  const ins = db.prepare('INSERT INTO o (k, data) VALUES (?, ?)');
  const t = performance.now();
  for (let i = 0; i < N; i++) ins.run(`w-${i}`, JSON.stringify(doc(i)));
  rate('raw better-sqlite3 insert (autocommit)', performance.now() - t);
  db.close();
  fs.rmSync(dir, { recursive: true });
}
{
  const dir = tmp();
  const store = new Store({ dir, compaction: { intervalMs: 0 } });
  const t = performance.now();
  for (let i = 0; i < N; i++)
    store.create({ group: 'g', resource: 'widgets', namespace: 'default', name: `w-${i}` }, doc(i));
  rate('Store.create (object + event + rv, 1 txn)', performance.now() - t);
  store.close();
  fs.rmSync(dir, { recursive: true });
}
{
  const dir = tmp();
  const store = new Store({ dir, compaction: { intervalMs: 0 } });
  const registry = new Registry({ store, kinds: [WIDGET] });
  const t = performance.now();
  for (let i = 0; i < N; i++) {
    const d = doc(i) as any;
    delete d.metadata.namespace;
    await registry.create(W, 'default', d, {}, { userAgent: 'bench' });
  }
  rate('Registry.create (admission, managedFields)', performance.now() - t);
  const t1 = performance.now();
  // 32 requests in flight, as concurrent HTTP clients: writes of one turn share a commit.
  let next = 0;
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (next < N) {
        const d = doc(N + next++) as any;
        delete d.metadata.namespace;
        await registry.create(W, 'default', d, {}, { userAgent: 'bench' });
      }
    }),
  );
  rate('Registry.create, 32 in flight (group commit)', performance.now() - t1);
  const t2 = performance.now();
  const l = await registry.list(W, 'default', {}, {});
  console.log(`Registry.list of ${l.items.length}: ${(performance.now() - t2).toFixed(1)} ms`);
  store.close();
  fs.rmSync(dir, { recursive: true });
}
{
  // Watch delivery: from the start of a create to the event reaching an in-process watcher
  // (includes admission, the fsync'd commit and the fan-out).
  const { InProcessClient } = await import('../../../runtime/client/inprocess.js');
  const dir = tmp();
  const store = new Store({ dir, compaction: { intervalMs: 0 } });
  const registry = new Registry({ store, kinds: [WIDGET] });
  const client = new InProcessClient(registry);
  const started = new Map<string, number>();
  const lat: number[] = [];
  const h = client.watch(W, 'default', { resourceVersion: String(store.currentRV) }, (ev) => {
    const t = started.get(ev.object.metadata.name!);
    if (t !== undefined) lat.push(performance.now() - t);
  });
  const M = Math.min(N, 1000);
  for (let i = 0; i < M; i++) {
    const d = doc(i) as any;
    delete d.metadata.namespace;
    started.set(d.metadata.name, performance.now());
    await client.create(W, 'default', d);
  }
  await new Promise((r) => setTimeout(r, 20));
  h.stop();
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(2);
  console.log(`watch delivery (create start -> event), ${lat.length} events: p50 ${q(0.5)} ms, p99 ${q(0.99)} ms`);
  store.close();
  fs.rmSync(dir, { recursive: true });
}
