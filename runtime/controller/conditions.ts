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
export function setCondition(conditions: Condition[] | undefined, c: ConditionInput, now: Date | number = Date.now()): Condition[] {
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
