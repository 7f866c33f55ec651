// The Grant controller (see reconciler.ts): one per egress proxy, woken by its Grants and by
// changes of the Sandboxes and AgentSessions they name. `register(manager, deps)`
// (controllers/README.md) adds it when the process has an egress proxy (`deps.egress`): the
// Secret's value stays in that proxy's memory.
import { agentSession } from '../../apis/agentsession.js';
import { grant } from '../../apis/grant.js';
import { sandbox } from '../../apis/sandbox.js';
import type { AgentSession, Grant, Sandbox } from '../../apis/zz_generated.types.js';
import { keyOf, type Informer, type Manager } from '../../runtime/controller/index.js';
import { gvrOf } from '../../runtime/meta/types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { GrantReconciler } from './reconciler.js';

export { GrantReconciler, grantsGVR, secretsGVR, type GrantInjector } from './reconciler.js';

/** The folder's register: the Grant controller (2 workers) when deps.egress is set; no subresources. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const injector = d.egress;
  if (!injector) return { controllers: [], subresources: [] };
  const sessions = manager.informer<AgentSession>(gvrOf(agentSession));
  const sessionSandbox = (ns: string, name: string): string | undefined =>
    sessions.cache.get(ns, name)?.status?.sandbox?.name;
  const { controller } = manager
    .controllerFor<Grant>(grant)
    .watches<Sandbox>(sandbox, (s, grants) =>
      grants.cache
        .list()
        .filter(
          (g) =>
            g.metadata.namespace === s.metadata.namespace &&
            (g.spec?.sandboxRef?.name === s.metadata.name ||
              (g.spec?.sessionRef &&
                sessionSandbox(g.metadata.namespace!, g.spec.sessionRef.name) === s.metadata.name)),
        )
        .map(keyOf),
    )
    .watches<AgentSession>(agentSession, (s, grants: Informer<Grant>) =>
      grants.cache
        .list()
        .filter((g) => g.metadata.namespace === s.metadata.namespace && g.spec?.sessionRef?.name === s.metadata.name)
        .map(keyOf),
    )
    .concurrency(d.concurrency?.grant ?? 2)
    .complete(
      (c) =>
        new GrantReconciler({
          ...c,
          injector,
          informers: { grants: c.informer, sandboxes: c.informerFor<Sandbox>(sandbox), sessions },
        }),
    );
  return { controllers: [controller], subresources: [] };
}
