// agentsessions/<name>/files/watch?path=&recursive= (E2B-shaped SDKs' files.watch):
// created / modified / deleted / renamed events below a directory of the session's sandbox, as
// Server-Sent Events (controllers/common/sse.ts: the host's 16 streams, paced by the client).
// The watcher runs inside the sandbox (Runtime.watchFiles: procbox's watch.c under the sandbox's
// own confinement; on vm the same watch.c in the guest) and the window, cursor, coalescing and limits are
// controllers/common/filewatch.ts.
// Session-token op files.read (tokens.ts: GET on `files`). Last-Event-ID (or ?cursor=) resumes.
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import { boolParam, queryParam } from '../sandbox/request.js';
import { FileWatches, watchPath, watchResponse } from '../common/filewatch.js';
import { lastEventId } from '../common/sse.js';
import { resolveSession, type AgentSessionSubresourceDeps } from './common.js';

/** The `files/watch` handler over `watches` (one registry per server). */
export function fileWatchHandler(
  d: AgentSessionSubresourceDeps,
  watches = new FileWatches(d.runtime),
): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`files/watch is a stream: GET, not ${r.method}`);
      const path = watchPath(queryParam(r, 'path'));
      const recursive = boolParam(r, 'recursive', false);
      const cursor = lastEventId(r) ?? queryParam(r, 'cursor');
      const t = await resolveSession(d, r);
      return watchResponse(watches, t.sandboxId, path, recursive, cursor);
    },
  };
}

export { watchPath, watchResponse } from '../common/filewatch.js';
