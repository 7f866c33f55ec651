import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

/** A file or directory that is gone by the time the walk reaches it (a sandbox torn down beside the walk). */
const gone = (e: unknown) => (e as NodeJS.ErrnoException).code === 'ENOENT';

/**
 * Every regular file under dir (a server's state dir: SQLite store and WAL, audit log, ledgers,
 * tokens files) with its size. The server keeps running while a test walks it, so what it removes
 * during the walk (a torn-down sandbox's files) is skipped, not an error.
 */
export function filesUnder(dir: string): { f: string; size: number }[] {
  const out: { f: string; size: number }[] = [];
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (e) {
    if (gone(e)) return out;
    throw e;
  }
  for (const e of entries) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(p));
    else if (e.isFile()) {
      try {
        out.push({ f: p, size: statSync(p).size });
      } catch (err) {
        if (!gone(err)) throw err;
      }
    }
  }
  return out;
}

/** The file's bytes as latin1 (any byte is one character), or '' when it was removed after the walk listed it. */
export function textIfThere(f: string): string {
  try {
    return readFileSync(f).toString('latin1');
  } catch (e) {
    if (gone(e)) return '';
    throw e;
  }
}
