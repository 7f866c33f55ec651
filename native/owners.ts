// Owner records of the runtimes on this host: a runtime writes
// `<dir>/<scope>.owner` (its state directory's path, device and inode) when it starts, so that
// what it leaves in host-global places (processes, cgroups, mounts, loop devices, network links)
// can be released once that directory is gone (native/orphans.ts). A directory made again at
// the same path is another one (its inode differs). Shared by procbox and vm.
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve as resolvePath } from 'node:path';

export interface Owner {
  root: string;
  dev: number;
  ino: number;
}

/** Where owner records live unless a runtime is told otherwise. */
export const OWNERS_BASE = '/run/fluxvm';

/** Records that the runtime of `scope` keeps its state in `root`. Never throws. */
export function recordOwner(dir: string, scope: string, root: string): void {
  try {
    const st = statSync(root);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const o: Owner = { root: resolvePath(root), dev: st.dev, ino: st.ino };
    writeFileSync(join(dir, `${scope}.owner`), JSON.stringify(o));
  } catch {
    // not root, or /run not writable: nothing host-global is made then either
  }
}

/** Drops an owner record (a runtime closed with nothing left). Never throws. */
export function dropOwner(dir: string, scope: string): void {
  rmSync(join(dir, `${scope}.owner`), { force: true });
}

/** True when the owner's state directory no longer exists (or another directory is at its path). */
export function ownerGone(o: Owner): boolean {
  try {
    const st = statSync(o.root);
    return st.dev !== o.dev || st.ino !== o.ino;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return code === 'ENOENT' || code === 'ENOTDIR';
  }
}

/** The scopes in `dir` whose owner's state directory is gone. */
export function goneScopes(dir: string): string[] {
  let names: string[] = [];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const out: string[] = [];
  for (const n of names) {
    if (!n.endsWith('.owner')) continue;
    try {
      if (ownerGone(JSON.parse(readFileSync(join(dir, n), 'utf8')) as Owner)) out.push(n.slice(0, -'.owner'.length));
    } catch {
      // a record being written
    }
  }
  return out;
}
