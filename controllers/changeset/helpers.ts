// Pure helpers of the Changeset controller: names, windows, output capping, side effects and
// the phase a reconcile moves to. No I/O here; table-tested in test/controllers/changeset/.
import { rfc3339 } from '../../runtime/controller/conditions.js';
import { CHANGESET_FINAL_PHASES, CHANGESET_LIMITS } from '../../apis/changeset.js';
import type { Changeset, ChangesetStatus, Sandbox } from '../../apis/zz_generated.types.js';
import type { GVR } from '../../runtime/meta/types.js';
import { isUnder, normalizeSandboxPath } from '../../native/workspace/index.js';
import { changeset } from '../../apis/changeset.js';
import { gvrOf } from '../common/kinds.js';

export const changesetsGVR: GVR = gvrOf(changeset);
export const CHANGESET_FINALIZER = 'fluxvm.dev/changeset';

export type Phase = NonNullable<ChangesetStatus['phase']>;
export type SideEffects = NonNullable<ChangesetStatus['sideEffects']>;

/** The changeset's staging directory: `<stateDir>/changesets/<uid>` (spec layout). */
export function stagingDir(stateDir: string, uid: string): string {
  if (!/^[A-Za-z0-9-]{1,64}$/.test(uid)) throw new Error(`invalid changeset uid ${JSON.stringify(uid)}`);
  return `${stateDir}/changesets/${uid}`;
}

/** Runtime id of the one-off copy the command runs in (deterministic, so a retry finds it). */
export function speculationId(uid: string): string {
  return `cs-${uid}`;
}

/** Marker of an apply in progress, in the changeset's directory (outside the sandbox). */
export function applyMarkerPath(dir: string): string {
  return `${dir}/apply.json`;
}

export function isFinal(phase: string | undefined): boolean {
  return (CHANGESET_FINAL_PHASES as readonly string[]).includes(phase ?? '');
}

/**
 * Effective TTL in seconds: spec.ttlSeconds (default 3600) clamped to 1..86400, and to the
 * server's cap when one is set (tests shorten the window).
 */
export function effectiveTtlSeconds(spec: Changeset['spec'], maxTtlSeconds?: number): number {
  const raw = spec.ttlSeconds ?? CHANGESET_LIMITS.ttlSecondsDefault;
  const clamped = Math.min(CHANGESET_LIMITS.ttlSecondsMax, Math.max(1, Math.floor(raw)));
  return maxTtlSeconds && maxTtlSeconds > 0 ? Math.min(clamped, maxTtlSeconds) : clamped;
}

/** creationTimestamp + TTL, in ms since the epoch. */
export function expiresAtMs(cs: Changeset, maxTtlSeconds?: number): number {
  const created = Date.parse(cs.metadata.creationTimestamp ?? '') || 0;
  return created + effectiveTtlSeconds(cs.spec, maxTtlSeconds) * 1000;
}

/**
 * metav1.Time with second precision (the schema's date-time), truncated like every other
 * time in status (rfc3339 of runtime/controller): one rounding everywhere keeps
 * startedAt <= finishedAt for times taken in that order.
 */
export function timeString(ms: number): string {
  return rfc3339(ms);
}

/**
 * The paths a speculation captures: spec.paths, or the sandbox's workspace. Each must be the
 * workspace or below it (only the workspace is a layer that can be diffed and applied);
 * returns an error message otherwise.
 */
export function speculationPaths(spec: Changeset['spec'], workspacePath: string): { paths: string[] } | { error: string } {
  const ws = normalizeSandboxPath(workspacePath);
  const paths = [...new Set((spec.paths?.length ? spec.paths : [ws]).map(normalizeSandboxPath))].sort();
  const outside = paths.filter((p) => !isUnder(p, ws));
  if (outside.length) return { error: `paths must be inside the sandbox workspace ${ws}: ${outside.join(', ')}` };
  return { paths };
}

/**
 * Captured output: the first `cap` bytes as text, then a `[truncated N bytes]` marker on its
 * own line when `dropped` bytes were cut.
 */
export function cappedOutput(kept: Buffer, dropped: number): string {
  const text = kept.toString('utf8');
  if (dropped <= 0) return text;
  return `${text}${text.endsWith('\n') || text === '' ? '' : '\n'}[truncated ${dropped} bytes]`;
}

/**
 * The side-effects report from the sandbox's network spec (spec: "Side-effects report").
 * The speculative copy has the sandbox's own network (never more), so this is what the
 * command could have reached; file changes are the only replayable effect.
 */
export function sideEffects(network: NonNullable<Sandbox['spec']>['network'] | undefined, fileChanges: number, paths: string[]): SideEffects {
  const replayable = [`${fileChanges} file change(s) under ${paths.join(', ')}`];
  switch (network?.mode) {
    case 'allowList': {
      const destinations = [...(network.allow ?? [])];
      return {
        egress: 'allow_listed',
        destinations,
        replayable,
        nonReplayable: destinations.map((d) => `possible traffic to allow-listed destination ${d}: recorded, never replayed`),
      };
    }
    case 'open':
      return {
        egress: 'unrestricted',
        destinations: [],
        replayable,
        nonReplayable: ['possible traffic to any destination (network open): external effects unknown, never replayed'],
      };
    default:
      return { egress: 'blocked', destinations: [], replayable, nonReplayable: [] };
  }
}

/** What a reconcile of a non-final, speculated changeset does next. Pure. */
export type Step =
  | { kind: 'expire' }
  | { kind: 'reject' }
  | { kind: 'approve'; thenApply: boolean }
  | { kind: 'apply' }
  | { kind: 'wait' };

export function nextStep(phase: Phase, spec: Changeset['spec'], nowMs: number, expiresMs: number): Step {
  if (spec.decision === 'Reject' && (phase === 'Pending' || phase === 'Approved')) return { kind: 'reject' };
  if (nowMs >= expiresMs) return { kind: 'expire' };
  if (phase === 'Pending' && spec.decision === 'Approve') return { kind: 'approve', thenApply: spec.apply === true };
  if (phase === 'Approved' && spec.apply === true) return { kind: 'apply' };
  return { kind: 'wait' };
}

/** When a finished changeset is deleted: the Finished condition's time + retention. */
export function retentionDeadlineMs(status: ChangesetStatus | undefined, retentionSeconds: number): number | undefined {
  const c = status?.conditions?.find((x) => x.type === 'Finished' && x.status === 'True');
  if (!c) return undefined;
  return Date.parse(c.lastTransitionTime) + retentionSeconds * 1000;
}

/** "1 file" / "3 files". */
export function files(n: number): string {
  return `${n} file${n === 1 ? '' : 's'}`;
}
