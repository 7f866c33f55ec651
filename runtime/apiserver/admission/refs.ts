// Same-namespace references: a top-level `spec.<x>Ref` whose schema has a `namespace` property
// may name only the object's own namespace (or leave it out). Another namespace is a 422 with a
// FieldValueForbidden cause on `spec.<x>Ref.namespace`, whether or not anything of that name
// exists there (no existence oracle across tenants). A schema declares such a reference by giving
// the ref a `namespace` property (apis/agentsandbox.ts sameNamespaceRef); refs without one do not
// accept the field at all. CRD mode cannot express this rule (CEL cannot read metadata.namespace):
// there the controllers resolve every reference in the object's namespace, so a foreign name
// resolves as absent.
import type { KindDefinition } from '../../../apis/types.js';
import type { StatusCause } from '../../meta/types.js';
import { isPlainObject } from './paths.js';

export function checkSameNamespaceRefs(def: KindDefinition, obj: Record<string, unknown>): StatusCause[] {
  const specSchema = def.schema.properties?.spec?.properties;
  if (!def.namespaced || !specSchema || !isPlainObject(obj.spec)) return [];
  const meta = isPlainObject(obj.metadata) ? obj.metadata : {};
  const ns = typeof meta.namespace === 'string' ? meta.namespace : '';
  const causes: StatusCause[] = [];
  for (const [k, sub] of Object.entries(specSchema)) {
    if (!k.endsWith('Ref') || !sub.properties?.namespace) continue;
    const ref = obj.spec[k];
    if (!isPlainObject(ref) || ref.namespace === undefined || ref.namespace === ns) continue;
    causes.push({
      reason: 'FieldValueForbidden',
      field: `spec.${k}.namespace`,
      message: `Forbidden: may not refer to another namespace (${JSON.stringify(ref.namespace)}): it is visible only to its own namespace "${ns}"`,
    });
  }
  return causes;
}
