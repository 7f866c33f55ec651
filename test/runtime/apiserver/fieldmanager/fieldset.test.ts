import { expect } from 'chai';
import {
  FieldSet,
  parsePeKey,
  pathString,
  peKey,
  type Path,
} from '../../../../runtime/apiserver/fieldmanager/index.js';

const f = (field: string) => ({ field });

describe('fieldmanager/fieldset', () => {
  describe('FieldsV1 round trip', () => {
    const cases: Array<{ name: string; v1: Record<string, unknown> }> = [
      { name: 'leaves', v1: { 'f:spec': { 'f:image': {}, 'f:runtime': {} } } },
      { name: 'member with children gets "."', v1: { 'f:metadata': { 'f:labels': { '.': {}, 'f:app': {} } } } },
      {
        name: 'map-list items keyed by JSON of the key fields',
        v1: { 'f:status': { 'f:conditions': { 'k:{"type":"Ready"}': { '.': {}, 'f:status': {}, 'f:type': {} } } } },
      },
      {
        name: 'set-list items by value',
        v1: { 'f:metadata': { 'f:finalizers': { '.': {}, 'v:"a"': {}, 'v:"b"': {} } } },
      },
      { name: 'empty', v1: {} },
    ];
    for (const c of cases) {
      it(c.name, () => {
        const s = FieldSet.fromFieldsV1(c.v1);
        expect(s.toFieldsV1()).to.deep.equal(c.v1);
        expect(JSON.stringify(s.toFieldsV1())).to.equal(JSON.stringify(c.v1));
      });
    }

    it('emits keys in kube order whatever the input order', () => {
      const s = FieldSet.fromFieldsV1({ 'v:"b"': {}, 'k:{"a":1}': {}, 'f:z': {}, 'f:a': {}, 'v:"a"': {}, 'v:1': {} });
      expect(Object.keys(s.toFieldsV1())).to.deep.equal(['f:a', 'f:z', 'k:{"a":1}', 'v:1', 'v:"a"', 'v:"b"']);
    });

    it('rejects malformed FieldsV1', () => {
      expect(() => FieldSet.fromFieldsV1({ 'x:spec': {} })).to.throw(/unknown path element/);
      expect(() => FieldSet.fromFieldsV1({ 'f:spec': 1 })).to.throw(/must be an object/);
      expect(() => FieldSet.fromFieldsV1({ 'k:notjson': {} })).to.throw();
      expect(() => FieldSet.fromFieldsV1([])).to.throw();
    });
  });

  describe('path elements', () => {
    it('sorts key fields by name and writes compact JSON', () => {
      const pe = parsePeKey('k:{"protocol":"TCP","containerPort":80}');
      expect(peKey(pe)).to.equal('k:{"containerPort":80,"protocol":"TCP"}');
    });
    it('escapes HTML characters as Go does', () => {
      expect(peKey({ value: 'a<b>&' })).to.equal('v:"a\\u003cb\\u003e\\u0026"');
    });
    const strings: Array<[Path, string]> = [
      [[f('spec'), f('image')], '.spec.image'],
      [
        [f('status'), f('conditions'), { key: [['type', 'Ready']] }, f('status')],
        '.status.conditions[type="Ready"].status',
      ],
      [
        [
          f('spec'),
          f('ports'),
          {
            key: [
              ['port', 80],
              ['protocol', 'TCP'],
            ],
          },
        ],
        '.spec.ports[port=80,protocol="TCP"]',
      ],
      [[f('metadata'), f('finalizers'), { value: 'x' }], '.metadata.finalizers[="x"]'],
      [[f('spec'), f('command'), { index: 2 }], '.spec.command[2]'],
    ];
    for (const [p, s] of strings) it(`prints ${s}`, () => expect(pathString(p)).to.equal(s));
  });

  describe('set operations', () => {
    const a = FieldSet.of([f('spec'), f('a')], [f('spec'), f('b')], [f('spec')]);
    const b = FieldSet.of([f('spec'), f('b')], [f('spec'), f('c')]);
    it('union', () => {
      expect(a.union(b).toFieldsV1()).to.deep.equal({ 'f:spec': { '.': {}, 'f:a': {}, 'f:b': {}, 'f:c': {} } });
    });
    it('intersection', () => {
      expect(a.intersection(b).toFieldsV1()).to.deep.equal({ 'f:spec': { 'f:b': {} } });
    });
    it('difference keeps descendants of a removed member', () => {
      expect(a.difference(FieldSet.of([f('spec')])).toFieldsV1()).to.deep.equal({ 'f:spec': { 'f:a': {}, 'f:b': {} } });
    });
    it('recursiveDifference removes everything below a member', () => {
      expect(a.recursiveDifference(FieldSet.of([f('spec')])).isEmpty()).to.equal(true);
    });
    it('has / isEmpty / paths', () => {
      expect(a.has([f('spec'), f('a')])).to.equal(true);
      expect(a.has([f('spec'), f('c')])).to.equal(false);
      expect(new FieldSet().isEmpty()).to.equal(true);
      expect(a.paths().map(pathString)).to.deep.equal(['.spec', '.spec.a', '.spec.b']);
    });
    it('operations never modify their operands', () => {
      const before = JSON.stringify(a.toFieldsV1());
      a.union(b);
      a.difference(b);
      a.recursiveDifference(b);
      a.intersection(b);
      expect(JSON.stringify(a.toFieldsV1())).to.equal(before);
    });
  });
});
