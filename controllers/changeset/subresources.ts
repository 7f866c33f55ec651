// The Changeset's imperative subresources:
//   GET changesets/NAME/diff         unified diff of the staged change (text/plain): each
//                                    added, modified or deleted file against the real
//                                    sandbox's current content; binary files named as such;
//                                    unstaged files listed with the reason.
//   GET changesets/NAME/files?path=  the staged content of one added or modified file
//                                    (application/octet-stream; X-Fluxvm-File-Mode octal).
// `path` is only a lookup key into the staged index of meta.json, never joined to a host
// path, so it cannot name anything but a staged blob. 409 while the speculation has not
// finished; 410 Expired once the staged files were dropped (applied, rejected, expired).
import { readFile } from 'node:fs/promises';
import type { Changeset } from '../../apis/zz_generated.types.js';
import { RuntimeError, type Runtime } from '../../native/runtime.js';
import { compareUtf8, createStaging, normalizeSandboxPath } from '../../native/workspace/index.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import type { Client } from '../../runtime/client/client.js';
import { errors } from '../../runtime/meta/errors.js';
import { toStatusError } from '../common/errors.js';
import { changesetsGVR, isFinal, stagingDir } from './helpers.js';
import type { ChangesetMeta } from './speculate.js';
import { DiffPoolBusy, type DiffPool } from './diffpool.js';
import { fileDiff } from './unidiff.js';
import { provenanceHandler } from './provenance.js';

export interface SubresourceDeps {
  client: Client;
  runtime: Runtime;
  stateDir: string;
  /** Computes the file diffs off the event loop (absent: on the calling thread, still bounded). */
  diffs?: DiffPool;
}

async function load(
  d: SubresourceDeps,
  r: SubresourceRequest,
): Promise<{ cs: Changeset; meta: ChangesetMeta; dir: string }> {
  if (r.method !== 'GET')
    throw errors.methodNotAllowed(`${r.method} is not supported on changesets/${r.subresource}; use GET`);
  const cs = (await d.client.get(changesetsGVR, r.namespace, r.name)) as unknown as Changeset;
  const phase = cs.status?.phase;
  if (!phase || phase === 'Running') {
    throw errors.conflict('changesets', changesetsGVR.group, r.name, 'the speculation has not finished yet');
  }
  if (isFinal(phase) && phase !== 'Failed')
    throw errors.gone(`the staged files of changeset ${r.name} were dropped when it became ${phase}`);
  const dir = stagingDir(d.stateDir, cs.metadata.uid!);
  let meta: ChangesetMeta;
  try {
    meta = await (await createStaging(dir)).readMeta<ChangesetMeta>();
  } catch (e) {
    if (e instanceof RuntimeError && e.code === 'NotFound')
      throw errors.gone(`changeset ${r.name} has no staged record`);
    throw e;
  }
  return { cs, meta, dir };
}

async function blob(dir: string, name: string, phase: string | undefined, csName: string): Promise<Buffer> {
  if (!/^[0-9]{6}$/.test(name)) throw errors.internal(`bad blob name in the staged index of ${csName}`);
  try {
    return await readFile(`${dir}/blobs/${name}`);
  } catch {
    throw errors.gone(`the staged files of changeset ${csName} were dropped (${phase})`);
  }
}

/**
 * The text of the diff subresource. Reads the real sandbox (old side) and the blobs; each
 * file is diffed by `pool` (off the event loop) or, without one, on this thread (bounded by
 * DIFF_LIMITS either way). Rejects with DiffPoolBusy when the pool's queue is full.
 */
export async function changesetDiff(
  rt: Runtime,
  meta: ChangesetMeta,
  dir: string,
  phase: string | undefined,
  name: string,
  pool?: DiffPool,
): Promise<string> {
  const staged = new Map(meta.staged.map((e) => [e.path, e]));
  const unstaged = new Map(meta.unstaged.map((u) => [u.path, u.reason]));
  const deleted = new Set(meta.changes.deleted);
  const all = [...meta.changes.added, ...meta.changes.modified, ...meta.changes.deleted].sort(compareUtf8);
  const added = new Set(meta.changes.added);
  const out: string[] = [];
  for (const p of all) {
    if (unstaged.has(p)) {
      out.push(`Not staged: ${p}: ${unstaged.get(p)}\n`);
      continue;
    }
    let before: Buffer | undefined;
    if (!added.has(p)) {
      try {
        before = await rt.readFile(meta.sandbox.uid, p);
      } catch (e) {
        if (!(e instanceof RuntimeError && e.code === 'NotFound')) throw e;
      }
    }
    const e = staged.get(p);
    const after = deleted.has(p) || !e ? undefined : await blob(dir, e.blob, phase, name);
    const old = before ?? (added.has(p) ? undefined : Buffer.alloc(0));
    out.push(pool ? await pool.fileDiff(p, old, after, meta.uid) : fileDiff(p, old, after));
  }
  return out.join('');
}

export function changesetSubresources(
  d: SubresourceDeps,
): Array<{ plural: string; name: string; handler: SubresourceHandler }> {
  const target = (r: SubresourceRequest) => ({ resource: 'changesets', group: changesetsGVR.group, name: r.name });
  const diff: SubresourceHandler = {
    verbs: ['get'],
    async handle(r) {
      try {
        const { cs, meta, dir } = await load(d, r);
        const text = await changesetDiff(d.runtime, meta, dir, cs.status?.phase, r.name, d.diffs).catch(
          (e: unknown) => {
            throw e instanceof DiffPoolBusy ? errors.tooManyRequests(e.message, 1) : e;
          },
        );
        r.reply.code(200).header('content-type', 'text/plain; charset=utf-8').send(text);
        return undefined;
      } catch (e) {
        throw toStatusError(e, target(r));
      }
    },
  };
  const files: SubresourceHandler = {
    verbs: ['get'],
    async handle(r) {
      try {
        const q = r.query.path;
        if (typeof q !== 'string' || !q) throw errors.badRequest('the path query parameter is required (one path)');
        const { cs, meta, dir } = await load(d, r);
        let p: string;
        try {
          p = normalizeSandboxPath(q);
        } catch {
          throw errors.badRequest(`invalid path ${JSON.stringify(q)}`);
        }
        const e = meta.staged.find((x) => x.path === p);
        if (!e) {
          const why = meta.unstaged.find((u) => u.path === p)?.reason;
          throw errors.notFound('changesets/files', changesetsGVR.group, why ? `${p} (not staged: ${why})` : p);
        }
        const data = await blob(dir, e.blob, cs.status?.phase, r.name);
        r.reply
          .code(200)
          .header('content-type', 'application/octet-stream')
          .header('x-fluxvm-file-mode', e.mode.toString(8).padStart(4, '0'))
          .header('x-fluxvm-sha256', e.sha256)
          .send(data);
        return undefined;
      } catch (e) {
        throw toStatusError(e, target(r));
      }
    },
  };
  return [
    { plural: 'changesets', name: 'diff', handler: diff },
    { plural: 'changesets', name: 'files', handler: files },
    { plural: 'changesets', name: 'provenance', handler: provenanceHandler(d) },
  ];
}
