// A gate a test opens: work waits on it (wait), the test sees who waits (waiting, reached) and
// lets them go (open) or fails them (fail). Synchronises a test on events, never on sleeps.
export class Gate {
  readonly waiting: string[] = [];
  private outcome?: { error?: Error };
  private readonly waiters: Array<() => void> = [];
  private readonly watchers: Array<() => void> = [];

  /** Waits until the gate opens (resolves) or fails (rejects with its error); `who` is recorded. */
  async wait(who: string): Promise<void> {
    this.waiting.push(who);
    for (const w of this.watchers.splice(0)) w();
    if (!this.outcome) await new Promise<void>((r) => this.waiters.push(r));
    if (this.outcome?.error) throw this.outcome.error;
  }

  /** Resolves once `n` waits have begun. */
  async reached(n = 1): Promise<void> {
    while (this.waiting.length < n) await new Promise<void>((r) => this.watchers.push(r));
  }

  /** Lets every waiter (and every later one) through. */
  open(): void {
    this.outcome ??= {};
    for (const w of this.waiters.splice(0)) w();
  }

  /** Fails every waiter (and every later one) with `error`. */
  fail(error: Error): void {
    this.outcome = { error };
    for (const w of this.waiters.splice(0)) w();
  }
}
