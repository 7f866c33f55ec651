// Time from spawning `fluxctl serve` (fresh state dir, as test/e2e/harness.ts starts it) to
// /readyz answering 200, and of a restart on the same state dir. A/B: pass several checkouts
// with --tree DIR (each with a built dist/, else its sources run through tsx); the rounds
// alternate between them so the shared load falls on each alike. A tree with the one-bundle
// build (dist/fluxctl/main.js, hack/bundle-fluxctl.mjs) is run both ways: from the bundle and
// from tsc's modules (dist/cmd/fluxctl/main.js).
//   npx tsx bench/serve-start.ts [--rounds 5] [--tree DIR ...]
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { httpRequest } from '../test/e2e/harness.js';
import { arg, median, section } from './lib.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const trees = process.argv.flatMap((a, i) => (a === '--tree' ? [path.resolve(process.argv[i + 1]!)] : []));
if (!trees.length) trees.push(repo);
const rounds = arg('rounds', 5);
// A server still running when this script ends (it failed midway) is killed with it.
const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

type Variant = { label: string; tree: string; argv: string[] };

/** The ways a tree's fluxctl can run: its bundle and its modules when built, else its sources through tsx. */
function variants(tree: string): Variant[] {
  const label = path.relative(repo, tree) || '.';
  const bundle = path.join(tree, 'dist', 'fluxctl', 'main.js');
  const modules = path.join(tree, 'dist', 'cmd', 'fluxctl', 'main.js');
  const out: Variant[] = [];
  if (fs.existsSync(bundle)) out.push({ label: `${label} (bundle)`, tree, argv: [process.execPath, bundle] });
  if (fs.existsSync(modules)) out.push({ label: `${label} (modules)`, tree, argv: [process.execPath, modules] });
  if (!out.length)
    out.push({
      label: `${label} (tsx)`,
      tree,
      argv: [process.execPath, '--import', 'tsx', path.join(tree, 'cmd', 'fluxctl', 'main.ts')],
    });
  return out;
}
const runs = trees.flatMap(variants);

/** CPU milliseconds (user + system) the process has used so far, from /proc (clock ticks of 10 ms). */
function cpuMs(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * 10; // utime, stime (fields 14 and 15)
}

/**
 * Milliseconds from spawn to /readyz 200 and the server's CPU milliseconds by then; then SIGTERM and wait for the exit.
 */
async function once(v: Variant, stateDir: string): Promise<{ ms: number; cpu: number }> {
  const argv = [...v.argv, 'serve', '--state-dir', stateDir, '--listen', '127.0.0.1:0'];
  const t0 = performance.now();
  const child = spawn(argv[0]!, argv.slice(1), { cwd: v.tree, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const exited = new Promise<void>((r) =>
    child.on('exit', () => {
      children.delete(child);
      r();
    }),
  );
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', () => {
      const m = /listening on (https?:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    child.on('exit', () => reject(new Error(`serve exited:\n${out}`)));
  });
  const ca = fs.readFileSync(path.join(stateDir, 'ca.crt'), 'utf8');
  for (;;) {
    const r = await httpRequest(`${url}/readyz`, 'GET', { ca }).catch(() => undefined);
    if (r?.status === 200) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  const ms = performance.now() - t0;
  const cpu = cpuMs(child.pid!);
  child.kill('SIGTERM');
  await exited;
  return { ms, cpu };
}

type Run = { ms: number; cpu: number };
const fresh = new Map<Variant, Run[]>(runs.map((v) => [v, []]));
const restart = new Map<Variant, Run[]>(runs.map((v) => [v, []]));
const load = os.loadavg()[0]!.toFixed(2);
for (let i = 0; i < rounds; i++) {
  for (const t of i % 2 ? [...runs].reverse() : runs) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-bench-serve-'));
    try {
      fresh.get(t)!.push(await once(t, dir));
      restart.get(t)!.push(await once(t, dir));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
}
section('fluxctl serve start (spawn to /readyz 200)', [
  `${rounds} rounds, trees and entries alternating; load average ${load} before, ${os.loadavg()[0]!.toFixed(2)} after.`,
  '',
  "Wall: spawn to /readyz 200, median (min-max) ms. CPU: the server process's user + system ms by then (median), less sensitive to the load.",
  '',
  '| tree (entry) | fresh state dir: wall | CPU | restart on the same state dir: wall | CPU |',
  '|---|---|---|---|---|',
  ...runs.map((t) => {
    const show = (xs: number[]) =>
      `${median(xs).toFixed(0)} (${Math.min(...xs).toFixed(0)}-${Math.max(...xs).toFixed(0)})`;
    const cols = (runs: Run[]) => `${show(runs.map((r) => r.ms))} | ${median(runs.map((r) => r.cpu)).toFixed(0)}`;
    return `| ${t.label} | ${cols(fresh.get(t)!)} | ${cols(restart.get(t)!)} |`;
  }),
]);
