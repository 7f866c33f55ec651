// sandboxes/<name>/files/watch?path=&recursive= (for plain Sandboxes): the same
// Server-Sent Events as agentsessions/<name>/files/watch (controllers/agentsession/watch.ts):
// created / modified / deleted / renamed events from the watcher inside the sandbox, a cursor
// (`<watch>.<seq>`, Last-Event-ID or ?cursor=) that resumes without loss inside the window, and an
// explicit `resync` past it. The registry (controllers/common/filewatch.ts FileWatches) is the one
// the composition root hands to every kind (ControllerDeps.fileWatches), so a Sandbox's and a
// session's watches share the host's watcher limit, and one (sandbox, path, recursive) is one watcher.
// Authorized as `get` on sandboxes/files/watch (kube-apiserver style); no ledger or policy.
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import type { FileWatches } from '../common/filewatch.js';
import { watchPath, watchResponse } from '../common/filewatch.js';
import { boolParam, queryParam, resolveSandbox, type SubresourceDeps } from './request.js';
import { lastEventId } from '../common/sse.js';

export function sandboxWatchHandler(d: SubresourceDeps, watches: FileWatches): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`files/watch is a stream: GET, not ${r.method}`);
      const path = watchPath(queryParam(r, 'path'));
      const recursive = boolParam(r, 'recursive', false);
      const cursor = lastEventId(r) ?? queryParam(r, 'cursor');
      const t = await resolveSandbox(d, r);
      return watchResponse(watches, t.id, path, recursive, cursor);
    },
  };
}
