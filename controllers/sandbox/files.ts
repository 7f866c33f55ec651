// sandboxes/files: the sandbox's workspace files.
//
//   GET    ?path=P            a directory: {kind: "FileList", path, items: [FileEntry]} (JSON);
//                             a file: its raw bytes (application/octet-stream)
//   GET    ?path=P&stat=true  the FileEntry of P (JSON, symlinks not followed)
//   GET    ?path=P&manifest=true  the sha256 Manifest of the regular files below the
//                             directory P ({mode, paths, files, modes, takenAt}; the manifest
//                             limits apply: 400 past them), what `fluxctl sandbox diff` compares
//   PUT    ?path=P[&mode=0644] body = the file's bytes; parents created (0755); the mode is
//                             kept on overwrite unless given; answers the new FileEntry
//   DELETE ?path=P[&recursive=true]  refuses '/', one-component paths and the workspace root
//
// Path rules (400 BadRequest): absolute, no '..' component, no NUL / newline / other control
// character, below the workspace. A symlink is never followed out of the workspace (the
// runtime resolves every component inside it): such a request is 400 and writes nothing.
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { FileEntry } from '../../native/runtime.js';
import { isUnder, normalizeSandboxPath, validateSandboxPath } from '../../native/workspace/paths.js';
import {
  respond,
  type SubresourceHandler,
  type SubresourceRequest,
} from '../../runtime/apiserver/http/subresources.js';
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
  if (!/^0?[0-7]{3,4}$/.test(v))
    throw errors.badRequest(`mode must be octal permission bits such as 0644, got ${JSON.stringify(v)}`);
  return parseInt(v, 8);
}

/**
 * 403 when the sandbox's workspace is read-only for its commands (spec.confinement.
 * workspaceReadOnly) and `path` (validated) is below the workspace and not below one of its
 * writePaths: the files and tar APIs do not write where the sandbox's own commands cannot.
 */
export function refuseReadOnlyWrite(sbx: Sandbox, path: string): void {
  const c = sbx.spec?.confinement;
  if (!c?.workspaceReadOnly) return;
  const p = normalizeSandboxPath(path);
  const ws = normalizeSandboxPath(sbx.spec?.workspace?.path ?? '/work');
  if (!isUnder(p, ws)) return;
  const writable = (c.writePaths ?? []).map((w) => normalizeSandboxPath(w.endsWith('/**') ? w.slice(0, -3) || '/' : w));
  if (writable.some((w) => isUnder(p, w))) return;
  throw errors.forbidden(
    `the workspace ${ws} of sandbox ${sbx.metadata.name} is read-only (spec.confinement.workspaceReadOnly): ${path} cannot be written`,
  );
}

export function filesHandler(d: SubresourceDeps): SubresourceHandler {
  return {
    verbs: ['get', 'create', 'update', 'delete'],
    async handle(r: SubresourceRequest) {
      const path = pathParam(r);
      const { sbx, id } = await resolveSandbox(d, r);
      if (r.method === 'PUT' || r.method === 'DELETE') refuseReadOnlyWrite(sbx, path);
      switch (r.method) {
        case 'GET': {
          if (boolParam(r, 'manifest')) return d.runtime.manifest(id, [path]);
          const st = await d.runtime.stat(id, path);
          if (boolParam(r, 'stat')) return st;
          // A symlink is read through (inside the workspace only): stat says what it is.
          const kind =
            st.type === 'symlink'
              ? await d.runtime
                  .listFiles(id, path)
                  .then(() => 'dir')
                  .catch(() => 'file')
              : st.type;
          if (kind === 'dir')
            return {
              kind: 'FileList',
              path: st.path,
              items: (await d.runtime.listFiles(id, path)) satisfies FileEntry[],
            };
          const data = await d.runtime.readFile(id, path, { maxBytes: d.maxReadBytes ?? 64 * 1024 * 1024 });
          return respond({
            headers: { 'Content-Type': 'application/octet-stream', 'Content-Length': String(data.length) },
            body: data,
          });
        }
        case 'PUT': {
          let mode = modeParam(queryParam(r, 'mode'));
          if (mode === undefined) {
            // Overwrite keeps the file's mode, as a shell redirection would.
            const old = await d.runtime.stat(id, path).catch(() => undefined);
            if (old?.type === 'file') mode = old.mode;
          }
          await d.runtime.writeFile(id, path, r.body ?? Buffer.alloc(0), {
            mkdirs: true,
            ...(mode !== undefined ? { mode } : {}),
          });
          return d.runtime.stat(id, path);
        }
        case 'DELETE':
          await d.runtime.deleteFile(id, path, { recursive: boolParam(r, 'recursive') });
          return {
            kind: 'Status',
            apiVersion: 'v1',
            metadata: {},
            status: 'Success',
            code: 200,
            message: `deleted ${path}`,
          };
        default:
          throw errors.methodNotAllowed(`files takes GET, PUT or DELETE, not ${r.method}`);
      }
    },
  };
}
