// The Changeset controller: speculation, review, approval and conflict-checked
// apply. `register(manager, deps)` (controllers/README.md) adds it through the builder and
// returns the changesets subresources (diff, files); staging lives in `<stateDir>/changesets/`.
import { changeset } from '../../apis/changeset.js';
import type { Changeset } from '../../apis/zz_generated.types.js';
import { drainOnStop, type Manager } from '../../runtime/controller/index.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { DiffPool } from './diffpool.js';
import { changesetSubresources } from './subresources.js';
import { ChangesetReconciler } from './reconciler.js';
import { ChangesetProvenance } from './provenance.js';
import { ProvenanceSigner } from '../common/provenance.js';

/** The process's provenance signer (ControllerDeps.provenanceSigner: serve shares it with its well-known key route). */
const provenanceSigner = (d: ControllerDeps) => d.provenanceSigner ?? new ProvenanceSigner(d.stateDir);

export { ChangesetReconciler, type ChangesetControllerOptions } from './reconciler.js';
export { changesetSubresources, changesetDiff, type SubresourceDeps } from './subresources.js';
export * from './helpers.js';
export type { ChangesetMeta } from './speculate.js';
export { DiffPool, DiffPoolBusy, type DiffPoolOptions } from './diffpool.js';

/**
 * The folder's register: the Changeset controller and the changesets subresources. Passes run
 * with 2 workers (one key is never run twice at once); speculations and applies run as
 * background work beside them, and a stop (or a lost leadership term) waits for the applies
 * in flight (the reconciler's drain()): one is never left half done by a graceful stop (a
 * crash leaves the marker: Failed ApplyInterrupted).
 */
export function register(manager: Manager, d: ControllerDeps): Registration & { reconciler: ChangesetReconciler } {
  const { controller, reconciler } = manager
    .controllerFor<Changeset>(changeset)
    .concurrency(d.concurrency?.changeset ?? 2)
    .complete(
      (c) =>
        new ChangesetReconciler({
          ...c,
          ...d.changeset,
          runtime: d.runtime,
          stateDir: d.stateDir,
          metrics: manager.metrics,
          provenance: new ChangesetProvenance({ client: d.client, signer: provenanceSigner(d) }),
        }),
    );
  // The diff subresource's file diffs run in worker threads; a stop ends them (they start
  // again on the next diff: the API server may go on serving after the manager stopped).
  const diffs = new DiffPool();
  manager.add(drainOnStop('changeset-diff-workers', () => diffs.close()));
  return {
    controllers: [controller],
    reconciler,
    subresources: changesetSubresources({ client: d.client, runtime: d.runtime, stateDir: d.stateDir, diffs }),
  };
}
