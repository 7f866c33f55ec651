// Helpers shared by the admission tests (admit.test.ts, admit-rules.test.ts): an object of a
// kind, a Changeset, and admit() run to its StatusError or its causes.
import { expect } from 'chai';
import { changeset } from '../../../../apis/changeset.js';
import type { KindDefinition } from '../../../../apis/types.js';
import { admit, type FieldValidation } from '../../../../runtime/apiserver/admission/index.js';
import { StatusError } from '../../../../runtime/meta/errors.js';
import type { StatusCause } from '../../../../runtime/meta/types.js';

export const GV = 'fluxvm.dev/v1alpha1';

export function mk(def: KindDefinition, spec: unknown, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const apiVersion = def.group ? `${def.group}/${def.version}` : def.version;
  return {
    apiVersion,
    kind: def.kind,
    metadata: { name: 'x', namespace: 'default' },
    ...(spec === undefined ? {} : { spec }),
    ...extra,
  };
}

export const cs = (spec: Record<string, unknown> = {}) =>
  mk(changeset, { sandboxRef: { name: 'sb' }, command: ['make', 'build'], ...spec });

/** Runs admit and returns the thrown StatusError (or undefined when it passed). */
export function fail(
  def: KindDefinition,
  obj: unknown,
  old?: object,
  fv: FieldValidation = 'Strict',
  subresource?: string,
): StatusError | undefined {
  try {
    admit(def, obj, old, { fieldValidation: fv, subresource });
    return undefined;
  } catch (e) {
    expect(e, 'only StatusErrors are thrown').to.be.instanceOf(StatusError);
    return e as StatusError;
  }
}

export function causes(def: KindDefinition, obj: unknown, old?: object, subresource?: string): StatusCause[] {
  const e = fail(def, obj, old, 'Strict', subresource);
  if (!e) return [];
  expect(e.code, e.message).to.equal(422);
  return e.status.details?.causes ?? [];
}

export const fields = (c: StatusCause[]) => c.map((x) => x.field);

export function cond(type: string) {
  return { type, status: 'True', lastTransitionTime: '2026-01-01T00:00:00Z', reason: 'Ok', message: '' };
}
