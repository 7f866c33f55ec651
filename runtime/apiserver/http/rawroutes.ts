// Raw routes (ApiServer.registerRawRoute): HTTP paths outside the API (console, /mcp, well-known keys)
// that take their requests before fastify sees them.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

export interface RawRoute {
  request(req: IncomingMessage, res: ServerResponse): void;
  /** An HTTP Upgrade on the prefix; absent: 400 like any path that does not upgrade. */
  upgrade?(req: IncomingMessage, socket: Duplex, head: Buffer): void;
}

/** `url` with the path segment after a raw route's prefix replaced (it may be a credential). Pure. */
export function redactRawPath(url: string, prefixes: Iterable<string>): string {
  const path = url.split('?')[0];
  for (const p of prefixes) if (path.startsWith(p)) return `${p}<redacted>`;
  return path;
}
