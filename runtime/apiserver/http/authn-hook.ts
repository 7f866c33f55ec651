// Authentication and authorization of every request the API server routes (WebSocket upgrades are
// checked in upgrade.ts): the request's attributes first (the audit log records them for a 401 too),
// then who asks, then whether they may.
import type { FastifyInstance } from 'fastify';
import { ANONYMOUS, type Attributes, type Authenticator, type ResourceAttributes } from './auth.js';
import { parseBool, type Query } from './options.js';
import { parseApiPath } from './paths.js';
import { resourceVerb } from './resources.js';

export function installAuthHook(
  app: FastifyInstance,
  authenticate: Authenticator | undefined,
  authorizeAttrs: (attrs: Attributes) => Promise<void>,
): void {
  app.addHook('onRequest', async (req) => {
    // The request's attributes first (the audit log records them for a 401 too).
    const authorize = async (
      attrs: { resource: ResourceAttributes } | { nonResource: { verb: string; path: string } },
    ) => {
      const user = (authenticate && (await authenticate(req.raw))) || ANONYMOUS;
      req.fluxUser = user;
      await authorizeAttrs({ user, ...attrs } as Attributes);
    };
    const pathname = (req.raw.url ?? '/').split('?')[0];
    let parsed: ReturnType<typeof parseApiPath> | undefined;
    try {
      parsed = /^\/apis?(\/|$)/.test(pathname) ? parseApiPath(pathname) : undefined;
    } catch {
      parsed = undefined; // malformed paths are refused by the route itself
    }
    if (parsed && !('groupOnly' in parsed) && parsed.resource !== undefined) {
      const query = (req.query ?? {}) as Query;
      let isWatch = parsed.watchPrefix;
      try {
        isWatch ||= parseBool(query, 'watch') === true;
      } catch {
        // a bad value is refused by the handler with 400
      }
      const resource: ResourceAttributes = {
        verb: resourceVerb(req.method as 'GET', parsed, isWatch),
        ...(parsed.namespace !== undefined ? { namespace: parsed.namespace } : {}),
        group: parsed.group,
        version: parsed.version,
        resource: parsed.resource,
        ...(parsed.subresource !== undefined ? { subresource: parsed.subresource } : {}),
        ...(parsed.name !== undefined ? { name: parsed.name } : {}),
      };
      req.fluxResource = resource;
      await authorize({ resource });
    } else {
      await authorize({ nonResource: { verb: req.method.toLowerCase(), path: pathname } });
    }
  });
}
