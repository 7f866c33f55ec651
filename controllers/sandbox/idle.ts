// Idle standby of a Sandbox (spec.idleSeconds), the reconciler's step: the runtime wrapper
// (native/idle.ts) tracks activity and wakes a sandbox on its next call; this step asks it, on each
// pass of a running sandbox with idleSeconds, to put the sandbox on standby once idle, and reports
// phase Standby (Ready=True reason Standby: the desired state is reached, so kstatus says Current).
// Not idle yet: the pass comes back when the idle time would end (requeueAfter, no timer of its
// own); activity meanwhile only moves that end further. A wake (exec, files, terminal, jobs,
// preview, claim) enqueues the Sandbox (onWake hook in index.ts) so status says Running again.
// Idle time counts from the sandbox's Running (status.startedAt; the pass that sets it passes its
// own time) or its last activity, whichever is later. Timers across a restart: activity before
// this process started is unknown, so idle is counted from the start at the earliest (the
// sandbox still goes on standby idleSeconds later); a sandbox on standby stays frozen (the
// backend keeps it on disk) and wakes as before.
// spec.idleSeconds removed while on standby: the pass wakes it. A backend without standby (a vm
// runtime without it) keeps the sandbox Running with a note in Ready's message; a remote node
// agent forwards standbyIfIdle and wake to its runtime (native/agent/client.ts).
import type { Sandbox } from '../../apis/zz_generated.types.js';
import { RuntimeError, type Runtime, type SandboxInfo } from '../../native/runtime.js';

export type IdleStep =
  | { standby: true; ready: { status: 'True'; reason: 'Standby'; message: string } }
  | { standby: false; requeueMs?: number; note?: string };

/** Never come back sooner than this for an idle check (a wait of 0 after a race). */
const MIN_RECHECK_MS = 50;

function standbyStep(secs: number): IdleStep {
  return {
    standby: true,
    ready: {
      status: 'True',
      reason: 'Standby',
      message: `idle for spec.idleSeconds (${secs} s): every process is frozen until the next exec, file call, terminal, job, preview request or claim wakes it`,
    },
  };
}

/** The idle step of a pass over a running sandbox `id` (the runtime instance of `sbx`). */
export async function idleStep(
  rt: Runtime,
  sbx: Sandbox,
  id: string,
  info: SandboxInfo,
  now: number = Date.now(),
): Promise<IdleStep> {
  const secs = sbx.spec?.idleSeconds;
  if (!secs) {
    if (info.standby) await rt.wake?.(id);
    return { standby: false };
  }
  if (info.standby) return standbyStep(secs);
  if (!rt.standbyIfIdle)
    return { standby: false, note: ' (spec.idleSeconds is ignored: this node cannot put sandboxes on standby)' };
  // Idle counts from the sandbox's Running at the earliest: without status.startedAt, this pass is
  // the one that makes it Running (and writes startedAt), so it starts now.
  const started = Date.parse(sbx.status?.startedAt ?? '');
  try {
    const d = await rt.standbyIfIdle(id, secs * 1000, Number.isNaN(started) ? now : started);
    if (d.standby) return standbyStep(secs);
    return { standby: false, requeueMs: Number.isFinite(d.waitMs) ? Math.max(MIN_RECHECK_MS, d.waitMs) : undefined };
  } catch (e) {
    if (e instanceof RuntimeError && e.code === 'Unsupported')
      return { standby: false, note: ` (spec.idleSeconds is ignored: ${e.message})` };
    throw e;
  }
}
