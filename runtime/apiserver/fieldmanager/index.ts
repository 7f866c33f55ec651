// Server-side apply field management: pure functions the registry calls on every write.
// See fieldmanager.ts for the contract of each entry point.
export {
  apply,
  recordUpdate,
  fieldsOf,
  managedFieldsBase,
  withManagedFields,
  BEFORE_FIRST_APPLY,
  type ApplyInput,
  type ApplyResult,
  type RecordUpdateInput,
  type FieldManagerScope,
} from './fieldmanager.js';
export { updateLastApplied, LAST_APPLIED_ANNOTATION } from './lastapplied.js';
export { conflictError } from './conflicts.js';
export { FieldSet, pathString, peKey, parsePeKey, type Path, type PathElement } from './fieldset.js';
export {
  decodeManagedFields,
  encodeManagedFields,
  managerId,
  type ManagerSet,
  MAX_UPDATE_MANAGERS,
  ANCIENT_CHANGES,
} from './managed.js';
