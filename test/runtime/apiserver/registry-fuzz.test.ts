// Bad input is never a 500: throw odd bodies, patches and options at every verb and require
// each failure to be a 4xx StatusError (and the store to stay consistent).
import { expect } from 'chai';
import { StatusError } from '../../../runtime/meta/errors.js';
import { makeEnv, widget, W, G, NS, type Env } from './registry-fixtures.js';

const ctx = { userAgent: 'fuzz' };
const odd: unknown[] = [
  null,
  0,
  'str',
  [],
  [{}],
  true,
  {},
  { metadata: null },
  { metadata: [] },
  { metadata: { name: 5 } },
  { metadata: { name: 'ok', labels: 'x' } },
  { metadata: { name: 'ok', labels: { a: 5 } } },
  { metadata: { name: 'ok', annotations: [] } },
  { metadata: { name: 'ok', finalizers: 'f' } },
  { metadata: { name: 'ok', finalizers: [1] } },
  { metadata: { name: 'ok', generateName: 7 } },
  { metadata: { name: 'ok', namespace: 5 } },
  { metadata: { name: 'ok', resourceVersion: 12 } },
  { metadata: { name: 'ok', uid: {} } },
  { metadata: { name: 'ok', managedFields: 'x' } },
  { metadata: { name: 'ok', managedFields: [1, 2] } },
  { metadata: { name: 'ok', deletionTimestamp: 3 } },
  { apiVersion: 5, metadata: { name: 'ok' } },
  { kind: [], metadata: { name: 'ok' } },
  { metadata: { name: '../x' } },
  { metadata: { name: 'x'.repeat(300) } },
];

/** Cases that were accepted (no error): each test compares them with the list it expects. */
let accepted: string[] = [];

/** Runs fn: an error must be a 4xx StatusError; an accepted call is recorded in `accepted` (checked by the test). */
async function only4xx(fn: () => unknown, what: string): Promise<void> {
  try {
    await fn();
  } catch (e) {
    expect(e, `${what}: ${String(e)}`).to.be.instanceOf(StatusError);
    const code = (e as StatusError).code;
    expect(code >= 400 && code < 500, `${what}: got ${code} ${(e as StatusError).message}`).to.equal(true);
    return;
  }
  accepted.push(what);
}

describe('registry: bad input is never a 500', () => {
  let env: Env;
  beforeEach(() => {
    env = makeEnv();
    accepted = [];
  });
  afterEach(() => env.close());

  it('odd bodies on create, update, merge/JSON/apply patches', async () => {
    await env.registry.create(W, 'default', widget('ok') as any, {}, ctx);
    for (const [i, b] of odd.entries()) {
      // The metadata of a body, for the cases that replace or merge .metadata itself.
      const meta =
        b !== null && typeof b === 'object' && !Array.isArray(b) && 'metadata' in b
          ? (b as { metadata: unknown }).metadata
          : b;
      await only4xx(() => env.registry.create(W, 'default', b as any, {}, ctx), `create #${i}`);
      await only4xx(() => env.registry.create(G, undefined, b as any, {}, ctx), `create cluster #${i}`);
      await only4xx(() => env.registry.update(W, 'default', 'ok', b as any, {}, ctx), `update #${i}`);
      await only4xx(
        () => env.registry.update(W, 'default', 'ok', b as any, { subresource: 'status' }, ctx),
        `update status #${i}`,
      );
      await only4xx(() => env.registry.patch(W, 'default', 'ok', 'merge', b, {}, ctx), `merge #${i}`);
      await only4xx(() => env.registry.patch(W, 'default', 'ok', 'json', b, {}, ctx), `json #${i}`);
      await only4xx(
        () =>
          env.registry.patch(W, 'default', 'ok', 'json', [{ op: 'replace', path: '/metadata', value: meta }], {}, ctx),
        `json meta #${i}`,
      );
      await only4xx(
        () => env.registry.patch(W, 'default', 'ok', 'apply', b, { fieldManager: 'f' }, ctx),
        `apply #${i}`,
      );
      await only4xx(
        () => env.registry.patch(W, 'default', 'ok', 'merge', { metadata: meta }, {}, ctx),
        `merge meta #${i}`,
      );
      await only4xx(() => env.registry.create(NS, undefined, b as any, {}, ctx), `namespace #${i}`);
    }
    // What is valid input after all (everything else is a 4xx): an empty JSON patch (#3), the
    // empty object as merge/apply/metadata (#6, a no-op), a managedFields that is not a list
    // of entries (#19, #20: managedFields is the server's to compute from the write), and the
    // metadata of #22/#23, whose oddity (apiVersion, kind) lies outside metadata.
    expect(accepted).to.deep.equal([
      'json #3',
      'merge #6',
      'json meta #6',
      'apply #6',
      'merge meta #6',
      'create cluster #19',
      'merge #19',
      'json meta #19',
      'merge meta #19',
      'namespace #19',
      'merge #20',
      'json meta #20',
      'merge meta #20',
      'json meta #22',
      'merge meta #22',
      'json meta #23',
      'merge meta #23',
    ]);
    const ok = await env.registry.get(W, 'default', 'ok', ctx);
    expect(ok.metadata.name).to.equal('ok');
  });

  it('odd options on reads and deletes', async () => {
    const lists: unknown[] = [
      { limit: 'x' },
      { limit: 1.5 },
      { continue: '' },
      { continue: '%%' },
      { resourceVersion: '-1' },
      { labelSelector: '(' },
      { fieldSelector: ',,=' },
    ];
    for (const o of lists)
      await only4xx(() => env.registry.list(W, 'default', o as any, ctx), `list ${JSON.stringify(o)}`);
    for (const o of [{ resourceVersion: 'x' }, { labelSelector: 'a in (' }, { fieldSelector: 'x=y' }])
      await only4xx(() => env.registry.watch(W, 'default', o as any, ctx).close(), `watch ${JSON.stringify(o)}`);
    await only4xx(() => env.registry.delete(W, 'default', 'nope', {}, ctx), 'delete missing');
    await only4xx(
      () => env.registry.delete(W, 'default', 'nope', { propagationPolicy: 'Sideways' as any }, ctx),
      'delete policy',
    );
    await only4xx(() => env.registry.get(W, undefined, 'x', ctx), 'get no namespace');
    // An empty continue token is no token: a plain list.
    expect(accepted).to.deep.equal(['list {"continue":""}']);
  });
});
