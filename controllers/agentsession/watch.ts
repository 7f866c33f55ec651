// agentsessions/<name>/files/watch?path=&recursive= (issue 23.4; E2B-shaped SDKs' files.watch):
// created / modified / deleted / renamed events below a directory of the session's sandbox, as
// Server-Sent Events (controllers/common/sse.ts: the host's 16 streams, paced by the client).
// The watcher runs inside the sandbox (Runtime.watchFiles: procbox's watch.c under the sandbox's
// own confinement; on vm the same watch.c in the guest) and the window, cursor, coalescing and limits are
// controllers/common/filewatch.ts.
// Session-token op files.read (tokens.ts: GET on `files`). Last-Event-ID (or ?cursor=) resumes.
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import { boolParam, queryParam } from '../sandbox/request.js';
import { FileWatches, followWatch, type Watch } from '../common/filewatch.js';
import { hostStreams, lastEventId, sseResponse } from '../common/sse.js';
import { validateSandboxPath } from '../../native/workspace/paths.js';
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

/** `path` checked: required, absolute, normalized, no NUL/newline (400 naming path). */
export function watchPath(v: string | undefined): string {
  if (v === undefined || v === '')
    throw errors.badRequest('path is required (an absolute directory in the sandbox)', [
      { reason: 'FieldValueRequired', field: 'path', message: 'Required value' },
    ]);
  try {
    validateSandboxPath(v);
  } catch (e) {
    throw errors.badRequest(`path: ${e instanceof Error ? e.message : String(e)}`, [
      { reason: 'FieldValueInvalid', field: 'path', message: 'must be an absolute path without .., NUL or newline' },
    ]);
  }
  const norm = v.length > 1 ? v.replace(/\/+$/, '') : v;
  return norm;
}

/**
 * The SSE response of a watch: the slot is taken first (429 on the 17th stream), then the
 * watcher is opened (or the one the cursor names is followed), so a refused stream starts nothing.
 */
export async function watchResponse(
  watches: FileWatches,
  sandboxId: string,
  path: string,
  recursive: boolean,
  cursor: string | undefined,
) {
  let from: { seq: number } | { resync: string } | undefined;
  let w: Watch | undefined;
  if (cursor !== undefined) {
    const c = watches.byCursor(cursor);
    const key = `${sandboxId}\0${path}\0${recursive ? 1 : 0}`;
    if (c && c.watch.key === key && !c.watch.ended && c.seq < c.watch.next) {
      w = c.watch;
      from = { seq: c.seq };
    } else from = { resync: c ? 'CursorInvalid' : 'WatchGone' };
  }
  // The host's stream limit first (429 before a watcher starts); a 404/400 of the path is then
  // the request's status, not an event after a 200.
  if (hostStreams.active >= hostStreams.max) hostStreams.acquire();
  const opened = w ?? (await watches.open(sandboxId, path, recursive));
  return sseResponse((sink) => followWatch(opened, sink, from));
}
