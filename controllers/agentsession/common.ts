// What the agentsessions subresource handlers share: their dependencies, the session a
// request names, and the small helpers (budget errors, Idempotency-Key, usage mirror).
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { SubresourceTarget } from '../../runtime/apiserver/http/subresources.js';
import type { Client } from '../../runtime/client/client.js';
import type { Clock, Logger } from '../../runtime/controller/index.js';
import { errors, type StatusError } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { agentSessionsGVR } from './gvr.js';
import type { Ledger } from './ledger.js';
import type { SessionState, Usage } from './state.js';

export interface AgentSessionSubresourceDeps {
  client: Client;
  runtime: Runtime;
  ledger: Ledger;
  state: SessionState;
  log?: Logger;
  /** Per-stream cap of exec output without budget.maxOutputBytes. Default 1 MiB. */
  maxOutputBytes?: number;
  /** How long fork waits for its children to be Running. Default 60 s. */
  forkWaitMs?: number;
  now?: () => number;
  /** The clock approvals use for their expiry and for approvalWaitSeconds (tests pass a FakeClock). Default: real time. */
  clock?: Clock;
}

export const GROUP = 'fluxvm.dev';
/** A resolved session and its sandbox's runtime id. */
export interface SessionTarget {
  s: AgentSession;
  uid: string;
  sandboxId: string;
}

/**
 * The session named by the request (its namespace only): 404 when missing; 409 when it is
 * not Running (Expired, Failed, being deleted, still Creating) or its sandbox is not.
 */
export async function resolveSession(d: AgentSessionSubresourceDeps, r: SubresourceTarget, opts: { running?: boolean } = { running: true }): Promise<SessionTarget> {
  if (!r.namespace) throw errors.notFound('agentsessions', GROUP, r.name);
  const s = await d.client.get<any>(agentSessionsGVR, r.namespace, r.name);
  if (opts.running === false) return { s, uid: s.metadata.uid, sandboxId: '' };
  const ph = s.status?.phase ?? 'Pending';
  if (s.metadata.deletionTimestamp || ph !== 'Running') {
    throw errors.conflict('agentsessions', GROUP, r.name, `the session is ${s.metadata.deletionTimestamp ? 'being deleted' : `not running (phase ${ph})`}`);
  }
  const sbx = await d.client.get<any>(sandboxesGVR, r.namespace, r.name).catch(() => undefined);
  if (!sbx?.metadata?.uid || (sbx.status?.phase !== 'Running' && sbx.status?.phase !== 'Paused')) {
    throw errors.conflict('agentsessions', GROUP, r.name, `the session's sandbox is not running (phase ${sbx?.status?.phase ?? 'absent'})`);
  }
  return { s, uid: s.metadata.uid, sandboxId: sbx.metadata.uid };
}

/** 403 naming the limit and the amount used (spec: Budgets). */
export function budgetError(limit: string, max: number, used: number, unit = ''): StatusError {
  return errors.forbidden(`budget exceeded: budget.${limit} is ${max}${unit}, the session used ${used}${unit}`);
}

export function idempotencyKey(r: SubresourceTarget): string | undefined {
  const v = r.headers['idempotency-key'];
  return Array.isArray(v) ? v[0] : v;
}

/** Mirrors the usage file into status.usage (a merge patch: no resourceVersion race with the reconciler). Best effort. */
export async function mirrorUsage(d: AgentSessionSubresourceDeps, s: AgentSession, u: Usage): Promise<void> {
  await d.client.patch(agentSessionsGVR, s.metadata.namespace, s.metadata.name!, 'merge', { status: { usage: u } }, { subresource: 'status' }).catch(() => undefined);
}

