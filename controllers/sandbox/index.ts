// Wiring of the Sandbox controller: `register(manager, deps)` (controllers/README.md) adds it
// to the manager through the builder and returns the sandbox subresource handlers (exec,
// files, baseline, changes, dryrun, ...) to register on the API server. The Checkpoint
// controller is wired by controllers/checkpoint/index.ts.
//
//   const { subresources } = register(manager, { client, runtime, stateDir, log });
//   for (const s of subresources) server.registerSubresource(s.plural, s.name, s.handler);
//
// Baselines live in `<stateDir>/runtime/controller/sandboxes/<uid>/` (stateDir is the
// process's state root). The runtime must be started (runtime.start()) before the manager
// starts. Dry-run copies left by a crash mid-dry-run are destroyed when the controllers start.
import { join } from 'node:path';
import { checkpoint } from '../../apis/checkpoint.js';
import { sandbox as sandboxKind } from '../../apis/sandbox.js';
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import {
  keyOf,
  metadataOnlyUpdate,
  type Manager,
  type ObjectKey,
  type Runnable,
} from '../../runtime/controller/index.js';
import { gvrOf, type KubeObject } from '../../runtime/meta/types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { nodeNameOf } from '../common/kinds.js';
import { nodeVolumes } from '../volume/index.js';
import { DRYRUN_ID } from './changes.js';
import { SandboxReconciler } from './reconciler.js';
import { SandboxStateStore } from './state.js';
import { sandboxSubresources } from './subresources.js';

const SOURCE_INDEX = 'fluxvm.dev/workspace-source';
/** A SOURCE_INDEX value: the source object, always in the sandbox's own namespace. */
const sourceKey = (kind: 'Sandbox' | 'Checkpoint', namespace: string | undefined, name: string) =>
  `${kind}/${namespace ?? ''}/${name}`;

/** The folder's register: the Sandbox controller and subresources; baselines below `<stateDir>/runtime/controller`. */
export function register(manager: Manager, d: ControllerDeps): Registration & { state: SandboxStateStore } {
  const log = d.log;
  const nodeName = d.nodeName ?? nodeNameOf();
  const state = new SandboxStateStore(join(d.stateDir, 'runtime', 'controller', 'sandboxes'));
  const sandboxes = manager.informer<Sandbox>(gvrOf(sandboxKind));
  // Sandboxes waiting on a source are woken when it changes (a parent becoming Running, a
  // checkpoint becoming ready), not only by their 2 s requeue.
  sandboxes.cache.addIndex(SOURCE_INDEX, (s) => {
    const src = s.spec?.workspace?.source;
    return [
      ...(src?.sandboxRef ? [sourceKey('Sandbox', s.metadata.namespace, src.sandboxRef.name)] : []),
      ...(src?.checkpointRef ? [sourceKey('Checkpoint', s.metadata.namespace, src.checkpointRef.name)] : []),
    ];
  });
  const dependents =
    (kind: 'Sandbox' | 'Checkpoint') =>
    (obj: KubeObject): ObjectKey[] =>
      sandboxes.cache
        .byIndex(SOURCE_INDEX, sourceKey(kind, obj.metadata.namespace, obj.metadata.name ?? ''))
        .filter((s) => !s.status?.phase || s.status.phase === 'Pending')
        .map(keyOf);
  // The end of a background create, clone, teardown or restore enqueues its key (the builder's enqueue).
  const { controller, reconciler } = manager
    .controllerFor<Sandbox>(sandboxKind)
    .watches(sandboxKind, dependents('Sandbox'))
    .watches(checkpoint, dependents('Checkpoint'))
    .concurrency(d.concurrency?.sandbox ?? 4)
    // A change of only labels or owner references (a claim taking a warm sandbox from its pool) runs
    // no pass: the reconciler reads neither. An annotation still runs one (an operator's poke).
    .withOptions({ recorderHost: nodeName, skipUpdate: metadataOnlyUpdate })
    .complete(
      (c) =>
        new SandboxReconciler({
          ...c,
          runtime: d.runtime,
          state,
          nodeName,
          scheduling: d.scheduling,
          volumes: nodeVolumes(d.stateDir),
          informers: { sandboxes: c.informer, checkpoints: c.informerFor<Checkpoint>(checkpoint) },
          siblings: (s) => {
            const ref = s.spec?.workspace?.source?.sandboxRef?.name;
            return ref ? sandboxes.cache.byIndex(SOURCE_INDEX, sourceKey('Sandbox', s.metadata.namespace, ref)) : [];
          },
        }),
    );
  // An instance the runtime failed on its own (a VM guest breaking the agent protocol) is
  // reported at once rather than at the next health check: its Sandbox (uid = runtime id) is
  // enqueued, and the reconciler's inspect reports Failed.
  // The same for an instance that stopped on its own (a VM's QEMU exited): the pass revives it
  // (a Restarted Event) or says why it cannot, within seconds rather than at the health check.
  const enqueueInstance = (id: string) => {
    const s = sandboxes.cache.list().find((x) => x.metadata.uid === id);
    if (s) controller.enqueue(keyOf(s));
  };
  d.runtime.onInstanceFailed?.(enqueueInstance);
  d.runtime.onInstanceStopped?.(enqueueInstance);
  d.runtime.onWake?.(enqueueInstance); // a sandbox woke from idle standby: status says Running again
  const reaper: Runnable = {
    name: 'dryrun-reaper',
    async start() {
      for (const s of await d.runtime.list()) {
        if (DRYRUN_ID.test(s.id))
          await d.runtime
            .destroy(s.id)
            .catch((err) => log.error('destroying a dry-run copy failed', { id: s.id, err }));
      }
    },
  };
  manager.add(reaper);
  const restore = (sbx: Sandbox, ck: string, name: string) => reconciler.restoreInPlace(sbx, ck, name);
  return {
    controllers: [controller],
    subresources: sandboxSubresources({ client: d.client, runtime: d.runtime, state, log, restore }, d.fileWatches),
    state,
  };
}
