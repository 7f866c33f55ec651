// Runs every benchmark in one go on this machine and writes bench/RESULTS.md: each script
// prints a markdown section of medians and ratios beside its peers. A script that fails is
// reported as failed in the file (with its last output lines), never silently dropped.
//   npx tsx bench/run.ts [name ...]     (default: all)
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const ALL = ['apiserver', 'procbox', 'sandbox', 'changeset', 'vm', 'egress', 'session-token'];
const wanted = process.argv.slice(2).length ? process.argv.slice(2) : ALL;

const parts: string[] = [
  '# Benchmark results',
  '',
  `Written by \`make bench\` (bench/run.ts) on ${new Date().toISOString()}: ${os.cpus().length} cores (${os.cpus()[0]?.model ?? 'unknown'}), ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB, Linux ${os.release()}, Node ${process.version}.`,
  'Medians unless stated; peers ran in the same run on the same machine.',
  '',
];
for (const name of wanted) {
  const file = path.join(here, `${name}.ts`);
  if (!fs.existsSync(file)) {
    parts.push(`## ${name}\n\nNot run: bench/${name}.ts does not exist yet.\n`);
    continue;
  }
  process.stderr.write(`bench: ${name}...\n`);
  const t = Date.now();
  const r = spawnSync(process.execPath, ['--import', 'tsx', file], { encoding: 'utf8', maxBuffer: 64 << 20, timeout: 30 * 60_000 });
  const secs = ((Date.now() - t) / 1000).toFixed(0);
  if (r.status === 0) {
    parts.push(r.stdout.trim(), '', `_(${name}: ${secs} s)_`, '');
  } else {
    const tail = `${r.stdout}\n${r.stderr}`.trim().split('\n').slice(-15).join('\n');
    parts.push(`## ${name}\n\nFAILED (exit ${r.status ?? r.signal}) after ${secs} s:\n\n\`\`\`\n${tail}\n\`\`\`\n`);
  }
}
fs.writeFileSync(path.join(here, 'RESULTS.md'), parts.join('\n') + '\n');
process.stderr.write(`bench: wrote ${path.join('bench', 'RESULTS.md')}\n`);
