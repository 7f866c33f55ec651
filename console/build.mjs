// Bundles the review console (console/src) into dist/console: index.html, assets/app.js,
// assets/app.css. esbuild, already in the tree through tsx, one binary: about a second on this
// 2-core host. Run by `make build`; `node console/build.mjs --check` also fails past the size budget.
// fluxctl's escaping (cmd/fluxctl/escape.ts) is bundled from its source; its one Node import
// (StringDecoder, used only by the byte-stream escaper the console does not call) gets a stub.
import * as esbuild from 'esbuild';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.resolve(here, '..', 'dist', 'console');
/** The JavaScript bundle's budget, gzipped (issue 26). */
const BUDGET_GZIP = 300 * 1024;

const nodeStub = {
  name: 'node-stub',
  setup(b) {
    b.onResolve({ filter: /^node:string_decoder$/ }, () => ({ path: 'string_decoder', namespace: 'stub' }));
    b.onLoad({ filter: /.*/, namespace: 'stub' }, () => ({
      contents: 'export class StringDecoder { write() { return ""; } end() { return ""; } }',
      loader: 'js',
    }));
  },
};

fs.mkdirSync(path.join(out, 'assets'), { recursive: true });
await esbuild.build({
  entryPoints: { app: path.join(here, 'src', 'main.tsx') },
  bundle: true,
  format: 'esm',
  target: ['es2022'],
  platform: 'browser',
  minify: true,
  sourcemap: false,
  legalComments: 'none',
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: path.join(out, 'assets'),
  resolveExtensions: ['.tsx', '.ts', '.js', '.mjs'],
  plugins: [nodeStub],
  logLevel: 'warning',
});
fs.copyFileSync(path.join(here, 'index.html'), path.join(out, 'index.html'));
const js = fs.readFileSync(path.join(out, 'assets', 'app.js'));
const gz = zlib.gzipSync(js, { level: 9 }).length;
console.log(`console: dist/console/assets/app.js ${js.length} bytes, ${gz} gzipped (budget ${BUDGET_GZIP})`);
if (process.argv.includes('--check') && gz > BUDGET_GZIP) {
  console.error(`console: the bundle is over its budget of ${BUDGET_GZIP} bytes gzipped`);
  process.exit(1);
}
