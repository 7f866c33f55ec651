// sandboxes/baseline, sandboxes/changes and sandboxes/dryrun (spec: sandbox-changes.md).
//
// POST baseline {paths}  records the sha256 manifest of the regular files below each path
//   (replacing any earlier one) -> {ok: true, files, mode: "sha256", paths (sorted)}.
//   Stored crash-safe with the sandbox's controller state; removed with the sandbox.
// POST changes [{paths}]  compares the current files with the baseline, optionally narrowed
//   to directories at or below the baseline's -> {added, modified, deleted (sorted),
//   unchanged, mode, paths, baselineTakenAtUnix}. A rename is one deletion plus one addition.
// POST changes {since: "fork"[, paths]}  what changed in a fork child since it was forked
//   (its layered history's fork mark, no baseline needed) -> {added, modified, deleted,
//   unchanged, since}; 409 when the sandbox has no fork point (not forked; vm).
// Status codes: 400 bad paths (relative, '..', control characters, more than 64, longer than
//   4096 bytes), a path that is not a directory, a failed walk, a listing beyond 200,000
//   files / 64 MiB, a corrupt stored baseline; 404 no such sandbox (in this namespace) or no
//   baseline yet; 409 the baseline's fingerprint mode differs from the current one.
//
// POST dryrun {command, paths?, timeoutSeconds?}  runs the command in a copy of the sandbox
//   (a runtime fork: the workspace's copy-on-write layer, same config) and reports what it
//   changed below `paths` (default: the workspace) -> the exec result plus
//   {changes: {added, modified, deleted, unchanged, mode, paths}, discarded, revertedVia:
//   "workspace-copy"} (a vm sandbox: the copy is a one-off fork of the machine, `paths` is
//   required (400 without), revertedVia "fork"). The real sandbox is never written, so it stays exactly as it was;
//   the copy is destroyed afterwards, also when the command fails or times out. discarded
//   is true only when destroying the copy worked; otherwise the call is a 500 saying the
//   copy may remain. One dry-run at a time per sandbox (409 Conflict). The command runs
//   without the sandbox's running processes (they are not copied). `egress` (none, readOnly,
//   sandbox; default readOnly with an allow-list, none otherwise) is the copy's network as a
//   Changeset's spec.egress, and the answer carries the same measured `sideEffects` report
//   (controllers/changeset/README.md); 400 for a bad value or readOnly on an open network.
import { randomBytes } from 'node:crypto';
import { RuntimeError } from '../../native/runtime.js';
import { diffManifests } from '../../native/workspace/diff.js';
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { rfc3339, writeStatus } from '../../runtime/controller/index.js';
import { errors } from '../../runtime/meta/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { DEFAULT_WORKSPACE } from './desired.js';
import { sideEffects, speculationEgress } from '../changeset/helpers.js';
import { egressTraffic } from '../changeset/speculate.js';
import { CHANGESET_EGRESS_MODES } from '../../apis/changeset.js';
import { CorruptBaselineError } from './state.js';
import {
  argvOf,
  execResultJson,
  jsonBody,
  pathsOf,
  resolveSandbox,
  timeoutOf,
  type SubresourceDeps,
} from './request.js';

/** Runtime ids of dry-run copies: `<sandbox uid>-dryrun-<hex>`; reaped at start-up. */
export const DRYRUN_ID = /-dryrun-[0-9a-f]+$/;

function post(r: SubresourceRequest, what: string): void {
  if (r.method !== 'POST') throw errors.methodNotAllowed(`${what} takes POST, not ${r.method}`);
}

export function baselineHandler(d: SubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      post(r, 'baseline');
      const body = jsonBody(r);
      if (body.paths === undefined) throw errors.badRequest('paths is required: the directories to record');
      const paths = pathsOf(body.paths);
      const { sbx, id } = await resolveSandbox(d, r);
      const m = await d.runtime.manifest(id, paths);
      await d.state.saveBaseline(id, m);
      const files = Object.keys(m.files).length;
      // Best effort: status shows the baseline; the stored file is what changes reads.
      // writeStatus: only status.baseline changes, re-applied to the newest object on a conflict.
      const baseline = { paths: m.paths, files, mode: m.mode, takenAt: rfc3339(m.takenAt) };
      await writeStatus(d.client, sandboxesGVR, sbx, (cur) => ({ ...(cur.status ?? {}), baseline }), {
        log: d.log,
      }).catch((e) =>
        d.log?.error('recording status.baseline failed', { sandbox: sbx.metadata.name, error: String(e) }),
      );
      return { ok: true, files, mode: m.mode, paths: m.paths };
    },
  };
}

export function changesHandler(d: SubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      post(r, 'changes');
      const body = jsonBody(r, true);
      const narrow = body.paths === undefined ? undefined : pathsOf(body.paths);
      if (body.since !== undefined && body.since !== 'fork')
        throw errors.badRequest(
          `since: only "fork" is supported (the sandbox's changes since it was forked), got ${JSON.stringify(body.since)}`,
          [{ reason: 'FieldValueNotSupported', field: 'since', message: 'supported: fork' }],
        );
      const { id } = await resolveSandbox(d, r);
      if (body.since === 'fork') {
        // Since the fork: the layered history's own mark (O(changed files)), no baseline needed.
        const info = await d.runtime.inspect(id);
        if (!info.forkMark)
          throw errors.conflict(
            'sandboxes',
            sandboxesGVR.group,
            r.name,
            `sandbox "${r.name}" has no fork point: it was not forked, or its backend does not keep a layered history`,
          );
        const diff = await d.runtime.changesSince(
          id,
          { sandboxId: id, token: info.forkMark },
          narrow?.length ? narrow : undefined,
        );
        return { ...diff, since: 'fork' };
      }
      let base;
      try {
        base = await d.state.loadBaseline(id);
      } catch (e) {
        if (e instanceof CorruptBaselineError) throw errors.badRequest(e.message);
        throw e;
      }
      if (!base)
        throw new RuntimeError(
          'NotFound',
          `no baseline recorded for sandbox "${r.name}": POST its baseline subresource first`,
        );
      if (base.mode !== 'sha256') {
        throw errors.conflict(
          'sandboxes',
          sandboxesGVR.group,
          r.name,
          `the baseline was taken in ${base.mode} mode and the current listing is sha256; take a new baseline`,
        );
      }
      const within = narrow?.length ? narrow : undefined; // an empty list narrows nothing
      const cur = await d.runtime.manifest(id, within ?? base.paths);
      const diff = diffManifests(base, cur, within);
      return {
        ...diff,
        mode: cur.mode,
        paths: cur.paths,
        baselineTakenAtUnix: Math.floor(Date.parse(base.takenAt) / 1000),
      };
    },
  };
}

export function dryRunHandler(d: SubresourceDeps, running: Set<string>): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      post(r, 'dryrun');
      const body = jsonBody(r);
      const argv = argvOf(body.command, 'command');
      const timeoutMs = timeoutOf(body.timeoutSeconds, 300);
      const { sbx, id } = await resolveSandbox(d, r);
      // A VM's copy is a one-off fork of the whole machine compared by manifests over `paths`,
      // which it must name (as a vm Changeset's spec.paths); procbox's is a workspace layer.
      const caps = d.runtime.capabilities(sbx.spec?.runtime ?? 'procbox');
      if (sbx.spec?.runtime === 'vm' && body.paths === undefined)
        throw errors.badRequest('paths is required for a dry-run on a vm sandbox: the directories to compare');
      const paths = body.paths === undefined ? [sbx.spec?.workspace?.path ?? DEFAULT_WORKSPACE] : pathsOf(body.paths);
      if (body.egress !== undefined && !(CHANGESET_EGRESS_MODES as readonly unknown[]).includes(body.egress)) {
        throw errors.badRequest(`egress: must be one of ${CHANGESET_EGRESS_MODES.join(', ')}`);
      }
      const egress = speculationEgress(
        body.egress as (typeof CHANGESET_EGRESS_MODES)[number] | undefined,
        sbx.spec?.network,
      );
      if ('error' in egress) throw errors.badRequest(`egress: ${egress.error}`);
      if (running.has(id)) {
        throw errors.conflict(
          'sandboxes',
          sandboxesGVR.group,
          r.name,
          'a dry-run is already running on this sandbox; one at a time',
        );
      }
      running.add(id);
      const copy = `${id}-dryrun-${randomBytes(4).toString('hex')}`;
      try {
        let result;
        let failure: unknown;
        try {
          await d.runtime.fork(id, [copy], { network: egress.network });
          const before = await d.runtime.manifest(copy, paths);
          const res = await d.runtime.exec(copy, { argv, timeoutMs, maxOutputBytes: d.maxOutputBytes ?? 1024 * 1024 });
          // Taken (and the copy's link sealed) as soon as the command ends.
          const traffic = await egressTraffic(d.runtime, copy, egress);
          // Whatever the command left running in the copy is frozen before the copy is walked
          // (the copy is destroyed below, frozen or not: no thaw needed).
          await d.runtime.freeze?.(copy).catch((e: unknown) => {
            if (!(e instanceof RuntimeError && e.code === 'Unsupported')) throw e; // a backend that cannot freeze
          });
          const after = await d.runtime.manifest(copy, paths);
          const changes = diffManifests(before, after);
          const n = changes.added.length + changes.modified.length + changes.deleted.length;
          result = {
            ...execResultJson(res),
            changes: { ...changes, mode: after.mode, paths: after.paths },
            sideEffects: sideEffects(egress, traffic, n, paths),
          };
        } catch (e) {
          failure = e;
        }
        try {
          await d.runtime.destroy(copy);
        } catch (e) {
          throw errors.internal(
            `the dry-run copy ${copy} could not be discarded (${(e as Error).message}); the sandbox itself was not changed`,
          );
        }
        if (failure) throw failure;
        return { ...result, discarded: true, revertedVia: caps.layeredWorkspace ? 'workspace-copy' : 'fork' };
      } finally {
        running.delete(id);
      }
    },
  };
}
