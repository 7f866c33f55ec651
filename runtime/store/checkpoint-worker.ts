// The store's checkpoint worker (a worker_threads entry; checkpointer.ts starts it): its own
// connection to the database, synchronous=FULL, running PASSIVE checkpoints on request, so they
// never block the store's writer. See checkpoint-protocol.ts for the shared flags.
import Database from 'better-sqlite3';
import { parentPort, workerData } from 'node:worker_threads';
import type { CheckpointReply, CheckpointRequest, CheckpointWorkerData } from './checkpoint-protocol.js';
import { BUSY, CLOSED, PAUSED } from './checkpoint-protocol.js';

const port = parentPort;
if (!port) throw new Error('checkpoint-worker.ts runs as a worker thread only');
const { file, flags } = workerData as CheckpointWorkerData;
let db: Database.Database | undefined;

const reply = (m: CheckpointReply): void => port.postMessage(m);

port.on('message', (m: CheckpointRequest) => {
  if (m === 'close') {
    try {
      db?.close();
    } catch {
      // Closing is best effort: the thread ends next.
    }
    Atomics.store(flags, CLOSED, 1);
    Atomics.notify(flags, CLOSED);
    port.close();
    return;
  }
  if (Atomics.compareExchange(flags, BUSY, 0, 1) !== 0) return reply({ skipped: true });
  try {
    if (Atomics.load(flags, PAUSED)) return reply({ skipped: true });
    if (!db) {
      db = new Database(file, { fileMustExist: true });
      db.pragma('synchronous = FULL');
      db.pragma('cache_size = -512');
    }
    const [result] = db.pragma('wal_checkpoint(PASSIVE)') as NonNullable<CheckpointReply['result']>[];
    reply({ result });
  } catch (e) {
    reply({ error: String((e instanceof Error && e.message) || e) });
  } finally {
    Atomics.store(flags, BUSY, 0);
    Atomics.notify(flags, BUSY);
  }
});
