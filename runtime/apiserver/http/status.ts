// The HTTP layer's errors: any thrown value as a metav1.Status error, sent as kube sends it.
import type { FastifyReply, FastifyRequest } from 'fastify';
import { errors, isStatusError, REASON_BY_CODE, StatusError } from '../../meta/errors.js';
import type { Status } from '../../meta/types.js';

export interface Logger {
  error(msg: string, fields?: Record<string, unknown>): void;
  warn?(msg: string, fields?: Record<string, unknown>): void;
  info?(msg: string, fields?: Record<string, unknown>): void;
}

export const DEFAULT_BODY_LIMIT = 3 * 1024 * 1024;

function statusBody(err: StatusError): Status {
  return err.status;
}

export function sendError(reply: FastifyReply, err: StatusError): FastifyReply {
  return reply
    .code(err.code)
    .header('content-type', 'application/json')
    .header('cache-control', 'no-cache, private')
    .send(Buffer.from(JSON.stringify(statusBody(err))));
}

/**
 * Maps any thrown value to a Status error: StatusErrors as they are, fastify's client errors
 * (body too large, bad content length, ...) to their 4xx, and anything else to a logged 500.
 */
export function toStatusError(err: unknown, req: FastifyRequest | undefined, log: Logger): StatusError {
  if (isStatusError(err)) return err;
  const e = err as { statusCode?: number; code?: string; message?: string };
  if (e?.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    return errors.tooLarge(`Request entity too large: limit is ${req?.routeOptions?.bodyLimit ?? DEFAULT_BODY_LIMIT}`);
  }
  if (typeof e?.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    return new StatusError(e.statusCode, REASON_BY_CODE[e.statusCode] ?? 'BadRequest', e.message ?? 'bad request');
  }
  log.error('internal error serving request', {
    method: req?.method,
    url: req?.url,
    err: String((err as Error)?.stack ?? err),
  });
  return errors.internal(
    `an error on the server ("${(err as Error)?.message ?? String(err)}") has prevented the request from succeeding`,
  );
}
