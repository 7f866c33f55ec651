// The diff subresource with a full diff pool: 429 TooManyRequests with a
// Retry-After, nothing computed; with room, the same request answers the diff. Real procbox
// speculation, the real subresource handler (its reply captured).
import { expect } from 'chai';
import { changesetSubresources, DiffPool } from '../../../controllers/changeset/index.js';
import type { SubresourceRequest } from '../../../runtime/apiserver/http/subresources.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import type { AnyObject } from '../../support/objects.js';
import { skipWith } from '../../skip.js';
import { lockFile } from './bigfiles.js';
import { makeEnv, skipReason, type Env } from './env.js';

/** GET changesets/NAME/diff through the handler: the status code and body sent, or the StatusError thrown. */
async function getDiff(env: Env, pool: DiffPool, name: string): Promise<{ code: number; body: string } | StatusError> {
  const diff = changesetSubresources({ client: env.client, runtime: env.rt, stateDir: env.stateDir, diffs: pool }).find(
    (s) => s.name === 'diff',
  )!;
  const sent = { code: 0, body: '' };
  const reply = {
    code(c: number) {
      sent.code = c;
      return reply;
    },
    header: () => reply,
    send(b: string) {
      sent.body = b;
      return reply;
    },
  };
  const r = {
    method: 'GET',
    namespace: 'default',
    name,
    subresource: 'diff',
    query: {},
    headers: {},
    body: undefined,
    reply,
  } as unknown as SubresourceRequest;
  try {
    await diff.handler.handle!(r);
    return sent;
  } catch (e) {
    if (e instanceof StatusError) return e;
    throw e;
  }
}

describe('changesets/diff with a full diff pool (procbox)', function () {
  this.timeout(120_000);
  let env: Env;

  before(async function () {
    skipWith(this, skipReason());
    env = await makeEnv();
    const sbx = await env.sandbox('box');
    await env.rt.writeFile(sbx, '/work/lock.json', lockFile(5000, 'old'));
    await env.changeset('edit', {
      sandboxRef: { name: 'box' },
      command: ['sh', '-c', 'sed -i s/pkg-500\\"/EDITED\\"/ /work/lock.json'],
    });
    await env.until('edit', (o: AnyObject) => o.status?.phase === 'Pending');
  });
  after(async () => env?.close());

  it('no room in the queue: 429 TooManyRequests, Retry-After 1; with room: the diff', async () => {
    const full = new DiffPool({ maxQueue: 0 });
    const refused = await getDiff(env, full, 'edit');
    expect(refused).to.be.instanceOf(StatusError);
    expect((refused as StatusError).status).to.deep.include({
      code: 429,
      reason: 'TooManyRequests',
      message: 'too many file diffs are being computed (0 waiting); retry later',
    });
    expect((refused as StatusError).status.details?.retryAfterSeconds).to.equal(1);
    expect(full.size).to.equal(0);
    const pool = new DiffPool({ maxQueue: 1 });
    try {
      const ok = await getDiff(env, pool, 'edit');
      expect(ok).to.not.be.instanceOf(StatusError);
      expect((ok as { code: number; body: string }).code).to.equal(200);
      expect((ok as { code: number; body: string }).body)
        .to.include('@@ -498,7 +498,7 @@\n')
        .and.include('\n+    "node_modules/EDITED": {');
    } finally {
      await pool.close();
    }
  });
});
