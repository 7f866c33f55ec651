// Runs every benchmark in one go on this machine and writes bench/RESULTS.md: each script
// prints a markdown section of medians and ratios beside its peers. A script that fails is
// reported as failed in the file (with its last output lines), never silently dropped.
//   npx tsx bench/run.ts [name ...]     (default: all)
// A run of some scripts replaces only their blocks (between `<!-- bench:NAME -->` markers) and
// keeps the others, each block saying when and on what load it was measured.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
// bench/auth.ts and lib.ts are modules (auth is printed by apiserver.ts), not scripts.
const ALL = [
  'hostfloor',
  'apiserver',
  'serve-start',
  'procbox',
  'jobs',
  'filewatch',
  'sandbox',
  'changeset',
  'agentsession',
  'session-token',
  'egress',
  'vm',
  'tti',
  'preview',
  'portfwd',
  'console',
  'warmcreate',
  'rewind',
  'provenance',
  'sdk',
  'scheduler',
  'scaleout',
];
const wanted = process.argv.slice(2).length ? process.argv.slice(2) : ALL;

const machine = `${os.cpus().length} cores (${os.cpus()[0]?.model ?? 'unknown'}), ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB, Linux ${os.release()}, Node ${process.version}`;
const header = [
  '# Benchmark results',
  '',
  `Written by \`make bench\` (bench/run.ts). Machine: ${machine}.`,
  'Medians unless stated; peers ran in the same run on the same machine. Each section says when it ran and the load average before it.',
  '',
];
const resultsFile = path.join(here, 'RESULTS.md');
const blocks = new Map<string, string>();
if (fs.existsSync(resultsFile)) {
  for (const m of fs
    .readFileSync(resultsFile, 'utf8')
    .matchAll(/<!-- bench:([\w-]+) -->\n([\s\S]*?)<!-- \/bench:\1 -->/g))
    blocks.set(m[1]!, m[2]!);
}
for (const name of wanted) {
  const file = path.join(here, `${name}.ts`);
  if (!fs.existsSync(file)) {
    blocks.set(name, `## ${name}\n\nNot run: bench/${name}.ts does not exist yet.\n`);
    continue;
  }
  process.stderr.write(`bench: ${name}...\n`);
  const load = os.loadavg()[0]!.toFixed(1);
  const t = Date.now();
  const r = spawnSync(process.execPath, ['--import', 'tsx', file], {
    encoding: 'utf8',
    maxBuffer: 64 << 20,
    timeout: 30 * 60_000,
  });
  const secs = ((Date.now() - t) / 1000).toFixed(0);
  const when = `_(${name}: ${secs} s, ${new Date(t).toISOString()}, load average ${load} before it)_`;
  if (r.status === 0) {
    blocks.set(name, `${r.stdout.trim()}\n\n${when}\n`);
  } else {
    const tail = `${r.stdout}\n${r.stderr}`.trim().split('\n').slice(-15).join('\n');
    blocks.set(
      name,
      `## ${name}\n\nFAILED (exit ${r.status ?? r.signal}) after ${secs} s:\n\n\`\`\`\n${tail}\n\`\`\`\n\n${when}\n`,
    );
  }
}
const order = [...ALL, ...[...blocks.keys()].filter((k) => !ALL.includes(k))];
const body = order
  .filter((k) => blocks.has(k))
  .map((k) => `<!-- bench:${k} -->\n${blocks.get(k)}<!-- /bench:${k} -->\n`);
fs.writeFileSync(resultsFile, [...header, ...body].join('\n'));
process.stderr.write(`bench: wrote ${path.join('bench', 'RESULTS.md')}\n`);
