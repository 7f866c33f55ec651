// The issue-number gate: code comments, tests and READMEs state facts; the history of a change (which issue asked
// for it, what was measured on the way) lives in docs/decisions/ (docs/README.md). A line naming an issue by number
// in a source or README file outside docs/decisions fails here. The files that still had such lines when the gate
// came in are listed in STILL_MENTION with their count then: a listed file may lose mentions, never gain one, and
// leaves the list once it has none (the gate fails on a listed file with none, so the list cannot go stale).
import { expect } from 'chai';
import { mkdtempSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { STILL_MENTION } from './issue-mentions-debt.js';

const REPO = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** A mention: the word, a space, a number (built here so this file does not mention one itself). */
export const MENTION = new RegExp('\\b[Ii]ssues?' + ' #?[0-9]');
const ROOTS = [
  'apis',
  'bench',
  'cmd',
  'console',
  'controllers',
  'deploy',
  'docs',
  'hack',
  'native',
  'runtime',
  'sdk',
  'test',
];
const TOP_FILES = ['README.md', 'Makefile'];
const SKIP_DIRS = new Set(['node_modules', 'dist', 'build', 'build-asan', '.git', '.fluxvm', 'decisions']);
const TEXT = /\.(ts|mjs|js|c|h|md|sh|py|ya?ml)$|^Makefile$/;

/** Lines with a mention, per file (relative to `root`), for source and README files below `root`. */
export function mentionLines(
  root: string,
  tops: string[] = ROOTS,
  topFiles: string[] = TOP_FILES,
): Map<string, number> {
  const out = new Map<string, number>();
  const count = (p: string): void => {
    let text: string;
    try {
      text = readFileSync(p, 'utf8');
    } catch {
      return; // not in this checkout
    }
    const n = text.split('\n').filter((l) => MENTION.test(l)).length;
    if (n) out.set(relative(root, p), n);
  };
  const walk = (dir: string): void => {
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (!SKIP_DIRS.has(e.name)) walk(p);
      } else if (e.isFile() && TEXT.test(e.name) && !e.name.startsWith('zz_')) count(p);
    }
  };
  for (const t of tops) walk(join(root, t));
  for (const f of topFiles) count(join(root, f));
  return out;
}

/** One line per file that has more mentions than it is allowed. */
export function mentionViolations(found: Map<string, number>, still: Record<string, number>): string[] {
  const bad: string[] = [];
  for (const [file, n] of found) {
    const allowed = still[file] ?? 0;
    if (n > allowed)
      bad.push(
        `${file}: ${n} line(s) name an issue by number (allowed ${allowed}): state the fact, history in docs/decisions`,
      );
  }
  return bad.sort();
}

describe('gate: no issue numbers in source and README files (history lives in docs/decisions)', () => {
  it('no file outside docs/decisions gains a line naming an issue by number', () => {
    expect(mentionViolations(mentionLines(REPO), STILL_MENTION)).to.deep.equal([]);
  });

  it('the list of files still mentioning issues holds only files that still do (remove cleaned ones)', () => {
    const found = mentionLines(REPO);
    const stale = Object.keys(STILL_MENTION).filter((f) => !found.has(f));
    expect(stale, 'these files no longer mention an issue: remove them from STILL_MENTION').to.deep.equal([]);
  });

  it('a planted mention fails; docs/decisions and build folders are not read', () => {
    const root = mkdtempSync(join(tmpdir(), 'mentions-'));
    try {
      mkdirSync(join(root, 'cmd'), { recursive: true });
      mkdirSync(join(root, 'docs', 'decisions'), { recursive: true });
      mkdirSync(join(root, 'native', 'node_modules'), { recursive: true });
      const planted = 'Is' + 'sue 99';
      writeFileSync(join(root, 'cmd', 'x.ts'), `// fixed for ${planted}\nexport const x = 1;\n`);
      writeFileSync(join(root, 'cmd', 'README.md'), `See ${planted.toLowerCase()} item 2.\n`);
      writeFileSync(join(root, 'cmd', 'y.ts'), '// an issuer 9 is no mention\n');
      writeFileSync(join(root, 'docs', 'decisions', '0001-x.md'), `${planted}\n`);
      writeFileSync(join(root, 'native', 'node_modules', 'z.ts'), `${planted}\n`);
      const found = mentionLines(root);
      expect([...found.keys()].sort()).to.deep.equal(['cmd/README.md', 'cmd/x.ts']);
      expect(mentionViolations(found, {})).to.have.length(2);
      expect(mentionViolations(found, { 'cmd/x.ts': 1, 'cmd/README.md': 1 })).to.deep.equal([]);
      expect(mentionViolations(found, { 'cmd/x.ts': 0, 'cmd/README.md': 1 })).to.have.length(1);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
