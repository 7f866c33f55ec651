// Idle standby and wake: `withIdle(runtime)` wraps a Runtime (the node's router) so that every
// call that needs a sandbox's processes (exec, streams and terminals, files, tar, manifest,
// checkpoint, restore, fork, marks, jobs that act, port connections, file watches, freeze) first
// wakes a sandbox on standby, transparently, and counts as activity. The Sandbox controller asks
// `standbyIfIdle(id, idleMs)` (spec.idleSeconds, controllers/sandbox/idle.ts); the backend freezes the
// sandbox (procbox: the cgroup freezer, native/procbox/idle.ts; vm: QMP stop) with the standby on
// disk first, so a restart keeps it frozen and `list()`/`inspect()` say `standby` (start() learns
// them back).
//
// Idle means: no call of the list below for idleMs (the last one's start or end, whichever is later),
// none in flight (a running exec, an open exec stream or terminal, a file call, an open file watch),
// and no background job running (a running job keeps its sandbox awake: freezing would pause it,
// and a job is work the user asked for). An open preview connection (connectPort) is not activity by
// itself; each preview request is (the preview proxy calls `wake` per request, also on a kept-alive
// connection). A server command (ExecRequest.serverCommand: the workspace size) wakes the sandbox
// but is not activity.
//
// Wake: concurrent callers share one wake (one thaw). It is bounded by WAKE_TIMEOUT_MS: past it the
// call fails with RuntimeError Conflict reason `WakeTimeout` (the preview proxy answers 503). The
// wake runs inside the call that needs it, so it is authorized exactly as that call was.
// Deciding and waking are ordered without a lock: `standbyIfIdle` checks activity and marks the
// sandbox as on standby in the same turn of the event loop, and every wrapped call counts itself in
// flight before it looks at that mark, so a call either prevents the standby or wakes it (the
// backend's wake waits for its standby under the sandbox's lock).
import {
  RuntimeError,
  type ExecRequest,
  type ExecStream,
  type IdleDecision,
  type Runtime,
  type SandboxInfo,
} from './runtime.js';
import type { WatchProcess } from './watch.js';
import type { JobInfo } from './jobs.js';

/** What Runtime.standbyIfIdle did. */

/** A wake that takes longer than this fails (the preview proxy answers 503 with the reason). */
export const WAKE_TIMEOUT_MS = 10_000;

/** Calls that need the sandbox's processes: they wake it first and count as activity. First argument: the id. */
const WAKES = new Set([
  'exec',
  'execStream',
  'listFiles',
  'stat',
  'readFile',
  'writeFile',
  'writeFileStream',
  'readRange',
  'deleteFile',
  'readTar',
  'writeTar',
  'manifest',
  'checkpoint',
  'restore',
  'fork',
  'mark',
  'changesSince',
  'freeze',
  'resolveExecutables',
  'connectPort',
  'watchFiles',
  'startJob',
  'writeJobStdin',
  'killJob',
]);

/** What the wrapper adds (all also optional Runtime methods). */
export interface IdleRuntime {
  standbyIfIdle(id: string, idleMs: number, notBeforeMs?: number): Promise<IdleDecision>;
  wake(id: string): Promise<boolean>;
  onWake(listener: (id: string) => void): void;
}

class IdleState {
  readonly last = new Map<string, number>();
  readonly inflight = new Map<string, number>();
  readonly standby = new Set<string>();
  readonly waking = new Map<string, Promise<boolean>>();
  readonly listeners: Array<(id: string) => void> = [];
  /** Activity before this process started is unknown: idle is counted from here at the earliest. */
  readonly since: number;

  constructor(
    readonly rt: Runtime,
    readonly now: () => number,
  ) {
    this.since = now();
  }

  touch(id: string): void {
    this.last.set(id, this.now());
  }

  begin(id: string, activity: boolean): () => void {
    this.inflight.set(id, (this.inflight.get(id) ?? 0) + 1);
    if (activity) this.touch(id);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const n = (this.inflight.get(id) ?? 1) - 1;
      if (n > 0) this.inflight.set(id, n);
      else this.inflight.delete(id);
      if (activity) this.touch(id);
    };
  }

  /** Wakes `id` if it is on standby (one wake for concurrent callers), bounded by WAKE_TIMEOUT_MS. */
  async wakeIfStandby(id: string): Promise<boolean> {
    let w = this.waking.get(id);
    if (!w) {
      if (!this.standby.has(id)) return false;
      if (!this.rt.wake) {
        this.standby.delete(id);
        return false;
      }
      w = this.rt.wake(id).then(
        (woke) => {
          this.standby.delete(id);
          this.waking.delete(id);
          for (const l of this.listeners) l(id);
          return woke;
        },
        (e: unknown) => {
          this.waking.delete(id);
          throw e;
        },
      );
      this.waking.set(id, w);
    }
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new RuntimeError(
              'Conflict',
              `sandbox ${id} did not wake from standby within ${WAKE_TIMEOUT_MS / 1000} s`,
              'WakeTimeout',
            ),
          ),
        WAKE_TIMEOUT_MS,
      );
      timer.unref();
    });
    try {
      return await Promise.race([w, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Learns standby from what the backend reports (after a restart of this process). */
  seen(info: SandboxInfo): SandboxInfo {
    if (info.standby && !this.waking.has(info.id)) this.standby.add(info.id);
    return info;
  }

  async standbyIfIdle(id: string, idleMs: number, notBeforeMs = 0): Promise<IdleDecision> {
    if (!this.rt.standby) return { standby: false, waitMs: Infinity, why: 'the backend has no standby' };
    if (this.standby.has(id)) return { standby: true };
    // Jobs first (asynchronous); a job started meanwhile counts as activity below.
    const jobs: JobInfo[] =
      (await (this.rt as Partial<{ listJobs(id: string): Promise<JobInfo[]> }>).listJobs?.(id).catch(() => [])) ?? [];
    const running = jobs.filter((j) => j.state === 'running').length;
    // From here to the mark, no await: a call cannot slip between the check and the mark.
    const now = this.now();
    const last = Math.max(this.last.get(id) ?? this.since, notBeforeMs);
    if (running) return { standby: false, waitMs: idleMs, why: `${running} background job(s) running` };
    if (this.inflight.get(id) || this.waking.has(id))
      return { standby: false, waitMs: idleMs, why: 'a call is in flight' };
    if (now - last < idleMs) return { standby: false, waitMs: idleMs - (now - last), why: 'active' };
    this.standby.add(id);
    try {
      await this.rt.standby(id);
    } catch (e) {
      this.standby.delete(id);
      throw e;
    }
    return { standby: true };
  }
}

/** Wraps `rt` with idle tracking, wake-on-use and standbyIfIdle (see the file comment). */
export function withIdle<T extends Runtime>(rt: T, now: () => number = Date.now): T & IdleRuntime {
  const st = new IdleState(rt, now);
  const own: Record<string, unknown> = {
    async start(): Promise<void> {
      await rt.start();
      for (const i of await rt.list()) st.seen(i);
    },
    async inspect(id: string, opts?: { revive?: boolean }): Promise<SandboxInfo> {
      return st.seen(await rt.inspect(id, opts));
    },
    async list(): Promise<SandboxInfo[]> {
      return (await rt.list()).map((i) => st.seen(i));
    },
    // A pause by the user ends a standby first (the pause then holds the sandbox frozen).
    async pause(id: string): Promise<void> {
      await st.wakeIfStandby(id);
      return rt.pause(id);
    },
    // A sandbox's idle time starts at its create (never at this process's start), as the
    // children's of a fork do (the parent's is a wrapped call: activity).
    async create(cfg: Parameters<Runtime['create']>[0]): Promise<SandboxInfo> {
      const info = await rt.create(cfg);
      st.touch(info.id);
      return info;
    },
    async destroy(id: string): Promise<void> {
      await rt.destroy(id);
      st.standby.delete(id);
      st.last.delete(id);
    },
    async wake(id: string): Promise<boolean> {
      const end = st.begin(id, true);
      try {
        return await st.wakeIfStandby(id);
      } finally {
        end();
      }
    },
    standbyIfIdle: (id: string, idleMs: number, notBeforeMs?: number) => st.standbyIfIdle(id, idleMs, notBeforeMs),
    onWake(listener: (id: string) => void): void {
      st.listeners.push(listener);
    },
  };
  return new Proxy(rt, {
    get(target, prop, receiver) {
      if (typeof prop === 'string' && prop in own) return own[prop];
      const v: unknown = Reflect.get(target, prop, receiver);
      if (typeof prop !== 'string' || typeof v !== 'function') return v;
      const fn = v as (...a: unknown[]) => unknown;
      if (!WAKES.has(prop)) return fn.bind(target);
      return async (id: string, ...rest: unknown[]) => {
        const activity = !(prop === 'exec' && (rest[0] as ExecRequest | undefined)?.serverCommand);
        const end = st.begin(id, activity);
        let handedOver = false;
        try {
          await st.wakeIfStandby(id);
          const out = await fn.call(target, id, ...rest);
          if (prop === 'fork') for (const child of rest[0] as string[]) st.touch(child);
          // A stream, terminal or watch is in flight until it ends.
          if (prop === 'execStream' || prop === 'watchFiles') {
            handedOver = true;
            void (out as ExecStream | WatchProcess).exit.then(end, end);
          }
          return out;
        } finally {
          if (!handedOver) end();
        }
      };
    },
  }) as T & IdleRuntime;
}
