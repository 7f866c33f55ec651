// fluxctl agent token: its flags are checked before anything is sent (a bad --ttl or -o names
// the flag; --ops is required); the rest is covered end to end (test/e2e/agentsession-tokens).
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

describe('fluxctl agent token flags', () => {
  const missing = path.join(os.tmpdir(), `fluxctl-no-kubeconfig-token-${process.pid}`);
  before(() => fs.rmSync(missing, { force: true }));

  it('a bad --ttl is refused naming the flag; 30m, 90 and 24h get past flag parsing', async () => {
    const bad = await run(['agent', 'token', 's1', '--ops', 'exec', '--ttl', '5q', '--kubeconfig', missing]);
    expect(bad.code).to.equal(1);
    expect(bad.err).to.contain('error: invalid duration for --ttl "5q"');
    for (const ok of ['30m', '90', '24h']) {
      const r = await run(['agent', 'token', 's1', '--ops', 'exec', '--ttl', ok, '--kubeconfig', missing]);
      expect(r.code).to.equal(1); // the kubeconfig does not exist: past flag parsing
      expect(r.err).to.not.contain('--ttl');
      expect(r.err).to.contain(missing);
    }
  });

  it('--ops is required; an unknown -o is refused before connecting', async () => {
    const noOps = await run(['agent', 'token', 's1', '--kubeconfig', missing]);
    expect(noOps.code).to.not.equal(0);
    expect(noOps.err).to.contain("required option '--ops <ops>' not specified");
    const badOut = await run(['agent', 'token', 's1', '--ops', 'exec', '-o', 'yaml', '--kubeconfig', missing]);
    expect(badOut.code).to.equal(1);
    expect(badOut.err).to.contain('error: unknown output format "yaml" (json)');
  });
});
