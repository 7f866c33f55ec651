// hack/setup.sh installs the npm packages with `npm ci --ignore-scripts` and then runs the install
// scripts it knows of itself: esbuild's check (setup.sh) and better-sqlite3's build of SQLite
// (`make addon`). A package added later with an install script of its own would be installed
// without running it: this test names the lockfile's packages that have one, so such a package
// is a decision (add its step beside the others), not a silent breakage.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const REPO = join(import.meta.dirname, '../..');

describe('npm install scripts: each one is run by the setup or the build', () => {
  it('the lockfile holds install scripts only for esbuild and better-sqlite3, and both are run', () => {
    const lock = JSON.parse(readFileSync(join(REPO, 'package-lock.json'), 'utf8')) as {
      packages: Record<string, { hasInstallScript?: boolean }>;
    };
    const withScripts = Object.entries(lock.packages)
      .filter(([, p]) => p.hasInstallScript)
      .map(([k]) => k)
      .sort();
    expect(withScripts).to.deep.equal(['node_modules/better-sqlite3', 'node_modules/esbuild']);
    const setup = readFileSync(join(REPO, 'hack/setup.sh'), 'utf8');
    expect(setup).to.match(/npm ci [^\n]*--ignore-scripts/);
    expect(setup).to.match(/npm rebuild [^\n]*esbuild/);
    const make = readFileSync(join(REPO, 'Makefile'), 'utf8');
    expect(make).to.match(/^build:.*\baddon\b/m);
    expect(make).to.match(/npm rebuild [^\n]*better-sqlite3/);
  });
});
