// End to end: `fluxctl serve` refuses authentication settings that are unsafe or broken, naming
// the setting, and starts nothing.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { startFluxctl, fluxctlCommand, REPO } from './harness.js';
import { runProcess } from './kubectl.js';
import { skipWith } from '../skip.js';

describe('e2e: serve refuses unsafe or broken auth settings', function () {
  this.timeout(60_000);

  async function serveFails(args: string[]): Promise<{ code: number; stderr: string }> {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-auth-bad-'));
    try {
      const r = await runProcess(
        [...fluxctlCommand(), 'serve', '--state-dir', dir, '--quiet', '--test-controller', ...args],
        { cwd: REPO, env: process.env, timeoutMs: 30_000 },
      );
      return { code: r.code, stderr: r.stderr + r.stdout };
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }

  it('--listen 0.0.0.0 without TLS (--insecure-http) is refused with a clear error', async () => {
    const r = await serveFails(['--listen', '0.0.0.0:0', '--insecure-http']);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain(
      '--insecure-http serves without TLS or authentication and is allowed on a loopback address only, not 0.0.0.0',
    );
  });

  it('a token file with a bad line stops serve with an error naming the line', async () => {
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-tok-')), 'tokens.csv');
    fs.writeFileSync(file, 'good-token,alice,1\nonly-two,fields\n');
    const r = await serveFails(['--listen', '127.0.0.1:0', '--token-auth-file', file]);
    expect(r.code).to.equal(1);
    expect(r.stderr).to.contain(`${file}:2: want token,user,uid[,"groups"], got 2 field(s)`);
    fs.rmSync(path.dirname(file), { recursive: true, force: true });
  });

  it('--insecure-http on loopback serves plain HTTP (the explicit opt-out)', async () => {
    const f = await startFluxctl({ args: ['--insecure-http', '--test-controller', '--quiet'] });
    try {
      expect(f.url).to.match(/^http:\/\//);
      expect(f.logs()).to.contain('plain HTTP, no authentication: loopback only');
      expect((await f.request('GET', '/api/v1/namespaces')).status).to.equal(200);
      // No authorizer, so no access reviews: they are not served (and never stored as objects).
      const review = await f.request('POST', '/apis/authentication.k8s.io/v1/selfsubjectreviews', {
        body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
      });
      expect(review.status).to.equal(404);
    } finally {
      await f.stop();
    }
  });

  it('openssl sees the serving certificate signed by the state CA with the loopback names', async function () {
    const have = spawnSync('openssl', ['version'], { encoding: 'utf8' }).status === 0;
    skipWith(this, have ? undefined : 'no openssl binary');
    const f = await startFluxctl({ args: ['--test-controller', '--quiet'] });
    try {
      const v = spawnSync(
        'openssl',
        ['verify', '-CAfile', path.join(f.stateDir, 'ca.crt'), path.join(f.stateDir, 'serving.crt')],
        { encoding: 'utf8' },
      );
      expect(v.stdout.trim(), v.stderr).to.match(/: OK$/);
      const t = spawnSync(
        'openssl',
        ['x509', '-noout', '-ext', 'subjectAltName', '-in', path.join(f.stateDir, 'serving.crt')],
        { encoding: 'utf8' },
      );
      expect(t.stdout).to.contain('IP Address:127.0.0.1').and.contain('DNS:localhost');
    } finally {
      await f.stop();
    }
  });
});
