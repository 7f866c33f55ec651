// Table tests of the quantity parsers every consumer of Sandbox.spec.resources uses.
import { expect } from 'chai';
import { parseCpu, parseMemory } from '../../apis/quantity.js';

describe('apis/quantity', () => {
  const memory: Array<[number | string, number]> = [
    [0, 0],
    [1024, 1024],
    ['1Ki', 1024],
    ['1.5Gi', 1.5 * 2 ** 30],
    ['2G', 2e9],
    ['0.5', 1], // a fraction of a byte rounds up: a limit is never below what was asked
  ];
  for (const [q, want] of memory)
    it(`parseMemory(${JSON.stringify(q)}) = ${want}`, () => expect(parseMemory(q)).to.equal(want));

  const cpu: Array<[number | string, number]> = [
    [2, 2000],
    ['1.5', 1500],
    ['0.001', 1], // three decimals: the smallest cores string
    ['500m', 500],
  ];
  for (const [q, want] of cpu) it(`parseCpu(${JSON.stringify(q)}) = ${want}`, () => expect(parseCpu(q)).to.equal(want));

  for (const q of [-1, 1.5, '1Pi', '1.5m', '', ' 1Gi']) {
    it(`parseMemory(${JSON.stringify(q)}) throws`, () =>
      expect(() => parseMemory(q)).to.throw(/invalid memory quantity/));
  }
  for (const q of [-1, 0.5, '0.0001', '1.5m', 'x']) {
    it(`parseCpu(${JSON.stringify(q)}) throws`, () => expect(() => parseCpu(q)).to.throw(/invalid cpu quantity/));
  }
});
