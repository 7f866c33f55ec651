// KeyedLock: same-key calls run one at a time in call order, other keys in parallel, a failure
// does not block the next call, and no key is kept once its work is done.
import { expect } from 'chai';
import { KeyedLock } from '../../../controllers/common/keyedlock.js';

describe('controllers/common KeyedLock', () => {
  it('serialises one key in call order, runs other keys alongside, survives a failure, forgets idle keys', async () => {
    const l = new KeyedLock();
    const log: string[] = [];
    let releaseA!: () => void;
    const gateA = new Promise<void>((r) => (releaseA = r));
    const a1 = l.run('a', async () => {
      log.push('a1 start');
      await gateA;
      log.push('a1 end');
      throw new Error('a1 failed');
    });
    const a2 = l.run('a', async () => {
      log.push('a2');
      return 2;
    });
    const b = l.run('b', async () => {
      log.push('b');
      return 'b';
    });
    expect(await b).to.equal('b');
    expect(log).to.deep.equal(['a1 start', 'b']); // a2 waits for a1; b did not
    expect(l.size).to.equal(1);
    releaseA();
    await a1.then(
      () => expect.fail('a1 should reject'),
      (e: Error) => expect(e.message).to.equal('a1 failed'),
    );
    expect(await a2).to.equal(2);
    expect(log).to.deep.equal(['a1 start', 'b', 'a1 end', 'a2']);
    await Promise.resolve();
    expect(l.size).to.equal(0);
  });
});
