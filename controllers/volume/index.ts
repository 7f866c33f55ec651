// Wiring of the Volume controller: `register(manager, deps)` (controllers/README.md). Volumes
// live below `<stateDir>/volumes` (images) and are mounted below /run/fluxvm/volumes (see
// native/volumes/volumes.ts). A Sandbox that names a Volume wakes it (mountedBy, and a
// deletion waiting for its sandboxes).
import { sandbox } from '../../apis/sandbox.js';
import { volume } from '../../apis/volume.js';
import type { Sandbox, Volume } from '../../apis/zz_generated.types.js';
import { NodeVolumes, volumesUnsupported } from '../../native/volumes/volumes.js';
import type { Manager } from '../../runtime/controller/index.js';
import { nodeNameOf } from '../common/kinds.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { volumeNames } from './mounts.js';
import { VolumeReconciler } from './reconciler.js';

export { VolumeReconciler } from './reconciler.js';

/** The node's volumes over a state root (the Sandbox controller binds what this makes). */
export function nodeVolumes(stateDir: string): NodeVolumes {
  return new NodeVolumes({
    stateDir,
    ...(process.env.FLUXVM_VOLUME_MOUNT_DIR ? { mountBase: process.env.FLUXVM_VOLUME_MOUNT_DIR } : {}),
  });
}

export function register(manager: Manager, d: ControllerDeps): Registration {
  const nodeName = d.nodeName ?? nodeNameOf();
  const volumes = nodeVolumes(d.stateDir);
  // Mounts left by a state directory removed without deleting its Volumes (image unlinked).
  void volumes.sweep();
  const { controller } = manager
    .controllerFor<Volume>(volume)
    .watches<Sandbox>(sandbox, (s) => volumeNames(s).map((name) => ({ namespace: s.metadata.namespace ?? '', name })))
    .concurrency(d.concurrency?.volume ?? 2)
    .withOptions({ recorderHost: nodeName })
    .complete(
      (c) =>
        new VolumeReconciler({
          ...c,
          volumes,
          nodeName,
          unsupported: volumesUnsupported(),
        }),
    );
  return { controllers: [controller], subresources: [] };
}
