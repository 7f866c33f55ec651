// Runs the store's WAL checkpoints in a worker thread (checkpoint-worker.ts), one at a time.
import { Worker } from 'node:worker_threads';
import type { CheckpointReply, CheckpointRequest, CheckpointWorkerData } from './checkpoint-protocol.js';
import { BUSY, CLOSED, FLAG_SLOTS, PAUSED } from './checkpoint-protocol.js';

/**
 * Starts the worker module next to this one: checkpoint-worker.js when running from dist/. From
 * the TypeScript sources (tests, `tsx`), Node 20 does not carry tsx's loader into a worker
 * thread, so a one-line bootstrap registers it there (tsx's tsImport) and imports the .ts file.
 */
function startWorker(workerData: CheckpointWorkerData): Worker {
  if (!import.meta.url.endsWith('.ts')) {
    return new Worker(new URL('./checkpoint-worker.js', import.meta.url), { workerData });
  }
  const entry = new URL('./checkpoint-worker.ts', import.meta.url).href;
  const api = import.meta.resolve('tsx/esm/api');
  const boot = `import(${JSON.stringify(api)}).then((t) => t.tsImport(${JSON.stringify(entry)}, ${JSON.stringify(entry)}));`;
  return new Worker(boot, { eval: true, workerData });
}

export class Checkpointer {
  private readonly worker: Worker;
  /** walTotal of the request in flight (undefined: none). */
  private requested?: number;
  /** The worker could not start or died: the store checkpoints itself. */
  failed = false;
  private readonly flags = new Int32Array(new SharedArrayBuffer(FLAG_SLOTS * 4));
  /** Checkpoints completed (tests and the bench read it). */
  done = 0;

  /** `onDone(at)`: a checkpoint requested at walTotal `at` completed. */
  constructor(file: string, onDone: (at: number) => void) {
    // About 8 MiB of resident memory (an isolate and a small page cache), measured.
    this.worker = startWorker({ file, flags: this.flags });
    this.worker.unref();
    // A checkpoint that failed (busy, disk full) only leaves a longer WAL; the next request retries.
    this.worker.on('message', (m: CheckpointReply) => {
      const at = this.requested;
      this.requested = undefined;
      if (!m.result) return;
      this.done++;
      if (!m.result.busy && at !== undefined) onDone(at);
    });
    this.worker.on('error', () => {
      this.failed = true;
    });
    this.worker.on('exit', () => {
      this.failed = true;
    });
  }

  private post(m: CheckpointRequest): void {
    this.worker.postMessage(m);
  }

  request(at: number): void {
    if (this.requested !== undefined || this.failed) return;
    this.requested = at;
    this.post('checkpoint');
  }

  /** No checkpoint starts from now on, and the one running (if any) has finished when this returns. */
  pause(): void {
    Atomics.store(this.flags, PAUSED, 1);
    while (Atomics.load(this.flags, BUSY) === 1) Atomics.wait(this.flags, BUSY, 1, 10_000);
  }

  resume(): void {
    Atomics.store(this.flags, PAUSED, 0);
  }

  /** Closes the worker's connection before returning (a checkpoint in progress finishes first). */
  close(): void {
    if (!this.failed) {
      this.post('close');
      Atomics.wait(this.flags, CLOSED, 0, 10_000);
    }
    void this.worker.terminate();
  }
}
