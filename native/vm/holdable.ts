// Timeouts that do not count while the guest is paused (idle standby: QMP stop, idle.ts). A host
// timeout on a guest answer (an agent call's timeoutMs) measures the guest's time: while its vCPUs are
// stopped it cannot answer, so the time it spends stopped is not held against it. `hold()` stops every
// running timeout with what it had left; `release()` starts them again for that remainder.

interface Entry {
  fn: () => void;
  left: number;
  startedAt: number;
  timer?: NodeJS.Timeout;
}

export class HoldableTimeouts {
  private readonly live = new Set<Entry>();
  private heldSince: number | undefined;

  get held(): boolean {
    return this.heldSince !== undefined;
  }

  /** Calls `fn` after `ms` of time not held. Returns a handle for clear(). */
  set(fn: () => void, ms: number): object {
    const e: Entry = { fn, left: ms, startedAt: performance.now() };
    this.live.add(e);
    if (!this.held) this.start(e);
    return e;
  }

  clear(handle: object | undefined): void {
    const e = handle as Entry | undefined;
    if (!e || !this.live.has(e)) return;
    if (e.timer) clearTimeout(e.timer);
    this.live.delete(e);
  }

  hold(): void {
    if (this.held) return;
    const now = performance.now();
    this.heldSince = now;
    for (const e of this.live) {
      if (e.timer) clearTimeout(e.timer);
      e.timer = undefined;
      e.left = Math.max(0, e.left - (now - e.startedAt));
    }
  }

  release(): void {
    if (!this.held) return;
    this.heldSince = undefined;
    for (const e of this.live) this.start(e);
  }

  private start(e: Entry): void {
    e.startedAt = performance.now();
    e.timer = setTimeout(() => {
      this.live.delete(e);
      e.fn();
    }, e.left);
  }
}
