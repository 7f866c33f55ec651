// Presence-only CEL rules (has(self.x) and nothing else of self) run on a one-level map of the
// object's fields instead of its converted subtree: same results, fewer conversions.
import { expect } from 'chai';
import type { Schema } from '../../../../apis/types.js';
import {
  celConversions,
  checkRules,
  evalCel,
  isPresenceOnlyRule,
  toCel,
} from '../../../../runtime/apiserver/admission/cel.js';

const big = { name: 'x', items: Array.from({ length: 50 }, (_, i) => ({ i, tags: ['a', 'b'] })) };
const ref: Schema = { type: 'object', properties: { name: { type: 'string' } } };
function schemaWith(rule: string, extra: Partial<Schema['x-kubernetes-validations']> = []): Schema {
  return {
    type: 'object',
    properties: { a: ref, b: ref, n: { type: 'integer' } },
    'x-kubernetes-validations': [{ rule }, ...(extra ?? [])],
  } as Schema;
}

describe('admission CEL: presence-only rules', () => {
  it('recognises rules whose only use of self/oldSelf is has(self.<field>)', () => {
    const yes = [
      'has(self.sessionRef) != has(self.sandboxRef)',
      '!has(self.claims)',
      '(has(self.checkpointRef) ? 1 : 0) + (has(self.sandboxRef) ? 1 : 0) + (has(self.git) ? 1 : 0) <= 1',
      'has(self.sessionRef) == has(oldSelf.sessionRef) && has( self . sandboxRef )',
    ];
    const no = [
      'has(self.a) && size(self.a) > 0',
      'has(self.a.b)',
      'self == oldSelf',
      'has(self.a) || "self" == ""',
      'has(self.`a-b`)',
      '!has(oldSelf.nodeName) || has(self.nodeName) || oldSelf.x',
      'x.self',
    ];
    for (const r of yes) expect(isPresenceOnlyRule(r), r).to.equal(true);
    for (const r of no) expect(isPresenceOnlyRule(r), r).to.equal(false);
  });

  it('converts nothing of a passing object for such a rule (the whole subtree before)', () => {
    const schema = schemaWith('has(self.a) != has(self.b)');
    const before = celConversions.nodes;
    expect(checkRules({ a: big, n: 3 }, undefined, schema, ['spec'], { reportEvalErrors: true })).to.deep.equal([]);
    expect(celConversions.nodes - before).to.equal(0);
  });

  // Edge values: the shortcut and the full conversion give the same verdict.
  const values: [string, unknown][] = [
    ['absent', {}],
    ['null', { a: null }],
    ['undefined', { a: undefined }],
    ['empty object', { a: {} }],
    ['zero', { a: 0 }],
    ['empty string', { a: '' }],
    ['false', { a: false }],
    ['empty list', { a: [] }],
    ['both', { a: {}, b: {} }],
    ['a list self', [1, 2]],
    ['a string self', 'str'],
  ];
  const rules = [
    'has(self.a) != has(self.b)',
    '!has(self.a)',
    '(has(self.a) ? 1 : 0) + (has(self.b) ? 1 : 0) <= 1',
    'has(self.a) == has(oldSelf.a)',
  ];
  for (const rule of rules)
    for (const [what, v] of values)
      it(`${rule} on ${what}: the full conversion's result`, () => {
        for (const old of [undefined, {}, { a: null }, { a: 1, b: 2 }]) {
          const transition = rule.includes('oldSelf');
          if (transition && old === undefined) continue;
          const schema = schemaWith(rule);
          const full = evalCel(
            rule,
            transition ? { self: toCel(v, schema), oldSelf: toCel(old, schema) } : { self: toCel(v, schema) },
          );
          const got = checkRules(v, old, schema, ['spec'], { reportEvalErrors: true });
          // An unchanged value is not checked (ratcheting); compare only where the rule ran.
          const ran = transition || old === undefined || JSON.stringify(v) !== JSON.stringify(old);
          if (!ran) continue;
          if (full === true) expect(got, JSON.stringify({ v, old })).to.deep.equal([]);
          else {
            expect(got, JSON.stringify({ v, old })).to.have.length(1);
            if (full instanceof Error) expect(got[0].message).to.include(`${full.message} evaluating rule`);
          }
        }
      });

  it("a failing rule's messageExpression still sees the whole values", () => {
    const schema = {
      type: 'object',
      properties: { a: ref, b: ref },
      'x-kubernetes-validations': [
        { rule: 'has(self.a) != has(self.b)', messageExpression: '"both set: " + self.a.name + "/" + self.b.name' },
      ],
    } as Schema;
    const got = checkRules({ a: { name: 'x' }, b: { name: 'y' } }, undefined, schema, ['spec'], {
      reportEvalErrors: true,
    });
    expect(got).to.have.length(1);
    expect(got[0].field).to.equal('spec');
    expect(got[0].message).to.equal('Invalid value: "object": both set: x/y');
  });
});
