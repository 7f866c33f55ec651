import { expect } from 'chai';
import { threeWayMergePatch, withLastApplied, LAST_APPLIED } from '../../../cmd/fluxctl/apply.js';
import { smartLabel, describeObject } from '../../../cmd/fluxctl/describe.js';
import { matchResource, type ResourceInfo } from '../../../cmd/fluxctl/discovery.js';
import { parse } from '../../../cmd/fluxctl/manifests.js';
import {
  LiveTabwriter,
  cellString,
  goTabwriter,
  jsonpathTemplate,
  tableRows,
  tabwrite,
  toJson,
  toYaml,
} from '../../../cmd/fluxctl/printers.js';
import { formatStatusError, parseDuration, resolveKubeconfig } from '../../../cmd/fluxctl/util.js';
import { conditionMet, jsonpathMet, parseFor } from '../../../cmd/fluxctl/wait.js';
import { errors } from '../../../runtime/meta/errors.js';

describe('cmd/fluxctl printers and helpers', () => {
  it('tabwrite pads like kubectl (minwidth 6, padding 3, last cell unpadded)', () => {
    expect(
      tabwrite([
        ['NAME', 'AGE'],
        ['a', '1s'],
        ['longer-name', '10s'],
      ]),
    ).to.equal('NAME          AGE\na             1s\nlonger-name   10s\n');
  });

  it('LiveTabwriter keeps widths across watch rows and only grows them, like kubectl get -w', () => {
    const tw = new LiveTabwriter();
    expect(
      tw.format([
        ['NAME', 'AGE'],
        ['a', '1s'],
      ]),
    ).to.equal('NAME   AGE\na      1s\n');
    expect(tw.format([['b', '2s']])).to.equal('b      2s\n');
    expect(tw.format([['longer-name', '3s']])).to.equal('longer-name   3s\n');
    expect(tw.format([['c', '4s']])).to.equal('c             4s\n');
  });

  it('goTabwriter aligns column blocks of consecutive lines only', () => {
    const s = goTabwriter('Name:\tx\nAPI Version:\tv1\nSpec:\n  Image:\ta\n  Runtime Class:\tb\n', 0, 2);
    expect(s).to.equal('Name:         x\nAPI Version:  v1\nSpec:\n  Image:          a\n  Runtime Class:  b\n');
  });

  it('tableRows: wide-only columns, namespace, labels, name prefix, nil cells', () => {
    const cols = [
      { name: 'Name', type: 'string', format: 'name' },
      { name: 'Image', type: 'string', priority: 1 },
      { name: 'Phase', type: 'string' },
    ];
    const rows = [
      { cells: ['a', 'alpine', null], object: { metadata: { namespace: 'ns', labels: { b: '2', a: '1' } } } },
    ];
    expect(tableRows(cols, rows, {})).to.deep.equal([
      ['NAME', 'PHASE'],
      ['a', ''],
    ]);
    expect(
      tableRows(cols, rows, { wide: true, withNamespace: true, showLabels: true, namePrefix: 'sandbox.fluxvm.dev/' }),
    ).to.deep.equal([
      ['NAMESPACE', 'NAME', 'IMAGE', 'PHASE', 'LABELS'],
      ['ns', 'sandbox.fluxvm.dev/a', 'alpine', '', 'a=1,b=2'],
    ]);
    expect(cellString([1, 'x'])).to.equal('[1 x]');
    expect(cellString({ b: 1, a: true })).to.equal('map[a:true b:1]');
  });

  it('yaml and json outputs sort keys like Go', () => {
    const o = {
      kind: 'X',
      apiVersion: 'v1',
      metadata: { name: 'demo', labels: { z: '1', a: '2' } },
      list: [{ b: 1, a: 'True' }],
    };
    expect(toYaml(o)).to.equal(
      'apiVersion: v1\nkind: X\nlist:\n- a: "True"\n  b: 1\nmetadata:\n  labels:\n    a: "2"\n    z: "1"\n  name: demo\n',
    );
    expect(toJson({ b: 1, a: 2 })).to.equal('{\n    "a": 2,\n    "b": 1\n}\n');
  });

  const jpCases: [string, unknown, string][] = [
    ['{.metadata.name}', { metadata: { name: 'x' } }, 'x'],
    ['{.items[*].metadata.name}', { items: [{ metadata: { name: 'a' } }, { metadata: { name: 'b' } }] }, 'a b'],
    [
      '{range .items[*]}{.metadata.name}{"\\n"}{end}',
      { items: [{ metadata: { name: 'a' } }, { metadata: { name: 'b' } }] },
      'a\nb\n',
    ],
    [
      '{.status.conditions[?(@.type=="Ready")].status}',
      {
        status: {
          conditions: [
            { type: 'X', status: 'False' },
            { type: 'Ready', status: 'True' },
          ],
        },
      },
      'True',
    ],
    ['name={.metadata.name} missing={.nope}', { metadata: { name: 'x' } }, 'name=x missing='],
    ['{.spec}', { spec: { a: 1 } }, '{"a":1}'],
  ];
  for (const [tpl, obj, want] of jpCases) {
    it(`jsonpath ${tpl}`, () => expect(jsonpathTemplate(tpl)(obj)).to.equal(want));
  }
  it('jsonpath syntax errors are reported', () => {
    expect(() => jsonpathTemplate('{range .items[*]}x')).to.throw(/unclosed range/);
    expect(() => jsonpathTemplate('{.a')).to.throw(/unclosed action/);
  });

  it('matchResource resolves plural, singular, short name, kind and .group forms', () => {
    const all: ResourceInfo[] = [
      {
        group: '',
        version: 'v1',
        resource: 'events',
        kind: 'Event',
        singular: 'event',
        namespaced: true,
        shortNames: ['ev'],
        categories: [],
        verbs: [],
        subresources: [],
      },
      {
        group: 'fluxvm.dev',
        version: 'v1alpha1',
        resource: 'sandboxes',
        kind: 'Sandbox',
        singular: 'sandbox',
        namespaced: true,
        shortNames: ['sbx'],
        categories: [],
        verbs: [],
        subresources: ['status'],
      },
    ];
    for (const w of [
      'sandboxes',
      'sandbox',
      'sbx',
      'Sandbox',
      'SBX',
      'sandboxes.fluxvm.dev',
      'sandbox.v1alpha1.fluxvm.dev',
    ])
      expect(matchResource(all, w)?.resource, w).to.equal('sandboxes');
    expect(matchResource(all, 'ev')?.resource).to.equal('events');
    expect(matchResource(all, 'sandboxes.other.dev')).to.equal(undefined);
    expect(matchResource(all, 'nothing')).to.equal(undefined);
  });

  it('three-way merge patch: changes, deletions of what the file dropped, others left alone', () => {
    const original = { metadata: { labels: { a: '1', gone: 'x' } }, spec: { image: 'a', list: [1] } };
    const modified = { metadata: { labels: { a: '2' } }, spec: { image: 'a', list: [1, 2] } };
    const current = {
      metadata: { labels: { a: '1', gone: 'x', other: 'kept' } },
      spec: { image: 'a', list: [1], defaulted: true },
      status: {},
    };
    expect(threeWayMergePatch(original, modified, current)).to.deep.equal({
      metadata: { labels: { a: '2', gone: null } },
      spec: { list: [1, 2] },
    });
    expect(threeWayMergePatch(modified, modified, { ...current, ...modified })).to.deep.equal({});
  });

  it('last-applied annotation is serialized as kubectl does', () => {
    const o = withLastApplied(
      {
        kind: 'Sandbox',
        apiVersion: 'fluxvm.dev/v1alpha1',
        metadata: { name: 'n', labels: { b: '1', a: '2' } },
        spec: { z: 1, a: 2 },
      },
      'default',
    );
    expect(o.metadata.annotations![LAST_APPLIED]).to.equal(
      '{"apiVersion":"fluxvm.dev/v1alpha1","kind":"Sandbox","metadata":{"annotations":{},"labels":{"a":"2","b":"1"},"name":"n","namespace":"default"},"spec":{"a":2,"z":1}}\n',
    );
  });

  it('manifests: multi-document YAML, Lists flattened, empty documents skipped, missing kind refused', () => {
    const m = parse(
      '---\napiVersion: v1\nkind: A\nmetadata: {name: a}\n---\n\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: B, metadata: {name: b}}\n',
      'f.yaml',
    );
    expect(m.map((x) => x.object.kind)).to.deep.equal(['A', 'B']);
    expect(() => parse('metadata: {name: a}\n', 'f.yaml')).to.throw(/kind not set/);
    expect(() => parse('a: [\n', 'f.yaml')).to.throw(/error parsing f.yaml/);
  });

  it('smartLabel follows kubectl', () => {
    expect(
      ['apiVersion', 'uid', 'observedGeneration', 'lastTransitionTime', 'ttlSeconds', 'HTTPServer', 'a.b'].map(
        smartLabel,
      ),
    ).to.deep.equal([
      'API Version',
      'UID',
      'Observed Generation',
      'Last Transition Time',
      'Ttl Seconds',
      'HTTP Server',
      'a.b',
    ]);
  });

  it('describe renders events with counts and <none> when there are none', () => {
    const now = Date.parse('2026-01-01T00:10:00Z');
    const obj = { apiVersion: 'v1', kind: 'X', metadata: { name: 'n', namespace: 'd' } };
    expect(describeObject(obj, [], now)).to.match(/Events:\s+<none>\n$/);
    const ev = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: {},
      type: 'Normal',
      reason: 'R',
      message: 'm ',
      count: 3,
      firstTimestamp: '2026-01-01T00:00:00Z',
      lastTimestamp: '2026-01-01T00:09:00Z',
      source: { component: 'c' },
    };
    expect(describeObject(obj, [ev], now)).to.contain('  Normal  R       60s (x3 over 10m)  c     m\n');
  });

  it('wait conditions honour observedGeneration and are case-insensitive', () => {
    expect(parseFor('condition=Ready')).to.deep.equal({ kind: 'condition', type: 'Ready', value: 'True' });
    expect(parseFor('condition=Ready=false')).to.deep.equal({ kind: 'condition', type: 'Ready', value: 'false' });
    expect(parseFor('jsonpath={.status.phase}=Running')).to.deep.equal({
      kind: 'jsonpath',
      path: '{.status.phase}',
      value: 'Running',
    });
    expect(parseFor('delete')).to.deep.equal({ kind: 'delete' });
    expect(() => parseFor('bogus')).to.throw(/unrecognized condition/);
    const o = (gen: number, cgen?: number, sgen?: number) => ({
      apiVersion: 'v1',
      kind: 'X',
      metadata: { name: 'n', generation: gen },
      status: {
        ...(sgen !== undefined ? { observedGeneration: sgen } : {}),
        conditions: [{ type: 'Ready', status: 'True', ...(cgen !== undefined ? { observedGeneration: cgen } : {}) }],
      },
    });
    expect(conditionMet(o(1, 1), 'ready', 'true')).to.equal(true);
    expect(conditionMet(o(2, 1), 'Ready', 'True')).to.equal(false);
    expect(conditionMet(o(2, undefined, 1), 'Ready', 'True')).to.equal(false);
    expect(conditionMet(o(2), 'Ready', 'True')).to.equal(true);
    expect(conditionMet(o(1, 1), 'Ready', 'False')).to.equal(false);
    expect(jsonpathMet({ ...o(1), status: { phase: 'Running' } } as any, '{.status.phase}', 'Running')).to.equal(true);
  });

  it('errors print as kubectl prints them', () => {
    expect(formatStatusError(errors.notFound('sandboxes', 'fluxvm.dev', 'x'))).to.equal(
      'Error from server (NotFound): sandboxes.fluxvm.dev "x" not found',
    );
    expect(
      formatStatusError(
        errors.invalid('Sandbox', 'fluxvm.dev', 'x', [{ field: 'spec.a', message: 'Invalid value: 1: bad' }]),
      ),
    ).to.equal('The Sandbox "x" is invalid: spec.a: Invalid value: 1: bad');
    expect(
      formatStatusError(
        errors.invalid('Sandbox', 'fluxvm.dev', 'x', [
          { field: 'spec.a', message: 'm1' },
          { field: 'spec.b', message: 'm2' },
        ]),
      ),
    ).to.equal('The Sandbox "x" is invalid: \n* spec.a: m1\n* spec.b: m2');
  });

  it('durations and kubeconfig resolution', () => {
    expect(parseDuration('30s')).to.equal(30_000);
    expect(parseDuration('1m30s')).to.equal(90_000);
    expect(parseDuration('500ms')).to.equal(500);
    expect(parseDuration('2')).to.equal(2000);
    expect(() => parseDuration('soon')).to.throw(/invalid duration/);
    expect(resolveKubeconfig('/x')).to.equal('/x');
    // kubectl: a KUBECONFIG list whose files are all missing is not replaced by a default.
    expect(resolveKubeconfig(undefined, { KUBECONFIG: '/nonexistent/a' })).to.equal('/nonexistent/a');
  });
});
