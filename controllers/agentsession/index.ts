// The AgentSession controller (issue 14, spec/agent-sessions.md): one call adds the
// reconciler to a manager and returns the agentsessions subresource handlers the API server
// serves. cmd/fluxctl/controller.ts (addControllers) wires it:
//
//   const subs = addAgentSessionController(manager, { client, runtime, stateDir, log });
//   for (const s of subs) server.registerSubresource(s.plural, s.name, s.handler);
//
// State (ledgers, usage, lifecycle markers, baselines, idempotency records) lives in
// `<stateDir>/<session uid>/`; the reconciler and the subresources share it, so both must run
// in the same process (fluxctl serve). See README.md.
import { Controller, EventRecorder, keyOf, OwnWrites, silentLogger, type Clock, type Logger, type Manager } from '../../runtime/controller/index.js';
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { sandboxesGVR } from '../common/kinds.js';
import type { ControllerDeps, Registration } from '../common/register.js';
import { join } from 'node:path';
import { controllerSession } from './desired.js';
import { agentSessionsGVR } from './gvr.js';
import { Ledger, usageFromLedger } from './ledger.js';
import { AgentSessionReconciler } from './reconciler.js';
import { SessionState } from './state.js';
import { agentSessionSubresources } from './subresources.js';
import { SessionTokens } from './tokens.js';

export { agentSessionsGVR } from './gvr.js';
export { AgentSessionReconciler } from './reconciler.js';
export { agentSessionSubresources } from './subresources.js';
export { Ledger, usageFromLedger } from './ledger.js';
export { SessionState } from './state.js';
export { SessionTokens, sessionTokenScope } from './tokens.js';

export interface AgentSessionControllerOptions {
  client: Client;
  runtime: Runtime;
  /** Session state lives in `<stateDir>/<uid>/`. */
  stateDir: string;
  log?: Logger;
  clock?: Clock;
  concurrency?: number;
  /** How long a fork waits for its children to be Running (default 60 s). */
  forkWaitMs?: number;
  /**
   * The session tokens the API server's authenticator knows (cmd/fluxctl/serve.ts makes one
   * over the same dir and plugs its `authenticate` into the chain); default: one of its own.
   */
  tokens?: SessionTokens;
}

/** Adds the AgentSession controller to `manager` (before it starts); returns its subresources and state. */
export function addAgentSessionController(
  manager: Manager,
  o: AgentSessionControllerOptions,
): { controller: Controller; ledger: Ledger; state: SessionState; tokens: SessionTokens; subresources: Array<{ plural: string; name: string; handler: SubresourceHandler }> } {
  const log = o.log ?? silentLogger;
  const ledger = new Ledger(o.stateDir);
  // Usage the ledger proves: every exec entry (and its time), every fork's children.
  const state = new SessionState(o.stateDir, Date.now, undefined, (uid) => usageFromLedger(ledger, uid));
  const recorder = new EventRecorder({ client: o.client, component: 'fluxvm-agentsession-controller', log });
  const sessions = manager.informer<AgentSession>(agentSessionsGVR);
  const writes = new OwnWrites();
  const sandboxes = manager.informer<Sandbox>(sandboxesGVR);
  const controller = new Controller({
    name: 'agentsession',
    informer: sessions,
    reconciler: new AgentSessionReconciler({ client: writes.wrap(o.client), writes, runtime: o.runtime, recorder, ledger, state, clock: o.clock, log, informers: { sandboxes, sessions } }),
    // A session is woken when the Sandbox it owns changes (Running, Failed, deleted).
    watches: [{ informer: sandboxes, map: (sbx: any) => (controllerSession(sbx) ? [{ ...keyOf(sbx), name: controllerSession(sbx)! }] : []) }],
    concurrency: o.concurrency ?? 4,
    log,
    clock: o.clock,
  });
  manager.add(controller);
  // A token is good while its session is in the informer's cache (not being deleted, not
  // expired); a deleted session's tokens are forgotten (the finalizer removes their file).
  const tokens = o.tokens ?? new SessionTokens(o.stateDir);
  tokens.attach((ns, name) => (sessions.hasSynced() ? sessions.cache.get(ns, name) : o.client.get(agentSessionsGVR, ns, name).catch(() => undefined)));
  sessions.addHandler({ delete: (s: any) => s?.metadata?.uid && tokens.forget(s.metadata.uid) });
  const subresources = agentSessionSubresources({ client: o.client, runtime: o.runtime, ledger, state, log, forkWaitMs: o.forkWaitMs, clock: o.clock }, tokens);
  return { controller, ledger, state, tokens, subresources };
}

/** The folder's register (controllers/README.md): session state below `<stateDir>/agentsessions`. */
export function register(manager: Manager, d: ControllerDeps): Registration {
  const a = addAgentSessionController(manager, { client: d.client, runtime: d.runtime, stateDir: join(d.stateDir, 'agentsessions'), log: d.log, tokens: d.agentSessionTokens });
  return { controllers: [a.controller], subresources: a.subresources };
}
