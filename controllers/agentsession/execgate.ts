// The exec gate every session exec passes before it runs (JSON, WebSocket, streamed jobs and
// the git verbs alike): lifecycle gate, process policy, approvals, budget, workspace size; and
// the pure helpers around it (budget refusal, timeout, output cut). Split out of
// subresources.ts so git.ts can use it without importing the module that registers it.
import type { AgentSession } from '../../apis/zz_generated.types.js';
import type { ExecRequest, ExecResult } from '../../native/runtime.js';
import { errors } from '../../runtime/meta/errors.js';
import { budgetError, GROUP, mirrorUsage, type AgentSessionSubresourceDeps, type SessionTarget } from './common.js';
import { checkCommand } from './policy.js';
import type { HeldRequest } from './approval-rules.js';
import { approvalGate, consumeApproval } from './approvals.js';
import type { Usage } from './state.js';
import { rewindBeforeStep } from './rewind-point.js';

/** The first budget limit an exec may not start under, or undefined. Pure. */
export function execBudgetRefusal(
  b: AgentSession['spec']['budget'],
  u: Usage,
): { limit: string; max: number; used: number; unit?: string } | undefined {
  if (!b) return undefined;
  if (b.maxExecs !== undefined && u.execs >= b.maxExecs) return { limit: 'maxExecs', max: b.maxExecs, used: u.execs };
  if (b.maxExecSeconds !== undefined && u.execMs >= b.maxExecSeconds * 1000)
    return { limit: 'maxExecSeconds', max: b.maxExecSeconds, used: Math.floor(u.execMs / 1000), unit: ' s' };
  if (b.maxComputeSeconds !== undefined && u.computeMs >= b.maxComputeSeconds * 1000)
    return { limit: 'maxComputeSeconds', max: b.maxComputeSeconds, used: Math.floor(u.computeMs / 1000), unit: ' s' };
  return undefined;
}

/** The timeout an exec gets: what it asked for, at most the exec and compute seconds left (ms, at least 1). Pure. */
export function execTimeoutMs(askedMs: number, b: AgentSession['spec']['budget'], u: Usage): number {
  let t = askedMs;
  if (b?.maxExecSeconds !== undefined) t = Math.min(t, b.maxExecSeconds * 1000 - u.execMs);
  if (b?.maxComputeSeconds !== undefined) t = Math.min(t, b.maxComputeSeconds * 1000 - u.computeMs);
  return Math.max(1, Math.ceil(t));
}

/**
 * `buf` cut to at most `max` bytes on a UTF-8 character boundary: the kept text and how many
 * bytes were dropped from `buf` (plus `alreadyDropped`, what the runtime dropped). Pure.
 */
export function cutOutput(buf: Buffer, max: number, alreadyDropped = 0): { text: string; dropped: number } {
  if (buf.length <= max && alreadyDropped === 0) return { text: buf.toString('utf8'), dropped: 0 };
  let end = Math.min(max, buf.length);
  // Step back over continuation bytes (10xxxxxx) to the start of a character, then keep that
  // character only if it is complete within end.
  if (end < buf.length || alreadyDropped > 0) {
    let i = end;
    while (i > 0 && i > end - 4 && (buf[i - 1]! & 0xc0) === 0x80) i--;
    if (i > 0) {
      const lead = buf[i - 1]!;
      const len = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      if (i - 1 + len > end) end = i - 1;
    }
  }
  return { text: buf.subarray(0, end).toString('utf8'), dropped: buf.length - end + alreadyDropped };
}

/** An exec that passed the gate, the policy and the budget: its timeout, its output cap, and how to account for it. */
export interface ExecTicket {
  timeoutMs: number;
  cap: number;
  command: string | string[];
  /** Records the finished command (usage, ledger); returns the ledger entry number. */
  finish(r: {
    exitCode: number;
    durationMs: number;
    timedOut: boolean;
    signal?: string;
    stdoutDropped: number;
    stderrDropped: number;
    tty?: boolean;
  }): Promise<number>;
  /** The command could not start: its reserved exec is given back. */
  abort(): Promise<void>;
}

/**
 * The checks every exec passes before it runs (JSON and WebSocket alike): the lifecycle gate
 * (409 during restore/fork/promote), the process policy (403 exec.refused, ledgered), the
 * budget (403 naming the limit, ledgered; maxExecs reserved under the lock), the workspace
 * size. Returns the ticket; the caller runs the command and calls finish or abort once.
 */
/**
 * How an exec meets policy.process.ask: the Approval it names, how long to wait for a decision, and the request's
 * parameters the digest covers.
 */
export interface Hold {
  name?: string;
  /** Held for approval whatever policy.process.ask says (git push/pull/fetch: git.ts). */
  ask?: { rule: string; piece: string };
  waitMs: number;
  signal?: AbortSignal;
  transport?: 'json' | 'stream';
  stdin?: string;
  env?: Record<string, string>;
  cwd?: string;
}

export async function beginExec(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  argv: string[],
  askedMs: number,
  hold: Hold = { waitMs: 0 },
): Promise<ExecTicket> {
  const { s, uid } = t;
  const name = s.metadata.name!;
  const command = argv[0] === 'sh' && argv[1] === '-c' && argv.length === 3 ? argv[2]! : argv;
  const gate = async () => {
    const op = await d.state.inFlight(uid);
    if (op && op.op !== 'checkpoint' && op.op !== 'delete') {
      throw errors.conflict(
        'agentsessions',
        GROUP,
        name,
        `exec is refused while a ${op.op} of this session is in flight (since ${op.startedAt})`,
      );
    }
  };
  await gate();
  const rules = s.spec.policy?.process ?? {};
  const verdict = checkCommand(argv, rules);
  if (!verdict.allowed) {
    await d.ledger.append(uid, 'exec.refused', { command, reason: verdict.why });
    const e = errors.forbidden(`exec.refused: ${verdict.why}`);
    e.status.details = {
      name,
      group: GROUP,
      kind: 'agentsessions',
      causes: [
        {
          reason: 'exec.refused',
          message: verdict.why,
          field: verdict.rule !== undefined ? 'spec.policy.process.deny' : 'spec.policy.process.allow',
        },
      ],
    };
    throw e;
  }
  const ask = hold.ask
    ? { allowed: false as const, ...hold.ask }
    : (rules.ask ?? []).length
      ? checkCommand(argv, { deny: rules.ask })
      : { allowed: true as const };
  let approval: string | undefined;
  const held: HeldRequest = {
    kind: 'exec',
    argv,
    timeoutSeconds: askedMs / 1000,
    stdin: hold.stdin,
    env: hold.env,
    cwd: hold.cwd,
    transport: hold.transport ?? 'json',
  };
  if (!ask.allowed) {
    // Held for an operator (approvals.ts): 428 / 403 unless an Approved, matching one is named
    // (or arrives within approvalWaitSeconds; the wait holds no lifecycle slot, so the gate is checked again).
    approval = await approvalGate(
      d,
      t,
      held,
      { rule: ask.rule!, piece: ask.piece },
      { approvalName: hold.name, waitMs: hold.waitMs, signal: hold.signal },
    );
    await gate();
  }
  const budget = s.spec.budget;
  const wsPath = s.spec.workspace?.path ?? '/work';
  // Reserve the exec under the lock so parallel requests cannot pass maxExecs together.
  let refused: ReturnType<typeof execBudgetRefusal>;
  let reserved: Usage | undefined;
  await d.state.updateUsage(
    uid,
    (u) => {
      refused = execBudgetRefusal(budget, u);
      if (refused) return u;
      reserved = { ...u, execs: u.execs + 1 };
      return reserved;
    },
    { persist: false },
  );
  if (refused || !reserved) {
    const b = refused!;
    await d.ledger.append(uid, 'budget.exceeded', { command, limit: b.limit, max: b.max, used: b.used });
    throw budgetError(b.limit, b.max, b.used, b.unit ?? '');
  }
  const giveBack = () => d.state.updateUsage(uid, (x) => ({ ...x, execs: Math.max(0, x.execs - 1) }));
  if (budget?.maxWorkspaceBytes !== undefined) {
    // serverCommand: du is the server's, not the agent's; it runs also under process.enforce exec.
    const du = await d.runtime.exec(t.sandboxId, {
      argv: ['du', '-sk', wsPath],
      timeoutMs: 30_000,
      maxOutputBytes: 4096,
      serverCommand: true,
    });
    const kb = Number(/^(\d+)/.exec(du.stdout.toString('utf8'))?.[1] ?? NaN);
    if (Number.isFinite(kb)) {
      const bytes = kb * 1024;
      await d.state.updateUsage(uid, (u) => ({ ...u, workspaceBytes: bytes }));
      if (bytes >= budget.maxWorkspaceBytes) {
        const u = await giveBack();
        await d.ledger.append(uid, 'budget.exceeded', {
          command,
          limit: 'maxWorkspaceBytes',
          max: budget.maxWorkspaceBytes,
          used: bytes,
        });
        mirrorUsage(d, s, u);
        throw budgetError('maxWorkspaceBytes', budget.maxWorkspaceBytes, bytes, ' bytes');
      }
    }
  }
  let consumed: Promise<unknown> = Promise.resolve();
  if (approval) {
    try {
      // single use: one of concurrent retries gets here
      consumed = (await consumeApproval(d, t, approval, held)).ledgered;
    } catch (e) {
      mirrorUsage(d, s, await giveBack());
      throw e;
    }
  }
  const timeoutMs = execTimeoutMs(askedMs, budget, reserved);
  const cap = budget?.maxOutputBytes ?? d.maxOutputBytes ?? 1024 * 1024;
  d.state.running.set(uid, (d.state.running.get(uid) ?? 0) + 1);
  let settled = false;
  const done = () => {
    if (settled) return false;
    settled = true;
    const n = (d.state.running.get(uid) ?? 1) - 1;
    if (n > 0) d.state.running.set(uid, n);
    else d.state.running.delete(uid);
    return true;
  };
  // rewind-point.ts: the automatic point before this step (trigger exec; best effort, never throws).
  const point = await rewindBeforeStep(d, t, 'exec', command);
  return {
    timeoutMs,
    cap,
    command,
    async finish(r) {
      if (!done()) return 0;
      await consumed; // approval.consumed is on disk before the answer
      const ms = Math.round(r.durationMs);
      const truncated = r.stdoutDropped > 0 || r.stderrDropped > 0;
      if (point) await point.ready(); // rewind-point.ts: the point is on disk before the entry naming it
      // usage.json (a cache the ledger proves) is written while the ledger line is fsynced.
      const usage = d.state.updateUsage(uid, (x) => ({ ...x, execMs: x.execMs + ms, computeMs: x.computeMs + ms }));
      const ledgered = d.ledger.append(uid, 'exec', {
        command,
        exitCode: r.exitCode,
        durationMs: ms,
        timeoutMs,
        ...(r.timedOut ? { timedOut: true } : {}),
        ...(r.signal ? { signal: r.signal } : {}),
        ...(r.tty ? { tty: true } : {}),
        ...(truncated
          ? { outputTruncated: true, stdoutDroppedBytes: r.stdoutDropped, stderrDroppedBytes: r.stderrDropped }
          : {}),
        ...(approval ? { approval } : {}),
        ...(point ? { rewindPoint: point.tag } : {}),
      });
      const [u, entry] = await Promise.all([usage, ledgered]);
      if (point) await point.done(entry.entry);
      mirrorUsage(d, s, u);
      return entry.entry;
    },
    async abort() {
      await consumed.catch(() => undefined);
      if (done()) await giveBack();
    },
  };
}

/**
 * Runs a buffered exec under a ticket from beginExec: the ticket's timeout and output cap, the
 * reserved exec given back when the command cannot start, the output cut on a character
 * boundary, and the ticket finished (usage, ledger). What every JSON exec of a session does.
 */
export async function runTicketed(
  d: AgentSessionSubresourceDeps,
  t: SessionTarget,
  tk: ExecTicket,
  req: Omit<ExecRequest, 'timeoutMs' | 'maxOutputBytes'>,
): Promise<{
  res: ExecResult;
  out: { text: string; dropped: number };
  err: { text: string; dropped: number };
  entry: number;
}> {
  let res: ExecResult;
  try {
    res = await d.runtime.exec(t.sandboxId, { ...req, timeoutMs: tk.timeoutMs, maxOutputBytes: Math.max(1, tk.cap) });
  } catch (e) {
    await tk.abort();
    throw e;
  }
  const out = cutOutput(res.stdout, tk.cap, res.stdoutDropped);
  const err = cutOutput(res.stderr, tk.cap, res.stderrDropped);
  const entry = await tk.finish({
    exitCode: res.exitCode,
    durationMs: res.durationMs,
    timedOut: res.timedOut,
    signal: res.signal,
    stdoutDropped: out.dropped,
    stderrDropped: err.dropped,
  });
  return { res, out, err, entry };
}
