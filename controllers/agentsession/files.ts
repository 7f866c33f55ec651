// agentsessions/<name>/files: the session's workspace files. The Sandbox files API
// (controllers/sandbox/files.ts: GET list/read/stat, PUT, DELETE, the same path rules and
// answers) on the session's own Sandbox, after the session's checks (404 unknown, 409 not
// Running). A readonly workspace (workspace.mode readonly -> the Sandbox's
// spec.confinement.workspaceReadOnly) refuses PUT and DELETE under it with 403, except below
// policy.filesystem.write paths. A write or delete that succeeded is ledgered (file.write with
// path and size, file.delete with path; never the content) before the answer.
import { filesHandler, pathParam } from '../sandbox/files.js';
import type { SubresourceDeps } from '../sandbox/request.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { resolveSession, type AgentSessionSubresourceDeps } from './common.js';
import { rewindBeforeStep } from './rewind-point.js';

export function sessionFilesHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  // The Sandbox handler needs only the client and the runtime (no Sandbox controller state).
  const inner = filesHandler({ client: d.client, runtime: d.runtime } as SubresourceDeps);
  return {
    verbs: inner.verbs,
    async handle(r: SubresourceRequest) {
      const path = pathParam(r);
      const t = await resolveSession(d, r);
      // The session's Sandbox has the session's name (desired.ts); resolveSession checked it runs.
      // rewind-point.ts: the automatic point before a write or delete (trigger fileWrite).
      const write = r.method === 'PUT' || r.method === 'DELETE';
      const point = write
        ? await rewindBeforeStep(d, t, 'fileWrite', `${r.method === 'PUT' ? 'write' : 'delete'} ${path}`)
        : undefined;
      const answer = await inner.handle!(r);
      const rp = point ? { rewindPoint: point.tag } : {};
      if (point) await point.ready(); // on disk before the entry naming it (rewind-point.ts)
      let e;
      if (r.method === 'PUT')
        e = await d.ledger.append(t.uid, 'file.write', { path, bytes: r.body?.length ?? 0, ...rp });
      else if (r.method === 'DELETE') e = await d.ledger.append(t.uid, 'file.delete', { path, ...rp });
      if (point && e) await point.done(e.entry);
      return answer;
    },
  };
}
