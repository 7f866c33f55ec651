// The Grant controller (see reconciler.ts): one per egress proxy, woken by its Grants and by
// changes of the Sandboxes, AgentSessions and Secrets they name. `register(manager, deps)`
// (controllers/README.md) adds it when the process has an egress proxy (`deps.egress`): the
// Secret's value stays in that proxy's memory.
import { agentSession } from '../../apis/agentsession.js';
import { secret } from '../../apis/core.js';
import { grant } from '../../apis/grant.js';
import { sandbox } from '../../apis/sandbox.js';
import type { AgentSession, Grant, Sandbox } from '../../apis/zz_generated.types.js';
import { keyOf, type Manager } from '../../runtime/controller/index.js';
import { gvrOf, type KubeObject } from '../../runtime/meta/types.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { GrantReconciler } from './reconciler.js';

export { GrantReconciler, grantsGVR, secretsGVR, type GrantInjector } from './reconciler.js';

/** "namespace/name" of a reference in `ns`. */
const ref = (ns: string | undefined, name: string | undefined): string[] => (name ? [`${ns ?? ''}/${name}`] : []);

/**
 * The folder's register: the Grant controller (2 workers) when deps.egress is set; no subresources.
 * Woken by what a Grant waits for, never by a timer per Grant: its Sandbox, its AgentSession (and
 * that session's sandbox) and its Secret (a metadata-only watch: the value is read by the
 * reconciler, never cached). Each mapping is an index lookup (the Grants by the sandbox, session
 * and Secret they name; the sessions by their sandbox), not a scan of every Grant.
 */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const injector = d.egress;
  if (!injector) return { controllers: [], subresources: [] };
  const sessions = manager.informer<AgentSession>(gvrOf(agentSession));
  sessions.cache.addIndex('sandbox', (s) => ref(s.metadata.namespace, s.status?.sandbox?.name));
  const grants = manager.informer<Grant>(gvrOf(grant));
  grants.cache.addIndex('sandbox', (g) => ref(g.metadata.namespace, g.spec?.sandboxRef?.name));
  grants.cache.addIndex('session', (g) => ref(g.metadata.namespace, g.spec?.sessionRef?.name));
  grants.cache.addIndex('secret', (g) => ref(g.metadata.namespace, g.spec?.secretRef?.name));
  const named = (index: string, o: KubeObject) =>
    grants.cache.byIndex(index, `${o.metadata.namespace ?? ''}/${o.metadata.name}`);
  const { controller } = manager
    .controllerFor<Grant>(grant)
    .watches<Sandbox>(sandbox, (s) =>
      [
        ...named('sandbox', s),
        ...sessions.cache
          .byIndex('sandbox', `${s.metadata.namespace ?? ''}/${s.metadata.name}`)
          .flatMap((sess) => named('session', sess)),
      ].map(keyOf),
    )
    .watches<AgentSession>(agentSession, (s) => named('session', s).map(keyOf))
    .watches<KubeObject>(secret, (s) => named('secret', s).map(keyOf), { metadataOnly: true })
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
