// Whether gcc can build with AddressSanitizer + UBSan here (the `make asan` tests skip with the
// reason when it cannot: libasan/libubsan come with Debian's gcc-12).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Why a sanitizer build cannot run here, or undefined. */
export function sanitizerMissing(): string | undefined {
  if (process.platform !== 'linux') return 'the sanitizer builds need Linux';
  const dir = mkdtempSync(join(tmpdir(), 'asan-probe-'));
  try {
    writeFileSync(join(dir, 'p.c'), 'int main(void) { return 0; }\n');
    const r = spawnSync('gcc', ['-fsanitize=address,undefined', '-o', join(dir, 'p'), join(dir, 'p.c')], {
      encoding: 'utf8',
    });
    if (r.error) return `gcc cannot be run: ${r.error.message}`;
    if (r.status !== 0)
      return `gcc cannot build with -fsanitize=address,undefined (libasan/libubsan missing?): ${r.stderr.trim().split('\n')[0]}`;
    return undefined;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
