// Create (POST, and server-side apply of an object that does not exist yet): name generation,
// the namespace checks, server-owned metadata, the kind's strategy, field-level authorization,
// admission, managedFields, dryRun and the store's create.
import { randomUUID } from 'node:crypto';
import type { KindDefinition } from '../../apis/types.js';
import type { WriteOptions } from '../client/client.js';
import { errors } from '../meta/errors.js';
import type { KubeObject } from '../meta/types.js';
import { StoreConflict } from '../store/store.js';
import { SERVER_OWNED_META_FIELDS } from './admission/metadata.js';
import { stageCoWrites } from './registry-cowrite.js';
import { GENERATE_SUFFIX } from './registry-meta.js';
import type { RequestContext, WriteResult } from './registry-types.js';
import {
  checkBodyShape,
  checkSize,
  managedFieldsFor,
  managerOf,
  objectKey,
  requireNamespace,
  validateMeta,
  type AppliedCreate,
  type RegistryCore,
} from './registry-write.js';

/**
 * Creates `body` as an object of `def` in `namespace` (or the body's). `applied` is set for
 * an upserting apply: the body is the applied configuration and managedFields come from the
 * field manager's apply. Throws 400 (shape, namespace mismatch), 403 (terminating namespace,
 * the guard), 404 (no namespace), 409 AlreadyExists, 413, 422; stores nothing on error or dryRun.
 */
export async function createObject(
  core: RegistryCore,
  def: KindDefinition,
  namespace: string | undefined,
  body: KubeObject,
  opts: WriteOptions,
  ctx: RequestContext,
  applied: AppliedCreate | undefined,
): Promise<WriteResult> {
  const strategy = core.strategy(def);
  let obj = checkBodyShape(def, body);
  const m = obj.metadata;
  let ns = '';
  if (def.namespaced) {
    if (namespace && m.namespace && m.namespace !== namespace)
      throw errors.badRequest('the namespace of the provided object does not match the namespace sent on the request');
    ns = requireNamespace(def, namespace || m.namespace);
    m.namespace = ns;
  } else {
    delete m.namespace;
  }
  if (!m.name) {
    if (m.generateName && typeof m.generateName === 'string') {
      m.name =
        m.generateName +
        Array.from({ length: 5 }, () => GENERATE_SUFFIX[Math.floor(Math.random() * GENERATE_SUFFIX.length)]).join('');
    } else {
      throw errors.invalid(def.kind, def.group, '', [
        {
          reason: 'FieldValueRequired',
          field: 'metadata.name',
          message: 'Required value: name or generateName is required',
        },
      ]);
    }
  }
  validateMeta(def, strategy, obj);
  core.checkNamespaceWritable(def, ns, true);
  const clientMF = m.managedFields;
  // As on update (the field manager's rule): an applied configuration carries no managedFields.
  if (applied && clientMF !== undefined && clientMF !== null)
    throw errors.badRequest('metadata.managedFields must be nil');
  for (const f of [...SERVER_OWNED_META_FIELDS, 'managedFields']) delete (m as Record<string, unknown>)[f];
  if (def.statusSubresource) delete obj.status;
  const manager = applied?.manager ?? managerOf(opts, ctx);
  if (applied) obj = core.fm.apply(def, undefined, obj, manager, applied.force, applied.subresource, core.timestamp());
  const appliedMF = obj.metadata.managedFields;
  obj.metadata.uid = randomUUID();
  obj.metadata.creationTimestamp = core.timestamp();
  obj.metadata.generation = 1;
  strategy.prepareForCreate(obj);
  strategy.canonicalize(obj);
  // Field-level authorization before admission: a 403 comes before a 422, as in kube.
  if (core.guard) await core.guard(def, undefined, obj, ctx, undefined);
  const admitted = await core.admit(def, obj, undefined, {
    fieldValidation: opts.fieldValidation,
    subresource: undefined,
  });
  obj = admitted.object;
  delete obj.metadata.managedFields;
  const mf = applied ? appliedMF : managedFieldsFor(core, def, undefined, obj, clientMF, manager, undefined);
  if (mf && mf.length) obj.metadata.managedFields = mf;
  const key = objectKey(def, ns, obj.metadata.name!);
  // Quota: 403 past a ResourceQuota; no await from here to the staging below (admission/quota.ts).
  const charged = core.quota?.charge(def, key, obj, undefined);
  if (opts.dryRun) {
    checkSize(core, obj);
    return { object: obj, created: true, warnings: admitted.warnings };
  }
  // Re-check the namespace after the await: it may have been deleted meanwhile.
  core.checkNamespaceWritable(def, ns, true);
  ctx.beforeStore?.(obj);
  // A kind's co-writes (registry-cowrite.ts): read, checked and staged right before the create, in
  // this synchronous run; they may set the object's status.
  stageCoWrites(core, core.coWriters, def, key, obj);
  try {
    // The store checks the size on the JSON it writes anyway (413, nothing staged).
    const staged = core.store.enqueueCreate(key, obj, { maxBytes: core.maxBytes });
    const out = await (charged ? charged(staged) : staged);
    return { object: out, created: true, warnings: admitted.warnings, json: core.store.writtenJSON(out) };
  } catch (e) {
    if (e instanceof StoreConflict) throw errors.alreadyExists(def.plural, def.group, obj.metadata.name!);
    throw e;
  }
}
