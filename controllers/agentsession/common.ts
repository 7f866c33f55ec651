// What the agentsessions subresource handlers share: their dependencies, the session a
// request names, and the small helpers (budget errors, Idempotency-Key, usage mirror).
import type { AgentSession, Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import type { SubresourceTarget } from '../../runtime/apiserver/http/subresources.js';
import type { Client } from '../../runtime/client/client.js';
import type { Clock, Logger } from '../../runtime/controller/index.js';
import { silentLogger } from '../../runtime/controller/reconciler.js';
import { writeStatus } from '../../runtime/controller/status.js';
import { errors, isNotFound, type StatusError } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { agentSessionsGVR } from './gvr.js';
import type { Ledger } from './ledger.js';
import type { Authorizer } from '../../runtime/apiserver/http/auth.js';
import type { ProvenanceSigner } from '../common/provenance.js';
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
  /**
   * The clock approvals use for their expiry and for approvalWaitSeconds (tests pass a FakeClock). Default: real time.
   */
  clock?: Clock;
  /**
   * The API server's authorizer: replay checks read on the source and exec on the target for the
   * requesting user. Absent: allowed.
   */
  authorize?: Authorizer;
  /** Signs the provenance of promotions (promote-provenance.ts); absent: none recorded. */
  provenanceSigner?: ProvenanceSigner;
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
export async function resolveSession(
  d: AgentSessionSubresourceDeps,
  r: SubresourceTarget,
  opts: { running?: boolean } = { running: true },
): Promise<SessionTarget> {
  if (!r.namespace) throw errors.notFound('agentsessions', GROUP, r.name);
  const s = await d.client.get<AgentSession>(agentSessionsGVR, r.namespace, r.name);
  if (opts.running === false) return { s, uid: s.metadata.uid!, sandboxId: '' };
  const ph = s.status?.phase ?? 'Pending';
  if (s.metadata.deletionTimestamp || ph !== 'Running') {
    throw errors.conflict(
      'agentsessions',
      GROUP,
      r.name,
      `the session is ${s.metadata.deletionTimestamp ? 'being deleted' : `not running (phase ${ph})`}`,
    );
  }
  const sbx = await d.client.get<Sandbox>(sandboxesGVR, r.namespace, r.name).catch(() => undefined);
  if (!sbx?.metadata?.uid || !['Running', 'Paused', 'Standby'].includes(sbx.status?.phase ?? '')) {
    throw errors.conflict(
      'agentsessions',
      GROUP,
      r.name,
      `the session's sandbox is not running (phase ${sbx?.status?.phase ?? 'absent'})`,
    );
  }
  return { s, uid: s.metadata.uid!, sandboxId: sbx.metadata.uid };
}

/** 403 naming the limit and the amount used (spec: Budgets). */
export function budgetError(limit: string, max: number, used: number, unit = ''): StatusError {
  return errors.forbidden(`budget exceeded: budget.${limit} is ${max}${unit}, the session used ${used}${unit}`);
}

export function idempotencyKey(r: SubresourceTarget): string | undefined {
  const v = r.headers['idempotency-key'];
  return Array.isArray(v) ? v[0] : v;
}

interface PendingMirror {
  d: AgentSessionSubresourceDeps;
  s: AgentSession;
  u: Usage;
  dirty: boolean;
}
const mirrors = new Map<string, PendingMirror>();
/** At most one usage mirror per session in this window: steps in between make one more write at its end. */
const MIRROR_WINDOW_MS = 200;

/**
 * Mirrors the usage file into status.usage, after the answer and at most once per
 * MIRROR_WINDOW_MS per session, the newest usage winning. status.usage is a view (budgets are
 * enforced from the usage file and the ledger; the reconciler mirrors the file too), and its
 * write is an API status update with its own durable commit, a watch event and a reconcile
 * pass. Run before the answer it took 1.5 ms of every exec's (traced in serve from the step's
 * end to the response's finish: 1.9 -> 0.3 ms); one per step, it was a status commit per exec
 * for every session running commands back to back. So: the first step's mirror is written
 * right after its answer (setImmediate), the steps that end within the window after it make
 * one write at the window's end. Fire and forget; a server stopping meanwhile drops the
 * pending one (the reconciler's next pass mirrors the file).
 */
export function mirrorUsage(d: AgentSessionSubresourceDeps, s: AgentSession, u: Usage): void {
  const key = s.metadata.uid ?? `${s.metadata.namespace}/${s.metadata.name}`;
  const pending = mirrors.get(key);
  if (pending) {
    Object.assign(pending, { d, s, u, dirty: true });
    return;
  }
  const m: PendingMirror = { d, s, u, dirty: true };
  mirrors.set(key, m);
  setImmediate(() => {
    void (async () => {
      while (m.dirty) {
        m.dirty = false;
        const started = Date.now();
        await writeUsageMirror(m.d, m.s, m.u);
        const rest = MIRROR_WINDOW_MS - (Date.now() - started);
        if (rest > 0) await new Promise((r) => setTimeout(r, rest).unref());
      }
      mirrors.delete(key);
    })();
  });
}

/**
 * The mirror's write (writeStatus: on a conflict with the reconciler's write the usage is set
 * again on the newest object). Never rejects. A session deleted meanwhile is fine (NotFound);
 * any other failure is logged (the usage file and the ledger stay the record; the next mirror
 * or usage read brings status up to date).
 */
async function writeUsageMirror(d: AgentSessionSubresourceDeps, s: AgentSession, u: Usage): Promise<void> {
  try {
    await writeStatus(d.client, agentSessionsGVR, s, (cur) => ({ ...(cur.status ?? {}), usage: u }), { log: d.log });
  } catch (e) {
    if (!isNotFound(e))
      (d.log ?? silentLogger).error('mirroring usage into status.usage failed', {
        session: `${s.metadata.namespace}/${s.metadata.name}`,
        error: String(e),
      });
  }
}
