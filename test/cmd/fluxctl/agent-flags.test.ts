// fluxctl agent's --timeout is a kubectl duration like every other verb's (30s, 5m; a bare
// number is seconds): a bad one is refused naming the flag before anything is sent.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { main } from '../../../cmd/fluxctl/main.js';

async function run(argv: string[]): Promise<{ code: number; err: string }> {
  let err = '';
  const code = await main(argv, { out: () => {}, err: (s: string) => (err += s), stdin: async () => '' });
  return { code, err };
}

describe('fluxctl agent --timeout', () => {
  const missing = path.join(os.tmpdir(), `fluxctl-no-kubeconfig-${process.pid}`);
  before(() => fs.rmSync(missing, { force: true }));

  for (const verb of [
    ['exec', 's1', '--timeout'],
    ['run', '--timeout'],
  ])
    it(`${verb[0]}: a bad duration is refused naming the flag; 2m and 90 are accepted`, async () => {
      const bad = await run(['agent', ...verb, '5q', '--kubeconfig', missing, '--', 'true']);
      expect(bad.code).to.equal(1);
      expect(bad.err).to.contain('error: invalid duration for --timeout "5q"');
      for (const ok of ['2m', '90']) {
        const r = await run(['agent', ...verb, ok, '--kubeconfig', missing, '--', 'true']);
        expect(r.code).to.equal(1); // the kubeconfig does not exist: past flag parsing
        expect(r.err).to.not.contain('--timeout');
        expect(r.err).to.contain(missing);
      }
    });
});
