// Errors of @fluxvm/sdk: every refusal of the API is a metav1.Status; each is thrown as the class
// of its code (and reason), carrying the Status as the server sent it, so a caller can branch on
// `instanceof NotFoundError` or read `err.status.details`.

/** metav1.Status as the API server sends it. */
export interface Status {
  kind?: string;
  apiVersion?: string;
  metadata?: Record<string, unknown>;
  status?: string;
  message?: string;
  reason?: string;
  code: number;
  details?: {
    name?: string;
    group?: string;
    kind?: string;
    uid?: string;
    causes?: { reason?: string; message?: string; field?: string }[];
    retryAfterSeconds?: number;
    [field: string]: unknown;
  };
}

/** Any refusal of the API: `status` is the metav1.Status, `code` its HTTP code. */
export class FluxError extends Error {
  readonly status: Status;
  constructor(status: Status) {
    super(status.message || status.reason || `HTTP ${status.code}`);
    this.name = new.target.name;
    this.status = status;
  }
  get code(): number {
    return this.status.code;
  }
  get reason(): string | undefined {
    return this.status.reason;
  }
}

/** 400 BadRequest. */
export class BadRequestError extends FluxError {}
/** 401 Unauthorized: no or a wrong credential. */
export class UnauthorizedError extends FluxError {}
/** 403 Forbidden: RBAC, a session token's ops, a policy refusal. */
export class ForbiddenError extends FluxError {}
/** 404 NotFound. */
export class NotFoundError extends FluxError {}
/** 409 Conflict (a stale resourceVersion, an operation in flight, a changeset conflict). */
export class ConflictError extends FluxError {}
/** 409 AlreadyExists: a create of a name that exists. */
export class AlreadyExistsError extends ConflictError {}
/** 410 Gone / Expired (a compacted watch, an ended session). */
export class GoneError extends FluxError {}
/** 412 PreconditionFailed (a file changed under a ranged download). */
export class PreconditionFailedError extends FluxError {}
/** 422 Invalid: the field is in `status.details.causes`. */
export class InvalidError extends FluxError {}
/**
 * 428: the command is held for an operator's approval; `approvalName` names the Approval to
 * retry with once it is approved (AgentSession.exec's `approvalName`).
 */
export class ApprovalRequiredError extends FluxError {
  get approvalName(): string | undefined {
    return this.status.details?.name;
  }
}
/** 429 TooManyRequests (a budget, the host's stream limit). */
export class TooManyRequestsError extends FluxError {}
/** 5xx. */
export class ServerError extends FluxError {}

/** The typed error of a Status. */
export function errorOf(s: Status): FluxError {
  switch (s.code) {
    case 400:
      return new BadRequestError(s);
    case 401:
      return new UnauthorizedError(s);
    case 403:
      return new ForbiddenError(s);
    case 404:
      return new NotFoundError(s);
    case 409:
      return s.reason === 'AlreadyExists' ? new AlreadyExistsError(s) : new ConflictError(s);
    case 410:
      return new GoneError(s);
    case 412:
      return new PreconditionFailedError(s);
    case 422:
      return new InvalidError(s);
    case 428:
      return new ApprovalRequiredError(s);
    case 429:
      return new TooManyRequestsError(s);
    default:
      return s.code >= 500 ? new ServerError(s) : new FluxError(s);
  }
}

/** A Status from an answer's code and body: the body when it is one, else one made from the text. */
export function statusOf(code: number, body: Buffer): Status {
  try {
    const j = JSON.parse(body.toString('utf8')) as Partial<Status> | null;
    if (j && typeof j === 'object' && j.kind === 'Status')
      return { ...j, code: typeof j.code === 'number' ? j.code : code };
  } catch {
    // not JSON
  }
  return { kind: 'Status', status: 'Failure', code, message: body.toString('utf8').slice(0, 1024) || `HTTP ${code}` };
}

/** The error an aborted call rejects with: the signal's reason, or an AbortError. */
export function abortError(signal?: AbortSignal): Error {
  const r: unknown = signal?.reason;
  if (r instanceof Error) return r;
  const e = new Error('the operation was aborted');
  e.name = 'AbortError';
  return e;
}
