// The one catalogue of API errors. Every error the API server returns is a StatusError whose
// body is a metav1.Status with a stable reason; clients rebuild the same class from a body,
// so a controller can test `isNotFound(err)` whether it talks in-process or over HTTP.
import type { Status, StatusCause, StatusDetails } from './types.js';

export type Reason =
  | 'BadRequest'
  | 'Unauthorized'
  | 'Forbidden'
  | 'NotFound'
  | 'AlreadyExists'
  | 'Conflict'
  | 'Gone'
  | 'Invalid'
  | 'Expired'
  | 'MethodNotAllowed'
  | 'NotAcceptable'
  | 'RequestEntityTooLarge'
  | 'UnsupportedMediaType'
  | 'TooManyRequests'
  | 'InternalError'
  | 'ServiceUnavailable'
  | 'Timeout'
  | 'NotImplemented'
  | 'InsufficientStorage';

/**
 * The reason of an HTTP error code that carries no Status body of its own (a fastify client
 * error on the server, a proxy's bare answer on the client). One table for both sides.
 */
export const REASON_BY_CODE: Readonly<Record<number, Reason>> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  406: 'NotAcceptable',
  408: 'Timeout',
  409: 'Conflict',
  410: 'Expired',
  413: 'RequestEntityTooLarge',
  415: 'UnsupportedMediaType',
  422: 'Invalid',
  429: 'TooManyRequests',
  500: 'InternalError',
  501: 'NotImplemented',
  503: 'ServiceUnavailable',
  504: 'Timeout',
  507: 'InsufficientStorage',
};

export class StatusError extends Error {
  readonly status: Status;
  constructor(code: number, reason: Reason | string, message: string, details?: StatusDetails) {
    super(message);
    this.name = 'StatusError';
    this.status = {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message,
      reason,
      ...(details ? { details } : {}),
      code,
    };
  }
  get code(): number {
    return this.status.code;
  }
  get reason(): string {
    return this.status.reason ?? '';
  }
  /** Rebuilds an error from a Status body received over the wire. */
  static fromStatus(s: Partial<Status>, fallbackCode = 500): StatusError {
    return new StatusError(
      s.code ?? fallbackCode,
      s.reason ?? 'InternalError',
      s.message ?? 'unknown error',
      s.details,
    );
  }
}

/** `sandboxes.fluxvm.dev` or `namespaces` for the core group. */
export function qualifiedResource(resource: string, group: string): string {
  return group ? `${resource}.${group}` : resource;
}

export const errors = {
  badRequest: (message: string, causes?: StatusCause[]) =>
    new StatusError(400, 'BadRequest', message, causes ? { causes } : undefined),
  notFound: (resource: string, group: string, name: string) =>
    new StatusError(404, 'NotFound', `${qualifiedResource(resource, group)} "${name}" not found`, {
      name,
      group,
      kind: resource,
    }),
  alreadyExists: (resource: string, group: string, name: string) =>
    new StatusError(409, 'AlreadyExists', `${qualifiedResource(resource, group)} "${name}" already exists`, {
      name,
      group,
      kind: resource,
    }),
  conflict: (resource: string, group: string, name: string, why?: string) =>
    new StatusError(
      409,
      'Conflict',
      `Operation cannot be fulfilled on ${qualifiedResource(resource, group)} "${name}": ${
        why ?? 'the object has been modified; please apply your changes to the latest version and try again'
      }`,
      { name, group, kind: resource },
    ),
  /** 422 with one cause per bad field. `kind` is the Kind (e.g. Sandbox), not the resource. */
  invalid: (kind: string, group: string, name: string, causes: StatusCause[]) => {
    const what = causes.map((c) => (c.field ? `${c.field}: ${c.message}` : c.message)).join(', ');
    const qkind = group ? `${kind}.${group}` : kind;
    return new StatusError(422, 'Invalid', `${qkind} "${name}" is invalid: ${what}`, { name, group, kind, causes });
  },
  forbidden: (message: string) => new StatusError(403, 'Forbidden', message),
  gone: (message: string) => new StatusError(410, 'Expired', message),
  expired: (message: string) => new StatusError(410, 'Expired', message),
  methodNotAllowed: (message: string) => new StatusError(405, 'MethodNotAllowed', message),
  notAcceptable: (message: string) => new StatusError(406, 'NotAcceptable', message),
  tooLarge: (message: string) => new StatusError(413, 'RequestEntityTooLarge', message),
  unsupportedMediaType: (message: string) => new StatusError(415, 'UnsupportedMediaType', message),
  tooManyRequests: (message: string, retryAfterSeconds = 1) =>
    new StatusError(429, 'TooManyRequests', message, { retryAfterSeconds }),
  internal: (message: string) => new StatusError(500, 'InternalError', message),
  unavailable: (message: string) => new StatusError(503, 'ServiceUnavailable', message),
  /** The store's disk is full (etcd's NOSPACE alarm): writes that grow it are refused. */
  insufficientStorage: (message: string) => new StatusError(507, 'InsufficientStorage', message),
  notImplemented: (message: string) => new StatusError(501, 'NotImplemented', message),
};

export function isStatusError(e: unknown): e is StatusError {
  return e instanceof StatusError;
}
export const isNotFound = (e: unknown) => isStatusError(e) && e.code === 404;
export const isAlreadyExists = (e: unknown) => isStatusError(e) && e.reason === 'AlreadyExists';
export const isConflict = (e: unknown) => isStatusError(e) && e.code === 409 && e.reason === 'Conflict';
export const isGone = (e: unknown) => isStatusError(e) && e.code === 410;
export const isInvalid = (e: unknown) => isStatusError(e) && e.code === 422;
