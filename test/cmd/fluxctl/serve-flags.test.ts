// The size flags of `fluxctl serve` (--watch-log-budget, --disk-reserve): bytes or Ki/Mi/Gi.
import { expect } from 'chai';
import { parseBytes } from '../../../cmd/fluxctl/main.js';
import { CliError } from '../../../cmd/fluxctl/util.js';

describe('fluxctl serve size flags', () => {
  it('bytes, Ki, Mi, Gi; 0 is allowed (no reserve)', () => {
    expect(parseBytes('0', '--disk-reserve')).to.equal(0);
    expect(parseBytes('4096', '--disk-reserve')).to.equal(4096);
    expect(parseBytes('512Ki', '--disk-reserve')).to.equal(512 * 1024);
    expect(parseBytes('64Mi', '--watch-log-budget')).to.equal(64 * 1024 * 1024);
    expect(parseBytes('1Gi', '--watch-log-budget')).to.equal(1024 ** 3);
  });

  it('anything else is a CliError naming the flag', () => {
    for (const v of ['', '-1', '1.5Mi', '64MB', 'Mi', '8 Mi']) {
      let err: unknown;
      try {
        parseBytes(v, '--disk-reserve');
      } catch (e) {
        err = e;
      }
      expect(err, v).to.be.instanceOf(CliError);
      expect((err as Error).message).to.contain('--disk-reserve');
    }
  });
});
