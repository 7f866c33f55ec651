// Approvals for held commands (spec/agent-sessions.md "Approvals"): an exec whose
// command matches policy.process.ask is not run. The server creates an Approval
// (apis/approval.ts) and answers 428 ApprovalRequired naming it; an operator decides through
// approvals/<name>/approval (fluxvm-approver only); the agent repeats the request with
// approvalName (or holds it open with approvalWaitSeconds) and it runs once.
//
// The approval is bound to a SHA-256 digest (approvalDigest) of the session uid, the kind,
// the exact argv, its parameters (timeout, stdin digest, env, cwd, transport), the session's
// policy (spec.policy and status.compiledPolicy) and the session revision (state.ts: bumped by
// checkpoint, restore, fork and promote). The retry recomputes it from the session as it is
// then; any difference is 403. Consumption is one status write with the Approval's
// resourceVersion as precondition, so of two concurrent retries exactly one runs.
// The pure parts (digest, state, refusals, the decision) are table-tested in
// test/controllers/agentsession/approvals.test.ts.
import { createHash, randomBytes } from 'node:crypto';
import { approval as approvalKind, APPROVAL_TTL_SECONDS } from '../../apis/approval.js';
import type { AgentSession, Approval } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { realClock, rfc3339, writeStatus, type Clock } from '../../runtime/controller/index.js';
import { errors, isNotFound, StatusError } from '../../runtime/meta/errors.js';
import { gvrOf, type GVR, type KubeObject } from '../../runtime/meta/types.js';
import { jsonBody } from '../sandbox/request.js';
import { GROUP, type AgentSessionSubresourceDeps, type SessionTarget } from './common.js';
import { agentSessionsGVR } from './gvr.js';
import {
  approvalsGVR,
  APPROVAL_TTL_MS,
  MAX_PENDING_APPROVALS,
  APPROVAL_RETENTION_MS,
  type HeldRequest,
  requestParams,
  sessionPolicy,
  approvalDigest,
  approvalExpiry,
  approvalState,
  type RetryFacts,
  useRefusal,
  decidedStatus,
  commandLine,
  approvalRequired,
  SESSION_USER_PREFIX,
  refusal,
} from './approval-rules.js';

const clockOf = (d: AgentSessionSubresourceDeps): Clock => d.clock ?? realClock;

async function facts(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  req: HeldRequest,
  fresh: boolean,
): Promise<RetryFacts & { s: AgentSession }> {
  const s = fresh
    ? await d.client.get<AgentSession>(agentSessionsGVR, t.s.metadata.namespace, t.s.metadata.name!)
    : t.s;
  if (s.metadata.uid !== t.uid) throw errors.notFound('agentsessions', GROUP, t.s.metadata.name!);
  const revision = await d.state.revision(t.uid);
  return {
    s,
    sessionUID: t.uid,
    request: req,
    revision,
    digest: approvalDigest(t.uid, req, sessionPolicy(s), revision),
  };
}

/**
 * The pending (or approved, unused) Approval for this exact request, created when there is
 * none: another ask with the same digest returns the same one; a denied one stays denied
 * (403) until it expires. Serialized per session in this process. 409 at the pending cap.
 */
export async function requestApproval(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  req: HeldRequest,
  match: { rule: string; piece: string },
): Promise<Approval> {
  const ns = t.s.metadata.namespace!;
  const session = t.s.metadata.name!;
  return d.state.locked(`${t.uid}/approvals`, async () => {
    const f = await facts(d, t, req, false);
    const now = clockOf(d).now();
    const all = (
      await d.client.list<Approval>(approvalsGVR, ns, { fieldSelector: `spec.sessionRef.name=${session}` })
    ).items.filter((a) => a.spec.sessionUID === t.uid);
    for (const a of all) {
      if (a.spec.digest !== f.digest) continue;
      const st = approvalState(a, now);
      if (st === 'Denied' && now < approvalExpiry(a)) {
        await d.ledger.append(t.uid, 'approval.refused', {
          approval: a.metadata!.name,
          approver: a.status?.approver,
          command: req.argv,
          why: 'denied',
        });
        throw refusal(403, useRefusal(a, f, now)!.why, a.metadata!.name!);
      }
      if (st === 'Pending' || st === 'Approved') return a;
    }
    for (const a of all) {
      const st = approvalState(a, now);
      if (st !== 'Pending' && st !== 'Approved' && approvalExpiry(a) + APPROVAL_RETENTION_MS < now) {
        void d.client.delete(approvalsGVR, ns, a.metadata!.name!).catch(() => undefined);
      }
    }
    const pending = all.filter((a) => approvalState(a, now) === 'Pending').length;
    if (pending >= MAX_PENDING_APPROVALS) {
      await d.ledger.append(t.uid, 'approval.refused', {
        command: req.argv,
        why: `${pending} approvals pending (the limit)`,
      });
      throw errors.conflict(
        'approvals',
        GROUP,
        session,
        `the session has ${pending} approvals pending, the limit is ${MAX_PENDING_APPROVALS}: decide some or let them expire (10 minutes) before asking again`,
      );
    }
    const base = session.slice(0, 40).replace(/[-.]+$/, '');
    const requestedAt = rfc3339(now);
    const created = await d.client.create<Approval>(approvalsGVR, ns, {
      apiVersion: 'fluxvm.dev/v1alpha1',
      kind: 'Approval',
      metadata: {
        name: `${base}-apr-${randomBytes(3).toString('hex')}`,
        namespace: ns,
        labels: { 'fluxvm.dev/session': session.length <= 63 ? session : session.slice(0, 63).replace(/[-.]+$/, '') },
        ownerReferences: [
          {
            apiVersion: 'fluxvm.dev/v1alpha1',
            kind: 'AgentSession',
            name: session,
            uid: t.uid,
            controller: true,
            blockOwnerDeletion: true,
          },
        ],
      },
      spec: {
        sessionRef: { name: session },
        sessionUID: t.uid,
        kind: req.kind,
        command: req.argv,
        commandLine: commandLine(req.argv),
        matched: { rule: match.rule, piece: match.piece.slice(0, 2048) },
        ...requestParams(req),
        sessionRevision: f.revision,
        digest: f.digest,
        requestedAt,
      },
    });
    const expiresAt = rfc3339(now + APPROVAL_TTL_MS);
    // The status of the new Approval is exactly its expiry (whatever create left there goes),
    // unless a decision landed first (a conflict re-applies this): then it is kept.
    const a = await writeStatus(
      d.client,
      approvalsGVR,
      created,
      (cur) => ({ ...(cur.status?.decision ? cur.status : {}), expiresAt }),
      { log: d.log },
    );
    await d.ledger.append(t.uid, 'approval.requested', {
      approval: a.metadata.name,
      command: req.argv,
      rule: match.rule,
      digest: f.digest,
      expiresAt,
    });
    return a;
  });
}

/**
 * Waits for `a` to be decided (a watch of that one object from its resourceVersion: no
 * polling), at most `ms` on the deps' clock, or until `signal` aborts; resolves with its
 * latest state (still pending on a timeout).
 */
export async function waitForDecision(
  d: AgentSessionSubresourceDeps,
  a: Approval,
  ms: number,
  signal?: AbortSignal,
): Promise<Approval> {
  const ns = a.metadata!.namespace!;
  const name = a.metadata!.name!;
  await new Promise<void>((resolve) => {
    let settled = false;
    const finish = () => {
      if (settled) return;
      settled = true;
      timer.cancel();
      w.stop();
      signal?.removeEventListener('abort', finish);
      resolve();
    };
    const timer = clockOf(d).setTimeout(finish, ms);
    const w = d.client.watch<Approval>(
      approvalsGVR,
      ns,
      { fieldSelector: `metadata.name=${name}`, resourceVersion: a.metadata!.resourceVersion },
      (ev) => {
        if (ev.type === 'DELETED' || ev.type === 'ERROR' || (ev.object as Approval)?.status?.decision) finish();
      },
    );
    void w.done.then(finish);
    if (signal?.aborted) finish();
    signal?.addEventListener('abort', finish, { once: true });
  });
  return d.client.get<Approval>(approvalsGVR, ns, name).catch((e) => {
    if (isNotFound(e)) throw refusal(403, `Approval ${name} was deleted`, name);
    throw e;
  });
}

/**
 * The gate of a command that matches policy.process.ask. Returns the name of an Approved,
 * unused, unexpired Approval whose digest matches (the caller consumes it when the command
 * starts); otherwise throws 428 (created or still pending; after approvalWaitSeconds without a
 * decision), 403 (denied, used, expired, or a different request), 404 (another session's).
 */
export async function approvalGate(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  req: HeldRequest,
  match: { rule: string; piece: string },
  o: { approvalName?: string; waitMs: number; signal?: AbortSignal },
): Promise<string> {
  const ns = t.s.metadata.namespace!;
  let a: Approval;
  if (o.approvalName) {
    a = await d.client.get<Approval>(approvalsGVR, ns, o.approvalName).catch((e) => {
      if (isNotFound(e)) throw refusal(404, `approvals.fluxvm.dev "${o.approvalName}" not found`, o.approvalName!);
      throw e;
    });
  } else a = await requestApproval(d, t, req, match);
  if (approvalState(a, clockOf(d).now()) === 'Pending' && o.waitMs > 0) {
    a = await waitForDecision(d, a, o.waitMs, o.signal);
    // The client went away while waiting: nothing runs (the approval stays for a retry).
    if (o.signal?.aborted) {
      await d.ledger.append(t.uid, 'approval.refused', {
        approval: a.metadata!.name,
        command: req.argv,
        why: 'the client went away while waiting for the decision',
      });
      throw new StatusError(
        408,
        'Timeout',
        `the client of the held request went away before Approval ${a.metadata!.name} was decided`,
      );
    }
  }
  const f = await facts(d, t, req, true);
  const r = useRefusal(a, f, clockOf(d).now());
  if (r?.code === 428)
    throw approvalRequired(a, o.waitMs > 0 ? `no decision within approvalWaitSeconds ${o.waitMs / 1000}` : undefined);
  if (r) {
    await d.ledger.append(t.uid, 'approval.refused', {
      approval: a.metadata!.name,
      approver: a.status?.approver,
      command: req.argv,
      why: r.why,
    });
    throw refusal(r.code, r.why, a.metadata!.name!);
  }
  if (!o.approvalName && o.waitMs === 0) {
    // Approved already, but the agent did not name it: say so rather than run unasked.
    throw approvalRequired(a, `Approval ${a.metadata!.name} is Approved`);
  }
  return a.metadata!.name!;
}

/**
 * Uses Approval `name` for this request, once: re-checks it against the session as it is now
 * and writes status.consumed with its resourceVersion as precondition. Of concurrent callers
 * exactly one succeeds; the others get 403 (already used). Ledgered approval.refused, and
 * approval.consumed: that append is queued (ahead of anything appended later for the session)
 * but not awaited, so the command starts without waiting for its fsync; the caller awaits
 * `ledgered` before it answers.
 */
export async function consumeApproval(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  name: string,
  req: HeldRequest,
): Promise<{ approver?: string; ledgered: Promise<unknown> }> {
  const ns = t.s.metadata.namespace!;
  // One writer per Approval in this process (so a loser re-reads the committed use instead of
  // racing the store's commit); the resourceVersion precondition guards across processes.
  return d.state.locked(approvalLock(ns, name), () => consumeLocked(d, t, ns, name, req));
}

const approvalLock = (ns: string, name: string) => `approval:${ns}/${name}`;

async function consumeLocked(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  ns: string,
  name: string,
  req: HeldRequest,
): Promise<{ approver?: string; ledgered: Promise<unknown> }> {
  const a0 = await d.client.get<Approval>(approvalsGVR, ns, name);
  const f = await facts(d, t, req, true);
  const now = clockOf(d).now();
  let refused: { a: Approval; r: { code: 403 | 404 | 428; why: string } } | undefined;
  // metadata.resourceVersion is the precondition: a concurrent consumer's write makes this a
  // 409, and the re-read Approval is checked again (then it is used: refused).
  const a = await writeStatus(
    d.client,
    approvalsGVR,
    a0,
    (cur) => {
      const r = useRefusal(cur, f, now);
      if (r) {
        refused = { a: cur, r };
        return undefined;
      }
      refused = undefined;
      return { ...(cur.status ?? {}), consumed: rfc3339(now) };
    },
    { attempts: 20, log: d.log },
  );
  if (refused) {
    const { a: ra, r } = refused;
    await d.ledger.append(t.uid, 'approval.refused', {
      approval: name,
      approver: ra.status?.approver,
      command: req.argv,
      why: r.why,
    });
    throw r.code === 428 ? approvalRequired(ra) : refusal(r.code, r.why, name);
  }
  const ledgered = d.ledger.append(t.uid, 'approval.consumed', {
    approval: name,
    approver: a.status?.approver,
    command: req.argv,
  });
  ledgered.catch(() => undefined); // awaited (and its failure reported) by the caller
  return { approver: a.status?.approver, ledgered };
}

function decisionOf(body: Record<string, unknown>): {
  decision: 'Approved' | 'Denied';
  reason?: string;
  message?: string;
} {
  // An untrusted body; any JSON value may be anywhere (a missing or odd one reads as undefined).
  const conds = (body.status as { conditions?: unknown } | null | undefined)?.conditions;
  const field = 'status.conditions';
  if (!Array.isArray(conds))
    throw errors.invalid('Approval', GROUP, '', [
      {
        reason: 'FieldValueRequired',
        field,
        message: 'Required value: one condition of type Approved or Denied with status True',
      },
    ]);
  type Decided = { type: 'Approved' | 'Denied'; status: 'True'; reason?: unknown; message?: unknown };
  const picked = (conds as Array<Record<string, unknown> | null>).filter(
    (c): c is Decided =>
      !!c && typeof c === 'object' && (c.type === 'Approved' || c.type === 'Denied') && c.status === 'True',
  );
  if (picked.length !== 1) {
    throw errors.invalid('Approval', GROUP, '', [
      {
        reason: 'FieldValueInvalid',
        field,
        message: `Invalid value: exactly one condition of type Approved or Denied with status True is required, got ${picked.length}`,
      },
    ]);
  }
  const c = picked[0];
  if (
    c.reason !== undefined &&
    (typeof c.reason !== 'string' ||
      !/^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$/.test(c.reason) ||
      c.reason.length > 1024)
  ) {
    throw errors.invalid('Approval', GROUP, '', [
      { reason: 'FieldValueInvalid', field: `${field}[0].reason`, message: 'Invalid value: a CamelCase identifier' },
    ]);
  }
  if (c.message !== undefined && (typeof c.message !== 'string' || c.message.length > 4096)) {
    throw errors.invalid('Approval', GROUP, '', [
      {
        reason: 'FieldValueInvalid',
        field: `${field}[0].message`,
        message: 'Invalid value: a string of at most 4096 characters',
      },
    ]);
  }
  // Checked above: each is a string or absent.
  return { decision: c.type, reason: c.reason as string | undefined, message: c.message as string | undefined };
}

/**
 * approvals/<name>/approval, as certificatesigningrequests/approval: GET the Approval; PUT (the
 * object) or PATCH (a merge patch) with one status condition Approved or Denied (status True,
 * optional reason and message) decides it, once. The approver is the requesting user. 404 in
 * another namespace or when the body's spec.sessionRef names another session; 409 decided
 * twice, expired, or its session gone; 403 for a session-token user; 422 for a body without
 * exactly one decision. Ledgered approval.approved / approval.denied on the session.
 */
export function approvalDecisionHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get', 'update', 'patch'],
    responseKind: { group: GROUP, version: 'v1alpha1', kind: 'Approval' },
    async handle(r) {
      if (!r.namespace) throw errors.notFound('approvals', GROUP, r.name);
      if (r.method === 'GET') return d.client.get(approvalsGVR, r.namespace, r.name);
      if (r.method !== 'PUT' && r.method !== 'PATCH')
        throw errors.methodNotAllowed(`approval takes GET, PUT or PATCH, not ${r.method}`);
      const ct = String(r.headers['content-type'] ?? '');
      if (r.method === 'PATCH' && /json-patch|apply-patch/.test(ct))
        throw errors.unsupportedMediaType(
          `approval takes a merge patch (application/merge-patch+json) of status.conditions, not ${ct}`,
        );
      const user = r.ctx.user?.name ?? 'system:admin';
      if (user.startsWith(SESSION_USER_PREFIX))
        throw errors.forbidden(
          `approvals.fluxvm.dev "${r.name}" is forbidden: User "${user}" is a session user; a session can never decide an approval`,
        );
      const body = jsonBody(r);
      const want = decisionOf(body);
      return d.state.locked(approvalLock(r.namespace, r.name), () => decide(d, r.namespace!, r.name, body, want, user));
    },
  };
}

/** One decision of Approval ns/name by `user`, under its lock (see approvalDecisionHandler). */
async function decide(
  d: AgentSessionSubresourceDeps,
  ns: string,
  name: string,
  body: Record<string, unknown>,
  want: ReturnType<typeof decisionOf>,
  user: string,
): Promise<KubeObject> {
  const a = await d.client.get<Approval>(approvalsGVR, ns, name);
  const asked = (body.spec as { sessionRef?: { name?: unknown } } | null | undefined)?.sessionRef?.name;
  if (asked !== undefined && asked !== a.spec.sessionRef.name) throw errors.notFound('approvals', GROUP, name);
  const s = await d.client.get<AgentSession>(agentSessionsGVR, ns, a.spec.sessionRef.name).catch(() => undefined);
  if (!s || s.metadata.uid !== a.spec.sessionUID)
    throw errors.conflict('approvals', GROUP, name, 'its session is gone');
  const now = clockOf(d).now();
  // On a conflict the Approval is re-read and decidedStatus runs again: a concurrent decision
  // then makes it throw 409 (decided twice).
  const out = await writeStatus(
    d.client,
    approvalsGVR,
    a,
    (cur) => decidedStatus(cur, want.decision, user, want.message, want.reason, now),
    { attempts: 20, log: d.log },
  );
  await d.ledger.append(a.spec.sessionUID!, want.decision === 'Approved' ? 'approval.approved' : 'approval.denied', {
    approval: name,
    approver: user,
    command: a.spec.command,
    ...(want.message ? { note: want.message } : {}),
  });
  return out;
}
