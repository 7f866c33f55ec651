// The registry's WatchStream: a per-watcher ordered queue between the store's synchronous
// fan-out and the consumer (the HTTP encoder or the in-process client).
//
// Contract: events are delivered asynchronously (microtasks), in the order they were pushed,
// only after `onEvent` has been registered (events pushed before are buffered). `end()`
// closes after the buffered events are delivered (used after an ERROR event and on
// timeoutSeconds); `close()` stops at once and drops what is buffered. `onClose` callbacks
// run exactly once. Both are safe to call repeatedly.
import type { WatchEvent } from '../meta/types.js';
import type { WatchStream } from './registry-types.js';

export class QueueWatch implements WatchStream {
  private queue: WatchEvent[] = [];
  private readonly eventCbs: ((ev: WatchEvent) => void)[] = [];
  private readonly closeCbs: (() => void)[] = [];
  private scheduled = false;
  private ending = false;
  private closed = false;
  private readonly cleanups: (() => void)[] = [];

  /** Registers something to undo (unsubscribe, timers) when the stream closes. */
  addCleanup(fn: () => void): void {
    if (this.closed) fn();
    else this.cleanups.push(fn);
  }

  get isClosed(): boolean {
    return this.closed || this.ending;
  }

  push(ev: WatchEvent): void {
    if (this.closed || this.ending) return;
    this.queue.push(ev);
    this.schedule();
  }

  /** Graceful close: deliver what is queued, then close. */
  end(): void {
    if (this.closed || this.ending) return;
    this.ending = true;
    this.runCleanups();
    this.schedule();
  }

  onEvent(cb: (ev: WatchEvent) => void): void {
    this.eventCbs.push(cb);
    this.schedule();
  }

  onClose(cb: () => void): void {
    if (this.closed) queueMicrotask(cb);
    else this.closeCbs.push(cb);
  }

  close(): void {
    if (this.closed) return;
    this.queue = [];
    this.finish();
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => this.flush());
  }

  private flush(): void {
    this.scheduled = false;
    if (this.closed) return;
    if (this.eventCbs.length > 0) {
      // Take the whole queue at once (shift() per event is quadratic for a large initial
      // state); events pushed by callbacks land in the fresh queue and go next round.
      while (this.queue.length > 0 && !this.closed) {
        const batch = this.queue;
        this.queue = [];
        for (const ev of batch) {
          if (this.closed) break;
          for (const cb of this.eventCbs) {
            try {
              cb(ev);
            } catch {
              // A consumer's exception must not stall other consumers or the stream.
            }
          }
        }
      }
    }
    if (this.ending && this.queue.length === 0) this.finish();
  }

  private runCleanups(): void {
    for (const fn of this.cleanups.splice(0)) {
      try {
        fn();
      } catch {
        // Cleanup is best effort; the stream is closing anyway.
      }
    }
  }

  private finish(): void {
    if (this.closed) return;
    this.closed = true;
    this.runCleanups();
    for (const cb of this.closeCbs.splice(0)) {
      try {
        cb();
      } catch {
        // See flush().
      }
    }
  }
}
