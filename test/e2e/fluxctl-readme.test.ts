// e2e: the README's five-minute tour runs as written. The shell block
// under "## A five-minute tour" is extracted from README.md and run by bash (set -euo
// pipefail) against a real `fluxctl serve`, with `fluxctl` on PATH as `make install` puts it
// there (a wrapper script exec'ing the built entry, or the sources through tsx when dist/ is
// stale), in a directory whose ./.fluxvm/kubeconfig is the server's. The `make install` line
// itself is the one line not run (the wrapper stands in for it: no build here).
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { fluxctlCommand, REPO, startFluxctl, type Fluxctl } from './harness.js';
import { runProcess } from './kubectl.js';
import { sandboxSkipReason, skipWith } from './sandbox-helpers.js';

/** The shell block of the tour, without the `make install` line. */
export function tourScript(readme: string): string {
  const at = readme.indexOf('## A five-minute tour');
  if (at < 0) throw new Error('README.md has no "## A five-minute tour" section');
  const m = /```sh\n([\s\S]*?)\n```/.exec(readme.slice(at));
  if (!m) throw new Error('the tour has no ```sh block');
  return m[1]
    .split('\n')
    .filter((l) => !/^make install\b/.test(l))
    .join('\n');
}

describe('e2e: the README tour runs as written', function () {
  this.timeout(900_000);
  let fx: Fluxctl;
  let dir: string;

  before(async function () {
    skipWith(this, sandboxSkipReason());
    fx = await startFluxctl();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxctl-tour-'));
    fs.mkdirSync(path.join(dir, '.fluxvm'));
    fs.copyFileSync(fx.kubeconfig, path.join(dir, '.fluxvm', 'kubeconfig'));
    fs.mkdirSync(path.join(dir, 'bin'));
    const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
    // `--import tsx` resolves from the working directory: name the loader by its path.
    const tsx = pathToFileURL(path.join(REPO, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
    const argv = fluxctlCommand().map((a) => (a === 'tsx' ? tsx : a));
    fs.writeFileSync(path.join(dir, 'bin', 'fluxctl'), `#!/bin/sh\nexec ${argv.map(q).join(' ')} "$@"\n`, {
      mode: 0o755,
    });
  });
  after(async () => {
    if (fx) {
      await fx.kubectl(['delete', 'checkpoints,sbx', '--all', '--wait=true', '--timeout=60s'], { timeoutMs: 70_000 });
      expect(await fx.stop()).to.equal(0, fx.logs());
    }
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  it('every command of the tour succeeds, and the ones that show something show it', async () => {
    const script = tourScript(fs.readFileSync(path.join(REPO, 'README.md'), 'utf8'));
    expect(script).to.include('fluxctl changeset approve tidy');
    expect(script).to.include('fluxctl sandbox restore demo before');
    expect(script).to.include('fluxctl cp ./proj demo:/work/proj');
    expect(script).not.to.match(/npx fluxctl|<changeset-name>/);
    const r = await runProcess(['bash', '-euo', 'pipefail', '-c', script], {
      cwd: dir,
      env: {
        ...process.env,
        PATH: `${path.join(dir, 'bin')}:${process.env.PATH}`,
        HOME: dir,
        KUBECONFIG: '',
        NO_COLOR: '1',
      },
      timeoutMs: 840_000,
    });
    expect(r.code, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`).to.equal(0);
    expect(r.stderr).to.include('error: command not found: nosuchcmd\n');
    expect(r.stdout).to.include('exit code 127\n');
    expect(r.stdout).to.include('changeset.fluxvm.dev/tidy applied to sandbox demo');
    expect(r.stdout).to.include('sandbox.fluxvm.dev/demo restored to checkpoint before\n');
    expect(r.stdout).to.match(/restored to checkpoint before\nnew\n/);
    expect(r.stdout).to.match(/"exitCode": 0/);
    expect(r.stdout.match(/^sandbox\.fluxvm\.dev\/demo-fork-[a-z0-9]+$/gm)).to.have.length(2);
    expect(r.stdout).to.include('1 files, 1 directories, 0 symlinks (8 B) copied to demo:/work/proj\n');
    expect(r.stdout).to.include('demo:/work/proj copied to ./proj-copy');
    expect(r.stdout).to.include('755 proj-copy/src/run.sh\n');
    expect(r.stdout).to.match(/^NAME\s+PHASE\s+OWNED\s+CHANGES\s+AGE$/m);
  });
});
