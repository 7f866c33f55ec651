// The agent-sandbox controllers (apis/agentsandbox.ts): warm pools and claims over fluxvm.dev
// Sandboxes. `register(manager, deps)` (controllers/README.md) adds the SandboxWarmPool and
// SandboxClaim controllers; both read Sandboxes through the shared informer, indexed by the uid of
// their controller owner (OWNER_INDEX).
import { agentSandboxView, sandboxClaim, sandboxTemplate, sandboxWarmPool } from '../../apis/agentsandbox.js';
import { grant } from '../../apis/grant.js';
import { sandbox } from '../../apis/sandbox.js';
import type { Grant, Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool } from '../../apis/zz_generated.types.js';
import { keyOf, type Manager } from '../../runtime/controller/index.js';
import { gvrOf } from '../../runtime/meta/types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { ClaimReconciler } from './claim.js';
import { OWNER_INDEX } from './index-names.js';
import { PoolReconciler } from './pool.js';
import { hasView, ViewReconciler, type SandboxView } from './view.js';

export { ClaimReconciler } from './claim.js';
export { PoolReconciler } from './pool.js';

/**
 * The folder's register: the pool (2 workers), claim (8 workers) and agents.x-k8s.io Sandbox view (2 workers)
 * controllers; no subresources.
 */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const sandboxes = manager.informer<Sandbox>(gvrOf(sandbox));
  sandboxes.cache.addIndex(OWNER_INDEX, (s) =>
    (s.metadata.ownerReferences ?? [])
      .filter((r) => r.controller && (r.kind === 'SandboxWarmPool' || r.kind === 'SandboxClaim'))
      .map((r) => r.uid),
  );
  const templates = manager.informer<SandboxTemplate>(gvrOf(sandboxTemplate));
  const pools = manager.informer<SandboxWarmPool>(gvrOf(sandboxWarmPool));
  const grants = manager.informer<Grant>(gvrOf(grant));
  const pool = manager
    .controllerFor<SandboxWarmPool>(sandboxWarmPool)
    .owns(sandbox)
    .watches<SandboxTemplate>(sandboxTemplate, (t, ps) =>
      ps.cache
        .list()
        .filter(
          (p) => p.metadata.namespace === t.metadata.namespace && p.spec.sandboxTemplateRef.name === t.metadata.name,
        )
        .map(keyOf),
    )
    .concurrency(d.concurrency?.sandboxwarmpool ?? 2)
    .complete((c) => new PoolReconciler({ ...c, sandboxes, templates }));
  const claim = manager
    .controllerFor<SandboxClaim>(sandboxClaim)
    .owns(sandbox)
    .owns(grant)
    .watches<SandboxWarmPool>(sandboxWarmPool, (p, cs) =>
      // A pool that appears (or refills) wakes its unbound claims.
      cs.cache
        .list()
        .filter(
          (c) =>
            c.metadata.namespace === p.metadata.namespace &&
            c.spec.warmPoolRef.name === p.metadata.name &&
            !c.status?.sandbox?.name,
        )
        .map(keyOf),
    )
    .concurrency(d.concurrency?.sandboxclaim ?? 8)
    .complete((c) => new ClaimReconciler({ ...c, runtime: d.runtime, sandboxes, pools, templates, grants }));
  // The agents.x-k8s.io Sandbox view of every pool or claim Sandbox (same key as the fluxvm.dev one).
  const view = manager
    .controllerFor<SandboxView>(agentSandboxView)
    .named('sandboxview')
    .watches<Sandbox>(sandbox, (s) => (hasView(s) ? [keyOf(s)] : []))
    .concurrency(d.concurrency?.sandboxview ?? 2)
    .complete((c) => new ViewReconciler({ ...c, sandboxes, templates }));
  return { controllers: [pool.controller, claim.controller, view.controller], subresources: [] };
}
