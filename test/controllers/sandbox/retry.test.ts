// Pure helpers of a failed create's report and backoff (controllers/sandbox/retry.ts).
import { expect } from 'chai';
import { RuntimeError } from '../../../native/runtime.js';
import {
  CreateRetries,
  describeFailure,
  MAX_CAUSE,
  RETRY_MAX_MS,
  retryDelayMs,
} from '../../../controllers/sandbox/retry.js';

describe('controllers/sandbox retry: what a failed create reports, when it is tried again', () => {
  it('backs off 1 s doubling, capped at 5 min (the cap reached and held)', () => {
    expect([1, 2, 3, 4, 9].map(retryDelayMs)).to.deep.equal([1000, 2000, 4000, 8000, 256_000]);
    expect(retryDelayMs(10)).to.equal(RETRY_MAX_MS);
    expect(retryDelayMs(1000)).to.equal(RETRY_MAX_MS);
  });

  it('describes a failure: the runtime reason or CreateFailed, the first line, permanent and stalled', () => {
    const table: Array<[unknown, { reason: string; cause: string; permanent: boolean; stalled: boolean }]> = [
      [
        new RuntimeError('Internal', 'timeout'),
        { reason: 'CreateFailed', cause: 'timeout', permanent: false, stalled: false },
      ],
      [
        new RuntimeError('Internal', '\n  qemu could not start (exit 1): x\nmore', 'QemuFailed'),
        { reason: 'QemuFailed', cause: 'qemu could not start (exit 1): x', permanent: false, stalled: true },
      ],
      [
        new RuntimeError('InvalidArgument', 'image "u" is not on this host', 'ImageNotFound'),
        { reason: 'ImageNotFound', cause: 'image "u" is not on this host', permanent: true, stalled: false },
      ],
      [new RuntimeError('Unsupported', 'no'), { reason: 'CreateFailed', cause: 'no', permanent: true, stalled: false }],
      [new Error(''), { reason: 'CreateFailed', cause: 'unknown error', permanent: false, stalled: false }],
      ['text', { reason: 'CreateFailed', cause: 'text', permanent: false, stalled: false }],
    ];
    for (const [e, want] of table) expect(describeFailure(e)).to.deep.equal(want);
    expect(describeFailure(new Error('x'.repeat(MAX_CAUSE))).cause).to.have.length(MAX_CAUSE);
    expect(describeFailure(new Error('x'.repeat(MAX_CAUSE + 1))).cause).to.equal(`${'x'.repeat(MAX_CAUSE)}...`);
  });

  it('counts failures per uid, waits until the next attempt is due, forgets on clear', () => {
    const r = new CreateRetries();
    expect(r.waitMs('a', 0)).to.equal(0);
    expect(r.fail('a', 10_000)).to.deep.equal({ attempt: 1, delayMs: 1000 });
    expect(r.waitMs('a', 10_400)).to.equal(600);
    expect(r.waitMs('a', 11_000)).to.equal(0);
    expect(r.waitMs('b', 10_400)).to.equal(0);
    expect(r.fail('a', 11_000)).to.deep.equal({ attempt: 2, delayMs: 2000 });
    expect(r.has('a')).to.equal(true);
    r.clear('a');
    expect(r.has('a')).to.equal(false);
    expect(r.fail('a', 0).attempt).to.equal(1);
  });
});
