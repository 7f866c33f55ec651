// Bundles fluxctl (dist/cmd/fluxctl/main.js, tsc's output, and the packages it imports) into
// dist/fluxctl/: main.js plus chunks, split at every dynamic import so that a command still
// loads only what its verb needs. Why, and what it saves (a server's start, a CLI command):
// docs/decisions/0011-fluxctl-runs-from-a-bundle.md.
// The code is unchanged: every module of dist/ keeps the location it has in dist/cmd's layout,
// because each `import.meta.url` in it is rewritten to that module's own file (native helpers,
// worker scripts and the console's files are found relative to it). What is loaded through
// createRequire at run time (pino-pretty, @peculiar/asn1-*, client-node's bundle) and
// better-sqlite3's addon stay outside, as do the worker scripts, which run from dist/ as before.
import { build } from 'esbuild';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dist = path.join(repo, 'dist');
const out = path.join(dist, 'fluxctl');
const tmp = `${out}.tmp.${process.pid}`;

/** `import.meta.url` of a module of dist/, as seen from any output file (all are in one directory). */
const ownUrl = {
  name: 'own-import-meta-url',
  setup(b) {
    b.onLoad({ filter: /\.js$/ }, async (args) => {
      if (!args.path.startsWith(dist + path.sep)) return undefined;
      const src = await fs.promises.readFile(args.path, 'utf8');
      if (!src.includes('import.meta.url')) return { contents: src, loader: 'js' };
      const rel = path.relative(out, args.path).split(path.sep).join('/');
      return {
        contents: src.replaceAll('import.meta.url', `new URL(${JSON.stringify(rel)}, import.meta.url).href`),
        loader: 'js',
      };
    });
  },
};

fs.rmSync(tmp, { recursive: true, force: true });
const result = await build({
  entryPoints: { main: path.join(dist, 'cmd', 'fluxctl', 'main.js') },
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  outdir: tmp,
  external: ['better-sqlite3'],
  plugins: [ownUrl],
  // CommonJS packages inside an ES module bundle call require() for node's built-ins.
  banner: {
    js: "import { createRequire as __fluxvmRequire } from 'node:module'; const require = __fluxvmRequire(import.meta.url);",
  },
  logLevel: 'warning',
  legalComments: 'inline',
});
if (result.errors.length > 0 || result.warnings.length > 0) {
  fs.rmSync(tmp, { recursive: true, force: true });
  console.error('bundle-fluxctl: esbuild reported problems; refusing to write the bundle');
  process.exit(1);
}
// The rewritten URLs are relative to the output directory, so it is swapped in whole.
fs.rmSync(out, { recursive: true, force: true });
fs.renameSync(tmp, out);
const files = fs.readdirSync(out);
const bytes = files.reduce((n, f) => n + fs.statSync(path.join(out, f)).size, 0);
console.log(`fluxctl: ${path.relative(repo, out)}/main.js and ${files.length - 1} chunks, ${bytes} bytes`);
