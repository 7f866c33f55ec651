// The one seam between the registry and field management (metadata.managedFields): the
// registry calls only `FieldManagerHooks`; the default delegates to the server-side apply
// implementation in runtime/apiserver/fieldmanager/ (kube's field manager semantics).
import type { KindDefinition } from '../../apis/types.js';
import type { KubeObject, ManagedFieldsEntry } from '../meta/types.js';
import { apply, recordUpdate } from './fieldmanager/index.js';

export interface FieldManagerHooks {
  /**
   * A non-apply write (create, update, merge/JSON patch) by `manager`: returns the new
   * managedFields for `next` (prev undefined on create). `next.metadata.managedFields` is
   * what the client sent: a non-empty valid value replaces the stored entries, `[{}]` clears
   * them (kube's rule). Never throws for admitted objects.
   */
  update(
    def: KindDefinition,
    prev: KubeObject | undefined,
    next: KubeObject,
    manager: string,
    subresource: string | undefined,
    now: string,
  ): ManagedFieldsEntry[] | undefined;
  /**
   * Server-side apply of `applied` (the user's configuration) onto `live` (undefined when the
   * object does not exist yet). Returns the merged object with its managedFields. Throws 409
   * Conflict (details.causes reason FieldManagerConflict) unless `force`; 400 for a
   * configuration of another kind or one carrying managedFields.
   */
  apply(
    def: KindDefinition,
    live: KubeObject | undefined,
    applied: KubeObject,
    manager: string,
    force: boolean,
    subresource: string | undefined,
    now: string,
  ): KubeObject;
}

const apiVersionOf = (def: KindDefinition) => (def.group ? `${def.group}/${def.version}` : def.version);

export const defaultFieldManager: FieldManagerHooks = {
  update(def, prev, next, manager, subresource, now) {
    return recordUpdate({
      schema: def.schema,
      apiVersion: apiVersionOf(def),
      subresource,
      statusSubresource: def.statusSubresource,
      oldObj: prev,
      newObj: next,
      manager,
      now,
    });
  },
  apply(def, live, applied, manager, force, subresource, now) {
    return apply({
      schema: def.schema,
      apiVersion: apiVersionOf(def),
      subresource,
      statusSubresource: def.statusSubresource,
      live,
      config: applied,
      manager,
      force,
      now,
      kind: def.kind,
    }).object;
  },
};
