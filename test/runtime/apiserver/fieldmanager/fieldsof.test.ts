import { expect } from 'chai';
import { fieldsOf } from '../../../../runtime/apiserver/fieldmanager/index.js';
import { AV, sbx, schema, stored } from './testschema.js';

describe('fieldmanager/fieldsOf', () => {
  const cases: Array<{
    name: string;
    obj: Record<string, unknown>;
    subresource?: string;
    want: Record<string, unknown>;
  }> = [
    {
      name: 'scalars; server-owned metadata, apiVersion and kind are not tracked',
      obj: stored(sbx({ image: 'debian:12', paused: false, ttlSeconds: 60 })),
      want: { 'f:spec': { 'f:image': {}, 'f:paused': {}, 'f:ttlSeconds': {} } },
    },
    {
      name: 'labels, annotations, finalizers (set) and ownerReferences (keyed by uid)',
      obj: sbx(
        {},
        {
          labels: { app: 'x' },
          annotations: { note: 'y' },
          finalizers: ['fluxvm.dev/cleanup'],
          ownerReferences: [{ apiVersion: 'v1', kind: 'Secret', name: 's', uid: 'abc' }],
        },
      ),
      want: {
        'f:metadata': {
          'f:annotations': { 'f:note': {} },
          'f:finalizers': { 'v:"fluxvm.dev/cleanup"': {} },
          'f:labels': { 'f:app': {} },
          'f:ownerReferences': {
            'k:{"uid":"abc"}': { '.': {}, 'f:apiVersion': {}, 'f:kind': {}, 'f:name': {}, 'f:uid': {} },
          },
        },
        'f:spec': {},
      },
    },
    {
      name: 'atomic list and atomic map are leaves; set-list items by value; map entries granular',
      obj: sbx({ command: ['sh', '-c', 'x'], resources: { cpu: '1' }, tags: ['a', 'b'], env: { A: '1', B: '2' } }),
      want: {
        'f:spec': {
          'f:command': {},
          'f:env': { 'f:A': {}, 'f:B': {} },
          'f:resources': {},
          'f:tags': { 'v:"a"': {}, 'v:"b"': {} },
        },
      },
    },
    {
      name: 'map-list items keyed by all key fields (sorted), the schema default completing a missing key',
      obj: sbx({
        ports: [
          { port: 80, name: 'http' },
          { port: 53, protocol: 'UDP' },
        ],
      }),
      want: {
        'f:spec': {
          'f:ports': {
            'k:{"port":53,"protocol":"UDP"}': { '.': {}, 'f:port': {}, 'f:protocol': {} },
            'k:{"port":80,"protocol":"TCP"}': { '.': {}, 'f:name': {}, 'f:port': {} },
          },
        },
      },
    },
    {
      name: 'preserve-unknown-fields content: maps granular (entries are members), lists atomic',
      obj: sbx({ extra: { a: { b: 1 }, l: [1, 2] } }),
      want: { 'f:spec': { 'f:extra': { 'f:a': { '.': {}, 'f:b': {} }, 'f:l': {} } } },
    },
    {
      name: 'empty object and null are owned leaves',
      obj: sbx({ network: {}, runtime: null }),
      want: { 'f:spec': { 'f:network': {}, 'f:runtime': {} } },
    },
    {
      name: 'status is not tracked on the main resource of a kind with a status subresource',
      obj: sbx({ image: 'a' }, {}, { phase: 'Running' }),
      want: { 'f:spec': { 'f:image': {} } },
    },
    {
      name: 'only status is tracked on the status subresource',
      obj: sbx(
        { image: 'a' },
        { labels: { a: 'b' } },
        { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] },
      ),
      subresource: 'status',
      want: {
        'f:status': {
          'f:conditions': { 'k:{"type":"Ready"}': { '.': {}, 'f:status': {}, 'f:type': {} } },
          'f:phase': {},
        },
      },
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const got = fieldsOf(c.obj, schema, { subresource: c.subresource, apiVersion: AV });
      expect(got.toFieldsV1()).to.deep.equal(c.want);
    });
  }

  it('tracks status on kinds without a status subresource', () => {
    const got = fieldsOf(sbx({}, {}, { phase: 'x' }), schema, { statusSubresource: false });
    expect(got.toFieldsV1()).to.deep.equal({ 'f:spec': {}, 'f:status': { 'f:phase': {} } });
  });
});
