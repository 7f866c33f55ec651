// The AgentSession controller (spec/agent-sessions.md): `register(manager, deps)`
// (controllers/README.md) adds the reconciler through the builder and returns the
// agentsessions subresource handlers the API server serves.
//
// State (ledgers, usage, lifecycle markers, baselines, idempotency records) lives in
// `<stateDir>/agentsessions/<session uid>/`; the reconciler and the subresources share it, so
// both must run in the same process (fluxctl serve). See README.md.
import { join } from 'node:path';
import { agentSession } from '../../apis/agentsession.js';
import { sandbox } from '../../apis/sandbox.js';
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { Manager } from '../../runtime/controller/index.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { agentSessionsGVR } from './gvr.js';
import { Ledger, usageFromLedger } from './ledger.js';
import { AgentSessionReconciler } from './reconciler.js';
import { SessionState } from './state.js';
import { agentSessionSubresources } from './subresources.js';
import { SessionTokens } from './tokens.js';
import { PreviewStore } from './previews.js';
import { sandboxesGVR } from '../common/kinds.js';
import { ProvenanceSigner } from '../common/provenance.js';

export { agentSessionsGVR } from './gvr.js';
export { AgentSessionReconciler } from './reconciler.js';
export { agentSessionSubresources } from './subresources.js';
export { Ledger, usageFromLedger } from './ledger.js';
export { SessionState } from './state.js';
export { SessionTokens, sessionTokenScope } from './tokens.js';

/**
 * The folder's register: session state below `<stateDir>/agentsessions`; also returns the
 * ledger, state and tokens (tests, benches).
 */
export function register(
  manager: Manager,
  d: ControllerDeps,
): Registration & { ledger: Ledger; state: SessionState; tokens: SessionTokens } {
  const dir = join(d.stateDir, 'agentsessions');
  const ledger = new Ledger(dir);
  // Usage the ledger proves: every exec entry (and its time), every fork's children.
  const state = new SessionState(dir, Date.now, undefined, (uid) => usageFromLedger(ledger, uid));
  // A session is woken when the Sandbox it owns changes (Running, Failed, deleted).
  const { controller } = manager
    .controllerFor<AgentSession>(agentSession)
    .owns(sandbox)
    .concurrency(d.concurrency?.agentsession ?? 4)
    .complete(
      (c) =>
        new AgentSessionReconciler({
          ...c,
          runtime: d.runtime,
          ledger,
          state,
          informers: { sessions: c.informer, sandboxes: c.informerFor<Sandbox>(sandbox) },
        }),
    );
  const sessions = manager.informer<AgentSession>(agentSessionsGVR);
  // A token is good while its session is in the informer's cache (not being deleted, not
  // expired); a deleted session's tokens are forgotten (the finalizer removes their file).
  const tokens = d.agentSessionTokens ?? new SessionTokens(dir);
  tokens.attach((ns, name) =>
    sessions.hasSynced()
      ? sessions.cache.get(ns, name)
      : d.client.get<AgentSession>(agentSessionsGVR, ns, name).catch(() => undefined),
  );
  sessions.addHandler({ delete: (s) => void (s.metadata.uid && tokens.forget(s.metadata.uid)) });
  // Preview URLs (previews.ts): the proxy reads sessions and sandboxes from the same caches.
  const previews = d.agentSessionPreviews ?? new PreviewStore(dir);
  const sandboxes = manager.informer<Sandbox>(sandboxesGVR);
  previews.attach({
    session: (ns, name) =>
      sessions.hasSynced()
        ? sessions.cache.get(ns, name)
        : d.client.get<AgentSession>(agentSessionsGVR, ns, name).catch(() => undefined),
    sandbox: (ns, name) =>
      sandboxes.hasSynced()
        ? sandboxes.cache.get(ns, name)
        : d.client.get<Sandbox>(sandboxesGVR, ns, name).catch(() => undefined),
  });
  sessions.addHandler({ delete: (s) => void (s.metadata.uid && previews.forget(s.metadata.uid)) });
  const subresources = agentSessionSubresources(
    {
      client: d.client,
      runtime: d.runtime,
      ledger,
      state,
      log: d.log,
      forkWaitMs: d.agentSessionForkWaitMs,
      clock: manager.clock,
      ...(d.authorize ? { authorize: d.authorize } : {}),
      provenanceSigner: d.provenanceSigner ?? new ProvenanceSigner(d.stateDir),
    },
    tokens,
    previews,
    d.fileWatches,
  );
  return { controllers: [controller], subresources, ledger, state, tokens };
}
