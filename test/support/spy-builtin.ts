// Watches calls of a Node built-in module's functions while a test's code runs, ESM importers of
// the module included (syncBuiltinESMExports updates their live bindings): what a hot path must
// not do (fork the server, write a cgroup file) is checked by seeing it not happen.
import { createRequire, syncBuiltinESMExports } from 'node:module';

/**
 * Runs `fn` with each function `names` of built-in `mod` (e.g. 'node:fs') wrapped: `onCall`
 * sees its name and arguments before the real call. Restored afterwards, also when `fn` throws.
 */
export async function whileSpying(
  mod: string,
  names: readonly string[],
  onCall: (name: string, args: unknown[]) => void,
  fn: () => Promise<void>,
): Promise<void> {
  const m = createRequire(import.meta.url)(mod) as Record<string, unknown>;
  const saved = new Map<string, unknown>();
  for (const name of names) {
    const orig = m[name] as (...a: unknown[]) => unknown;
    saved.set(name, orig);
    m[name] = function (this: unknown, ...a: unknown[]) {
      onCall(name, a);
      return orig.apply(this, a);
    };
  }
  syncBuiltinESMExports();
  try {
    await fn();
  } finally {
    for (const [name, orig] of saved) m[name] = orig;
    syncBuiltinESMExports();
  }
}
