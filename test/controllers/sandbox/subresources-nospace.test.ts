// A full disk under a sandbox's workspace (files PUT, baseline, dry-run) answers 507
// InsufficientStorage, never 500: the mapping every sandbox subresource goes through.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import { diskFullAt, guarded, noSpaceError } from '../../../controllers/sandbox/subresources.js';
import { RuntimeError } from '../../../native/runtime.js';
import type { SubresourceRequest } from '../../../runtime/apiserver/http/subresources.js';
import { StatusError } from '../../../runtime/meta/errors.js';
import { skipWith } from '../../skip.js';

async function statusOf(f: () => unknown): Promise<StatusError> {
  try {
    await f();
  } catch (e) {
    return e as StatusError;
  }
  throw new Error('no error');
}

describe('controllers/sandbox subresources: a full disk is 507, not 500', () => {
  it('a real ENOSPC from the file system (a write to /dev/full) through a handler', async function () {
    skipWith(this, fs.existsSync('/dev/full') ? undefined : 'no /dev/full on this host');
    const h = guarded({ handle: () => fs.writeFileSync('/dev/full', 'x') });
    const e = await statusOf(() => h.handle!({ name: 'sbx', namespace: 'default' } as SubresourceRequest));
    expect(e).to.be.instanceOf(StatusError);
    expect(e.status).to.include({ code: 507, reason: 'InsufficientStorage' });
    expect(e.message).to.match(/^the sandbox's disk is full: ENOSPC/);
  });

  it('a runtime error carrying the errno text (procbox helper, guest agent), also as a cause', () => {
    expect(noSpaceError(new RuntimeError('Internal', 'write /work/a: No space left on device'))?.code).to.equal(507);
    expect(
      noSpaceError(new Error('staging failed', { cause: Object.assign(new Error('x'), { code: 'EDQUOT' }) }))?.code,
    ).to.equal(507);
  });

  it('other failures keep their mapping', async () => {
    expect(noSpaceError(new RuntimeError('Internal', 'broken pipe'))).to.equal(undefined);
    const h = guarded({
      handle: () => {
        throw new RuntimeError('Internal', 'broken pipe');
      },
    });
    expect(
      (await statusOf(() => h.handle!({ name: 'sbx', namespace: 'default' } as SubresourceRequest))).code,
    ).to.equal(500);
    // An internal error on a disk with room stays a 500 (the full-disk reading needs a full disk).
    const roomy = guarded(
      {
        handle: () => {
          throw new RuntimeError('Internal', 'readdir: Input/output error');
        },
      },
      os.tmpdir(),
    );
    expect(
      (await statusOf(() => roomy.handle!({ name: 'sbx', namespace: 'default' } as SubresourceRequest))).code,
    ).to.equal(500);
    expect(diskFullAt(os.tmpdir())).to.equal(false);
    const nf = guarded({
      handle: () => {
        throw new RuntimeError('NotFound', 'no such file');
      },
    });
    expect(
      (await statusOf(() => nf.handle!({ name: 'sbx', namespace: 'default' } as SubresourceRequest))).code,
    ).to.equal(404);
  });
});
