import { expect } from 'chai';
import { getCondition, isConditionTrue, rfc3339, setCondition } from '../../../runtime/controller/conditions.js';
import { keyString, parseKey } from '../../../runtime/controller/reconciler.js';

describe('runtime/controller conditions', () => {
  const t0 = Date.UTC(2026, 0, 1, 0, 0, 0);
  const t1 = t0 + 60_000;

  it('adds a condition with lastTransitionTime now', () => {
    const c = setCondition(undefined, { type: 'Ready', status: 'False', reason: 'Booting', observedGeneration: 1 }, t0);
    expect(c).to.deep.equal([
      {
        type: 'Ready',
        status: 'False',
        observedGeneration: 1,
        lastTransitionTime: '2026-01-01T00:00:00Z',
        reason: 'Booting',
        message: '',
      },
    ]);
  });

  const cases: { name: string; from: 'True' | 'False'; to: 'True' | 'False'; flips: boolean }[] = [
    { name: 'same status keeps lastTransitionTime', from: 'True', to: 'True', flips: false },
    { name: 'flip True->False moves it', from: 'True', to: 'False', flips: true },
    { name: 'flip False->True moves it', from: 'False', to: 'True', flips: true },
  ];
  for (const tc of cases) {
    it(tc.name, () => {
      const a = setCondition([], { type: 'Ready', status: tc.from, reason: 'A', observedGeneration: 1 }, t0);
      const b = setCondition(a, { type: 'Ready', status: tc.to, reason: 'B', message: 'm', observedGeneration: 2 }, t1);
      const c = getCondition(b, 'Ready')!;
      expect(c.lastTransitionTime).to.equal(tc.flips ? '2026-01-01T00:01:00Z' : '2026-01-01T00:00:00Z');
      expect(c.reason).to.equal('B');
      expect(c.message).to.equal('m');
      expect(c.observedGeneration).to.equal(2);
      expect(a[0].reason).to.equal('A', 'input not modified');
    });
  }

  it('keeps other conditions and their order', () => {
    let c = setCondition([], { type: 'A', status: 'True', reason: 'x' }, t0);
    c = setCondition(c, { type: 'B', status: 'True', reason: 'x' }, t0);
    c = setCondition(c, { type: 'A', status: 'False', reason: 'y' }, t1);
    expect(c.map((x) => x.type)).to.deep.equal(['A', 'B']);
  });

  it('isConditionTrue honours observedGeneration like kubectl wait', () => {
    const c = setCondition([], { type: 'Ready', status: 'True', reason: 'x', observedGeneration: 1 }, t0);
    expect(isConditionTrue(c, 'Ready', 1)).to.equal(true);
    expect(isConditionTrue(c, 'Ready', 2)).to.equal(false);
    expect(isConditionTrue(c, 'Other')).to.equal(false);
  });

  it('rfc3339: second precision from a number, a Date or a parseable string; an invalid time throws', () => {
    expect(rfc3339(t0 + 999)).to.equal('2026-01-01T00:00:00Z');
    expect(rfc3339(new Date(t1))).to.equal('2026-01-01T00:01:00Z');
    expect(rfc3339('2026-01-01T00:01:00.123456Z')).to.equal('2026-01-01T00:01:00Z');
    expect(rfc3339('2026-01-01T02:01:00.5+02:00')).to.equal('2026-01-01T00:01:00Z');
    expect(() => rfc3339('yesterday')).to.throw(RangeError);
  });

  it('keys round-trip', () => {
    expect(parseKey(keyString({ namespace: 'ns', name: 'a' }))).to.deep.equal({ namespace: 'ns', name: 'a' });
    expect(parseKey(keyString({ namespace: '', name: 'a' }))).to.deep.equal({ namespace: '', name: 'a' });
  });
});
