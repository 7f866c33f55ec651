// The ResourceQuota controller (reconciler.ts): one per process, woken by its quotas and by any
// change of a counted kind in a namespace that has a quota (the fluxvm.dev kinds, the
// agent-sandbox kinds and Secrets), plus a periodic full recalculation. Events and Leases are
// counted on the periodic pass only (they change too often to watch for this). Enforcement is
// the API server's (runtime/apiserver/admission/quota.ts); this keeps status.used current.
import { agentSandboxKinds } from '../../apis/agentsandbox.js';
import { secret } from '../../apis/core.js';
import { fluxKinds } from '../../apis/registry.js';
import { resourceQuota } from '../../apis/resourcequota.js';
import { keyOf, type Informer, type Manager } from '../../runtime/controller/index.js';
import type { KubeObject } from '../../runtime/meta/types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { QuotaReconciler, type ResourceQuota } from './reconciler.js';
import { quotaEvaluators } from './usage.js';

export { QuotaReconciler, RESYNC_MS } from './reconciler.js';
export { quotaEvaluators, sandboxUsage, setQuotaDefaults } from './usage.js';

/** The folder's register: the ResourceQuota controller (1 worker); no subresources. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const quotasOf = (o: KubeObject, quotas: Informer<ResourceQuota>) =>
    quotas.cache.byIndex('namespace', o.metadata.namespace ?? '').map(keyOf);
  let b = manager.controllerFor<ResourceQuota>(resourceQuota).named('resourcequota');
  for (const def of [...fluxKinds, ...agentSandboxKinds, secret].filter((k) => k.namespaced))
    b = b.watches<KubeObject>(def, quotasOf);
  const { controller } = b
    .concurrency(d.concurrency?.resourcequota ?? 1)
    .complete((c) => new QuotaReconciler({ ...c, evaluators: quotaEvaluators() }));
  return { controllers: [controller], subresources: [] };
}
