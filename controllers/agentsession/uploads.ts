// agentsessions/NAME/uploads and agentsessions/NAME/files/range (spec "Large files:
// resumable upload and ranged download"): the sandbox handlers (controllers/sandbox/uploads.ts)
// on the session's own Sandbox, after the session's checks (404 unknown, 409 not Running), with
// the staging below the session's state directory (`<dir>/<session uid>/uploads/`, removed by
// the finalizer with the rest of it). A readonly workspace refuses uploads under it (403) as the
// files routes do. Session-token ops: uploads get = files.read, create/update/delete =
// files.write (tokens.ts); files/range is authorized as files get = files.read.
// Ledger (path and size, never content): upload.open {upload, path, size, checksum: bool},
// file.upload {upload, path, size, sha256, verified} once per upload (a repeated complete adds
// nothing), upload.abort {upload, path, received}.
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { sandboxesGVR } from '../common/kinds.js';
import { UploadStore, type UploadStoreOptions } from '../common/uploads.js';
import { rangeHandler, uploadsHandler, type UploadTarget } from '../sandbox/uploads.js';
import { resolveSession, type AgentSessionSubresourceDeps } from './common.js';

/** The session's uploads and files/range handlers (not yet wrapped into Status errors). */
export function sessionLargeFileSubresources(
  d: AgentSessionSubresourceDeps,
  opts: UploadStoreOptions = {},
): Array<{ plural: string; name: string; handler: SubresourceHandler }> {
  const uploads = new UploadStore(d.state.dir, opts);
  const resolve = async (r: SubresourceRequest): Promise<UploadTarget> => {
    const t = await resolveSession(d, r);
    const sbx = await d.client.get<Sandbox>(sandboxesGVR, r.namespace!, r.name);
    return { owner: t.uid, id: t.sandboxId, sbx, kind: 'AgentSession' };
  };
  const handler = uploadsHandler(
    { runtime: d.runtime, uploads },
    {
      resolve,
      opened: async (t, u) =>
        void (await d.ledger.append(t.owner, 'upload.open', {
          upload: u.id,
          path: u.path,
          size: u.size,
          checksum: u.sha256 !== undefined,
        })),
      completed: async (t, u, first) => {
        if (first)
          await d.ledger.append(t.owner, 'file.upload', {
            upload: u.id,
            path: u.path,
            size: u.size,
            sha256: u.writtenSha256,
            verified: u.sha256 !== undefined,
          });
      },
      aborted: async (t, u) =>
        void (await d.ledger.append(t.owner, 'upload.abort', { upload: u.id, path: u.path, received: u.received })),
    },
  );
  return [
    { plural: 'agentsessions', name: 'uploads', handler },
    { plural: 'agentsessions', name: 'files/range', handler: rangeHandler(d, resolve) },
  ];
}
