// Wiring of the Sandbox controller: `register(manager, deps)` (controllers/README.md) adds it
// to the manager and returns the sandbox subresource handlers (exec, files, baseline, changes,
// dryrun) to register on the API server. The Checkpoint controller is wired by
// controllers/checkpoint/index.ts; addSandboxControllers adds both (tests, benches).
//
//   const { subresources } = register(manager, { client, runtime, stateDir, log });
//   for (const s of subresources) server.registerSubresource(s.plural, s.name, s.handler);
//
// Baselines live in `<stateDir>/runtime/controller/sandboxes/<uid>/` (register's stateDir is the
// process's state root; addSandboxController's is the controller directory itself).
// The runtime must be started (runtime.start()) before the manager starts. Dry-run copies
// left by a crash mid-dry-run are destroyed when the controllers start.
import { join } from 'node:path';
import type { Checkpoint, Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import { Controller, drainOnStop, EventRecorder, keyOf, OwnWrites, silentLogger, type Logger, type Manager, type Runnable } from '../../runtime/controller/index.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { addCheckpointController } from '../checkpoint/index.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { checkpointsGVR, nodeNameOf, sandboxesGVR } from '../common/kinds.js';
import { DRYRUN_ID } from './changes.js';
import { SandboxReconciler } from './reconciler.js';
import { SandboxStateStore } from './state.js';
import { sandboxSubresources } from './subresources.js';

export interface SandboxControllersOptions {
  client: Client;
  runtime: Runtime;
  /** Controller state (baselines) lives in `<stateDir>/sandboxes/<uid>/`. */
  stateDir: string;
  log?: Logger;
  nodeName?: string;
  /** Parallel reconciles per controller. Default 4 (creates are mostly waiting on the kernel). */
  concurrency?: number;
}

export interface SandboxControllers {
  sandbox: Controller;
  checkpoint: Controller;
  subresources: Array<{ plural: string; name: string; handler: SubresourceHandler }>;
  state: SandboxStateStore;
}

const SOURCE_INDEX = 'fluxvm.dev/workspace-source';
/** A SOURCE_INDEX value: the source object, always in the sandbox's own namespace. */
const sourceKey = (kind: 'Sandbox' | 'Checkpoint', namespace: string | undefined, name: string) => `${kind}/${namespace ?? ''}/${name}`;

/** The folder's register: the Sandbox controller and subresources; baselines below `<stateDir>/runtime/controller`. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const sc = addSandboxController(manager, {
    client: d.client,
    runtime: d.runtime,
    stateDir: join(d.stateDir, 'runtime', 'controller'),
    log: d.log,
    ...(d.nodeName ? { nodeName: d.nodeName } : {}),
  });
  return { controllers: [sc.sandbox], subresources: sc.subresources };
}

/** Adds the Sandbox and Checkpoint controllers to `manager` (before it starts). */
export function addSandboxControllers(manager: Manager, o: SandboxControllersOptions): SandboxControllers {
  const sc = addSandboxController(manager, o);
  const checkpoint = addCheckpointController(manager, { client: o.client, runtime: o.runtime, log: o.log, nodeName: o.nodeName, concurrency: o.concurrency });
  return { ...sc, checkpoint };
}

/** Adds the Sandbox controller (and the dry-run reaper) to `manager` (before it starts). */
export function addSandboxController(manager: Manager, o: SandboxControllersOptions): Omit<SandboxControllers, 'checkpoint'> {
  const log = o.log ?? silentLogger;
  const nodeName = o.nodeName ?? nodeNameOf();
  const state = new SandboxStateStore(join(o.stateDir, 'sandboxes'));
  const recorder = new EventRecorder({ client: o.client, component: 'fluxvm-sandbox-controller', host: nodeName, log });
  const sandboxes = manager.informer<Sandbox>(sandboxesGVR);
  const checkpoints = manager.informer<Checkpoint>(checkpointsGVR);
  // Sandboxes waiting on a source are woken when it changes (a parent becoming Running, a
  // checkpoint becoming ready), not only by their 2 s requeue.
  sandboxes.cache.addIndex(SOURCE_INDEX, (s) => {
    const src = s.spec?.workspace?.source;
    return [
      ...(src?.sandboxRef ? [sourceKey('Sandbox', s.metadata.namespace, src.sandboxRef.name)] : []),
      ...(src?.checkpointRef ? [sourceKey('Checkpoint', s.metadata.namespace, src.checkpointRef.name)] : []),
    ];
  });
  const dependents = (kind: 'Sandbox' | 'Checkpoint') => (obj: any) =>
    sandboxes.cache
      .byIndex(SOURCE_INDEX, sourceKey(kind, obj.metadata.namespace, obj.metadata.name))
      .filter((s) => !s.status?.phase || s.status.phase === 'Pending')
      .map(keyOf);
  // The end of a background create, clone, teardown or restore enqueues its key on this controller.
  let sandbox: Controller | undefined;
  const writes = new OwnWrites();
  const reconciler = new SandboxReconciler({
    client: writes.wrap(o.client),
    writes,
    runtime: o.runtime,
    recorder,
    state,
    nodeName,
    enqueue: (k) => sandbox?.enqueue(k),
    log,
    informers: { sandboxes, checkpoints },
    siblings: (s) => {
      const ref = s.spec?.workspace?.source?.sandboxRef?.name;
      return ref ? (sandboxes.cache.byIndex(SOURCE_INDEX, sourceKey('Sandbox', s.metadata.namespace, ref))) : [];
    },
  });
  sandbox = new Controller({
    name: 'sandbox',
    kind: 'Sandbox',
    informer: sandboxes,
    reconciler,
    watches: [
      { informer: sandboxes, map: dependents('Sandbox') },
      { informer: checkpoints, map: dependents('Checkpoint') },
    ],
    concurrency: o.concurrency ?? 4,
    log,
  });
  // An instance the runtime failed on its own (a VM guest breaking the agent protocol) is
  // reported at once rather than at the next health check: its Sandbox (uid = runtime id) is
  // enqueued, and the reconciler's inspect reports Failed.
  // The same for an instance that stopped on its own (a VM's QEMU exited): the pass revives it
  // (a Restarted Event) or says why it cannot, within seconds rather than at the health check.
  const enqueueInstance = (id: string) => {
    const s = sandboxes.cache.list().find((x: any) => x.metadata?.uid === id);
    if (s) sandbox!.enqueue(keyOf(s));
  };
  o.runtime.onInstanceFailed?.(enqueueInstance);
  o.runtime.onInstanceStopped?.(enqueueInstance);
  const reaper: Runnable = {
    name: 'dryrun-reaper',
    async start() {
      for (const s of await o.runtime.list()) {
        if (DRYRUN_ID.test(s.id)) await o.runtime.destroy(s.id).catch((e) => log.error('destroying a dry-run copy failed', { id: s.id, error: String(e) }));
      }
    },
  };
  manager.add(reaper);
  manager.add(sandbox);
  // A stop (or a lost leadership term) waits for the creates, teardowns and restores in flight.
  manager.add(drainOnStop('sandbox-work', () => reconciler.drain()));
  const restore = (sbx: Sandbox, ck: string, name: string) => reconciler.restoreInPlace(sbx, ck, name);
  return { sandbox, subresources: sandboxSubresources({ client: o.client, runtime: o.runtime, state, log, restore }), state };
}
