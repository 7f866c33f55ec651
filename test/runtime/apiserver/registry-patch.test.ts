import { expect } from 'chai';
import { applyJsonPatch, applyMergePatch } from '../../../runtime/apiserver/patch.js';

describe('JSON merge patch (RFC 7386 appendix A)', () => {
  const table: [unknown, unknown, unknown][] = [
    [{ a: 'b' }, { a: 'c' }, { a: 'c' }],
    [{ a: 'b' }, { b: 'c' }, { a: 'b', b: 'c' }],
    [{ a: 'b' }, { a: null }, {}],
    [{ a: 'b', b: 'c' }, { a: null }, { b: 'c' }],
    [{ a: ['b'] }, { a: 'c' }, { a: 'c' }],
    [{ a: 'c' }, { a: ['b'] }, { a: ['b'] }],
    [{ a: { b: 'c' } }, { a: { b: 'd', c: null } }, { a: { b: 'd' } }],
    [{ a: [{ b: 'c' }] }, { a: [1] }, { a: [1] }],
    [{ e: null }, { a: 1 }, { e: null, a: 1 }],
    [{}, { a: { bb: { ccc: null } } }, { a: { bb: {} } }],
  ];
  for (const [doc, patch, want] of table) {
    it(`${JSON.stringify(doc)} + ${JSON.stringify(patch)}`, () => {
      const before = JSON.stringify(doc);
      expect(applyMergePatch(doc, patch)).to.deep.equal(want);
      expect(JSON.stringify(doc)).to.equal(before);
    });
  }
  it('a non-object merge patch is 400', () => {
    expect(() => applyMergePatch({}, [1])).to.throw('a merge patch must be a JSON object');
  });
});

describe('JSON patch (RFC 6902)', () => {
  const doc = { spec: { image: 'a', list: [1, 2, 3], 'x/y': 1, 'm~n': 2 }, metadata: { name: 'n' } };
  const ok: [string, unknown[], unknown][] = [
    ['add member', [{ op: 'add', path: '/spec/cpus', value: 2 }], { ...doc, spec: { ...doc.spec, cpus: 2 } }],
    [
      'add to array middle',
      [{ op: 'add', path: '/spec/list/1', value: 9 }],
      { ...doc, spec: { ...doc.spec, list: [1, 9, 2, 3] } },
    ],
    [
      'append with -',
      [{ op: 'add', path: '/spec/list/-', value: 4 }],
      { ...doc, spec: { ...doc.spec, list: [1, 2, 3, 4] } },
    ],
    ['remove', [{ op: 'remove', path: '/spec/image' }], { ...doc, spec: { list: [1, 2, 3], 'x/y': 1, 'm~n': 2 } }],
    [
      'replace escaped ~1 ~0',
      [
        { op: 'replace', path: '/spec/x~1y', value: 5 },
        { op: 'replace', path: '/spec/m~0n', value: 6 },
      ],
      { ...doc, spec: { ...doc.spec, 'x/y': 5, 'm~n': 6 } },
    ],
    [
      'move',
      [{ op: 'move', from: '/spec/image', path: '/metadata/image' }],
      { spec: { list: [1, 2, 3], 'x/y': 1, 'm~n': 2 }, metadata: { name: 'n', image: 'a' } },
    ],
    ['copy', [{ op: 'copy', from: '/spec/list/0', path: '/spec/first' }], { ...doc, spec: { ...doc.spec, first: 1 } }],
    [
      'test then replace',
      [
        { op: 'test', path: '/spec/image', value: 'a' },
        { op: 'replace', path: '/spec/image', value: 'b' },
      ],
      { ...doc, spec: { ...doc.spec, image: 'b' } },
    ],
    ['test deep equality', [{ op: 'test', path: '/spec/list', value: [1, 2, 3] }], doc],
  ];
  for (const [name, patch, want] of ok) {
    it(name, () => expect(applyJsonPatch(doc, patch)).to.deep.equal(want));
  }
  const failing: [string, unknown, number, RegExp][] = [
    [
      'failed test is 422 and nothing applies',
      [
        { op: 'replace', path: '/spec/image', value: 'z' },
        { op: 'test', path: '/spec/image', value: 'a' },
      ],
      422,
      /testing value \/spec\/image failed/,
    ],
    ['missing path', [{ op: 'replace', path: '/spec/nope', value: 1 }], 422, /does not exist/],
    ['remove missing', [{ op: 'remove', path: '/nope/x' }], 422, /does not exist/],
    ['index out of bounds', [{ op: 'add', path: '/spec/list/9', value: 1 }], 422, /out of bounds/],
    ['not an array', { op: 'add' }, 400, /JSON array/],
    ['unknown op', [{ op: 'frob', path: '/a' }], 400, /unexpected op/],
    ['missing value', [{ op: 'add', path: '/a' }], 400, /missing value/],
    ['bad pointer', [{ op: 'add', path: 'a', value: 1 }], 400, /not a JSON pointer/],
  ];
  for (const [name, patch, code, re] of failing) {
    it(name, () => {
      try {
        applyJsonPatch(doc, patch);
        expect.fail('expected an error');
      } catch (e: any) {
        expect(e.status?.code, String(e)).to.equal(code);
        expect(e.status.message).to.match(re);
      }
    });
  }
});
