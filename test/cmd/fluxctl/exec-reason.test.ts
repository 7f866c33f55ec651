// fluxctl exec's one-line reason: a command that printed nothing, or whose only
// output is the runtime's line saying why it could not start, gets "error: command not found"
// (127) or "command not executable" (126); a command that printed anything else does not.
import { expect } from 'chai';
import { exitReason, onlyStartFailure } from '../../../cmd/fluxctl/sandbox.js';

describe('cmd/fluxctl exec: the reason line of a command that could not start', () => {
  it("recognises only the runtime's single start-failure line (procbox, vm guest agent, on a terminal too)", () => {
    const cases: Array<[string, boolean]> = [
      ['procbox: exec nosuchcmd: No such file or directory\n', true],
      ['procbox: exec ./x.sh: Permission denied\r\n', true],
      ['fluxvm-agent: nosuchcmd: No such file or directory\n', true],
      ['', false],
      ['oops\n', false],
      ['procbox: exec nosuchcmd: No such file or directory', false], // not a whole line
      ['procbox: exec a: No such file or directory\nmore\n', false],
      ['own line\nprocbox: exec a: No such file or directory\n', false],
      ['procbox: chdir /x: No such file or directory\n', false],
      [`procbox: exec ${'a'.repeat(1100)}: No such file or directory\n`, false], // beyond the 1 KiB it looks at
    ];
    for (const [text, want] of cases) expect(onlyStartFailure(Buffer.from(text)), JSON.stringify(text)).to.equal(want);
  });

  it('names 127 and 126, and nothing for a clean exit or an ordinary failure', () => {
    expect(exitReason(['nosuchcmd', '-x'], 127, undefined)).to.equal('command not found: nosuchcmd');
    expect(exitReason(['./x.sh'], 126, undefined)).to.equal('command not executable: ./x.sh');
    expect(exitReason(['true'], 0, undefined)).to.equal(undefined);
    expect(exitReason(['false'], 1, undefined)).to.equal(undefined);
  });
});
