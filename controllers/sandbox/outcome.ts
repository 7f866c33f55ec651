// What one pass of the Sandbox reconciler decided (an Outcome) and the status it becomes: the phase, the kstatus
// conditions (README "Sandbox status") and the rest of status.Sandbox. Pure functions of the outcome and the stored
// object; reconciler.ts writes the result and records the events.
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { Capabilities, SandboxInfo } from '../../native/runtime.js';
import type { CloneResult } from './clone.js';
import { rfc3339, setKstatusConditions, type EventType, type KstatusInput } from '../../runtime/controller/index.js';

/** A Sandbox's status.phase (apis/sandbox.ts SANDBOX_PHASES). */
export type Phase = NonNullable<NonNullable<Sandbox['status']>['phase']>;

/** What one pass decided: the status to report and the events to record once it is written. */
export interface Outcome {
  phase: Phase;
  ready: { status: 'True' | 'False'; reason: string; message: string };
  message?: string;
  info?: SandboxInfo;
  events: Array<[EventType, string, string]>;
  /** status.workspaceSource to record (a finished clone). */
  workspaceSource?: NonNullable<Sandbox['status']>['workspaceSource'];
  /** The object to write status against when this pass already wrote once (its resourceVersion). */
  base?: Sandbox;
  /** No phase-change Event (a step that is only started here: its end records one). */
  quiet?: boolean;
  /**
   * Starting, but Stalled rather than Reconciling: the last attempt failed for a reason retrying will not fix (still
   * retried with backoff).
   */
  stalled?: boolean;
  /** Come back sooner than the health check (the idle standby's check, idle.ts). */
  idleRecheckMs?: number;
}

/** A terminal outcome: Failed (Stalled) with the reason in Ready and a Warning Event. */
export function failedOutcome(reason: string, message: string): Outcome {
  return {
    phase: 'Failed',
    ready: { status: 'False', reason, message },
    message,
    events: [['Warning', reason, message]],
  };
}

/** The kstatus conditions of an outcome: in progress, stalled for good, or current. Exported for tests. */
export function kstatusOf(o: {
  phase: Phase;
  ready: { status: 'True' | 'False'; reason: string; message: string };
  stalled?: boolean;
}): KstatusInput {
  const why = { reason: o.ready.reason, message: o.ready.message };
  if (o.phase === 'Failed' || o.phase === 'Expired' || o.stalled) return { ready: o.ready, stalled: why };
  if (o.phase === 'Running' || o.phase === 'Paused' || o.phase === 'Standby') return { ready: o.ready };
  return { ready: o.ready, reconciling: why };
}

/**
 * The status a pass reports for an outcome, computed from the stored status `cur` (so it can be re-applied after a
 * write conflict); undefined when nothing would change. `gen` is the generation the pass acted on.
 */
export function statusAfter(
  cur: Sandbox,
  o: Outcome,
  at: { gen: number; now: number; exp: number | undefined; nodeName: string; capabilities: Capabilities },
): NonNullable<Sandbox['status']> | undefined {
  const running = o.phase === 'Running' || o.phase === 'Paused' || o.phase === 'Standby';
  const st = cur.status ?? {};
  const next: NonNullable<Sandbox['status']> = {
    ...st,
    phase: o.phase,
    conditions: setKstatusConditions(st.conditions, kstatusOf(o), at.gen, at.now),
    observedGeneration: at.gen,
    nodeName: at.nodeName,
    capabilities: at.capabilities,
    ...(running && !st.startedAt ? { startedAt: rfc3339(at.now) } : {}),
    ...(at.exp !== undefined ? { expiresAt: rfc3339(at.exp) } : {}),
  };
  if (o.info?.address) next.address = o.info.address;
  else if (!running) delete next.address;
  if (o.info?.limits) next.limits = { ...o.info.limits };
  if (o.workspaceSource) next.workspaceSource = o.workspaceSource;
  if (o.message) next.message = o.message;
  else delete next.message;
  if (o.phase === 'Expired') delete next.baseline;
  return JSON.stringify(next) !== JSON.stringify(st) ? next : undefined;
}

/** The events to record once an outcome is written: its own, and a phase-change event unless quiet or already there. */
export function outcomeEvents(prev: Phase | undefined, o: Outcome): Outcome['events'] {
  const events = [...o.events];
  if (
    !o.quiet &&
    prev !== o.phase &&
    !events.some(([, r]) => r === o.phase || (o.phase === 'Running' && r === 'Started'))
  ) {
    events.push([o.phase === 'Failed' ? 'Warning' : 'Normal', o.phase, o.ready.message]);
  }
  return events;
}

/**
 * A finished clone's outcome when the sandbox runs on: Running with the commit (Cloned), or, for an optional source
 * whose clone failed, Running with an empty workspace and git's reason (a Warning CloneFailed).
 */
export function clonedOutcome(
  r: CloneResult,
  git: { url: string; ref?: string },
  { info, base, at, nodeName }: { info: SandboxInfo; base: Sandbox; at: string; nodeName: string },
): Outcome {
  const what = { url: git.url, ...(git.ref ? { ref: git.ref } : {}) };
  if (!r.ok) {
    return {
      phase: 'Running',
      info,
      base,
      events: [['Warning', 'CloneFailed', `${r.message} (source.git.optional: running with an empty workspace)`]],
      workspaceSource: { git: { ...what, error: r.message, clonedAt: at } },
      ready: {
        status: 'True',
        reason: 'Running',
        message: `sandbox is running on node ${nodeName}; the optional clone failed: ${r.message}`,
      },
    };
  }
  const done = `cloned ${git.url} at ${r.commit.slice(0, 12)} in ${r.durationMs} ms`;
  return {
    phase: 'Running',
    info,
    base,
    events: [['Normal', 'Cloned', done]],
    workspaceSource: { git: { ...what, commit: r.commit, clonedAt: at } },
    ready: { status: 'True', reason: 'Running', message: `sandbox is running on node ${nodeName}; ${done}` },
  };
}
