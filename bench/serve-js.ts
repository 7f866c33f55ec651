// The server as shipped, for the bench scripts: the sources transpiled to JavaScript (esbuild,
// one file per source, laid out like dist/) and `node <entry> serve` started on a temp state dir.
// Under tsx the loader thread alone adds ~70 MiB of resident memory and some CPU, so the
// benches measure the transpiled server. `transpile(dir)` takes another checkout (e.g. a
// `git archive <rev>`) for before/after runs in one process.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import * as esbuild from 'esbuild';
import { httpRequest, REPO } from '../test/e2e/harness.js';

/** Transpiles the server's sources into a temp dir laid out like dist/; returns the entry and the dir. */
export async function transpile(SOURCE: string = REPO): Promise<{ entry: string; dir: string }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-js-'));
  const sources: string[] = [];
  const walk = (d: string) => {
    for (const e of fs.readdirSync(path.join(SOURCE, d), { withFileTypes: true })) {
      const rel = path.join(d, e.name);
      if (e.isDirectory()) walk(rel);
      else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) sources.push(path.join(SOURCE, rel));
    }
  };
  for (const d of ['apis', 'runtime', 'controllers', 'native', 'cmd', 'sdk/src'])
    if (fs.existsSync(path.join(SOURCE, d))) walk(d);
  await esbuild.build({
    entryPoints: sources,
    outdir: dir,
    outbase: SOURCE,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    logLevel: 'error',
  });
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ type: 'module' }));
  fs.symlinkSync(path.join(REPO, 'node_modules'), path.join(dir, 'node_modules'));
  // The procbox helper is found next to the module, as in dist/ after `make build`.
  if (fs.existsSync(path.join(REPO, 'native', 'procbox', 'build')))
    fs.symlinkSync(path.join(REPO, 'native', 'procbox', 'build'), path.join(dir, 'native', 'procbox', 'build'));
  return { entry: path.join(dir, 'cmd', 'fluxctl', 'main.js'), dir };
}

export interface Server {
  url: string;
  child: ChildProcess;
  logs(): string;
  stop(): Promise<void>;
}

/** `node <entry> serve` on a temp state dir and a free port; resolves once /readyz answers 200. */
export async function startCompiled(
  entry: string,
  env: Record<string, string>,
  args: string[] = ['--insecure-http'],
  nodeArgs: string[] = [],
): Promise<Server & { stateDir: string }> {
  const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-state-'));
  const child = spawn(
    process.execPath,
    [...nodeArgs, entry, 'serve', '--state-dir', stateDir, '--listen', '127.0.0.1:0', ...args],
    {
      cwd: REPO,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<void>((r) => child.on('exit', () => r()));
  const deadline = Date.now() + 60_000;
  let url: string | undefined;
  while (Date.now() < deadline && child.exitCode === null) {
    url ??= /listening on (https?:\/\/\S+)/.exec(out)?.[1];
    const ca = url?.startsWith('https:') ? fs.readFileSync(path.join(stateDir, 'ca.crt'), 'utf8') : undefined;
    if (
      url &&
      (await httpRequest(`${url}/readyz`, 'GET', { ca, timeoutMs: 5000 }).then(
        (r) => r.status === 200,
        () => false,
      ))
    )
      break;
    await new Promise((r) => setTimeout(r, 50));
  }
  if (!url || child.exitCode !== null) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
    fs.rmSync(stateDir, { recursive: true, force: true });
    throw new Error(`fluxctl serve did not start:\n${out}`);
  }
  return {
    url,
    stateDir,
    child,
    logs: () => out,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      fs.rmSync(stateDir, { recursive: true, force: true });
    },
  };
}
