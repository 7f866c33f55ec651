// One async critical section per key (a session's uid, a records file): calls with the same
// key run one after another in call order, a failed one does not block the next, and the map
// holds only keys with work queued.
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const run = (this.tails.get(key) ?? Promise.resolve()).catch(() => undefined).then(fn);
    this.tails.set(key, run);
    const clear = () => {
      if (this.tails.get(key) === run) this.tails.delete(key);
    };
    run.then(clear, clear);
    return run;
  }

  /** Keys with work queued or running (tests read it). */
  get size(): number {
    return this.tails.size;
  }
}
