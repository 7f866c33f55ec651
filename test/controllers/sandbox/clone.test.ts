import { expect } from 'chai';
import { cleanMessage, validRef } from '../../../controllers/sandbox/clone.js';

describe('sandbox git clone (pure parts)', () => {
  it('a ref git could read as an option, or with odd characters, is refused before anything runs', () => {
    for (const ok of [undefined, '', 'main', 'v1.2.3', 'feature/x', 'a1b2c3d4', 'release@2026+1'])
      expect(validRef(ok), String(ok)).to.equal(true);
    for (const bad of ['-b', '--upload-pack=touch /x', '-', 'a b', 'x;y', '$(id)', 'a\nb'])
      expect(validRef(bad), bad).to.equal(false);
  });

  it('git output in status: control characters escaped, only the last lines, bounded', () => {
    expect(cleanMessage('Cloning...\nfatal: \x1b[31mno\x1b[0m\r\n')).to.equal(
      'Cloning...; fatal: \\x1b[31mno\\x1b[0m\\x0d',
    );
    const long = cleanMessage(Array.from({ length: 20 }, (_, i) => `line ${i}`).join('\n'));
    expect(long).to.equal(Array.from({ length: 6 }, (_, i) => `line ${i + 14}`).join('; '));
    expect(cleanMessage('x'.repeat(5000), 100)).to.have.length(103);
    expect(cleanMessage('\u009b2J')).to.equal('\\x9b2J');
  });
});
