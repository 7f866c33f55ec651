// The pure rules of approvals for held commands (approvals.ts holds the requests, waits and
// decisions that read and write the API): the request digest an approval is bound to, an
// Approval's state and expiry, the refusals of a retry, the decided status, the command line a
// reviewer reads (control and bidi characters made visible) and the request's approval fields.
// Table-tested in test/controllers/agentsession/approvals.test.ts.
import { createHash } from 'node:crypto';
import { approval as approvalKind, APPROVAL_TTL_SECONDS } from '../../apis/approval.js';
import type { AgentSession, Approval } from '../../apis/zz_generated.types.js';
import { rfc3339 } from '../../runtime/controller/conditions.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { gvrOf, type GVR, type KubeObject } from '../../runtime/meta/types.js';
import { GROUP } from './common.js';

export const approvalsGVR: GVR = gvrOf(approvalKind);
export const APPROVAL_TTL_MS = APPROVAL_TTL_SECONDS * 1000;
/** Undecided, unexpired Approvals one session may have; the next held command is 409. */
export const MAX_PENDING_APPROVALS = 100;
/** approvalWaitSeconds: at most this (121 is 422 naming the field). */
export const MAX_APPROVAL_WAIT_SECONDS = 120;
/** Finished approvals (used, denied, expired) are deleted this long after their expiry, when the session asks again. */
export const APPROVAL_RETENTION_MS = 3600_000;
/** Session-token users (controllers/agentsession/tokens.ts) never decide, whatever RBAC says. */
export const SESSION_USER_PREFIX = 'system:agentsession:';

/** The request an approval is for: what the digest covers. */
export interface HeldRequest {
  kind: 'exec' | 'job';
  argv: string[];
  timeoutSeconds: number;
  stdin?: string;
  env?: Record<string, string>;
  cwd?: string;
  transport: 'json' | 'stream';
}

export type ApprovalState = 'Pending' | 'Approved' | 'Denied' | 'Consumed' | 'Expired';

/** JSON with object keys sorted at every level, so equal values hash equally. Pure. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v ?? null);
}

/** The parameters of a request as the Approval's spec records them (stdin only as its digest). Pure. */
export function requestParams(req: HeldRequest) {
  return {
    timeoutSeconds: req.timeoutSeconds,
    ...(req.stdin !== undefined
      ? { stdinSHA256: createHash('sha256').update(req.stdin).digest('hex'), stdinBytes: Buffer.byteLength(req.stdin) }
      : {}),
    ...(req.env && Object.keys(req.env).length ? { env: req.env } : {}),
    ...(req.cwd !== undefined ? { cwd: req.cwd } : {}),
    transport: req.transport,
  };
}

/** The policy a digest covers: what the user asked for and what it compiled to. Pure. */
export function sessionPolicy(s: AgentSession): unknown {
  return { spec: s.spec.policy ?? {}, compiled: s.status?.compiledPolicy ?? {} };
}

/** SHA-256 (hex) over the session uid, kind, argv, parameters, policy and revision. Pure and deterministic. */
export function approvalDigest(sessionUID: string, req: HeldRequest, policy: unknown, revision: number): string {
  const doc = {
    v: 1,
    session: sessionUID,
    kind: req.kind,
    command: req.argv,
    params: requestParams(req),
    policy,
    revision,
  };
  return createHash('sha256').update(canonicalJson(doc)).digest('hex');
}

/** When `a` expires (ms): status.expiresAt, else requestedAt + 10 minutes. Pure. */
export function approvalExpiry(a: Approval): number {
  const e = Date.parse(a.status?.expiresAt ?? '');
  if (Number.isFinite(e)) return e;
  const r = Date.parse(a.spec.requestedAt ?? a.metadata?.creationTimestamp ?? '');
  return (Number.isFinite(r) ? r : 0) + APPROVAL_TTL_MS;
}

/**
 * Where `a` stands at `now`: a denial is final; a used one is Consumed; otherwise past its expiry it is Expired. Pure.
 */
export function approvalState(a: Approval, now: number): ApprovalState {
  if (a.status?.consumed) return 'Consumed';
  const d = a.status?.decision;
  if (d === 'Denied') return 'Denied';
  if (now >= approvalExpiry(a)) return 'Expired';
  return d === 'Approved' ? 'Approved' : 'Pending';
}

/** What the retry of a request is, to compare with the Approval's spec. */
export interface RetryFacts {
  sessionUID: string;
  digest: string;
  request: HeldRequest;
  revision: number;
}

/**
 * Why `a` may not run the request described by `f` at `now` (undefined: it may): 404 for
 * another session's approval, 428 while it is pending, 403 for denied, used, expired or a
 * digest that differs (naming what differs). Pure.
 */
export function useRefusal(
  a: Approval,
  f: RetryFacts,
  now: number,
): { code: 403 | 404 | 428; why: string } | undefined {
  const name = a.metadata?.name;
  if (a.spec.sessionUID !== f.sessionUID)
    return { code: 404, why: `approvals.fluxvm.dev "${name}" not found for this session` };
  const st = approvalState(a, now);
  const by = a.status?.approver ? ` by ${a.status.approver}` : '';
  if (st === 'Denied')
    return {
      code: 403,
      why: `Approval ${name} was denied${by}${a.status?.conditions?.find((c) => c.type === 'Denied')?.message ? `: ${a.status!.conditions!.find((c) => c.type === 'Denied')!.message}` : ''}`,
    };
  if (st === 'Consumed')
    return {
      code: 403,
      why: `Approval ${name} was already used at ${a.status!.consumed}; an approval runs one request once`,
    };
  if (st === 'Expired') return { code: 403, why: `Approval ${name} expired at ${rfc3339(approvalExpiry(a))}` };
  if (st === 'Pending') return { code: 428, why: `Approval ${name} is not decided yet` };
  if (a.spec.digest === f.digest) return undefined;
  let what: string;
  if (canonicalJson(a.spec.command) !== canonicalJson(f.request.argv) || a.spec.kind !== f.request.kind)
    what = 'the command differs from the approved one';
  else if (canonicalJson(paramsOfSpec(a)) !== canonicalJson(requestParams(f.request)))
    what = 'a parameter (timeoutSeconds, stdin, env, cwd or transport) differs from the approved request';
  else if ((a.spec.sessionRevision ?? 0) !== f.revision)
    what = `the session was checkpointed, restored, forked or promoted since it was approved (revision ${a.spec.sessionRevision ?? 0} -> ${f.revision})`;
  else what = 'the session policy changed since it was requested';
  return { code: 403, why: `Approval ${name} does not match this request: ${what}` };
}

function paramsOfSpec(a: Approval) {
  const s = a.spec;
  return {
    timeoutSeconds: s.timeoutSeconds,
    ...(s.stdinSHA256 !== undefined ? { stdinSHA256: s.stdinSHA256, stdinBytes: s.stdinBytes } : {}),
    ...(s.env && Object.keys(s.env).length ? { env: s.env } : {}),
    ...(s.cwd !== undefined ? { cwd: s.cwd } : {}),
    transport: s.transport,
  };
}

/**
 * The status after `user` decides `a` (Approved or Denied, once): 409 when it is already
 * decided, used or expired. Pure.
 */
export function decidedStatus(
  a: Approval,
  decision: 'Approved' | 'Denied',
  user: string,
  note: string | undefined,
  reason: string | undefined,
  now: number,
): NonNullable<Approval['status']> {
  const st = approvalState(a, now);
  const name = a.metadata?.name ?? '';
  if (a.status?.decision) {
    throw errors.conflict(
      'approvals',
      GROUP,
      name,
      `it is already ${a.status.decision}${a.status.approver ? ` by ${a.status.approver}` : ''}; a decision is final`,
    );
  }
  if (st === 'Expired')
    throw errors.conflict(
      'approvals',
      GROUP,
      name,
      `it expired at ${rfc3339(approvalExpiry(a))}; the session must ask again`,
    );
  const t = rfc3339(now);
  return {
    ...(a.status ?? {}),
    conditions: [
      {
        type: decision,
        status: 'True',
        reason: reason ?? (decision === 'Approved' ? 'OperatorApproved' : 'OperatorDenied'),
        message: note ?? '',
        lastUpdateTime: t,
        lastTransitionTime: t,
      },
    ],
    decision,
    approver: user,
  };
}

// eslint-disable-next-line no-control-regex
const INVISIBLE = /[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** A word as a POSIX shell reads it back: as is when plain, else single-quoted. Pure. */
export function shellWord(w: string): string {
  return /^[-\w./:=@%+,]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`;
}

/**
 * The command as one reviewable line: `sh -c X` as X, other argv words shell-quoted when needed; invisible characters
 * as \uNNNN; at most 1024 characters. Pure.
 */
export function commandLine(argv: string[]): string {
  const line = argv[0] === 'sh' && argv[1] === '-c' && argv.length === 3 ? argv[2]! : argv.map(shellWord).join(' ');
  const shown = line.replace(INVISIBLE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return shown.length > 1024 ? `${shown.slice(0, 1023)}…` : shown;
}

/** 428 ApprovalRequired naming the Approval, the rule, its expiry and the command an operator runs. */
export function approvalRequired(a: Approval, why?: string): StatusError {
  const name = a.metadata!.name!;
  const session = a.spec.sessionRef.name;
  const ns = a.metadata!.namespace!;
  const expires = rfc3339(approvalExpiry(a));
  const m = a.spec.matched;
  return new StatusError(
    428,
    'ApprovalRequired',
    `${why ?? `exec held for approval: ${JSON.stringify(m?.piece ?? '')} matches policy.process.ask ${JSON.stringify(m?.rule ?? '')}`}; Approval ${name} is pending until ${expires} ` +
      `(an operator runs: fluxctl agent approve ${session} ${name} -n ${ns}); repeat the request with approvalName ${name}, or wait with approvalWaitSeconds`,
    {
      name,
      group: GROUP,
      kind: 'approvals',
      causes: [
        {
          reason: 'ApprovalRequired',
          field: 'spec.policy.process.ask',
          message: `${m?.piece ?? ''} matches ${m?.rule ?? ''}`,
        },
        { reason: 'ExpiresAt', field: 'status.expiresAt', message: expires },
      ],
    },
  );
}

export function refusal(code: 403 | 404, why: string, name: string): StatusError {
  if (code === 404) return new StatusError(404, 'NotFound', why, { name, group: GROUP, kind: 'approvals' });
  const e = errors.forbidden(`approval.refused: ${why}`);
  e.status.details = {
    name,
    group: GROUP,
    kind: 'approvals',
    causes: [{ reason: 'approval.refused', field: 'approvalName', message: why }],
  };
  return e;
}

/** approvalWaitSeconds of a body or query: 0..120 (ms), 422 naming the field otherwise. */
export function approvalWaitMs(v: unknown, session: string): number {
  if (v === undefined || v === null || v === '') return 0;
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > MAX_APPROVAL_WAIT_SECONDS) {
    throw errors.invalid('AgentSession', GROUP, session, [
      {
        reason: 'FieldValueInvalid',
        field: 'approvalWaitSeconds',
        message: `Invalid value: ${JSON.stringify(v)}: must be an integer between 0 and ${MAX_APPROVAL_WAIT_SECONDS}`,
      },
    ]);
  }
  return n * 1000;
}

/** approvalName of a body or query (a DNS subdomain) or undefined; 400 otherwise. */
export function approvalNameOf(v: unknown): string | undefined {
  if (v === undefined || v === null || v === '') return undefined;
  if (typeof v !== 'string' || v.length > 253 || !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(v))
    throw errors.badRequest('approvalName must be the name of an Approval', [
      { reason: 'FieldValueInvalid', field: 'approvalName', message: 'not a name' },
    ]);
  return v;
}
