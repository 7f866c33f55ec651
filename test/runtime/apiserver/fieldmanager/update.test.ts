import { expect } from 'chai';
import { recordUpdate, ANCIENT_CHANGES, withManagedFields } from '../../../../runtime/apiserver/fieldmanager/index.js';
import type { KubeObject, ManagedFieldsEntry } from '../../../../runtime/meta/types.js';
import { AV, T0, T1, T2, sbx, schema, stored } from './testschema.js';
import { loose } from '../../../support/objects.js';

function entry(
  manager: string,
  fieldsV1: Record<string, unknown>,
  time = T0,
  extra: Partial<ManagedFieldsEntry> = {},
): ManagedFieldsEntry {
  return { manager, operation: 'Update', apiVersion: AV, time, fieldsType: 'FieldsV1', fieldsV1, ...extra };
}

function update(
  oldObj: KubeObject | undefined,
  newObj: KubeObject,
  manager: string,
  now: string,
  managedFields?: ManagedFieldsEntry[],
  subresource?: string,
) {
  return recordUpdate({ oldObj, newObj, manager, now, schema, apiVersion: AV, subresource, managedFields });
}

describe('fieldmanager/recordUpdate', () => {
  it('create: the creator owns every field it set; added objects are members (".")', () => {
    const obj = sbx({ image: 'debian:12', network: { mode: 'none' } }, { labels: { app: 'x' } });
    expect(update(undefined, obj, 'kubectl-create', T0)).to.deep.equal([
      entry('kubectl-create', {
        'f:metadata': { 'f:labels': { '.': {}, 'f:app': {} } },
        'f:spec': { '.': {}, 'f:image': {}, 'f:network': { '.': {}, 'f:mode': {} } },
      }),
    ]);
  });

  it('update: changed fields move to the writer, never a conflict; the old owner keeps the rest', () => {
    const v1 = stored(sbx({ image: 'a', runtime: 'procbox' }));
    const mf = update(undefined, v1, 'creator', T0);
    const v2 = { ...v1, spec: { image: 'b', runtime: 'procbox' } };
    expect(update(v1, withManagedFields(v2, []), 'kubectl-edit', T1, mf)).to.deep.equal([
      entry('creator', { 'f:spec': { '.': {}, 'f:runtime': {} } }, T0),
      entry('kubectl-edit', { 'f:spec': { 'f:image': {} } }, T1),
    ]);
  });

  it('update: an entry left empty is dropped; removed fields leave every entry', () => {
    const v1 = stored(sbx({ image: 'a', runtime: 'procbox' }));
    const mf = [entry('a', { 'f:spec': { 'f:image': {} } }), entry('b', { 'f:spec': { 'f:runtime': {} } })];
    const v2 = { ...v1, spec: { image: 'z' } };
    expect(update(v1, v2, 'c', T1, mf)).to.deep.equal([entry('c', { 'f:spec': { 'f:image': {} } }, T1)]);
  });

  it('update: a write that changes nothing tracked leaves the entries (and times) alone', () => {
    const v1 = stored(sbx({ image: 'a' }));
    const mf = update(undefined, v1, 'creator', T0);
    const v2 = { ...v1, metadata: { ...v1.metadata, resourceVersion: '8', generation: 2 } };
    expect(update(v1, v2, 'other', T2, mf)).to.deep.equal(mf);
  });

  it('update: the writer keeps earlier fields and its time moves to now', () => {
    const v1 = stored(sbx({ image: 'a' }));
    const mf = update(undefined, v1, 'w', T0);
    const v2 = { ...v1, spec: { image: 'a', paused: true } };
    expect(update(v1, v2, 'w', T1, mf)).to.deep.equal([
      entry('w', { 'f:spec': { '.': {}, 'f:image': {}, 'f:paused': {} } }, T1),
    ]);
  });

  it('update: map-list item fields move individually; list item removal clears it from all', () => {
    const v1 = stored(
      sbx({
        ports: [
          { port: 80, protocol: 'TCP', name: 'http' },
          { port: 53, protocol: 'UDP' },
        ],
      }),
    );
    const mf = update(undefined, v1, 'creator', T0);
    const v2 = { ...v1, spec: { ports: [{ port: 80, protocol: 'TCP', name: 'web' }] } };
    expect(update(v1, v2, 'editor', T1, mf)).to.deep.equal([
      entry(
        'creator',
        {
          'f:spec': {
            '.': {},
            'f:ports': { '.': {}, 'k:{"port":80,"protocol":"TCP"}': { '.': {}, 'f:port': {}, 'f:protocol': {} } },
          },
        },
        T0,
      ),
      entry('editor', { 'f:spec': { 'f:ports': { 'k:{"port":80,"protocol":"TCP"}': { 'f:name': {} } } } }, T1),
    ]);
  });

  it('status subresource: entries carry subresource and own only status', () => {
    const v1 = stored(sbx({ image: 'a' }));
    const mf = update(undefined, v1, 'creator', T0);
    const v2 = { ...v1, status: { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] } };
    expect(update(v1, v2, 'sandbox-controller', T1, mf, 'status')).to.deep.equal([
      entry('creator', { 'f:spec': { '.': {}, 'f:image': {} } }, T0),
      entry(
        'sandbox-controller',
        {
          'f:status': {
            '.': {},
            'f:conditions': { '.': {}, 'k:{"type":"Ready"}': { '.': {}, 'f:status': {}, 'f:type': {} } },
            'f:phase': {},
          },
        },
        T1,
        { subresource: 'status' },
      ),
    ]);
  });

  it('main resource of a kind with a status subresource: status changes are not recorded', () => {
    const v1 = stored(sbx({ image: 'a' }));
    const v2 = { ...v1, status: { phase: 'Running' } };
    expect(update(v1, v2, 'x', T1, [])).to.deep.equal([]);
  });

  it('entries are in kube order: Apply first, then by time, then manager name', () => {
    const v1 = stored(sbx({ image: 'a', runtime: 'r', paused: true }));
    const mf: ManagedFieldsEntry[] = [
      entry('zeta', { 'f:spec': { 'f:image': {} } }, T0),
      entry('alpha', { 'f:spec': { 'f:runtime': {} } }, T0),
      { ...entry('applier', { 'f:spec': { 'f:paused': {} } }, T2), operation: 'Apply' },
    ];
    const v2 = { ...v1, spec: { ...loose(v1).spec, ttlSeconds: 5 } };
    expect(update(v1, v2, 'beta', T1, mf).map((e) => `${e.operation}/${e.manager}`)).to.deep.equal([
      'Apply/applier',
      'Update/alpha',
      'Update/zeta',
      'Update/beta',
    ]);
  });

  describe('client-supplied managedFields (kubectl migration, [{}] reset)', () => {
    const v1 = withManagedFields(stored(sbx({ image: 'a' })), [entry('old', { 'f:spec': { 'f:image': {} } })]);

    it('a non-empty list in the new object replaces the stored one', () => {
      const given = [{ ...entry('kubectl', { 'f:spec': { 'f:image': {} } }), operation: 'Apply' as const }];
      const v2 = withManagedFields(v1, given);
      expect(update(v1, v2, 'kubectl', T1)).to.deep.equal(given);
    });
    it('[{}] resets it (the writer then owns only what it changed)', () => {
      const v2 = { ...v1, metadata: { ...v1.metadata, managedFields: [{} as ManagedFieldsEntry] } };
      expect(update(v1, v2, 'x', T1)).to.deep.equal([]);
    });
    it('malformed entries are ignored: the stored ones are kept', () => {
      const v2 = {
        ...v1,
        metadata: {
          ...v1.metadata,
          managedFields: [{ manager: 'm', operation: 'Bogus' } as unknown as ManagedFieldsEntry],
        },
      };
      expect(update(v1, v2, 'x', T1)).to.deep.equal(v1.metadata.managedFields);
    });
    it('an omitted list keeps the stored one', () => {
      const v2 = withManagedFields({ ...v1, spec: { image: 'a', paused: true } }, []);
      expect(update(v1, v2, 'x', T1)).to.deep.equal([
        entry('old', { 'f:spec': { 'f:image': {} } }),
        entry('x', { 'f:spec': { 'f:paused': {} } }, T1),
      ]);
    });
    it('a create may supply managedFields, but the creator added every field, so it takes them all', () => {
      const given = [
        entry('importer', { 'f:spec': { 'f:image': {} }, 'f:status': { 'f:phase': {} } }, T0, {
          subresource: 'status',
        }),
      ];
      const obj = withManagedFields(sbx({ image: 'a', paused: true }), given);
      expect(update(undefined, obj, 'kubectl-create', T1)).to.deep.equal([
        entry('importer', { 'f:status': { 'f:phase': {} } }, T0, { subresource: 'status' }),
        entry('kubectl-create', { 'f:spec': { '.': {}, 'f:image': {}, 'f:paused': {} } }, T1),
      ]);
    });
    it('status writes cannot replace managedFields', () => {
      const v2 = withManagedFields({ ...v1, status: { phase: 'x' } }, [entry('evil', { 'f:spec': {} })]);
      expect(update(v1, v2, 'c', T1, undefined, 'status').map((e) => e.manager)).to.deep.equal(['old', 'c']);
    });
  });

  it('more than ten Update entries fold the oldest into ancient-changes', () => {
    const spec: Record<string, unknown> = {};
    const mf: ManagedFieldsEntry[] = [];
    for (let i = 0; i < 10; i++) {
      spec[`f${i}`] = i;
      mf.push(entry(`m${i}`, { 'f:spec': { 'f:extra': { [`f:f${i}`]: {} } } }, `2026-01-01T00:00:0${i}Z`));
    }
    const v1 = stored(sbx({ extra: spec }));
    const v2 = { ...v1, spec: { extra: { ...spec, f10: 10 } } };
    const out = update(v1, v2, 'm10', T2, mf);
    expect(out.map((e) => e.manager)).to.deep.equal([
      'ancient-changes',
      'm2',
      'm3',
      'm4',
      'm5',
      'm6',
      'm7',
      'm8',
      'm9',
      'm10',
    ]);
    expect(out[0]).to.deep.equal(
      entry(ANCIENT_CHANGES, { 'f:spec': { 'f:extra': { 'f:f0': {}, 'f:f1': {} } } }, '2026-01-01T00:00:01Z'),
    );
  });

  it('is deterministic and does not modify its inputs', () => {
    const v1 = stored(sbx({ image: 'a' }));
    const v2 = { ...v1, spec: { image: 'b' } };
    const before = JSON.stringify([v1, v2]);
    const a = update(v1, v2, 'x', T1, []);
    const b = update(v1, v2, 'x', T1, []);
    expect(a).to.deep.equal(b);
    expect(JSON.stringify([v1, v2])).to.equal(before);
  });
});

describe('fieldmanager/recordUpdate on create', () => {
  // The create path writes FieldsV1 directly; it must equal the general diff against an empty
  // object, key order included (kube's order is part of the wire form).
  const general = (obj: KubeObject, subresource?: string, statusSubresource?: boolean) =>
    recordUpdate({
      oldObj: {} as KubeObject,
      newObj: obj,
      manager: 'm',
      now: T0,
      schema,
      apiVersion: AV,
      subresource,
      statusSubresource,
    });
  const created = (obj: KubeObject, subresource?: string, statusSubresource?: boolean) =>
    recordUpdate({
      oldObj: undefined,
      newObj: obj,
      manager: 'm',
      now: T0,
      schema,
      apiVersion: AV,
      subresource,
      statusSubresource,
    });
  const objects: Array<[string, KubeObject]> = [
    ['empty spec', sbx({})],
    [
      'nothing but identity',
      { apiVersion: AV, kind: 'Sandbox', metadata: { name: 'a', namespace: 'ns' } } as KubeObject,
    ],
    [
      'nested objects and labels',
      sbx(
        { image: 'debian:12', network: { mode: 'none' }, zz: { b: 1, a: [1, 2] } },
        { labels: { b: '1', a: '2' }, annotations: { x: 'y' } },
      ),
    ],
    [
      'map lists, set lists, atomic lists',
      sbx(
        {
          ports: [
            { port: 80, protocol: 'TCP', name: 'http' },
            { port: 53, protocol: 'UDP' },
            { port: 80, protocol: 'TCP' },
          ],
          command: ['sh', '-c'],
        },
        { finalizers: ['b', 'a', 'b'] },
      ),
    ],
    [
      'null, empty containers, undefined entries',
      sbx({ image: null, network: {}, ports: [], extra: { gone: undefined } } as Record<string, unknown>),
    ],
    [
      'status and ownerReferences',
      sbx(
        { image: 'a' },
        {
          ownerReferences: [
            { apiVersion: 'v1', kind: 'X', name: 'x', uid: 'u2' },
            { apiVersion: 'v1', kind: 'X', name: 'y', uid: 'u1' },
          ],
        },
        { phase: 'Ready', conditions: [{ type: 'Ready', status: 'True' }] },
      ),
    ],
    [
      'malformed metadata values',
      {
        apiVersion: AV,
        kind: 'Sandbox',
        metadata: { name: { odd: true }, uid: 'x', labels: 'nope' },
        spec: 'text',
      } as unknown as KubeObject,
    ],
  ];
  for (const [name, obj] of objects) {
    for (const [sub, statusSub] of [
      [undefined, true],
      [undefined, false],
      ['status', true],
    ] as const) {
      it(`${name} (${sub ?? 'main resource'}, status subresource ${statusSub})`, () => {
        const want = general(obj, sub, statusSub);
        const got = created(obj, sub, statusSub);
        expect(got).to.deep.equal(want);
        expect(JSON.stringify(got)).to.equal(JSON.stringify(want));
      });
    }
  }
});
