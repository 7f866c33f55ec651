// The Changeset's status: the one status write of its controller (patchStatus) and the kstatus reading of a status
// (changesetKstatus, README "Status for GitOps").
import type { Changeset, ChangesetStatus } from '../../apis/zz_generated.types.js';
import type { Client } from '../../runtime/client/client.js';
import {
  passLog,
  setKstatusConditions,
  writeStatus,
  type Clock,
  type KstatusInput,
  type Logger,
} from '../../runtime/controller/index.js';
import { changesetsGVR } from './helpers.js';

/** What a status write goes through. */
export interface StatusWriter {
  client: Client;
  clock: Clock;
  log: Logger;
}

type Conditions = NonNullable<ChangesetStatus['conditions']>;

/** A change of the status: a field set to null is removed; conditions may be computed from the stored ones. */
export type StatusPatch = { [K in Exclude<keyof ChangesetStatus, 'conditions'>]?: ChangesetStatus[K] | null } & {
  conditions?: Conditions | null | ((stored: Conditions | undefined) => Conditions | undefined);
};

/** How the command ended, for status.result (and Ready's reason while the changeset is Pending). */
export function commandResult(
  st: Pick<ChangesetStatus, 'exitCode' | 'signal' | 'timedOut'>,
): 'Succeeded' | 'CommandFailed' | 'TimedOut' {
  if (st.timedOut) return 'TimedOut';
  return st.exitCode === 0 && !st.signal ? 'Succeeded' : 'CommandFailed';
}

/**
 * The kstatus reading of a changeset's status (controllers/changeset/README.md "Status for
 * GitOps"): Reconciling while it waits for its sandbox, runs the command or applies; Ready
 * once reviewable (Pending, whatever the command's exit: the reason says Succeeded,
 * CommandFailed or TimedOut) and once the decision is carried out (Approved, Applied,
 * Rejected); Stalled when it cannot get further by itself (Failed, Expired, an apply refused
 * for drift or unstaged files). Pure; exported for tests.
 */
export function changesetKstatus(st: ChangesetStatus, spec: Changeset['spec']): KstatusInput {
  const cond = (t: string) => st.conditions?.find((c) => c.type === t && c.status === 'True');
  const inProgress = (reason: string, message: string): KstatusInput => ({
    ready: { status: 'False', reason, message },
    reconciling: { reason, message },
  });
  const stalled = (reason: string, message: string): KstatusInput => ({
    ready: { status: 'False', reason, message },
    stalled: { reason, message },
  });
  switch (st.phase) {
    case undefined: {
      const r = st.conditions?.find((c) => c.type === 'Ready');
      return inProgress(r?.reason ?? 'SandboxNotReady', r?.message ?? 'waiting for the sandbox');
    }
    case 'Running':
      return inProgress('Running', 'the command runs in an isolated copy');
    case 'Pending': {
      const result = st.result ?? commandResult(st);
      const how =
        result === 'TimedOut'
          ? 'timed out'
          : result === 'CommandFailed'
            ? `failed (exit code ${st.exitCode ?? '?'}${st.signal ? `, ${st.signal}` : ''})`
            : 'succeeded';
      return {
        ready: {
          status: 'True',
          reason: result,
          message: `the command ${how}; the changeset is reviewable: waiting for a decision`,
        },
      };
    }
    case 'Approved': {
      const refused = cond('NotApplicable') ?? cond('Conflict');
      if (spec.apply && refused) return stalled(refused.reason, `apply refused: ${refused.message}`);
      if (spec.apply) return inProgress('Applying', 'applying the approved changes');
      return { ready: { status: 'True', reason: 'Approved', message: 'approved; set apply to write the changes' } };
    }
    case 'Applying':
      return inProgress('Applying', 'applying the approved changes');
    case 'Applied':
    case 'Rejected': {
      const f = cond('Finished');
      return { ready: { status: 'True', reason: st.phase, message: f?.message ?? st.phase.toLowerCase() } };
    }
    default: {
      const f = cond('Finished');
      return stalled(f?.reason ?? st.phase, f?.message ?? st.message ?? st.phase);
    }
  }
}

/**
 * The one status write of this controller (writeStatus: the resourceVersion read is the
 * precondition; on a conflict the change is re-applied to the newest object). Fields set
 * to null are removed; `conditions` may be a function of the stored conditions, so a
 * re-applied write keeps conditions another write set meanwhile. observedGeneration (the
 * generation this pass acted on, never lowered) and the kstatus conditions (Ready,
 * Reconciling, Stalled) are recomputed from the resulting status on every write. `attempts: 1`
 * makes it a plain optimistic write: a conflict is thrown, not re-applied (claim.ts).
 */
export function patchStatus(
  w: StatusWriter,
  cs: Changeset,
  change: StatusPatch,
  gen = cs.metadata.generation ?? 1,
  attempts?: number,
): Promise<Changeset> {
  return writeStatus(
    w.client,
    changesetsGVR,
    cs,
    (cur) => {
      const merged: Record<string, unknown> = { ...(cur.status ?? {}) };
      for (const [k, v] of Object.entries(change)) {
        if (k === 'conditions') continue;
        if (v === null) delete merged[k];
        else if (v !== undefined) merged[k] = v;
      }
      const next = merged as ChangesetStatus;
      const conds =
        typeof change.conditions === 'function' ? change.conditions(cur.status?.conditions) : change.conditions;
      if (conds === null) delete next.conditions;
      else if (conds !== undefined) next.conditions = conds;
      next.conditions = setKstatusConditions(next.conditions, changesetKstatus(next, cur.spec), gen, w.clock.now());
      next.observedGeneration = Math.max(gen, cur.status?.observedGeneration ?? 0);
      return next;
    },
    { log: passLog(w.log), ...(attempts ? { attempts } : {}) },
  );
}
