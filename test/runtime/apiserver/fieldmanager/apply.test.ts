import { expect } from 'chai';
import {
  apply,
  recordUpdate,
  withManagedFields,
  LAST_APPLIED_ANNOTATION,
  type ApplyResult,
} from '../../../../runtime/apiserver/fieldmanager/index.js';
import { StatusError } from '../../../../runtime/meta/errors.js';
import type { KubeObject, ManagedFieldsEntry } from '../../../../runtime/meta/types.js';
import { AV, T0, T1, T2, T3, sbx, schema, stored } from './testschema.js';
import type { AnyObject } from '../../../support/objects.js';

function doApply(
  live: KubeObject | undefined,
  config: KubeObject,
  manager: string,
  now: string,
  opts: { force?: boolean; subresource?: string } = {},
): ApplyResult & { object: AnyObject } {
  return apply({
    live,
    config,
    manager,
    force: opts.force ?? false,
    now,
    schema,
    apiVersion: AV,
    subresource: opts.subresource,
    kind: 'Sandbox',
  });
}

function update(
  oldObj: KubeObject | undefined,
  newObj: KubeObject,
  manager: string,
  now: string,
  subresource?: string,
): KubeObject {
  const mf = recordUpdate({ oldObj, newObj, manager, now, schema, apiVersion: AV, subresource });
  return withManagedFields(newObj, mf);
}

function conflictOf(fn: () => unknown): StatusError {
  try {
    fn();
  } catch (e) {
    expect(e).to.be.instanceOf(StatusError);
    return e as StatusError;
  }
  throw new Error('expected a conflict');
}

const applyEntry = (
  manager: string,
  fieldsV1: Record<string, unknown>,
  time: string,
  extra: Partial<ManagedFieldsEntry> = {},
): ManagedFieldsEntry => ({
  manager,
  operation: 'Apply',
  apiVersion: AV,
  time,
  fieldsType: 'FieldsV1',
  fieldsV1,
  ...extra,
});

describe('fieldmanager/apply', () => {
  describe('create and no-op', () => {
    it('creates an absent object from the configuration, the applier owning its fields (no ".")', () => {
      const r = doApply(
        undefined,
        sbx({ image: 'a', network: { mode: 'none' } }, { labels: { app: 'x' } }),
        'kubectl',
        T0,
      );
      expect(r.changed).to.equal(true);
      expect(r.object.spec).to.deep.equal({ image: 'a', network: { mode: 'none' } });
      expect(r.object.metadata.labels).to.deep.equal({ app: 'x' });
      expect(r.managedFields).to.deep.equal([
        applyEntry(
          'kubectl',
          { 'f:metadata': { 'f:labels': { 'f:app': {} } }, 'f:spec': { 'f:image': {}, 'f:network': { 'f:mode': {} } } },
          T0,
        ),
      ]);
      expect(r.object.metadata.managedFields).to.deep.equal(r.managedFields);
    });

    it('applying the same configuration again changes nothing, not even the time', () => {
      const cfg = sbx({ image: 'a' });
      const v1 = stored(doApply(undefined, cfg, 'kubectl', T0).object);
      const r = doApply(v1, cfg, 'kubectl', T1);
      expect(r.changed).to.equal(false);
      expect(r.object).to.deep.equal(v1);
    });

    it('keeps server-owned metadata and fields nobody applied', () => {
      const v1 = stored(doApply(undefined, sbx({ image: 'a' }, { labels: { a: '1' } }), 'kubectl', T0).object);
      const r = doApply(v1, sbx({ image: 'b' }), 'kubectl', T1);
      expect(r.object.metadata).to.include({
        name: 'demo',
        namespace: 'default',
        uid: 'u-1',
        resourceVersion: '7',
        generation: 1,
      });
      expect(r.object.metadata.labels).to.equal(undefined);
    });
  });

  describe('conflicts', () => {
    const base = () =>
      update(
        undefined,
        stored(sbx({ image: 'a', runtime: 'procbox', paused: false })),
        'kubectl-client-side-apply',
        T0,
      );

    it('a different value for a field another (Update) manager owns is a 409 naming field and manager', () => {
      const err = conflictOf(() => doApply(base(), sbx({ image: 'b' }), 'kubectl', T1));
      expect(err.status).to.deep.equal({
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message:
          'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using fluxvm.dev/v1alpha1: .spec.image',
        reason: 'Conflict',
        details: {
          causes: [
            {
              reason: 'FieldManagerConflict',
              message: 'conflict with "kubectl-client-side-apply" using fluxvm.dev/v1alpha1',
              field: '.spec.image',
            },
          ],
        },
        code: 409,
      });
    });

    it('the same value is shared ownership, not a conflict', () => {
      const r = doApply(base(), sbx({ image: 'a' }), 'kubectl', T1);
      expect(r.changed).to.equal(false);
      expect(r.managedFields.map((e) => [e.manager, e.fieldsV1])).to.deep.equal([
        ['kubectl', { 'f:spec': { 'f:image': {} } }],
        ['kubectl-client-side-apply', { 'f:spec': { '.': {}, 'f:image': {}, 'f:paused': {}, 'f:runtime': {} } }],
      ]);
    });

    it('several conflicts with several managers: kube message, managers sorted; Apply managers print without apiVersion', () => {
      let v = base();
      v = doApply(v, sbx({ ttlSeconds: 5 }), 'gitops', T1).object;
      const err = conflictOf(() => doApply(v, sbx({ image: 'b', runtime: 'vm', ttlSeconds: 9 }), 'kubectl', T2));
      expect(err.code).to.equal(409);
      expect(err.message).to.equal(
        'Apply failed with 3 conflicts: conflicts with "gitops":\n- .spec.ttlSeconds\nconflicts with "kubectl-client-side-apply" using fluxvm.dev/v1alpha1:\n- .spec.image\n- .spec.runtime',
      );
      expect(err.status.details?.causes).to.deep.equal([
        { reason: 'FieldManagerConflict', message: 'conflict with "gitops"', field: '.spec.ttlSeconds' },
        {
          reason: 'FieldManagerConflict',
          message: 'conflict with "kubectl-client-side-apply" using fluxvm.dev/v1alpha1',
          field: '.spec.image',
        },
        {
          reason: 'FieldManagerConflict',
          message: 'conflict with "kubectl-client-side-apply" using fluxvm.dev/v1alpha1',
          field: '.spec.runtime',
        },
      ]);
    });

    it('force takes ownership of the conflicting fields only', () => {
      const r = doApply(base(), sbx({ image: 'b', paused: false }), 'kubectl', T1, { force: true });
      expect(r.object.spec).to.deep.equal({ image: 'b', runtime: 'procbox', paused: false });
      expect(r.managedFields.map((e) => [e.manager, e.operation, e.fieldsV1])).to.deep.equal([
        ['kubectl', 'Apply', { 'f:spec': { 'f:image': {}, 'f:paused': {} } }],
        ['kubectl-client-side-apply', 'Update', { 'f:spec': { '.': {}, 'f:paused': {}, 'f:runtime': {} } }],
      ]);
    });

    it('an Update by another manager takes a field from an applier; the next apply conflicts with it', () => {
      const v1 = stored(doApply(undefined, sbx({ image: 'a' }), 'kubectl', T0).object);
      const v2 = update(v1, { ...v1, spec: { image: 'hotfix' } }, 'kubectl-edit', T1);
      expect(v2.metadata.managedFields!.map((e) => e.manager)).to.deep.equal(['kubectl-edit']);
      const err = conflictOf(() => doApply(v2, sbx({ image: 'a' }), 'kubectl', T2));
      expect(err.message).to.equal(
        'Apply failed with 1 conflict: conflict with "kubectl-edit" using fluxvm.dev/v1alpha1: .spec.image',
      );
    });

    it('a status-subresource owner is named with its subresource', () => {
      const v1 = stored(sbx({ image: 'a' }));
      const v2 = update(v1, { ...v1, status: { phase: 'Running' } }, 'controller', T1, 'status');
      const err = conflictOf(() =>
        doApply(v2, { ...sbx(), status: { phase: 'Failed' } }, 'kubectl', T2, { subresource: 'status' }),
      );
      expect(err.message).to.equal(
        'Apply failed with 1 conflict: conflict with "controller" with subresource "status" using fluxvm.dev/v1alpha1: .status.phase',
      );
    });
  });

  describe('removal of fields the applier stopped applying', () => {
    it('a field applied before and omitted now is removed', () => {
      const v1 = stored(
        doApply(undefined, sbx({ image: 'a', ttlSeconds: 5, network: { mode: 'none' } }), 'kubectl', T0).object,
      );
      const r = doApply(v1, sbx({ image: 'a' }), 'kubectl', T1);
      expect(r.object.spec).to.deep.equal({ image: 'a' });
      expect(r.managedFields).to.deep.equal([applyEntry('kubectl', { 'f:spec': { 'f:image': {} } }, T1)]);
    });

    it('a field also owned by another applier stays; only ownership is dropped', () => {
      let v = stored(doApply(undefined, sbx({ image: 'a', ttlSeconds: 5 }), 'a', T0).object);
      v = doApply(v, sbx({ ttlSeconds: 5 }), 'b', T1).object;
      const r = doApply(v, sbx({ image: 'a' }), 'a', T2);
      expect(r.object.spec).to.deep.equal({ image: 'a', ttlSeconds: 5 });
      // Nothing changed in the object, so a's entry keeps its time (T0) and sorts first.
      expect(r.changed).to.equal(false);
      expect(r.managedFields.map((e) => [e.manager, e.time, e.fieldsV1])).to.deep.equal([
        ['a', T0, { 'f:spec': { 'f:image': {} } }],
        ['b', T1, { 'f:spec': { 'f:ttlSeconds': {} } }],
      ]);
    });

    it('a field also owned by an Update manager stays', () => {
      let v = stored(doApply(undefined, sbx({ image: 'a', ttlSeconds: 5 }), 'kubectl', T0).object);
      v = update(v, { ...v, spec: { image: 'a', ttlSeconds: 6 } }, 'kubectl-edit', T1);
      const r = doApply(v, sbx({ image: 'a' }), 'kubectl', T2);
      expect(r.object.spec).to.deep.equal({ image: 'a', ttlSeconds: 6 });
    });

    it('labels and annotations are removed like any field', () => {
      const v1 = stored(doApply(undefined, sbx({ image: 'a' }, { labels: { a: '1', b: '2' } }), 'kubectl', T0).object);
      const r = doApply(v1, sbx({ image: 'a' }, { labels: { a: '1' } }), 'kubectl', T1);
      expect(r.object.metadata.labels).to.deep.equal({ a: '1' });
    });

    it('an object emptied by removals disappears (its owner of the container alone keeps nothing)', () => {
      const live = withManagedFields(stored(sbx({ image: 'a', env: { FOO: '1' } })), [
        applyEntry('a', { 'f:spec': { 'f:env': { 'f:FOO': {} }, 'f:image': {} } }, T0),
        {
          manager: 'b',
          operation: 'Update',
          apiVersion: AV,
          time: T0,
          fieldsType: 'FieldsV1',
          fieldsV1: { 'f:spec': { 'f:env': { '.': {} } } },
        },
      ]);
      const r = doApply(live, sbx({ image: 'a' }), 'a', T1);
      expect(r.object.spec).to.deep.equal({ image: 'a' });
      expect(r.managedFields).to.deep.equal([applyEntry('a', { 'f:spec': { 'f:image': {} } }, T1)]);
    });

    it('an applier that applies nothing removes everything it solely owned', () => {
      let v = stored(doApply(undefined, sbx({ image: 'a', runtime: 'vm' }), 'kubectl', T0).object);
      v = doApply(v, sbx({ paused: true }), 'other', T1).object;
      const r = doApply(v, { apiVersion: AV, kind: 'Sandbox', metadata: { name: 'demo' } }, 'kubectl', T2);
      expect(r.object.spec).to.deep.equal({ paused: true });
      expect(r.object.metadata.uid).to.equal('u-1');
      expect(r.managedFields.find((e) => e.manager === 'kubectl')?.fieldsV1).to.deep.equal({});
    });
  });

  describe('merging lists and maps', () => {
    it('map-lists merge by key; an item no longer applied is removed when solely owned', () => {
      const ports1 = [
        { port: 80, protocol: 'TCP', name: 'http' },
        { port: 53, protocol: 'UDP' },
      ];
      let v = stored(doApply(undefined, sbx({ ports: ports1 }), 'a', T0).object);
      v = doApply(v, sbx({ ports: [{ port: 22, protocol: 'TCP' }] }), 'b', T1).object;
      expect(v.spec.ports).to.deep.equal([...ports1, { port: 22, protocol: 'TCP' }]);
      const r = doApply(v, sbx({ ports: [{ port: 80, name: 'web' }] }), 'a', T2);
      // protocol was applied before and is omitted now: removed (defaulting would restore it).
      expect(r.object.spec.ports).to.deep.equal([
        { port: 80, name: 'web' },
        { port: 22, protocol: 'TCP' },
      ]);
    });

    it('map-list item owned by another manager survives; its other fields leave with the applier', () => {
      let v = stored(doApply(undefined, sbx({ ports: [{ port: 80, name: 'http' }] }), 'a', T0).object);
      v = doApply(v, sbx({ ports: [{ port: 80 }] }), 'b', T1).object;
      const r = doApply(v, sbx({ image: 'x' }), 'a', T2);
      expect(r.object.spec.ports).to.deep.equal([{ port: 80 }]);
    });

    it('conditions (map-list keyed by type) on the status subresource', () => {
      const v1 = stored(sbx({ image: 'a' }));
      const cfg = (conds: unknown[]) => ({ ...sbx(), status: { conditions: conds } });
      let r = doApply(
        v1,
        cfg([
          { type: 'Ready', status: 'True' },
          { type: 'Synced', status: 'False' },
        ]),
        'ctl',
        T1,
        { subresource: 'status' },
      );
      expect(r.managedFields).to.deep.equal([
        applyEntry(
          'ctl',
          {
            'f:status': {
              'f:conditions': {
                'k:{"type":"Ready"}': { '.': {}, 'f:status': {}, 'f:type': {} },
                'k:{"type":"Synced"}': { '.': {}, 'f:status': {}, 'f:type': {} },
              },
            },
          },
          T1,
          { subresource: 'status' },
        ),
      ]);
      r = doApply(r.object, cfg([{ type: 'Ready', status: 'False', reason: 'Down' }]), 'ctl', T2, {
        subresource: 'status',
      });
      expect(r.object.status.conditions).to.deep.equal([{ type: 'Ready', status: 'False', reason: 'Down' }]);
      expect(r.object.spec).to.deep.equal({ image: 'a' });
    });

    it('set-lists merge by value; values no longer applied are removed', () => {
      let v = stored(doApply(undefined, sbx({ tags: ['a', 'b'] }), 'x', T0).object);
      v = doApply(v, sbx({ tags: ['c'] }), 'y', T1).object;
      expect(v.spec.tags).to.deep.equal(['a', 'b', 'c']);
      const r = doApply(v, sbx({ tags: ['b', 'd'] }), 'x', T2);
      expect(r.object.spec.tags).to.deep.equal(['b', 'c', 'd']);
    });

    it('list order: shared items follow the configuration, items only in live keep their place', () => {
      const live = update(undefined, stored(sbx({ tags: ['a', 'b', 'c'] })), 'x', T0);
      expect(doApply(live, sbx({ tags: ['c', 'a'] }), 'y', T1).object.spec.tags).to.deep.equal(['b', 'c', 'a']);
      expect(doApply(live, sbx({ tags: ['d', 'b'] }), 'y', T1).object.spec.tags).to.deep.equal(['a', 'd', 'b', 'c']);
    });

    it('atomic lists and maps are replaced whole, and owned as one field', () => {
      let v = stored(
        doApply(undefined, sbx({ command: ['a', 'b'], resources: { cpu: '1', memory: '1Gi' } }), 'x', T0).object,
      );
      let r = doApply(v, sbx({ command: ['c'], resources: { cpu: '2' } }), 'x', T1);
      expect(r.object.spec).to.deep.equal({ command: ['c'], resources: { cpu: '2' } });
      v = r.object;
      const err = conflictOf(() => doApply(v, sbx({ command: ['d'] }), 'y', T2));
      expect(err.message).to.equal('Apply failed with 1 conflict: conflict with "x": .spec.command');
      r = doApply(v, sbx({ command: ['c'] }), 'y', T2);
      expect(r.managedFields.map((e) => e.manager)).to.deep.equal(['x', 'y']);
    });

    it('nested objects merge field by field; granular maps entry by entry', () => {
      let v = stored(doApply(undefined, sbx({ network: { mode: 'allowList' }, env: { A: '1' } }), 'x', T0).object);
      v = doApply(v, sbx({ network: { allow: ['github.com'] }, env: { B: '2' } }), 'y', T1).object;
      expect(v.spec).to.deep.equal({ network: { mode: 'allowList', allow: ['github.com'] }, env: { A: '1', B: '2' } });
      const r = doApply(v, sbx({}), 'x', T2);
      expect(r.object.spec).to.deep.equal({ network: { allow: ['github.com'] }, env: { B: '2' } });
    });

    it('preserve-unknown-fields content merges granularly', () => {
      let v = stored(doApply(undefined, sbx({ extra: { a: { b: 1 }, l: [1] } }), 'x', T0).object);
      v = doApply(v, sbx({ extra: { a: { c: 2 }, l: [1] } }), 'y', T1).object;
      expect(v.spec.extra).to.deep.equal({ a: { b: 1, c: 2 }, l: [1] });
    });
  });

  describe('scope', () => {
    it('status in a main-resource apply is ignored when the kind has a status subresource', () => {
      const v1 = update(undefined, stored(sbx({ image: 'a' }, {}, { phase: 'Running' })), 'c', T0);
      const r = doApply(v1, sbx({ image: 'a' }, {}, { phase: 'Failed' }), 'kubectl', T1);
      expect(r.object.status).to.deep.equal({ phase: 'Running' });
      expect(r.managedFields.find((e) => e.manager === 'kubectl')?.fieldsV1).to.deep.equal({
        'f:spec': { 'f:image': {} },
      });
    });

    it('a status apply changes only status and never removes spec', () => {
      const v1 = stored(doApply(undefined, sbx({ image: 'a' }, { labels: { x: 'y' } }), 'kubectl', T0).object);
      const r = doApply(v1, { ...sbx({ image: 'zzz' }, { labels: {} }), status: { phase: 'Running' } }, 'kubectl', T1, {
        subresource: 'status',
      });
      expect(r.object.spec).to.deep.equal({ image: 'a' });
      expect(r.object.metadata.labels).to.deep.equal({ x: 'y' });
      expect(r.object.status).to.deep.equal({ phase: 'Running' });
      expect(r.managedFields.map((e) => [e.manager, e.subresource ?? ''])).to.deep.equal([
        ['kubectl', ''],
        ['kubectl', 'status'],
      ]);
    });
  });

  describe('bad requests', () => {
    it('a wrong apiVersion or kind is 400 invalid object type', () => {
      const e1 = conflictOf(() => doApply(undefined, { ...sbx(), apiVersion: 'fluxvm.dev/v2' }, 'k', T0));
      expect([e1.code, e1.reason, e1.message]).to.deep.equal([
        400,
        'BadRequest',
        'invalid object type: fluxvm.dev/v2, Kind=Sandbox',
      ]);
      const e2 = conflictOf(() => doApply(undefined, { ...sbx(), kind: 'Grant' }, 'k', T0));
      expect(e2.message).to.equal('invalid object type: fluxvm.dev/v1alpha1, Kind=Grant');
    });
    it('stored managedFields that do not decode are a 500 naming the entry', () => {
      const live = withManagedFields(stored(sbx({ image: 'a' })), [
        { ...applyEntry('x', {}, T0), fieldsType: 'FieldsV2' as 'FieldsV1' },
      ]);
      const e = conflictOf(() => doApply(live, sbx({ image: 'b' }), 'k', T1));
      expect([e.code, e.message]).to.deep.equal([
        500,
        'failed to decode managed fields: invalid fieldsType "FieldsV2" in managed fields entry 0',
      ]);
    });
    it('managedFields in the configuration is 400', () => {
      const e = conflictOf(() => doApply(undefined, withManagedFields(sbx(), [applyEntry('x', {}, T0)]), 'k', T0));
      expect([e.code, e.message]).to.deep.equal([400, 'metadata.managedFields must be nil']);
    });
  });

  it('an object without managedFields: existing fields belong to before-first-apply', () => {
    const v1 = stored(sbx({ image: 'a', runtime: 'vm' }));
    const err = conflictOf(() => doApply(v1, sbx({ image: 'b' }), 'kubectl', T1));
    expect(err.message).to.equal(
      'Apply failed with 1 conflict: conflict with "before-first-apply" using fluxvm.dev/v1alpha1: .spec.image',
    );
    const r = doApply(v1, sbx({ image: 'a' }), 'kubectl', T1);
    expect(r.managedFields.map((e) => e.manager)).to.deep.equal(['kubectl', 'before-first-apply']);
  });

  describe('last-applied annotation', () => {
    it('kubectl rewrites an existing annotation from the applied configuration', () => {
      const v1 = update(
        undefined,
        stored(sbx({ image: 'a' }, { annotations: { [LAST_APPLIED_ANNOTATION]: '{"old":1}\n', keep: 'me' } })),
        'csa',
        T0,
      );
      const cfg = sbx({ image: 'a', command: ['x<y'] }, { annotations: { keep: 'me' } });
      const r = doApply(v1, cfg, 'kubectl', T1);
      expect(r.object.metadata.annotations).to.deep.equal({
        [LAST_APPLIED_ANNOTATION]:
          '{"apiVersion":"fluxvm.dev/v1alpha1","kind":"Sandbox","metadata":{"annotations":{"keep":"me"},"name":"demo","namespace":"default"},"spec":{"command":["x\\u003cy"],"image":"a"}}\n',
        keep: 'me',
      });
    });
    it('other managers and objects without the annotation are left alone', () => {
      const v1 = update(
        undefined,
        stored(sbx({ image: 'a' }, { annotations: { [LAST_APPLIED_ANNOTATION]: 'x' } })),
        'csa',
        T0,
      );
      expect(doApply(v1, sbx({ image: 'a' }), 'helm', T1).object.metadata.annotations).to.deep.equal({
        [LAST_APPLIED_ANNOTATION]: 'x',
      });
      const v2 = stored(doApply(undefined, sbx({ image: 'a' }), 'kubectl', T0).object);
      expect(doApply(v2, sbx({ image: 'b' }), 'kubectl', T1).object.metadata.annotations).to.equal(undefined);
    });
  });

  it('end to end: client-side apply, then server-side apply conflicts, force, then removal', () => {
    // kubectl apply (client-side): create with the Update manager kubectl-client-side-apply.
    const manifest = sbx({ image: 'debian:12', runtime: 'procbox', ttlSeconds: 600 });
    let live: AnyObject = update(undefined, stored(manifest), 'kubectl-client-side-apply', T0);
    expect(live.metadata.managedFields).to.deep.equal([
      {
        manager: 'kubectl-client-side-apply',
        operation: 'Update',
        apiVersion: AV,
        time: T0,
        fieldsType: 'FieldsV1',
        fieldsV1: { 'f:spec': { '.': {}, 'f:image': {}, 'f:runtime': {}, 'f:ttlSeconds': {} } },
      },
    ]);

    // kubectl apply --server-side with a changed image: conflict naming the CSA manager.
    const changed = sbx({ image: 'debian:13', runtime: 'procbox', ttlSeconds: 600 });
    const err = conflictOf(() => doApply(live, changed, 'kubectl', T1));
    expect(err.status.details?.causes).to.deep.equal([
      {
        reason: 'FieldManagerConflict',
        message: 'conflict with "kubectl-client-side-apply" using fluxvm.dev/v1alpha1',
        field: '.spec.image',
      },
    ]);

    // --force-conflicts: ownership of the image moves; the equal fields are shared.
    let r = doApply(live, changed, 'kubectl', T1, { force: true });
    live = r.object;
    expect(live.spec.image).to.equal('debian:13');
    expect(r.managedFields.map((e) => [e.manager, e.operation, e.fieldsV1])).to.deep.equal([
      ['kubectl', 'Apply', { 'f:spec': { 'f:image': {}, 'f:runtime': {}, 'f:ttlSeconds': {} } }],
      ['kubectl-client-side-apply', 'Update', { 'f:spec': { '.': {}, 'f:runtime': {}, 'f:ttlSeconds': {} } }],
    ]);

    // kubectl migrates: it replaces managedFields so that kubectl owns what CSA owned (PATCH).
    const migrated = withManagedFields(live, [
      applyEntry('kubectl', { 'f:spec': { 'f:image': {}, 'f:runtime': {}, 'f:ttlSeconds': {} } }, T2),
    ]);
    live = withManagedFields(
      live,
      recordUpdate({ oldObj: live, newObj: migrated, manager: 'kubectl', now: T2, schema, apiVersion: AV }),
    );
    expect(live.metadata.managedFields!.map((e) => e.manager)).to.deep.equal(['kubectl']);

    // Applying without ttlSeconds removes it.
    r = doApply(live, sbx({ image: 'debian:13', runtime: 'procbox' }), 'kubectl', T3);
    expect(r.object.spec).to.deep.equal({ image: 'debian:13', runtime: 'procbox' });
    expect(r.managedFields).to.deep.equal([
      applyEntry('kubectl', { 'f:spec': { 'f:image': {}, 'f:runtime': {} } }, T3),
    ]);
  });

  it("kubectl's own migration sequence (docs/reference/kubernetes-api.md section 4) runs without conflicts and ends with kubectl owning the fields", () => {
    const ann = (v: string) => ({ annotations: { [LAST_APPLIED_ANNOTATION]: v } });
    const csaBody = sbx({ image: 'debian:12', ttlSeconds: 600 }, ann('{"csa":1}\n'));
    let live: AnyObject = update(undefined, stored(csaBody), 'kubectl-client-side-apply', T0);

    // 1. PATCH apply by kubectl (same values): shared ownership; kubectl rewrites the annotation.
    const manifest = sbx({ image: 'debian:12', ttlSeconds: 600 });
    live = doApply(live, manifest, 'kubectl', T1).object;
    const rewritten = live.metadata.annotations![LAST_APPLIED_ANNOTATION];
    expect(JSON.parse(rewritten)).to.deep.equal(manifest);

    // 2. No Apply manager owns the annotation: kubectl-last-applied applies just the annotation.
    live = doApply(
      live,
      { apiVersion: AV, kind: 'Sandbox', metadata: { name: 'demo', ...ann(rewritten) } },
      'kubectl-last-applied',
      T1,
    ).object;

    // 3. json-patch of managedFields: kubectl's Apply entry takes the union of its and CSA's sets.
    const mf = live.metadata.managedFields!;
    const csa = mf.find((e) => e.manager === 'kubectl-client-side-apply')!;
    const kubectl = mf.find((e) => e.manager === 'kubectl')!;
    expect(csa.fieldsV1).to.deep.equal({
      'f:metadata': { 'f:annotations': { '.': {}, [`f:${LAST_APPLIED_ANNOTATION}`]: {} } },
      'f:spec': { '.': {}, 'f:image': {}, 'f:ttlSeconds': {} },
    });
    const merged = {
      ...kubectl,
      fieldsV1: {
        'f:metadata': { 'f:annotations': { '.': {}, [`f:${LAST_APPLIED_ANNOTATION}`]: {} } },
        'f:spec': { '.': {}, 'f:image': {}, 'f:ttlSeconds': {} },
      },
    };
    const patched = withManagedFields(live, [merged, ...mf.filter((e) => e !== csa && e !== kubectl)]);
    live = withManagedFields(
      live,
      recordUpdate({ oldObj: live, newObj: patched, manager: 'kubectl', now: T2, schema, apiVersion: AV }),
    );
    expect(live.metadata.managedFields!.map((e) => e.manager)).to.deep.equal(['kubectl', 'kubectl-last-applied']);

    // 4. The apply again: what CSA applied and the manifest omits goes; the annotation stays.
    const r = doApply(live, sbx({ image: 'debian:13' }), 'kubectl', T3);
    expect(r.object.spec).to.deep.equal({ image: 'debian:13' });
    expect(JSON.parse(r.object.metadata.annotations![LAST_APPLIED_ANNOTATION])).to.deep.equal(
      sbx({ image: 'debian:13' }),
    );
    expect(r.managedFields.map((e) => [e.manager, e.fieldsV1])).to.deep.equal([
      ['kubectl-last-applied', { 'f:metadata': { 'f:annotations': { [`f:${LAST_APPLIED_ANNOTATION}`]: {} } } }],
      ['kubectl', { 'f:spec': { 'f:image': {} } }],
    ]);
  });
});
