// The 409 an apply answers when it would change fields other managers own, worded exactly as
// kube's apiserver (apimachinery managedfields NewConflictError), so kubectl prints it as usual.
import { StatusError } from '../../meta/errors.js';
import type { StatusCause } from '../../meta/types.js';
import { type Path, compareStrings, pathString } from './fieldset.js';
import { type ManagerSet, managerId, printManager } from './managed.js';

/**
 * 409 Conflict with one FieldManagerConflict cause per (manager, field). One conflict reads
 * `Apply failed with 1 conflict: conflict with "m" using v: .spec.x`; several read
 * `Apply failed with N conflicts: conflicts with "m":\n- .spec.x\n...`, managers sorted by
 * identity. `conflicts` must not be empty.
 */
export function conflictError(conflicts: Array<{ m: ManagerSet; paths: Path[] }>): StatusError {
  // kube sorts managers by their identifier (the JSON of manager, operation, apiVersion, subresource).
  const sorted = [...conflicts].sort((a, b) => compareStrings(managerId(a.m), managerId(b.m)));
  const causes: StatusCause[] = [];
  for (const { m, paths } of sorted) {
    for (const p of paths)
      causes.push({
        reason: 'FieldManagerConflict',
        message: `conflict with ${printManager(m)}`,
        field: pathString(p),
      });
  }
  let message: string;
  if (causes.length === 1) {
    message = `Apply failed with 1 conflict: conflict with ${printManager(sorted[0].m)}: ${causes[0].field}`;
  } else {
    const lines: string[] = [];
    for (const { m, paths } of sorted) {
      lines.push(`conflicts with ${printManager(m)}:`);
      for (const p of paths) lines.push(`- ${pathString(p)}`);
    }
    message = `Apply failed with ${causes.length} conflicts: ${lines.join('\n')}`;
  }
  return new StatusError(409, 'Conflict', message, { causes });
}
