// Wiring of the Checkpoint controller: `register(manager, deps)` (controllers/README.md) adds
// it to the manager through the builder. Checkpoints have no subresources of their own and no
// state outside the runtime (which stores the checkpoint's data).
import { checkpoint } from '../../apis/checkpoint.js';
import type { Checkpoint } from '../../apis/zz_generated.types.js';
import type { Manager } from '../../runtime/controller/index.js';
import { nodeNameOf } from '../common/kinds.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { CheckpointReconciler } from './reconciler.js';

export { CheckpointReconciler } from './reconciler.js';

/** The folder's register: the Checkpoint controller (4 workers); no subresources. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const nodeName = d.nodeName ?? nodeNameOf();
  const { controller } = manager
    .controllerFor<Checkpoint>(checkpoint)
    .concurrency(d.concurrency?.checkpoint ?? 4)
    .withOptions({ recorderHost: nodeName })
    .complete((c) => new CheckpointReconciler({ ...c, runtime: d.runtime, nodeName }));
  return { controllers: [controller], subresources: [] };
}
