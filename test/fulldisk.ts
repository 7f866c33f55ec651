// A real full disk for tests: a tmpfs of a given size on a new directory, and a file that
// fills it to the last byte. Shared by the store, sandbox and e2e full-disk tests.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** Mounts a tmpfs of `size` (mount's syntax, e.g. '64m') on a new directory; `why` when it cannot. */
export function mountTmpfs(size: string): { dir?: string; why?: string } {
  if (process.getuid?.() !== 0) return { why: 'mounting a tmpfs needs root' };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fluxvm-full-'));
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size},mode=0700`, 'tmpfs', dir], { stdio: 'pipe' });
    return { dir };
  } catch (e) {
    fs.rmSync(dir, { recursive: true, force: true });
    return { why: `mount -t tmpfs failed: ${String((e as { stderr?: Buffer }).stderr ?? e).trim()}` };
  }
}

/** Unmounts and removes a directory made by mountTmpfs. Safe to call twice. */
export function unmountTmpfs(dir: string): void {
  try {
    execFileSync('umount', ['-l', dir], { stdio: 'pipe' });
  } catch {
    // already unmounted
  }
  fs.rmSync(dir, { recursive: true, force: true });
}

/**
 * Writes `file` until the disk is full, in shrinking chunks so the last free block is used too.
 * Returns the file's path; any error but ENOSPC is thrown.
 */
export function fillToTheBrim(file: string): string {
  const fd = fs.openSync(file, 'w');
  try {
    for (const size of [1024 * 1024, 64 * 1024, 4096, 512]) {
      const chunk = Buffer.alloc(size, 1);
      try {
        for (;;) fs.writeSync(fd, chunk);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOSPC') throw e;
      }
    }
  } finally {
    fs.closeSync(fd);
  }
  return file;
}
