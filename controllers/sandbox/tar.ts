// sandboxes/tar: a directory (or a file) of the sandbox's workspace as a tar stream, both ways.
// `fluxctl cp` is its client.
//
//   GET      ?path=P   200 application/x-tar: ustar + pax, P named by its last component
//                      (a directory as NAME/ and everything below it; symlinks below it kept as
//                      symlinks, never followed; FIFOs, devices and sockets left out)
//   PUT|POST ?path=P   body application/x-tar (415 otherwise): extracted into the directory P
//                      (created, parents too, when missing); entries named relative to P
//                      ("./x", "x", "." for P itself). All or nothing: an entry named with
//                      '..' or an absolute path, a path through a symlink (one the archive
//                      made or one the sandbox has), a hard link, a device or FIFO is 400
//                      naming it, more than maxTarEntries entries 400, a full disk or quota
//                      507, and nothing is written. Answers {kind: "TarResult", path,
//                      entries, files, dirs, symlinks, bytes}. A refusal is answered at once,
//                      while the client may still be sending: the rest of the body is read
//                      and dropped (drain.ts, at most 64 MiB or 10 s, then the connection is
//                      cut and the reason logged).
//
// Both stream with backpressure end to end (HTTP body <-> helper pipe, fileops.ts tarOut /
// tarIn): the server holds a pipe's worth of an archive, whatever its size. Path rules as
// for files (400). The vm backend runs the guest's tar through the agent's streaming exec and
// re-checks every entry on the host both ways (native/vm/tar.ts). A backend without archives
// answers 501.
import { RuntimeError } from '../../native/runtime.js';
import {
  respond,
  type SubresourceHandler,
  type SubresourceRequest,
} from '../../runtime/apiserver/http/subresources.js';
import { drainRequest } from '../../runtime/apiserver/http/drain.js';
import { errors } from '../../runtime/meta/errors.js';
import { pathParam, refuseReadOnlyWrite } from './files.js';
import { resolveSandbox, type SubresourceDeps } from './request.js';

export const TAR_MEDIA_TYPE = 'application/x-tar';

function unsupported(backend: string): never {
  throw errors.notImplemented(
    `the ${backend} backend cannot stream archives: copy single files with \`fluxctl sandbox put\` / \`cat\``,
  );
}

export function tarHandler(d: SubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get', 'create', 'update'],
    async handle(r: SubresourceRequest) {
      const path = pathParam(r);
      try {
        const { sbx, id } = await resolveSandbox(d, r);
        const backend = sbx.spec?.runtime ?? d.runtime.capabilities().backend;
        if (r.method === 'GET') {
          if (!d.runtime.readTar) unsupported(backend);
          const tar = await d.runtime.readTar(id, path);
          // Piped with backpressure; a failure after the first byte can only cut the response (the client
          // sees a short archive), and a client that leaves destroys the archive stream.
          return respond({
            headers: { 'Content-Type': TAR_MEDIA_TYPE, 'Cache-Control': 'no-cache, private' },
            body: tar,
          });
        }
        if (r.method !== 'PUT' && r.method !== 'POST')
          throw errors.methodNotAllowed(`tar takes GET, PUT or POST, not ${r.method}`);
        refuseReadOnlyWrite(sbx, path);
        const ct = String(r.headers['content-type'] ?? '')
          .split(';')[0]!
          .trim()
          .toLowerCase();
        if (ct !== TAR_MEDIA_TYPE)
          throw errors.unsupportedMediaType(
            `tar takes a body of Content-Type ${TAR_MEDIA_TYPE}, not ${JSON.stringify(ct || 'none')}`,
          );
        if (!d.runtime.writeTar) unsupported(backend);
        const sum = await d.runtime.writeTar(id, path, r.req, { maxEntries: d.maxTarEntries });
        return { kind: 'TarResult', apiVersion: 'fluxvm.dev/v1alpha1', path, ...sum };
      } catch (e) {
        // The client may still be sending the archive: the answer goes out now, and what it still
        // sends is read and dropped meanwhile, so it reads the answer while it uploads (a refused
        // 1 GiB copy says why at once). Past the drain's bound (64 MiB or 10 s) the connection is
        // cut: the reason is logged, or no one would know it.
        if (r.method !== 'GET' && !r.req.readableEnded) {
          void drainRequest(r.req).then(() => {
            if (!r.req.readableEnded)
              d.log?.warn?.('tar upload failed; the rest of its body was not read and the connection was cut', {
                namespace: r.namespace,
                name: r.name,
                path,
                err: e instanceof Error ? e.message : String(e),
              });
          });
        }
        // A router whose backend for this sandbox cannot stream (vm) says Unsupported.
        if (e instanceof RuntimeError && e.code === 'Unsupported' && /cannot stream archives/.test(e.message))
          unsupported(/\bthe (\w+) backend/.exec(e.message)?.[1] ?? "sandbox's");
        throw e;
      }
    },
  };
}
