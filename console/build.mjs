// Bundles the review console (console/src) into dist/console: index.html, assets/boot-<hash>.js
// (starts the first requests: early.ts), assets/app-<hash>.js (the entry: shell, changesets,
// diff), assets/chunk-<hash>.js (code split: the pages loaded when first shown, highlight.js,
// shared code), assets/app-<hash>.css. Every asset is named by its content's hash (serve sends them
// immutable: a warm load asks only for index.html, which is never cached); index.html, written
// from console/index.html with those names, gets a modulepreload link for each chunk the entry
// imports, so they load beside it. esbuild, already in the tree through
// tsx, one binary: about a second on this 2-core host. Run by `make build`;
// `node console/build.mjs --check` also fails past the size budget (all chunks together).
// fluxctl's escaping (cmd/fluxctl/escape.ts) is bundled from its source; its one Node import
// (StringDecoder, used only by the byte-stream escaper the console does not call) gets a stub.
import * as esbuild from 'esbuild';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.resolve(here, '..', 'dist', 'console');
/** The JavaScript bundle's budget, gzipped. */
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

// A new directory each time: chunks of an older build must not linger (names are content hashes).
const assets = path.join(out, 'assets');
const staging = path.join(out, `assets.new-${process.pid}`);
fs.rmSync(staging, { recursive: true, force: true });
fs.mkdirSync(staging, { recursive: true });
const result = await esbuild.build({
  entryPoints: { app: path.join(here, 'src', 'main.tsx') },
  bundle: true,
  format: 'esm',
  splitting: true,
  entryNames: '[name]-[hash]',
  chunkNames: 'chunk-[hash]',
  metafile: true,
  target: ['es2022'],
  platform: 'browser',
  minify: true,
  sourcemap: false,
  legalComments: 'none',
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: staging,
  resolveExtensions: ['.tsx', '.ts', '.js', '.mjs'],
  plugins: [nodeStub],
  logLevel: 'warning',
});
// boot.js: early.ts alone as a classic script (no imports, no module graph to wait for), loaded
// async beside app.js: it starts the route's first requests while the modules load.
const boot = await esbuild.build({
  entryPoints: { boot: path.join(here, 'src', 'boot.ts') },
  bundle: true,
  format: 'iife',
  entryNames: '[name]-[hash]',
  metafile: true,
  target: ['es2022'],
  platform: 'browser',
  minify: true,
  legalComments: 'none',
  outdir: staging,
  logLevel: 'warning',
});
// The entry's static imports, preloaded from the page (no waterfall: app.js, then its chunks).
const entry = Object.entries(result.metafile.outputs).find(([, o]) => o.entryPoint?.endsWith('main.tsx'));
const preload = (entry?.[1].imports ?? [])
  .filter((i) => i.kind === 'import-statement')
  .map((i) => `    <link rel="modulepreload" href="assets/${path.basename(i.path)}" />\n`)
  .join('');
const named = (outputs, ext) => {
  const o = Object.keys(outputs).find((k) => k.endsWith(ext) && /\/(app|boot)-[A-Z0-9]+\.[a-z]+$/.test(k));
  if (!o) throw new Error(`console/build.mjs: no ${ext} entry output`);
  return path.basename(o);
};
const names = {
  'assets/app.js': named(result.metafile.outputs, '.js'),
  'assets/app.css': named(result.metafile.outputs, '.css'),
  'assets/boot.js': named(boot.metafile.outputs, '.js'),
};
let html = fs.readFileSync(path.join(here, 'index.html'), 'utf8');
for (const [k, v] of Object.entries(names)) {
  if (!html.includes(`"${k}"`)) throw new Error(`console/index.html: ${k} is not named`);
  html = html.replace(`"${k}"`, `"assets/${v}"`);
}
const tag = `    <script type="module" src="assets/${names['assets/app.js']}"></script>\n`;
if (!html.includes(tag)) throw new Error('console/index.html: the app.js script tag is missing');
fs.rmSync(assets, { recursive: true, force: true });
fs.renameSync(staging, assets);
fs.writeFileSync(path.join(out, 'index.html'), html.replace(tag, preload + tag));
let gz = 0;
let raw = 0;
for (const f of fs.readdirSync(assets).filter((n) => n.endsWith('.js'))) {
  const b = fs.readFileSync(path.join(assets, f));
  raw += b.length;
  gz += zlib.gzipSync(b, { level: 9 }).length;
}
const app = fs.readFileSync(path.join(assets, names['assets/app.js']));
console.log(
  `console: dist/console/assets: JavaScript ${raw} bytes, ${gz} gzipped (budget ${BUDGET_GZIP}); entry app.js ${app.length} bytes, ${zlib.gzipSync(app, { level: 9 }).length} gzipped`,
);
if (process.argv.includes('--check') && gz > BUDGET_GZIP) {
  console.error(`console: the bundle is over its budget of ${BUDGET_GZIP} bytes gzipped`);
  process.exit(1);
}
