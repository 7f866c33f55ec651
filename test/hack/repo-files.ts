// The repository's TypeScript files, for the ratchet tests of test/hack/ that grep the code.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Every .ts file below `dir` (relative to the repository), as repository-relative paths. */
export function tsFiles(dir: string): string[] {
  return fs.readdirSync(path.join(REPO, dir), { withFileTypes: true }).flatMap((e) => {
    const rel = path.posix.join(dir, e.name);
    return e.isDirectory() ? tsFiles(rel) : e.name.endsWith('.ts') ? [rel] : [];
  });
}

/** The text of a repository-relative file. */
export const readRepo = (f: string): string => fs.readFileSync(path.join(REPO, f), 'utf8');
