// CreateIdempotency (runtime/apiserver/idempotency.ts) on a real SQLite file: the record of a
// create cut by a crash (a second instance on the same file stands for the restarted server)
// is settled by the store, a running key is 409 in its own process, another request 422, a
// failed create frees the key, records expire after 24 h.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CreateIdempotency, idempotencyKeyOf, requestDigest } from '../../../runtime/apiserver/idempotency.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import type { KubeObject } from '../../../runtime/meta/types.js';

const req = (key: string, body: unknown = { a: 1 }) => ({
  user: 'u',
  key,
  digest: requestDigest(body),
  kind: 'Sandbox',
  group: 'fluxvm.dev',
});
const obj = (name: string, uid: string): KubeObject => ({
  apiVersion: 'v1',
  kind: 'Sandbox',
  metadata: { name, uid, namespace: 'default' },
});
const codeOf = async (p: Promise<unknown>) =>
  p.then(
    () => 0,
    (e) => (e instanceof StatusError ? e.code : -1),
  );

describe('runtime/apiserver CreateIdempotency', () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'idem-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('a create cut after the store committed: the restarted server answers with that object; cut before: the create runs again', async () => {
    const file = join(dir, 'idempotency.db');
    const a = new CreateIdempotency(file);
    const stored = new Map<string, KubeObject>();
    // Cut after beforeStore (the store committed, the answer was never recorded): it hangs forever.
    void a.run(
      req('k1'),
      'default',
      () => undefined,
      async (before) => {
        const o = obj('idem-abcde', 'uid-1');
        before(o);
        stored.set('idem-abcde', o);
        return new Promise<never>(() => undefined);
      },
    );
    // Cut before the store: pending without a name.
    void a.run(
      req('k2'),
      'default',
      () => undefined,
      () => new Promise<never>(() => undefined),
    );
    await new Promise((r) => setImmediate(r));
    // The same process: still running.
    expect(
      await codeOf(
        a.run(
          req('k1'),
          'default',
          () => undefined,
          async () => ({ object: obj('x', 'y') }),
        ),
      ),
    ).to.equal(409);
    const b = new CreateIdempotency(file);
    let ran = 0;
    const out = await b.run(
      req('k1'),
      'default',
      (_ns, name) => stored.get(name),
      async () => (ran++, { object: obj('other', 'uid-2') }),
    );
    expect(ran).to.equal(0);
    expect(JSON.parse(out.replay!).metadata).to.include({ name: 'idem-abcde', uid: 'uid-1' });
    const again = await b.run(
      req('k2'),
      'default',
      () => undefined,
      async () => (ran++, { object: obj('fresh', 'uid-3') }),
    );
    expect(ran).to.equal(1);
    expect(again.result!.object.metadata.name).to.equal('fresh');
    a.close();
    b.close();
  });

  it('another request with the key is 422; a failed create frees the key; records expire after 24 h', async () => {
    let now = 1_000_000;
    const c = new CreateIdempotency(join(dir, 'i.db'), () => now);
    await c.run(
      req('k'),
      'default',
      () => undefined,
      async () => ({ object: obj('a', '1') }),
    );
    expect(
      await codeOf(
        c.run(
          req('k', { a: 2 }),
          'default',
          () => undefined,
          async () => ({ object: obj('b', '2') }),
        ),
      ),
    ).to.equal(422);
    expect(
      await codeOf(
        c.run(
          req('f'),
          'default',
          () => undefined,
          async () => Promise.reject(new StatusError(409, 'AlreadyExists', 'x')),
        ),
      ),
    ).to.equal(409);
    expect(
      (
        await c.run(
          req('f'),
          'default',
          () => undefined,
          async () => ({ object: obj('c', '3') }),
        )
      ).result,
    ).to.not.equal(undefined);
    now += 24 * 3600 * 1000 - 1;
    expect(
      (
        await c.run(
          req('k'),
          'default',
          () => undefined,
          async () => ({ object: obj('d', '4') }),
        )
      ).replay,
    ).to.be.a('string');
    now += 2;
    expect(
      (
        await c.run(
          req('k', { a: 2 }),
          'default',
          () => undefined,
          async () => ({ object: obj('e', '5') }),
        )
      ).result?.object.metadata.name,
    ).to.equal('e');
    c.close();
  });

  it('the header: 1-256 printable ASCII characters', () => {
    expect(idempotencyKeyOf({})).to.equal(undefined);
    expect(idempotencyKeyOf({ 'idempotency-key': 'x'.repeat(256) })).to.have.length(256);
    for (const bad of ['', 'x'.repeat(257), 'a b', 'caf\u00e9'])
      expect(() => idempotencyKeyOf({ 'idempotency-key': bad }), bad).to.throw(StatusError);
  });
});
