// withRawTerminal (cmd/fluxctl/terminal.ts) on a real pseudo-terminal: raw while the session
// runs, window sizes followed, and the terminal's modes back as they were right after the
// session ends (returned, thrown, or ended by a signal), while the process still runs (Node
// resets the terminal at exit on its own: that would hide a missing restore).
import { expect } from 'chai';
import path from 'node:path';
import { ECHO, ICANON, ptySkipReason, runOnPty } from '../../e2e/pty.js';
import { skipWith } from '../../skip.js';

const SCRIPT = path.join(import.meta.dirname, 'fixtures', 'raw-session.ts');

describe('fluxctl terminal: withRawTerminal on a real pty', function () {
  this.timeout(60_000);
  before(function () {
    skipWith(this, ptySkipReason());
  });
  const start = () => runOnPty([process.execPath, '--import', 'tsx', SCRIPT], { rows: 30, cols: 90 });

  it('raw during the session, the size followed, cooked again right after it returns', async () => {
    const p = start();
    const before = await p.initialModes;
    await p.until(/IN 30x90 raw=true\r?\n/);
    expect((await p.modes())[3] & (ECHO | ICANON)).to.equal(0);
    p.resize(40, 100);
    await p.until(/RESIZE 40x100/);
    p.send('k');
    await p.until(/OUT 5 raw=false/);
    expect(await p.modes()).to.deep.equal(before);
    p.send('k\r'); // cooked again: a line
    expect(await p.exit).to.equal(0);
  });

  it('restored when the session throws', async () => {
    const p = start();
    const before = await p.initialModes;
    await p.until(/IN 30x90 raw=true/);
    p.send('x');
    await p.until(/THREW boom\r?\nOUT 9 raw=false/);
    expect(await p.modes()).to.deep.equal(before);
    p.send('k\r'); // cooked again: a line
    expect(await p.exit).to.equal(0);
  });

  for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
    it(`a ${sig} ends the session with 128+N, restored first, and the process keeps control`, async () => {
      const p = start();
      const before = await p.initialModes;
      await p.until(/IN 30x90 raw=true/);
      p.signal(sig);
      const n = { SIGTERM: 15, SIGINT: 2, SIGHUP: 1 }[sig];
      await p.until(new RegExp(`SIGNAL ${sig}\\r?\\nOUT ${128 + n} raw=false`));
      expect(await p.modes()).to.deep.equal(before);
      p.send('k\r');
      expect(await p.exit).to.equal(0);
    });
  }
});
