// metav1.Condition helpers (pure). Status is conditions plus observedGeneration; a
// condition's lastTransitionTime changes only when its status flips.
import type { Condition } from '../meta/types.js';

export interface ConditionInput {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message?: string;
  /** metadata.generation the condition was computed from. */
  observedGeneration?: number;
}

/**
 * Returns a new conditions list with `c` set: an existing condition of the same type keeps
 * its lastTransitionTime unless the status changes; reason, message and observedGeneration
 * are always updated. The input array is not modified. Calling it twice is harmless.
 */
export function setCondition(
  conditions: Condition[] | undefined,
  c: ConditionInput,
  now: Date | number = Date.now(),
): Condition[] {
  const list = conditions ?? [];
  const time = rfc3339(now);
  const prev = list.find((x) => x.type === c.type);
  const next: Condition = {
    type: c.type,
    status: c.status,
    ...(c.observedGeneration !== undefined
      ? { observedGeneration: c.observedGeneration }
      : prev?.observedGeneration !== undefined
        ? { observedGeneration: prev.observedGeneration }
        : {}),
    lastTransitionTime: prev && prev.status === c.status ? prev.lastTransitionTime : time,
    reason: c.reason,
    message: c.message ?? '',
  };
  return prev ? list.map((x) => (x.type === c.type ? next : x)) : [...list, next];
}

export function getCondition(conditions: Condition[] | undefined, type: string): Condition | undefined {
  return conditions?.find((c) => c.type === type);
}

/** True when the condition is True and, if a generation is given, computed from it (kubectl wait's rule). */
export function isConditionTrue(conditions: Condition[] | undefined, type: string, generation?: number): boolean {
  const c = getCondition(conditions, type);
  if (!c || c.status !== 'True') return false;
  return generation === undefined || c.observedGeneration === undefined || c.observedGeneration >= generation;
}

/**
 * metav1.Time: RFC 3339 with second precision, as Kubernetes serializes it. A string is any
 * time Date parses (e.g. a runtime's millisecond ISO time); an invalid time throws RangeError.
 */
export function rfc3339(t: Date | number | string): string {
  return new Date(t).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** What a pass decided about an object, in kstatus terms (sigs.k8s.io/cli-utils pkg/kstatus). */
export interface KstatusInput {
  /** Ready: True once the desired state is reached (also for a paused sandbox or a finished changeset). */
  ready: { status: 'True' | 'False'; reason: string; message?: string };
  /** Reconciling=True while the controller is still working towards the spec (kstatus InProgress). */
  reconciling?: { reason: string; message?: string };
  /** Stalled=True for a failure that will not fix itself (kstatus Failed). */
  stalled?: { reason: string; message?: string };
}

/**
 * The kstatus condition set: Ready (with observedGeneration) always; Reconciling and Stalled
 * present with status True only while they hold, removed otherwise (kstatus reads only a True
 * one, and an absent condition is the abnormal-true convention's "all is well").
 */
export function setKstatusConditions(
  conditions: Condition[] | undefined,
  k: KstatusInput,
  generation: number,
  now: Date | number = Date.now(),
): Condition[] {
  let list = setCondition(conditions, { type: 'Ready', ...k.ready, observedGeneration: generation }, now);
  for (const [type, c] of [
    ['Reconciling', k.reconciling],
    ['Stalled', k.stalled],
  ] as const) {
    list = c
      ? setCondition(
          list,
          { type, status: 'True', reason: c.reason, message: c.message ?? '', observedGeneration: generation },
          now,
        )
      : list.filter((x) => x.type !== type);
  }
  return list;
}
