// The Changeset controller (issue 5): speculation, review, approval and conflict-checked
// apply. `register(manager, deps)` (controllers/README.md) adds it and returns the changesets
// subresources (diff, files); staging lives in `<stateDir>/changesets/`.
import { Controller, drainOnStop, EventRecorder, OwnWrites, type Manager } from '../../runtime/controller/index.js';
import type { Changeset } from '../../apis/zz_generated.types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { DiffPool } from './diffpool.js';
import { changesetSubresources } from './subresources.js';
import { changesetsGVR } from './helpers.js';
import { ChangesetReconciler, type ChangesetControllerOptions } from './reconciler.js';

export { ChangesetReconciler, type ChangesetControllerOptions } from './reconciler.js';
export { changesetSubresources, changesetDiff, type SubresourceDeps } from './subresources.js';
export * from './helpers.js';
export type { ChangesetMeta } from './speculate.js';
export { DiffPool, DiffPoolBusy, type DiffPoolOptions } from './diffpool.js';

/**
 * Adds the Changeset controller to the manager (before manager.start). Passes run with
 * `concurrency` workers (default 2; one key is never run twice at once); speculations and
 * applies run as background work beside them. Returns the controller.
 */
export function addChangesetController(
  manager: Manager,
  opts: Omit<ChangesetControllerOptions, 'recorder' | 'client'> & { recorder?: EventRecorder; concurrency?: number },
): Controller {
  const writes = new OwnWrites();
  const client = writes.wrap(manager.client);
  const informer = manager.informer<Changeset>(changesetsGVR);
  const recorder = opts.recorder ?? new EventRecorder({ client, component: 'changeset-controller', log: opts.log });
  // The end of a background speculation or apply enqueues its key on this controller.
  let c: Controller | undefined;
  const reconciler = new ChangesetReconciler({ ...opts, client, informer, writes, recorder, enqueue: (k) => c?.enqueue(k) });
  c = new Controller({
    name: 'changeset',
    kind: 'Changeset',
    informer,
    reconciler,
    concurrency: opts.concurrency ?? 2,
    log: opts.log,
    clock: opts.clock,
  });
  manager.add(c);
  // A stop (or a lost leadership term) waits for the applies in flight: one is never left
  // half done by a graceful stop (a crash leaves the marker: Failed ApplyInterrupted).
  manager.add(drainOnStop('changeset-applies', () => reconciler.drainApplies()));
  return c;
}

/** The folder's register: the Changeset controller and the changesets subresources. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const c = addChangesetController(manager, {
    runtime: d.runtime,
    stateDir: d.stateDir,
    log: d.log,
    retentionSeconds: d.changeset?.retentionSeconds,
    maxTtlSeconds: d.changeset?.maxTtlSeconds,
    applyDelayMsPerFile: d.changeset?.applyDelayMsPerFile,
    metrics: manager.metrics,
  });
  // The diff subresource's file diffs run in worker threads; a stop ends them (they start
  // again on the next diff: the API server may go on serving after the manager stopped).
  const diffs = new DiffPool();
  manager.add(drainOnStop('changeset-diff-workers', () => diffs.close()));
  return { controllers: [c], subresources: changesetSubresources({ client: d.client, runtime: d.runtime, stateDir: d.stateDir, diffs }) };
}
