// The one way a test or suite skips itself: print why, then mocha's skip, so a skipped run
// says what it did not check.

/**
 * Skips the running suite or test (mocha's `this`) when `why` is set, printing the reason.
 * Returns only when `why` is undefined (mocha's skip throws).
 */
export function skipWith(ctx: Mocha.Context, why: string | undefined): void {
  if (!why) return;
  console.log(`      skipped: ${why}`);
  ctx.skip();
}
