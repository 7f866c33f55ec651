// The audit log's hooks on the API server: one record per request when its response is complete.
import type { FastifyInstance } from 'fastify';
import { levelOf, type AuditRecord } from '../auth/audit.js';
import { ANONYMOUS } from './auth.js';

/** `requestURI(url)`: the request's URL as the record shows it (raw routes' secrets redacted). */
export function installAuditHooks(
  app: FastifyInstance,
  audit: (rec: AuditRecord) => void,
  requestURI: (url: string | undefined) => string,
): void {
  // One record per request, when its response is complete ('close' also covers hijacked
  // watches and streams, and clients that went away).
  app.addHook('onRequest', async (req, reply) => {
    const received = Date.now();
    reply.raw.once('close', () => {
      const r = req.fluxResource;
      const full = levelOf(r) === 'RequestResponse';
      let requestObject: unknown;
      if (full && Buffer.isBuffer(req.body) && req.body.length) {
        try {
          requestObject = JSON.parse(req.body.toString('utf8'));
        } catch {
          requestObject = undefined;
        }
      }
      audit({
        user: req.fluxUser ?? ANONYMOUS,
        verb: r?.verb ?? req.method.toLowerCase(),
        requestURI: requestURI(req.raw.url),
        sourceIPs: [req.socket.remoteAddress ?? ''],
        userAgent: req.headers['user-agent'],
        resource: r,
        code: reply.raw.statusCode,
        received,
        completed: Date.now(),
        ...(requestObject !== undefined ? { requestObject } : {}),
        ...(full && req.fluxAuditResponse !== undefined ? { responseObject: req.fluxAuditResponse } : {}),
      });
    });
  });
  app.addHook('onSend', async (req, _reply, payload) => {
    if (levelOf(req.fluxResource) === 'RequestResponse' && (Buffer.isBuffer(payload) || typeof payload === 'string')) {
      try {
        req.fluxAuditResponse = JSON.parse(payload.toString());
      } catch {
        // not JSON: not recorded
      }
    }
    return payload;
  });
}
