// The one rule for a command's environment entry (native/env.ts), used by exec, jobs and a
// claim's env on a running sandbox.
import { expect } from 'chai';
import { validEnvEntry } from '../../native/env.js';

describe('native/env: validEnvEntry', () => {
  it('takes shell identifiers with string values and refuses the rest', () => {
    for (const [k, v] of [
      ['A', ''],
      ['_x9', 'a=b c'],
      ['PATH', '/usr/bin'],
    ] as const)
      expect(validEnvEntry(k, v), k).to.equal(true);
    for (const [k, v] of [
      ['', 'x'],
      ['9A', 'x'],
      ['A-B', 'x'],
      ['A=B', 'x'],
      ['A B', 'x'],
      ['A', 'nul\0inside'],
      ['A', 1],
      ['A', undefined],
    ] as const)
      expect(validEnvEntry(k, v), `${JSON.stringify(k)}=${JSON.stringify(v)}`).to.equal(false);
  });
});
