// Wiring of the Checkpoint controller: `register(manager, deps)` (controllers/README.md) adds
// it to the manager. Checkpoints have no subresources of their own and no state outside the
// runtime (which stores the checkpoint's data).
import type { Checkpoint } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import { Controller, drainOnStop, EventRecorder, OwnWrites, silentLogger, type Logger, type Manager } from '../../runtime/controller/index.js';
import { checkpointsGVR, nodeNameOf } from '../common/kinds.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { CheckpointReconciler } from './reconciler.js';

export { CheckpointReconciler } from './reconciler.js';

export interface CheckpointControllerOptions {
  client: Client;
  runtime: Runtime;
  log?: Logger;
  nodeName?: string;
  /** Parallel reconciles. Default 4. */
  concurrency?: number;
}

/** Adds the Checkpoint controller to `manager` (before it starts) and returns it. */
export function addCheckpointController(manager: Manager, o: CheckpointControllerOptions): Controller {
  const log = o.log ?? silentLogger;
  const nodeName = o.nodeName ?? nodeNameOf();
  // Events keep the source component they always had (the sandbox controller's).
  const recorder = new EventRecorder({ client: o.client, component: 'fluxvm-sandbox-controller', host: nodeName, log });
  // The end of a background checkpoint enqueues its key on this controller.
  let checkpoint: Controller | undefined;
  const informer = manager.informer<Checkpoint>(checkpointsGVR);
  const writes = new OwnWrites();
  const reconciler = new CheckpointReconciler({ client: writes.wrap(o.client), informer, writes, runtime: o.runtime, recorder, nodeName, enqueue: (k) => checkpoint?.enqueue(k) });
  checkpoint = new Controller({
    name: 'checkpoint',
    kind: 'Checkpoint',
    informer,
    reconciler,
    concurrency: o.concurrency ?? 4,
    log,
  });
  manager.add(checkpoint);
  // A stop (or a lost leadership term) waits for the checkpoints being taken.
  manager.add(drainOnStop('checkpoint-work', () => reconciler.drain()));
  return checkpoint;
}

/** The folder's register: the Checkpoint controller; no subresources. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const checkpoint = addCheckpointController(manager, { client: d.client, runtime: d.runtime, log: d.log, ...(d.nodeName ? { nodeName: d.nodeName } : {}) });
  return { controllers: [checkpoint], subresources: [] };
}
