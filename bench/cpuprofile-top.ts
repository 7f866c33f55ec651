// Summarises a V8 .cpuprofile (node --cpu-prof, or bench/probe.mjs's FLUXVM_CPU_PROFILE): self
// time by function and by file (node_modules collapsed to the package), as markdown tables.
//   npx tsx bench/cpuprofile-top.ts FILE.cpuprofile [--top 25] [--per N] [--inclusive N]
// `--inclusive N` adds the N functions with the most inclusive time; `--per N` prints each row's
// microseconds per operation too (N = the operations in the profiled window, e.g. the creates).
import fs from 'node:fs';
import { arg } from './lib.js';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: Node[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

/** Where a script URL belongs: a package for node_modules, the repo-relative path otherwise. */
export function fileOf(url: string): string {
  if (!url) return '(native/vm)';
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + 14).split('/');
    return `npm:${rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]}`;
  }
  if (url.startsWith('node:')) return url;
  const m = /\/((?:apis|runtime|controllers|native|cmd)\/.*)$/.exec(url);
  return m ? m[1]! : url.replace(/^file:\/\//, '');
}

const fnName = (cf: Node['callFrame']) =>
  `${cf.functionName || '(anonymous)'} ${fileOf(cf.url)}${cf.url ? `:${cf.lineNumber + 1}` : ''}`;

/** Inclusive time by function: each sample counted once for every distinct function on its stack. */
export function inclusive(p: Profile): Map<string, number> {
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map<number, number>();
  for (let i = 0; i < p.samples.length; i++)
    self.set(p.samples[i]!, (self.get(p.samples[i]!) ?? 0) + (p.timeDeltas[i] ?? 0));
  const out = new Map<string, number>();
  for (const [id, us] of self) {
    const seen = new Set<string>();
    for (let n: number | undefined = id; n !== undefined; n = parent.get(n)) {
      const k = fnName(byId.get(n)!.callFrame);
      if (seen.has(k)) continue;
      seen.add(k);
      out.set(k, (out.get(k) ?? 0) + us);
    }
  }
  return out;
}

export function summarise(p: Profile): { total: number; byFn: Map<string, number>; byFile: Map<string, number> } {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map<number, number>();
  for (let i = 0; i < p.samples.length; i++) {
    const id = p.samples[i]!;
    self.set(id, (self.get(id) ?? 0) + (p.timeDeltas[i] ?? 0));
  }
  const byFn = new Map<string, number>();
  const byFile = new Map<string, number>();
  let total = 0;
  for (const [id, us] of self) {
    const cf = byId.get(id)!.callFrame;
    const file = fileOf(cf.url);
    const fn = fnName(cf);
    byFn.set(fn, (byFn.get(fn) ?? 0) + us);
    byFile.set(file, (byFile.get(file) ?? 0) + us);
    total += us;
  }
  return { total, byFn, byFile };
}

function table(title: string, m: Map<string, number>, total: number, top: number, per: number): string[] {
  const rows = [...m].sort((a, b) => b[1] - a[1]).slice(0, top);
  return [
    `| ${title} | self ms | % |${per ? ' us per op |' : ''}`,
    `|---|---:|---:|${per ? '---:|' : ''}`,
    ...rows.map(
      ([k, us]) =>
        `| \`${k}\` | ${(us / 1000).toFixed(1)} | ${((100 * us) / total).toFixed(1)} |${per ? ` ${(us / per).toFixed(1)} |` : ''}`,
    ),
  ];
}

if (process.argv[1]?.endsWith('cpuprofile-top.ts')) {
  const file = process.argv[2];
  if (!file) throw new Error('usage: cpuprofile-top.ts FILE.cpuprofile [--top N] [--per N]');
  const top = arg('top', 25);
  const per = arg('per', 0);
  const prof = JSON.parse(fs.readFileSync(file, 'utf8')) as Profile;
  const { total, byFn, byFile } = summarise(prof);
  const idle = (byFn.get('(idle) (native/vm)') ?? 0) + (byFn.get('(program) (native/vm)') ?? 0);
  console.log(
    `samples: ${(total / 1000).toFixed(0)} ms in all, of it (idle) + (program) ${(idle / 1000).toFixed(0)} ms\n`,
  );
  console.log(table('function (self time)', byFn, total, top, per).join('\n') + '\n');
  console.log(table('file or package (self time)', byFile, total, top, per).join('\n'));
  if (process.argv.includes('--inclusive')) {
    const inc = new Map([...inclusive(prof)].filter(([k]) => !k.startsWith('(root)')));
    console.log('\n' + table('function (inclusive time)', inc, total, arg('inclusive', top) || top, per).join('\n'));
  }
}
