// The Grant controller (see reconciler.ts): one per egress proxy, woken by its Grants and by
// changes of the Sandboxes they name.
import type { AgentSession, Grant, Sandbox } from '../../apis/zz_generated.types.js';
import type { Client } from '../../runtime/client/client.js';
import { Controller, EventRecorder, keyOf, OwnWrites, silentLogger, type Logger, type Manager } from '../../runtime/controller/index.js';
import { agentSessionsGVR } from '../agentsession/gvr.js';
import { sandboxesGVR } from '../common/kinds.js';
import { GrantReconciler, grantsGVR, type GrantInjector } from './reconciler.js';

export { GrantReconciler, grantsGVR, secretsGVR, type GrantInjector } from './reconciler.js';

export function addGrantController(manager: Manager, o: { client: Client; injector: GrantInjector; log?: Logger; recheckMs?: number }): Controller {
  const log = o.log ?? silentLogger;
  const grants = manager.informer<Grant>(grantsGVR);
  const writes = new OwnWrites();
  const sandboxes = manager.informer<Sandbox>(sandboxesGVR);
  const sessions = manager.informer<AgentSession>(agentSessionsGVR);
  const sessionSandbox = (ns: string, name: string): string | undefined =>
    sessions.cache.get(ns, name)?.status?.sandbox?.name;
  const recorder = new EventRecorder({ client: o.client, component: 'fluxvm-grant-controller', log });
  const c = new Controller({
    name: 'grant',
    kind: 'Grant',
    informer: grants,
    reconciler: new GrantReconciler({ client: writes.wrap(o.client), writes, injector: o.injector, recorder, recheckMs: o.recheckMs, informers: { sandboxes, sessions, grants } }),
    watches: [
      {
        informer: sandboxes,
        map: (s) =>
          grants.cache
            .list()
            .filter((g) => g.metadata.namespace === s.metadata.namespace && (g.spec?.sandboxRef?.name === s.metadata.name || (g.spec?.sessionRef && sessionSandbox(g.metadata.namespace!, g.spec.sessionRef.name) === s.metadata.name)))
            .map(keyOf),
      },
      {
        informer: sessions,
        map: (s) => grants.cache.list().filter((g) => g.metadata.namespace === s.metadata.namespace && g.spec?.sessionRef?.name === s.metadata.name).map(keyOf),
      },
    ],
    concurrency: 2,
    log,
  });
  manager.add(c);
  return c;
}
