// The one place a native RuntimeError becomes a metav1.Status error (StatusError), for every
// subresource handler of every kind. Anything that is not a RuntimeError or a StatusError is
// an internal error (500) whose message is kept (the API is for the sandbox's owner).
import { RuntimeError, type RuntimeErrorCode } from '../../native/runtime.js';
import { errors, isStatusError, StatusError } from '../../runtime/meta/errors.js';

export interface ErrorTarget {
  /** Plural resource, e.g. sandboxes. */
  resource: string;
  group: string;
  name: string;
}

const codeStatus: Record<RuntimeErrorCode, (m: string, t: ErrorTarget) => StatusError> = {
  NotFound: (m) => new StatusError(404, 'NotFound', m),
  InvalidPath: (m) => errors.badRequest(m),
  InvalidArgument: (m) => errors.badRequest(m),
  LimitExceeded: (m) => errors.badRequest(m),
  NotADirectory: (m) => errors.badRequest(m),
  IsADirectory: (m) => errors.badRequest(m),
  Unsupported: (m) => errors.notImplemented(m),
  Busy: (m, t) => errors.conflict(t.resource, t.group, t.name, m),
  Conflict: (m, t) => errors.conflict(t.resource, t.group, t.name, m),
  Internal: (m) => errors.internal(m),
};

/**
 * Maps any error of a subresource call to a StatusError: StatusErrors pass through,
 * RuntimeErrors by code (NotFound 404; InvalidPath, InvalidArgument, LimitExceeded,
 * NotADirectory, IsADirectory 400; Busy and Conflict 409 Conflict; Unsupported 501;
 * Internal 500), anything else 500. Pure.
 */
export function toStatusError(e: unknown, target: ErrorTarget): StatusError {
  if (isStatusError(e)) return e;
  if (e instanceof RuntimeError) return (codeStatus[e.code] ?? codeStatus.Internal)(e.message, target);
  return errors.internal(e instanceof Error ? e.message : String(e));
}

/** True for RuntimeErrors a retry cannot fix (bad input, unsupported by the backend). */
export function isPermanentRuntimeError(e: unknown): e is RuntimeError {
  return (
    e instanceof RuntimeError &&
    (e.code === 'InvalidArgument' || e.code === 'InvalidPath' || e.code === 'Unsupported' || e.code === 'LimitExceeded')
  );
}
