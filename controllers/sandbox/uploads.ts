// Large files: resumable uploads and ranged reads, for sandboxes (`sandboxes/NAME/
// uploads`, `sandboxes/NAME/files/range`) and, through the same handlers, for agentsessions
// (controllers/agentsession/uploads.ts adds the session's checks and ledger).
//
//   POST   uploads                 {path, size, sha256?, mode?, parents?} -> 201 Upload
//                                  (size 1 byte..2 GiB: 422 naming `size`; at most 8 open: 409;
//                                  staging bound or disk: 507)
//   GET    uploads                 {kind: UploadList, items}
//   GET    uploads/ID              the Upload: received (where the next chunk starts), state
//   PUT    uploads/ID?offset=N     raw bytes, at most 4 MiB (413 past it), streamed to the
//                                  staging file; N must be `received` (409 naming it, header
//                                  Upload-Offset); answered once its bytes and record are
//                                  written (made durable every 64 MiB: common/uploads.ts)
//   POST   uploads/ID/complete     {sha256?} (a client that hashed while sending names it here;
//                                  two different checksums, here and at open, are 422); size
//                                  and sha256 verified on the host (a mismatch: 409, nothing
//                                  written), then streamed into the
//                                  sandbox by Runtime.writeFileStream (temporary name next to
//                                  the destination, renamed into place); idempotent
//   DELETE uploads/ID              drops the upload and its staging
//   GET    files/range?path=&offset=&length=&checksum=  up to 4 MiB of a file: the bytes, and
//                                  headers X-File-Size, X-File-Mtime, ETag, X-File-Eof and with
//                                  checksum=true X-File-Sha256 (the whole file); If-Match with
//                                  an ETag that is no longer the file's: 412, no bytes
//
// Staging is on the host (controllers/common/uploads.ts): below the sandbox's state directory
// for sandboxes, the session's for sessions, removed with them. The PUT body is not read by the
// HTTP layer (its media type, application/offset+octet-stream, has no parser; any other is
// 415): it is streamed into the staging file, never more than 4 MiB accepted.
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { Runtime } from '../../native/runtime.js';
import { validateSandboxPath } from '../../native/workspace/paths.js';
import {
  respond,
  type SubresourceHandler,
  type SubresourceRequest,
} from '../../runtime/apiserver/http/subresources.js';
import { drainRequest } from '../../runtime/apiserver/http/drain.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { UPLOAD_LIMITS, type UploadRecord, type UploadSpec, type UploadStore } from '../common/uploads.js';
import { modeParam, pathParam, refuseReadOnlyWrite } from './files.js';
import { boolParam, jsonBody, queryParam, resolveSandbox, type SubresourceDeps } from './request.js';

/** The media type of a chunk's body (tus's): the HTTP layer streams it to the handler unread. */
export const CHUNK_MEDIA_TYPE = 'application/offset+octet-stream';

/** Largest ranged read. */
export const MAX_RANGE = 4 * 1024 * 1024;

/** Where a request's uploads live and what is told about them (the session adds its ledger). */
export interface UploadTarget {
  /** The staging owner: the sandbox's or session's uid. */
  owner: string;
  /** The runtime instance. */
  id: string;
  sbx: Sandbox;
  /** The kind named in 422s. */
  kind: 'Sandbox' | 'AgentSession';
}

export interface UploadHooks {
  resolve(r: SubresourceRequest): Promise<UploadTarget>;
  opened?(t: UploadTarget, rec: UploadRecord): Promise<void>;
  completed?(t: UploadTarget, rec: UploadRecord, first: boolean): Promise<void>;
  aborted?(t: UploadTarget, rec: UploadRecord): Promise<void>;
}

const SHA256_FORMAT = 'must be 64 lowercase hex digits';

/** Absent, or a sha256 in hex as the open and the complete take it. */
const isSha256 = (v: unknown): v is string | undefined =>
  v === undefined || (typeof v === 'string' && /^[0-9a-f]{64}$/.test(v));

/** The open request's body checked field by field: 422 naming each bad field. Pure. */
export function uploadSpec(body: Record<string, unknown>, kind: string, name: string): UploadSpec {
  const causes: { reason: string; field: string; message: string }[] = [];
  const bad = (field: string, message: string) =>
    causes.push({
      reason: 'FieldValueInvalid',
      field,
      message: `Invalid value: ${JSON.stringify(body[field])}: ${message}`,
    });
  const { path, size, sha256, mode, parents } = body;
  if (typeof path !== 'string' || path === '')
    causes.push({ reason: 'FieldValueRequired', field: 'path', message: 'Required value' });
  if (typeof size !== 'number' || !Number.isSafeInteger(size)) bad('size', 'must be an integer number of bytes');
  else if (size < 1) bad('size', 'must be at least 1 byte');
  else if (size > UPLOAD_LIMITS.maxSize) bad('size', `must be at most ${UPLOAD_LIMITS.maxSize} bytes (2 GiB)`);
  if (!isSha256(sha256)) bad('sha256', SHA256_FORMAT);
  let m: number | undefined;
  if (mode !== undefined) {
    if (typeof mode === 'number' && Number.isInteger(mode) && mode >= 0 && mode <= 0o7777) m = mode;
    else if (typeof mode === 'string') {
      try {
        m = modeParam(mode);
      } catch {
        bad('mode', 'must be octal permission bits such as "0644" or a number up to 4095');
      }
    } else bad('mode', 'must be octal permission bits such as "0644" or a number up to 4095');
  }
  if (parents !== undefined && typeof parents !== 'boolean') bad('parents', 'must be a boolean');
  if (causes.length) throw errors.invalid(kind, 'fluxvm.dev', name, causes);
  validateSandboxPath(path as string);
  return {
    path: path as string,
    size: size as number,
    ...(sha256 ? { sha256: sha256 as string } : {}),
    ...(m !== undefined ? { mode: m } : {}),
    ...(parents !== undefined ? { parents: parents as boolean } : {}),
  };
}

/**
 * The complete request's optional body `{sha256?}`: the file's checksum, for a client that
 * hashes while it sends (it could not name it at open). 422 naming `sha256` when malformed or
 * when another field is there. Pure.
 */
export function completeSha256(body: Record<string, unknown>, kind: string, name: string): string | undefined {
  const causes: { reason: string; field: string; message: string }[] = [];
  for (const k of Object.keys(body))
    if (k !== 'sha256') causes.push({ reason: 'FieldValueNotSupported', field: k, message: 'unknown field' });
  const v = body.sha256;
  if (!isSha256(v))
    causes.push({
      reason: 'FieldValueInvalid',
      field: 'sha256',
      message: `Invalid value: ${JSON.stringify(v)}: ${SHA256_FORMAT}`,
    });
  if (causes.length) throw errors.invalid(kind, 'fluxvm.dev', name, causes);
  return v as string | undefined;
}

/** A non-negative integer query parameter (`def` when absent); 400 naming it otherwise. */
function intParam(r: SubresourceRequest, name: string, def?: number): number {
  const v = queryParam(r, name);
  if (v === undefined || v === '') {
    if (def !== undefined) return def;
    throw errors.badRequest(`the ${name} query parameter is required`, [
      { reason: 'FieldValueRequired', field: name, message: 'Required value' },
    ]);
  }
  const n = /^\d{1,16}$/.test(v) ? Number(v) : NaN;
  if (!Number.isSafeInteger(n))
    throw errors.badRequest(`${name} must be a non-negative integer, got ${JSON.stringify(v)}`, [
      { reason: 'FieldValueInvalid', field: name, message: v },
    ]);
  return n;
}

export function uploadsHandler(d: { runtime: Runtime; uploads: UploadStore }, hooks: UploadHooks): SubresourceHandler {
  return {
    verbs: ['get', 'create', 'update', 'delete'],
    subpaths: true,
    async handle(r: SubresourceRequest) {
      try {
        return await serve(d, hooks, r);
      } finally {
        // A refused chunk: read (and drop) what the client still sends, so it gets the answer.
        if (r.method !== 'GET' && !r.req.readableEnded && !r.req.destroyed) await drainRequest(r.req);
      }
    },
  };
}

async function serve(
  d: { runtime: Runtime; uploads: UploadStore },
  hooks: UploadHooks,
  r: SubresourceRequest,
): Promise<unknown> {
  const [id, verb, ...rest] = (r.subpath ?? '').split('/').filter(Boolean);
  if (rest.length || (verb !== undefined && verb !== 'complete'))
    throw errors.notFound('uploads', 'fluxvm.dev', r.subpath ?? '');
  if (id === undefined) {
    if (r.method === 'GET') {
      const t = await hooks.resolve(r);
      return { kind: 'UploadList', apiVersion: 'fluxvm.dev/v1alpha1', items: await d.uploads.list(t.owner) };
    }
    if (r.method !== 'POST') throw errors.methodNotAllowed(`uploads takes POST (open) or GET (list), not ${r.method}`);
    const t = await hooks.resolve(r);
    const spec = uploadSpec(jsonBody(r), t.kind, r.name);
    refuseReadOnlyWrite(t.sbx, spec.path);
    if (!d.runtime.writeFileStream)
      throw errors.notImplemented(
        `the ${t.sbx.spec?.runtime ?? "sandbox's"} backend cannot stream a file in: uploads are not available`,
      );
    const rec = await d.uploads.open(t.owner, spec);
    await hooks.opened?.(t, rec);
    return respond({
      status: 201,
      headers: { 'Content-Type': 'application/json', Location: `uploads/${rec.id}` },
      body: JSON.stringify(rec),
    });
  }
  const t = await hooks.resolve(r);
  if (verb === 'complete') {
    if (r.method !== 'POST') throw errors.methodNotAllowed(`uploads/ID/complete takes POST, not ${r.method}`);
    const sha256 = completeSha256(jsonBody(r, true), t.kind, r.name);
    const before = await d.uploads.get(t.owner, id);
    if (before.state === 'Open') refuseReadOnlyWrite(t.sbx, before.path);
    const rec = await d.uploads.complete(
      t.owner,
      id,
      (data, u) =>
        d.runtime.writeFileStream!(t.id, u.path, data, {
          size: u.size,
          mkdirs: u.parents,
          ...(u.mode !== undefined ? { mode: u.mode } : {}),
        }),
      sha256,
    );
    await hooks.completed?.(t, rec, before.state !== 'Complete');
    return rec;
  }
  switch (r.method) {
    case 'GET':
      return d.uploads.get(t.owner, id);
    case 'PUT': {
      const offset = intParam(r, 'offset');
      const ct = String(r.headers['content-type'] ?? '')
        .split(';')[0]!
        .trim()
        .toLowerCase();
      if (ct !== CHUNK_MEDIA_TYPE)
        throw errors.unsupportedMediaType(
          `a chunk is a body of Content-Type ${CHUNK_MEDIA_TYPE} (the raw bytes), not ${JSON.stringify(ct || 'none')}`,
        );
      const cl = Number(r.headers['content-length']);
      if (Number.isFinite(cl) && cl > UPLOAD_LIMITS.maxChunk)
        throw errors.tooLarge(`a chunk is at most ${UPLOAD_LIMITS.maxChunk} bytes (4 MiB), the request has ${cl}`);
      try {
        const rec = await d.uploads.writeChunk(t.owner, id, offset, r.req as AsyncIterable<Buffer>);
        return respond({
          status: 200,
          headers: { 'Content-Type': 'application/json', 'Upload-Offset': String(rec.received) },
          body: JSON.stringify(rec),
        });
      } catch (e) {
        // Where to continue, also as a header (tus's Upload-Offset) beside the Status.
        const at =
          e instanceof StatusError && e.code === 409
            ? e.status.details?.causes?.find((c) => c.field === 'offset')?.message
            : undefined;
        if (at === undefined) throw e;
        return respond({
          status: 409,
          headers: { 'Content-Type': 'application/json', 'Upload-Offset': at },
          body: JSON.stringify((e as StatusError).status),
        });
      }
    }
    case 'DELETE': {
      const rec = await d.uploads.abort(t.owner, id);
      await hooks.aborted?.(t, rec);
      return {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Success',
        code: 200,
        message: `upload ${id} of ${rec.path} deleted`,
      };
    }
    default:
      throw errors.methodNotAllowed(`uploads/ID takes GET, PUT or DELETE, not ${r.method}`);
  }
}

/** GET files/range: see the file comment. `resolve` gives the runtime instance and the sandbox. */
export function rangeHandler(
  d: { runtime: Runtime },
  resolve: (r: SubresourceRequest) => Promise<{ id: string }>,
): SubresourceHandler {
  return {
    verbs: ['get'],
    async handle(r: SubresourceRequest) {
      if (r.method !== 'GET') throw errors.methodNotAllowed(`files/range takes GET, not ${r.method}`);
      const path = pathParam(r);
      const offset = intParam(r, 'offset', 0);
      const length = intParam(r, 'length', MAX_RANGE);
      if (length > MAX_RANGE)
        throw errors.badRequest(`length must be at most ${MAX_RANGE} bytes (4 MiB), got ${length}`, [
          { reason: 'FieldValueInvalid', field: 'length', message: String(length) },
        ]);
      const checksum = boolParam(r, 'checksum');
      const { id } = await resolve(r);
      if (!d.runtime.readRange) throw errors.notImplemented('this backend has no ranged reads');
      const f = await d.runtime.readRange(id, path, offset, length, { checksum });
      const ifMatch = r.headers['if-match'];
      if (
        ifMatch !== undefined &&
        ifMatch !== '*' &&
        !String(ifMatch)
          .split(',')
          .map((s) => s.trim())
          .includes(f.etag)
      ) {
        throw new StatusError(
          412,
          'PreconditionFailed',
          `${path} changed since it was read as ${ifMatch}: it is now ${f.etag} (${f.size} bytes, modified ${f.mtime}); start the read again`,
          {
            causes: [{ reason: 'FieldValueInvalid', field: 'If-Match', message: f.etag }],
          },
        );
      }
      return respond({
        status: 200,
        headers: {
          'Content-Type': 'application/octet-stream',
          'Cache-Control': 'no-store',
          ETag: f.etag,
          'X-File-Size': String(f.size),
          'X-File-Mtime': f.mtime,
          'Last-Modified': new Date(f.mtime).toUTCString(),
          'X-File-Eof': String(offset + f.data.length >= f.size),
          ...(f.data.length ? { 'Content-Range': `bytes ${offset}-${offset + f.data.length - 1}/${f.size}` } : {}),
          ...(f.sha256 ? { 'X-File-Sha256': f.sha256 } : {}),
        },
        body: f.data,
      });
    },
  };
}

/** The sandboxes' uploads and files/range subresources (staging below the sandbox controller's state dir). */
export function sandboxLargeFileSubresources(
  d: SubresourceDeps,
  uploads: UploadStore,
): Array<{ plural: string; name: string; handler: SubresourceHandler }> {
  const resolve = async (r: SubresourceRequest): Promise<UploadTarget> => {
    const { sbx, id } = await resolveSandbox(d, r);
    return { owner: id, id, sbx, kind: 'Sandbox' };
  };
  return [
    { plural: 'sandboxes', name: 'uploads', handler: uploadsHandler({ runtime: d.runtime, uploads }, { resolve }) },
    { plural: 'sandboxes', name: 'files/range', handler: rangeHandler(d, resolve) },
  ];
}
