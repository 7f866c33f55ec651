// The promote subresource of agentsessions: a fork child's workspace changes written into its
// parent, planned against the baseline (promotePlan), refused where the parent is read-only,
// capped at MAX_PROMOTE_CHANGES, under the parent's lifecycle slot and a checkpoint before.
import { createHash } from 'node:crypto';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { SubresourceHandler } from '../../runtime/apiserver/http/subresources.js';
import { getIfExists } from '../../runtime/client/client.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import type { Manifest } from '../../native/workspace/types.js';
import { GROUP, resolveSession, type AgentSessionSubresourceDeps } from './common.js';
import { jsonBody } from '../sandbox/subresources.js';
import { refuseReadOnlyWrite } from '../sandbox/files.js';
import { sandboxesGVR } from '../common/kinds.js';
import { baseline } from './baseline.js';
import { rewindBeforeStep } from './rewind-point.js';
import { recordPromote } from './promote-provenance.js';
import { bool, clearInterrupted, lifecycle, str, takeCheckpoint } from './lifecycle-slot.js';

/** Changes one promote may write; more is 400 and writes nothing. */
export const MAX_PROMOTE_CHANGES = 2000;

/**
 * Why the plan cannot be written into the parent: its workspace is read-only for its own
 * commands (workspace.mode readonly -> the Sandbox's spec.confinement.workspaceReadOnly) and a
 * path to apply is below it and not below one of its filesystem.write paths, the rule the
 * files API keeps (refuseReadOnlyWrite). Undefined when every change may be written. Pure.
 */
export function readOnlyRefusal(
  parentSbx: Sandbox,
  parentName: string,
  apply: Array<{ path: string }>,
): string | undefined {
  const blocked: string[] = [];
  for (const a of apply) {
    try {
      refuseReadOnlyWrite(parentSbx, a.path);
    } catch (e) {
      if (!(e instanceof StatusError && e.code === 403)) throw e;
      blocked.push(a.path);
    }
  }
  if (!blocked.length) return undefined;
  const ws = parentSbx.spec?.workspace?.path ?? '/work';
  return `the workspace ${ws} of the parent session ${parentName} is read-only (workspace.mode readonly): ${blocked.length} of the ${apply.length} changes (${blocked.slice(0, 5).join(', ')}${blocked.length > 5 ? ', ...' : ''}) cannot be written there; nothing was changed`;
}

/** The three-way promotion plan of a child onto its parent (spec: Promoting a fork). Pure. */
export function promotePlan(base: Manifest, child: Manifest, parent: Manifest, paths?: string[]) {
  const inScope = (p: string) =>
    !paths?.length || paths.some((q) => p === q || p.startsWith(q.endsWith('/') ? q : q + '/'));
  const apply: Array<{ path: string; op: 'added' | 'modified' | 'deleted' }> = [];
  const alreadyApplied: string[] = [];
  const conflicts: Array<{ path: string; why: string }> = [];
  const all = new Set([...Object.keys(base.files), ...Object.keys(child.files)]);
  let untouched = 0;
  for (const p of [...all].sort()) {
    const b = base.files[p];
    const c = child.files[p];
    if (b === c) {
      untouched++;
      continue;
    }
    if (!inScope(p)) continue;
    const pf = parent.files[p];
    const op = b === undefined ? 'added' : c === undefined ? 'deleted' : 'modified';
    if (pf === c) alreadyApplied.push(p);
    else if (pf === b) apply.push({ path: p, op });
    else
      conflicts.push({
        path: p,
        why:
          pf === undefined
            ? 'the parent deleted it'
            : b === undefined
              ? 'the parent added it too, with other content'
              : 'the parent changed it too',
      });
  }
  const planId =
    'sha256:' +
    createHash('sha256')
      .update(
        JSON.stringify({
          apply,
          alreadyApplied,
          conflicts,
          p: apply.map((a) => parent.files[a.path] ?? null),
          c: apply.map((a) => child.files[a.path] ?? null),
        }),
      )
      .digest('hex');
  return { apply, alreadyApplied, conflicts, untouched, planId };
}

export function promoteHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`promote takes POST, not ${r.method}`);
      const body = jsonBody(r, true);
      const dryRun = bool(body, 'dryRun') ?? false;
      const skipConflicts = bool(body, 'skipConflicts') ?? false;
      const planId = str(body, 'planId');
      const paths = body.paths;
      if (paths !== undefined && (!Array.isArray(paths) || paths.some((p) => typeof p !== 'string')))
        throw errors.badRequest('paths must be a list of absolute paths inside the workspace');
      const child = await resolveSession(d, r);
      const parentName = child.s.spec.forkOf?.name;
      if (!parentName)
        throw errors.badRequest('promote applies a fork child to its parent: this session has no spec.forkOf');
      const ws = child.s.spec.workspace?.path ?? '/work';
      for (const p of (paths as string[] | undefined) ?? []) {
        if (!p.startsWith('/') || p.split('/').includes('..') || (p !== ws && !p.startsWith(ws + '/'))) {
          throw errors.badRequest(`paths: ${JSON.stringify(p)} is outside the workspace ${ws}`, [
            { reason: 'FieldValueInvalid', field: 'paths', message: 'outside the workspace' },
          ]);
        }
      }
      const parent = await resolveSession(d, { ...r, name: parentName });
      const base = await baseline(d, child);
      if (!base)
        throw errors.conflict(
          'agentsessions',
          GROUP,
          r.name,
          'the child has no workspace baseline, so it cannot be promoted',
        );
      const run = async () => {
        const [cm, pm] = await Promise.all([
          d.runtime.manifest(child.sandboxId, [ws]),
          d.runtime.manifest(parent.sandboxId, [ws]),
        ]);
        const plan = promotePlan(base, cm, pm, paths as string[] | undefined);
        const answer = {
          parent: parentName,
          ...plan,
          applyCount: plan.apply.length,
          notCarried: ['memory', 'processes', `files outside the workspace ${ws}`],
        };
        // The parent's Sandbox says what its workspace lets be written (the child may differ: a
        // session created with spec.forkOf by hand, or the parent's readonly mode).
        const readOnly = readOnlyRefusal(
          await d.client.get<Sandbox>(sandboxesGVR, parent.s.metadata.namespace, parentName),
          parentName,
          plan.apply,
        );
        if (dryRun) return { dryRun: true, ...answer, ...(readOnly ? { refused: readOnly } : {}) };
        if (readOnly) throw errors.forbidden(`promote refused: ${readOnly}`);
        if (planId !== undefined && planId !== plan.planId)
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            `the plan changed since ${planId}: it is ${plan.planId} now; review it again (dryRun)`,
          );
        if (plan.conflicts.length && !skipConflicts)
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            `${plan.conflicts.length} conflicts (${plan.conflicts
              .slice(0, 5)
              .map((c) => c.path)
              .join(
                ', ',
              )}${plan.conflicts.length > 5 ? ', ...' : ''}); nothing was changed; promote with skipConflicts to apply the clean paths`,
          );
        if (plan.apply.length > MAX_PROMOTE_CHANGES)
          throw errors.badRequest(
            `the promotion has ${plan.apply.length} changes, more than ${MAX_PROMOTE_CHANGES}; narrow it with paths`,
          );
        if (d.state.running.get(child.uid) || d.state.running.get(parent.uid))
          throw errors.conflict(
            'agentsessions',
            GROUP,
            r.name,
            'promote is refused while commands run on the child or the parent',
          );
        const release = await d.state.begin(parent.uid, parentName, 'promote');
        try {
          const point = await rewindBeforeStep(d, parent, 'promote', `promote ${r.name}`); // rewind-point.ts
          const ckName = `pre-promote-${r.name}-${Date.now()}`.slice(0, 63).replace(/-+$/, '');
          await takeCheckpoint(d, parent, undefined, false, ckName);
          const startedAt = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
          // The provenance subjects (promote-provenance.ts).
          const written: Array<{ path: string; sha256: string }> = [];
          let done = 0;
          try {
            for (const a of plan.apply) {
              if (a.op === 'deleted') await d.runtime.deleteFile(parent.sandboxId, a.path);
              else {
                const data = await d.runtime.readFile(child.sandboxId, a.path);
                const mode = cm.modes?.[a.path];
                await d.runtime.writeFile(parent.sandboxId, a.path, data, {
                  mkdirs: true,
                  ...(mode !== undefined ? { mode } : {}),
                });
                written.push({ path: a.path, sha256: 'sha256:' + createHash('sha256').update(data).digest('hex') });
              }
              done++;
            }
          } catch (e) {
            throw errors.internal(
              `promote failed after ${done} of ${plan.apply.length} paths: ${(e as Error).message}; restore checkpoint ${ckName} of ${parentName} to undo them`,
            );
          }
          // The signed record is on disk before the ledger entry and the answer name it.
          const provenance = await recordPromote(d, {
            namespace: r.namespace!,
            parent,
            child,
            parentSandbox: await getIfExists<Sandbox>(d.client, sandboxesGVR, r.namespace, parentName),
            planId: plan.planId,
            ...(paths ? { paths: paths as string[] } : {}),
            skipConflicts,
            checkpoint: ckName,
            written,
            deleted: plan.apply.filter((a) => a.op === 'deleted').map((a) => a.path),
            base,
            parentBefore: pm,
            startedAt,
            finishedAt: new Date().toISOString().replace(/\.\d{3}Z$/, 'Z'),
          });
          const promoted = await d.ledger.append(parent.uid, 'promote', {
            ...(provenance ? { provenance: { name: provenance.name, digest: provenance.digest } } : {}),
            child: r.name,
            applied: done,
            skippedConflicts: skipConflicts ? plan.conflicts.length : 0,
            checkpoint: ckName,
            planId: plan.planId,
            ...(point ? { rewindPoint: point.tag } : {}),
          });
          if (point) await point.done(promoted.entry);
          await d.ledger.append(child.uid, 'promote.out', { parent: parentName, applied: done, planId: plan.planId });
          await release();
          await clearInterrupted(d, parent.s);
          return { dryRun: false, ...answer, applied: done, checkpoint: ckName, ...(provenance ? { provenance } : {}) };
        } finally {
          await release();
        }
      };
      if (dryRun) return run();
      return lifecycle(d, r, child, 'promote', body, run);
    },
  };
}
