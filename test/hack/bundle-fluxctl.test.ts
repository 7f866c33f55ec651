// dist/fluxctl/ (hack/bundle-fluxctl.mjs): fluxctl and its packages bundled, split per dynamic
// import. What would break silently: a module of dist/ that finds a file relative to itself (a
// native helper, a worker script, the console) looking in the wrong place, and a command loading
// every verb's packages at start-up.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadedBy } from '../support/import-trace/loaded-by.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const out = path.join(root, 'dist', 'fluxctl');

/** The bundle's output files and their text; `make build` makes them. */
function outputs(): Map<string, string> {
  expect(existsSync(path.join(out, 'main.js')), `${out}/main.js is missing: run make build`).to.equal(true);
  return new Map(readdirSync(out).map((f) => [f, readFileSync(path.join(out, f), 'utf8')]));
}

/** The packages (node_modules/<name>/) and dist/ modules an output file holds, from esbuild's path comments. */
function contents(text: string): Set<string> {
  const held = new Set<string>();
  for (const m of text.matchAll(/^\/\/ (node_modules\/(?:@[^/\n]+\/)?[^/\n]+|dist\/\S+\.js)/gm)) held.add(m[1]!);
  return held;
}

describe('hack/bundle-fluxctl.mjs: fluxctl in one bundle', function () {
  this.timeout(60_000);

  it("every module keeps its own location: each rewritten import.meta.url names that module's file in dist/", function () {
    const files = outputs();
    let rewritten = 0;
    for (const [f, text] of files) {
      for (const m of text.matchAll(/new URL\("([^"]+)", import\.meta\.url\)\.href/g)) {
        rewritten++;
        const target = path.resolve(out, m[1]!);
        expect(target.startsWith(path.join(root, 'dist') + path.sep), `${f}: ${m[1]}`).to.equal(true);
        expect(existsSync(target), `${f}: ${m[1]} is not a file of dist/`).to.equal(true);
      }
    }
    // procbox's core, the checkpoint worker, the diff pool, the console's files, the VM state dir, the egress relay ...
    expect(rewritten).to.be.at.least(10);
    const all = [...files.values()].join('\n');
    for (const m of [
      'dist/native/procbox/core.js',
      'dist/runtime/store/checkpointer.js',
      'dist/cmd/fluxctl/console-serve.js',
    ])
      expect(all, m).to.include(`new URL("../${m.slice('dist/'.length)}", import.meta.url).href`);
  });

  it('a command loads only the chunks it needs: no ws, tar, diff, pino, p-queue or controller machinery at start-up', function () {
    const files = outputs();
    const everywhere = new Set([...files.values()].flatMap((t) => [...contents(t)]));
    // The bundle holds them (so the check below can fail) ...
    for (const p of ['node_modules/ws', 'node_modules/tar', 'node_modules/pino', 'dist/runtime/controller/manager.js'])
      expect(everywhere.has(p), p).to.equal(true);
    // ... and importing the entry, as any command does first, loads none of them.
    const loaded = loadedBy(path.join(out, 'main.js'))
      .filter((u) => u.startsWith('file:') && path.dirname(fileURLToPath(u)) === out)
      .map((u) => path.basename(fileURLToPath(u)));
    expect(loaded).to.include('main.js');
    expect(loaded.length).to.be.lessThan(files.size);
    const held = new Set(loaded.flatMap((f) => [...contents(files.get(f)!)]));
    const heavy = [...held].filter((p) =>
      /^node_modules\/(ws|tar|diff|pino|p-queue)$|^dist\/runtime\/controller\/manager\.js$|^dist\/native\/workspace\/manifest\.js$/.test(
        p,
      ),
    );
    expect(heavy).to.deep.equal([]);
  });

  it('runs: the bundle prints its version and the help of a verb', function () {
    const r = spawnSync(process.execPath, [path.join(out, 'main.js'), 'sandbox', '--help'], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(r.status, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/Usage: fluxctl sandbox/);
  });
});
