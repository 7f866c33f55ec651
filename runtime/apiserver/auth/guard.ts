// The field guard (the registry's WriteGuard): fields a kind gives to a field subresource
// (`Changeset.fieldSubresources.approval = ['spec.decision', 'spec.apply']`) may be changed by a
// write of the main resource, or set on create, only by a user who may `update` that
// subresource. Anyone else gets a 403 naming the fields and the permission they lack, and
// nothing is written. In-process writes (controllers: no user on the context) are trusted.
import { StatusError } from '../../meta/errors.js';
import { qualifiedResource } from '../../meta/errors.js';
import type { WriteGuard } from '../registry.js';
import type { Authorizer } from '../http/auth.js';

function at(o: unknown, path: string[]): unknown {
  let v = o;
  for (const p of path) v = v !== null && typeof v === 'object' ? (v as Record<string, unknown>)[p] : undefined;
  return v;
}

export function fieldGuard(authorize: Authorizer): WriteGuard {
  return async (def, old, next, ctx, subresource) => {
    const subs = def.fieldSubresources;
    if (!subs || !ctx.user || subresource) return;
    for (const [sub, fields] of Object.entries(subs)) {
      const changed = fields.filter(
        (f) => JSON.stringify(at(old, f.split('.'))) !== JSON.stringify(at(next, f.split('.'))),
      );
      if (!changed.length) continue;
      const name = next.metadata?.name;
      const attrs = {
        user: ctx.user,
        resource: {
          verb: 'update',
          namespace: next.metadata?.namespace,
          group: def.group,
          version: def.version,
          resource: def.plural,
          subresource: sub,
          ...(name ? { name } : {}),
        },
      };
      const d = await authorize(attrs);
      if (d.allowed) continue;
      const qr = qualifiedResource(def.plural, def.group);
      throw new StatusError(
        403,
        'Forbidden',
        `${qr} "${name ?? ''}" is forbidden: User "${ctx.user.name}" cannot change ${changed.join(', ')}: ` +
          `only ${def.plural}/${sub} may (it needs verb update on resource "${def.plural}/${sub}" in API group "${def.group}"` +
          `${next.metadata?.namespace ? ` in the namespace "${next.metadata.namespace}"` : ''})`,
        {
          name,
          group: def.group,
          kind: def.plural,
          causes: changed.map((f) => ({
            reason: 'FieldValueForbidden',
            field: f,
            message: `Forbidden: may only be changed through the ${sub} subresource`,
          })),
        },
      );
    }
  };
}
