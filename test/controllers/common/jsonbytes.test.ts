// jsonBytes (controllers/common/jsonbytes.ts): the same bytes as Buffer.from(JSON.stringify(v)) for
// what a Statement holds and for the corners of JSON.stringify's rules, with arrays around the
// 64-element batch edge, big arrays nested in big arrays, and text that JSON must escape.
import { expect } from 'chai';
import { JsonArrayText, jsonBytes, jsonString } from '../../../controllers/common/jsonbytes.js';
import { statementOf } from '../../support/changeset-statement.js';

function same(v: unknown, what: string): void {
  const want = Buffer.from(JSON.stringify(v));
  const got = jsonBytes(v);
  expect(got.toString(), what).to.equal(want.toString());
  expect(got.equals(want), what).to.equal(true);
}

describe('jsonBytes: JSON.stringify bytes built in batches', () => {
  it('arrays at, one under and one past each batch edge, with holes, undefined and functions inside', () => {
    for (const n of [0, 1, 63, 64, 65, 127, 128, 129, 1000]) {
      const a: unknown[] = Array.from({ length: n }, (_, i) =>
        i % 7 === 0 ? undefined : i % 11 === 0 ? () => i : { i, s: `x${i}`, u: undefined },
      );
      if (n > 3) delete a[2]; // a hole
      same(a, `array of ${n}`);
      same({ a, tail: n }, `object holding an array of ${n}`);
    }
  });

  it('big arrays inside big arrays, nested objects, and the values JSON.stringify drops or rewrites', () => {
    const inner = Array.from({ length: 200 }, (_, i) => ({ i, deep: Array.from({ length: 70 }, (_, j) => j * i) }));
    same({ outer: Array.from({ length: 130 }, () => inner.slice(0, 3)), inner }, 'nested');
    same(
      {
        u: undefined,
        f: () => 1,
        sym: Symbol('s'),
        [Symbol('k')]: 1,
        n: null,
        nan: NaN,
        inf: -Infinity,
        d: new Date(0),
        m: new Map([[1, 2]]),
        boxed: new String('ab'),
        custom: { toJSON: () => ({ replaced: true }) },
        notAFunction: { toJSON: 1 },
        bare: Object.assign(Object.create(null) as object, { x: 1 }),
      },
      'corners',
    );
    const withToJson = Object.assign(
      Array.from({ length: 100 }, (_, i) => i),
      { toJSON: () => 'whole' },
    );
    same({ withToJson }, 'an array with its own toJSON');
    same(
      Array.from({ length: 100 }, (_, i) => i),
      'a top-level array',
    );
    same('text', 'a string');
    same(7, 'a number');
  });

  it('text JSON escapes: quotes, control characters, lone surrogates, U+2028, multi-byte characters', () => {
    const names = Array.from({ length: 150 }, (_, i) => `/w/"q\\${String.fromCharCode(i % 32)}\ud800é漢😀\u2028${i}`);
    same({ subject: names.map((name) => ({ name })), [`k"\n\ud800`]: names }, 'escapes');
  });

  it("a 1,000-file changeset's Statement", () => {
    const staged = Array.from({ length: 1000 }, (_, i) => ({
      path: `/work/src/file-${i}.ts`,
      sha256: 'sha256:' + i.toString(16).padStart(64, '0'),
    }));
    const st = statementOf({
      staged,
      base: Object.fromEntries(staged.map((e) => [e.path, e.sha256])),
      deleted: ['/work/gone'],
      sideEffects: { egress: 'none', network: 'none', measured: true, contacted: [], held: [] },
    });
    same(st, 'statement');
  });

  it('refuses what has no JSON text, as JSON.stringify returns undefined for it', () => {
    expect(() => jsonBytes(undefined)).to.throw(TypeError);
    expect(() => jsonBytes(() => 1)).to.throw(TypeError);
  });

  it('JsonArrayText: its elements written as pushed, at, one under and one past each batch edge; JSON.stringify sees the array', () => {
    for (const n of [0, 1, 63, 64, 65, 127, 128, 129, 1000]) {
      const values = Array.from({ length: n }, (_, i) => ({ i, s: `"\\${String.fromCharCode(i % 32)}é\ud800` }));
      const text = new JsonArrayText();
      for (const v of values) text.push(JSON.stringify(v));
      expect(text.length).to.equal(n);
      const whole = { head: 1, list: text, tail: [text] };
      const want = JSON.stringify({ head: 1, list: values, tail: [values] });
      expect(jsonBytes(whole).toString(), `${n} elements`).to.equal(want);
      expect(JSON.stringify(whole), `${n} elements, toJSON`).to.equal(want);
      expect(text.batches(), `${n} elements: batches of 64`).to.have.length(Math.ceil(n / 64));
    }
  });

  it('jsonString is JSON.stringify for every UTF-16 code unit, alone and inside text, and for surrogate pairs', () => {
    for (let c = 0; c <= 0xffff; c++) {
      const ch = String.fromCharCode(c);
      for (const s of [ch, `/work/${ch}x`]) if (jsonString(s) !== JSON.stringify(s)) expect.fail(`U+${c.toString(16)}`);
    }
    for (const s of ['', '😀', '/a/😀\ud800', 'a\u2028b', 'plain/path.ts'])
      expect(jsonString(s)).to.equal(JSON.stringify(s));
  });
});
