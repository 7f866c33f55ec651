import { expect } from 'chai';
import {
  compileFieldSelector,
  compileLabelSelector,
  parseFieldSelector,
} from '../../../runtime/apiserver/selectors.js';

const obj = (labels: Record<string, string>, extra: Record<string, unknown> = {}) =>
  ({ apiVersion: 'v1', kind: 'X', metadata: { name: 'n1', namespace: 'ns1', labels }, ...extra }) as any;

describe('label selectors', () => {
  const L = { app: 'web', tier: 'gold', n: '5', empty: '' };
  const table: [string, boolean][] = [
    ['', true],
    ['app', true],
    ['!app', false],
    ['!missing', true],
    ['missing', false],
    ['app=web', true],
    ['app==web', true],
    ['app=db', false],
    ['app!=db', true],
    ['app!=web', false],
    ['missing!=x', true],
    ['app in (web,db)', true],
    ['app in (db)', false],
    ['app notin (db)', true],
    ['app notin (web)', false],
    ['missing notin (web)', true],
    ['missing in (web)', false],
    ['app=web,tier=gold', true],
    ['app=web, tier in (silver)', false],
    [' app = web ', true],
    ['empty=', true],
    ['empty in (a,)', true],
    ['n>4', true],
    ['n<5', false],
    ['missing>1', false],
    ['example.com/x', false],
    ['app in (web),!missing,tier', true],
  ];
  for (const [sel, want] of table) {
    it(`${JSON.stringify(sel)} -> ${want}`, () => expect(compileLabelSelector(sel)(obj(L))).to.equal(want));
  }

  const invalid: [string, RegExp][] = [
    ['app in web', /expected: '\('/],
    ['app=web=x', /found '=', expected: ',' or 'end of string'/],
    ['a b', /found 'b', expected: in, notin, =, ==, !=, gt, lt/],
    ['=x', /found '=', expected: identifier/],
    ['app in (a', /expected: ',', '\)'/],
    ['bad key!=1', /found 'key'/],
    ['-app=x', /key: Invalid value: "-app"/],
    ['app=not valid', /found 'valid'/],
    ['app=-x', /values\[0\]\[app\]: Invalid value: "-x"/],
    ['n>x', /must be an integer/],
    ['a/b/c', /qualified name/],
    ['app,', /expected: identifier/],
  ];
  for (const [sel, re] of invalid) {
    it(`invalid ${JSON.stringify(sel)} is 400 BadRequest`, () => {
      try {
        compileLabelSelector(sel);
        expect.fail('expected an error');
      } catch (e: any) {
        expect(e.status?.code, String(e)).to.equal(400);
        expect(e.status.reason).to.equal('BadRequest');
        expect(e.status.message).to.match(/^unable to parse requirement: /);
        expect(e.status.message).to.match(re);
      }
    });
  }
});

describe('field selectors', () => {
  const kind = { group: '', plural: 'events', selectableFields: [] };
  const ev = obj(
    {},
    {
      involvedObject: { kind: 'Sandbox', name: 'demo', namespace: 'ns1', uid: 'u-1' },
      type: 'Normal',
      reason: 'Booted',
      source: { component: 'c' },
    },
  );
  const table: [string, boolean][] = [
    ['', true],
    ['metadata.name=n1', true],
    ['metadata.name==n1', true],
    ['metadata.name!=n1', false],
    ['metadata.namespace=ns1,metadata.name=n1', true],
    ['involvedObject.namespace=ns1,involvedObject.kind=Sandbox,involvedObject.uid=u-1,involvedObject.name=demo', true],
    ['involvedObject.name=other', false],
    ['type=Normal,reason=Booted', true],
    ['source=c', true],
    ['type!=Warning', true],
  ];
  for (const [sel, want] of table) {
    it(`${JSON.stringify(sel)} -> ${want}`, () => expect(compileFieldSelector(sel, kind).matcher(ev)).to.equal(want));
  }

  it('selectableFields of a kind (leading dot allowed), missing value is empty string', () => {
    const k = { group: 'g', plural: 'widgets', selectableFields: ['.spec.color', 'spec.size'] };
    const o = obj({}, { spec: { color: 'red', size: 3 } });
    expect(compileFieldSelector('spec.color=red', k).matcher(o)).to.equal(true);
    expect(compileFieldSelector('spec.size=3', k).matcher(o)).to.equal(true);
    expect(compileFieldSelector('spec.color=', k).matcher(obj({}))).to.equal(true);
  });

  it('escapes in values', () => {
    expect(parseFieldSelector('metadata.name=a\\,b\\=c,metadata.namespace!=x')).to.deep.equal([
      { field: 'metadata.name', op: '=', value: 'a,b=c' },
      { field: 'metadata.namespace', op: '!=', value: 'x' },
    ]);
  });

  const invalid: [string, string][] = [
    ['spec.foo=x', 'field label not supported: spec.foo'],
    ['metadata.name', "invalid selector: 'metadata.name'; can't understand 'metadata.name'"],
    ['=x', "invalid selector: '=x'; can't understand '=x'"],
    ['metadata.name=a=b', 'invalid field selector: unescaped = in value'],
  ];
  for (const [sel, msg] of invalid) {
    it(`invalid ${JSON.stringify(sel)} is 400`, () => {
      try {
        compileFieldSelector(sel, { group: 'g', plural: 'widgets' });
        expect.fail('expected an error');
      } catch (e: any) {
        expect(e.status).to.deep.include({ code: 400, reason: 'BadRequest', message: msg });
      }
    });
  }
});
