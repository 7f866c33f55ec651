// sandboxes/files: the sandbox's workspace files.
//
//   GET    ?path=P            a directory: {kind: "FileList", path, items: [FileEntry]} (JSON);
//                             a file: its raw bytes (application/octet-stream)
//   GET    ?path=P&stat=true  the FileEntry of P (JSON, symlinks not followed)
//   PUT    ?path=P[&mode=0644] body = the file's bytes; parents created (0755); the mode is
//                             kept on overwrite unless given; answers the new FileEntry
//   DELETE ?path=P[&recursive=true]  refuses '/', one-component paths and the workspace root
//
// Path rules (400 BadRequest): absolute, no '..' component, no NUL / newline / other control
// character, below the workspace. A symlink is never followed out of the workspace (the
// runtime resolves every component inside it): such a request is 400 and writes nothing.
import type { FileEntry } from '../../native/runtime.js';
import { validateSandboxPath } from '../../native/workspace/paths.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { errors } from '../../runtime/meta/errors.js';
import { boolParam, queryParam, resolveSandbox, type SubresourceDeps } from './request.js';

/** The path query parameter, checked against the path rules (400 naming the problem). */
export function pathParam(r: SubresourceRequest): string {
  const p = queryParam(r, 'path');
  if (p === undefined || p === '') throw errors.badRequest('the path query parameter is required');
  validateSandboxPath(p);
  return p;
}

/** An octal mode string (644, 0644, 0755, 4755) as a number; 400 otherwise. */
export function modeParam(v: string | undefined): number | undefined {
  if (v === undefined || v === '') return undefined;
  if (!/^0?[0-7]{3,4}$/.test(v)) throw errors.badRequest(`mode must be octal permission bits such as 0644, got ${JSON.stringify(v)}`);
  return parseInt(v, 8);
}

export function filesHandler(d: SubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get', 'create', 'update', 'delete'],
    async handle(r: SubresourceRequest) {
      const path = pathParam(r);
      const { id } = await resolveSandbox(d, r);
      switch (r.method) {
        case 'GET': {
          const st = await d.runtime.stat(id, path);
          if (boolParam(r, 'stat')) return st;
          // A symlink is read through (inside the workspace only): stat says what it is.
          const kind = st.type === 'symlink' ? (await d.runtime.listFiles(id, path).then(() => 'dir').catch(() => 'file')) : st.type;
          if (kind === 'dir') return { kind: 'FileList', path: st.path, items: (await d.runtime.listFiles(id, path)) satisfies FileEntry[] };
          const data = await d.runtime.readFile(id, path, { maxBytes: d.maxReadBytes ?? 64 * 1024 * 1024 });
          r.reply.hijack();
          r.reply.raw.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': data.length });
          r.reply.raw.end(data);
          return undefined;
        }
        case 'PUT': {
          let mode = modeParam(queryParam(r, 'mode'));
          if (mode === undefined) {
            // Overwrite keeps the file's mode, as a shell redirection would.
            const old = await d.runtime.stat(id, path).catch(() => undefined);
            if (old?.type === 'file') mode = old.mode;
          }
          await d.runtime.writeFile(id, path, r.body ?? Buffer.alloc(0), { mkdirs: true, ...(mode !== undefined ? { mode } : {}) });
          return d.runtime.stat(id, path);
        }
        case 'DELETE':
          await d.runtime.deleteFile(id, path, { recursive: boolParam(r, 'recursive') });
          return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', code: 200, message: `deleted ${path}` };
        default:
          throw errors.methodNotAllowed(`files takes GET, PUT or DELETE, not ${r.method}`);
      }
    },
  };
}
