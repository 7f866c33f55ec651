// @fluxvm/sdk as a built package: `make build` builds it (its `sdk` step: sdk/src -> sdk/dist, ESM +
// .d.ts, only when a source changed), every entry of sdk/package.json's `exports` points at a file
// that exists, every source has its .js and .d.ts, and a node process imports the package by its
// name (resolved through `exports`, as a consumer's import is) and finds the client, the classes
// and both providers.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { REPO } from '../e2e/harness.js';

const SDK = path.join(REPO, 'sdk');

function sources(dir: string): string[] {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((e) =>
      e.isDirectory() ? sources(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : [],
    );
}

describe('sdk: the built package (sdk/dist)', function () {
  this.timeout(180_000);

  before(() => {
    // The Makefile's step, as `make build` runs it: a no-op when sdk/dist is fresh.
    execFileSync('make', ['-s', 'sdk'], { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'], timeout: 170_000 });
  });

  it('make build builds it (build depends on the sdk step)', () => {
    const mk = fs.readFileSync(path.join(REPO, 'Makefile'), 'utf8');
    const build = /^build:([^\n]*)$/m.exec(mk);
    expect(build, 'a build rule').to.not.equal(null);
    expect(build![1]!.trim().split(/\s+/)).to.include('sdk');
    expect(mk).to.match(/^sdk:/m);
  });

  it('has a .js and a .d.ts for every source, none older than its source', () => {
    const missing: string[] = [];
    for (const f of sources(path.join(SDK, 'src'))) {
      const rel = path.relative(path.join(SDK, 'src'), f).replace(/\.ts$/, '');
      for (const out of [`${rel}.js`, `${rel}.d.ts`]) {
        const o = path.join(SDK, 'dist', out);
        if (!fs.existsSync(o)) missing.push(`${out} (missing)`);
        else if (fs.statSync(o).mtimeMs < fs.statSync(f).mtimeMs) missing.push(`${out} (older than its source)`);
      }
    }
    expect(missing).to.deep.equal([]);
  });

  it("every entry of package.json's exports exists (types and import)", () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(SDK, 'package.json'), 'utf8')) as {
      name: string;
      type: string;
      exports: Record<string, { types: string; import: string }>;
    };
    expect(pkg.name).to.equal('@fluxvm/sdk');
    expect(pkg.type).to.equal('module');
    expect(Object.keys(pkg.exports)).to.include.members(['.', './providers/ai-sdk', './providers/computesdk']);
    for (const [k, e] of Object.entries(pkg.exports)) {
      expect(fs.existsSync(path.join(SDK, e.types)), `${k} types ${e.types}`).to.equal(true);
      expect(fs.existsSync(path.join(SDK, e.import)), `${k} import ${e.import}`).to.equal(true);
    }
    expect(fs.readFileSync(path.join(SDK, 'dist', 'index.d.ts'), 'utf8')).to.match(/FluxClient/);
  });

  it('a node process imports @fluxvm/sdk and its providers by name (ESM, through exports)', () => {
    // Inside the package a bare import of its own name resolves through its `exports` (Node's
    // self-reference), exactly as it does from a consumer's node_modules.
    const script = `
      const sdk = await import('@fluxvm/sdk');
      const ai = await import('@fluxvm/sdk/providers/ai-sdk');
      const cs = await import('@fluxvm/sdk/providers/computesdk');
      const r = await import.meta.resolve('@fluxvm/sdk');
      console.log(JSON.stringify({
        resolved: r,
        client: typeof sdk.FluxClient, sandbox: typeof sdk.Sandbox, session: typeof sdk.AgentSession,
        notFound: new sdk.NotFoundError({ kind: 'Status', code: 404, message: 'x' }) instanceof sdk.FluxError,
        ai: Object.keys(ai).sort(), cs: Object.keys(cs).sort(),
      }));`;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: SDK,
      encoding: 'utf8',
      timeout: 60_000,
      env: { ...process.env, NODE_OPTIONS: '' },
    });
    const v = JSON.parse(out.trim().split('\n').pop()!) as Record<string, unknown>;
    expect(v.resolved).to.equal(`file://${path.join(SDK, 'dist', 'index.js')}`);
    expect(v).to.deep.include({ client: 'function', sandbox: 'function', session: 'function', notFound: true });
    expect(v.ai).to.include.members(['sandboxSessionOf', 'harnessSessionOf', 'fluxvmHarnessProvider']);
    expect(v.cs).to.include('fluxvm');
  });
});
