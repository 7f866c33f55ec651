// Tracked background work of the Changeset reconciler (issue 12 "bounded work"): a
// speculation or an apply may take minutes, so the pass that starts one returns at once and
// the work runs here, by changeset uid. When it settles, its key is enqueued again (the next
// pass reads what it wrote); an error it threw is handed to that pass, which throws it (a
// rate-limited retry, as if the pass itself had failed). A pass that finds work running for
// its uid does nothing but requeue.
import type { ObjectKey } from '../../runtime/controller/index.js';

export class BackgroundWork {
  private readonly running = new Map<string, Promise<void>>();
  private readonly errors = new Map<string, unknown>();

  /** `onSettled` is told the key of each work that settled (the controller's enqueue). */
  constructor(private readonly onSettled: (key: ObjectKey) => void = () => undefined) {}

  /** Starts `fn` for `uid` unless work for it runs already (then false). */
  start(uid: string, key: ObjectKey, fn: () => Promise<unknown>): boolean {
    if (this.running.has(uid)) return false;
    const work = Promise.resolve()
      .then(fn)
      .then(
        () => undefined,
        (e) => void this.errors.set(uid, e),
      )
      .finally(() => {
        this.running.delete(uid);
        this.onSettled(key);
      });
    this.running.set(uid, work);
    return true;
  }

  has(uid: string): boolean {
    return this.running.has(uid);
  }

  get size(): number {
    return this.running.size;
  }

  /** The error the last work of `uid` threw, once ({error}), or undefined. */
  takeError(uid: string): { error: unknown } | undefined {
    if (!this.errors.has(uid)) return undefined;
    const error = this.errors.get(uid);
    this.errors.delete(uid);
    return { error };
  }

  /** Resolves once nothing runs (work started meanwhile included). Never rejects. */
  async drain(): Promise<void> {
    while (this.running.size) await Promise.all([...this.running.values()]);
  }
}
