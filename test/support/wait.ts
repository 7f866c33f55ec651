// The one bounded poll for tests: waits for a condition the code under test offers no event for.
// It fails with what it waited for, never hangs past its bound.

/**
 * Calls `fn` until it returns a truthy value (resolved with it) or `timeoutMs` passes (rejects naming
 * `what`): at once, then after 5 ms, the pause doubling up to 100 ms, so a condition met soon is seen
 * soon and a long wait costs little. Safe to call concurrently; `fn` may throw to abort the wait.
 */
export async function eventually<T>(
  fn: () => Promise<T | undefined | false> | T | undefined | false,
  timeoutMs: number,
  what: string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (let pause = 5; ; pause = Math.min(100, pause * 2)) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, pause));
  }
}
