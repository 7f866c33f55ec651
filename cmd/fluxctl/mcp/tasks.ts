// MCP Tasks for FluxVM's long work (speculate, apply, checkpoint, fork, a held `ask` command).
// A task belongs to the principal that started it (tasks/get, tasks/result, tasks/list and
// tasks/cancel see only their own; another principal's task id is "not found"). A command held
// for approval is `input_required` with the Approval's summary; tasks/update answers it with the
// ANSWERING principal's credential (decideApproval: the API decides who may approve, so a session
// token is refused by the API's own scope), then the command runs once with the task owner's
// credential. The store lives in the serving process (stateless requests find a task by id);
// tasks are not kept across a restart.
import { randomBytes } from 'node:crypto';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { decideApproval } from './tools-changeset.js';
import { escapeLine } from '../escape.js';
import type { Held, Outcome, ToolContext } from './tool.js';

export type TaskStatus = 'working' | 'input_required' | 'completed' | 'failed' | 'cancelled';

export interface TaskView {
  taskId: string;
  status: TaskStatus;
  statusMessage?: string;
  createdAt: string;
  lastUpdatedAt: string;
  ttl: number;
  pollInterval: number;
}

interface TaskRec extends TaskView {
  owner: string;
  held?: Held;
  result?: CallToolResult;
  abort: AbortController;
  expires: number;
  done: Promise<void>;
  finish: () => void;
}

export const DEFAULT_TASK_TTL_MS = 3_600_000;
export const MAX_TASK_TTL_MS = 86_400_000;
/** Live (not finished) tasks one principal may hold; the next tools/call with a task is a tool error. */
export const MAX_LIVE_TASKS = 64;
/** How long one held request waits for the decision before it is asked again (the API allows 120). */
export const APPROVAL_WAIT_SECONDS = 60;

const TERMINAL: TaskStatus[] = ['completed', 'failed', 'cancelled'];

export class TaskError extends Error {
  constructor(
    message: string,
    readonly data?: unknown,
  ) {
    super(message);
  }
}

/** The summary a person (or the agent) reads while a command waits for approval. */
export function heldSummary(h: Held): string {
  return `held for approval: Approval ${h.approval} of session ${h.namespace}/${h.session} (command: ${escapeLine(h.commandLine)}${
    h.expiresAt ? `; pending until ${h.expiresAt}` : ''
  }); an approver answers with tasks/update {decision: approve|deny}`;
}

export class TaskStore {
  private readonly tasks = new Map<string, TaskRec>();

  constructor(private readonly toResult: (o: Outcome) => CallToolResult) {}

  private sweep(now = Date.now()) {
    for (const [id, t] of this.tasks) if (t.expires < now) this.tasks.delete(id);
  }

  liveCount(owner: string): number {
    let n = 0;
    for (const t of this.tasks.values()) if (t.owner === owner && !TERMINAL.includes(t.status)) n++;
    return n;
  }

  /** Starts `work` in the background as a task of `owner`. */
  start(
    owner: string,
    ttlMs: number | undefined,
    work: (signal: AbortSignal, progress: (m: string) => void) => Promise<Outcome>,
  ): TaskView {
    this.sweep();
    if (this.liveCount(owner) >= MAX_LIVE_TASKS)
      throw new TaskError(
        `too many running tasks: ${MAX_LIVE_TASKS} is the limit per principal; wait for one to finish`,
      );
    const now = new Date().toISOString();
    const ttl = Math.min(Math.max(ttlMs ?? DEFAULT_TASK_TTL_MS, 1000), MAX_TASK_TTL_MS);
    let finish = () => {};
    const done = new Promise<void>((r) => (finish = r));
    const t: TaskRec = {
      taskId: randomBytes(16).toString('hex'),
      status: 'working',
      createdAt: now,
      lastUpdatedAt: now,
      ttl,
      pollInterval: 500,
      owner,
      abort: new AbortController(),
      expires: Date.now() + ttl,
      done,
      finish,
    };
    this.tasks.set(t.taskId, t);
    this.run(t, () => work(t.abort.signal, (m) => this.set(t, 'working', m)));
    return view(t);
  }

  private set(t: TaskRec, status: TaskStatus, message?: string) {
    if (TERMINAL.includes(t.status)) return;
    t.status = status;
    t.statusMessage = message;
    t.lastUpdatedAt = new Date().toISOString();
    t.expires = Date.now() + t.ttl;
    if (TERMINAL.includes(status)) t.finish();
  }

  private run(t: TaskRec, work: () => Promise<Outcome>) {
    work().then(
      (o) => {
        if (t.status === 'cancelled') return;
        if (o.kind === 'held') {
          t.held = o.held;
          this.set(t, 'input_required', heldSummary(o.held));
          this.run(t, () => this.awaitDecision(t, o.held));
          return;
        }
        t.held = undefined;
        t.result = this.toResult(o);
        this.set(t, o.kind === 'ok' ? 'completed' : 'failed', o.kind === 'ok' ? undefined : o.message);
      },
      (e: unknown) => {
        t.result = this.toResult({ kind: 'error', message: String((e as Error)?.message ?? e) });
        this.set(t, 'failed', t.result.content[0]?.type === 'text' ? t.result.content[0].text : 'failed');
      },
    );
  }

  /**
   * While the task is input_required: the held request again with its Approval, each time held
   * open up to APPROVAL_WAIT_SECONDS by the API (a watch of the Approval), until it is decided by
   * anyone allowed to (tasks/update here, `fluxctl agent approve`, kubectl), it expires, or the
   * task is cancelled. Approved: the command runs once (the API consumes the Approval).
   */
  private async awaitDecision(t: TaskRec, h: Held): Promise<Outcome> {
    for (;;) {
      if (t.abort.signal.aborted) return { kind: 'error', message: 'cancelled' };
      const o = await h.retry(h.approval, APPROVAL_WAIT_SECONDS);
      if (o.kind !== 'held') return o;
      if (h.expiresAt && Date.parse(h.expiresAt) < Date.now())
        return { kind: 'error', message: `Approval ${h.approval} expired without a decision` };
    }
  }

  private own(owner: string, id: string): TaskRec {
    this.sweep();
    const t = this.tasks.get(id);
    if (!t || t.owner !== owner) throw new TaskError(`task ${id} not found`);
    return t;
  }

  get(owner: string, id: string): TaskView & { inputRequest?: Record<string, unknown> } {
    const t = this.own(owner, id);
    return { ...view(t), ...(t.status === 'input_required' && t.held ? { inputRequest: inputRequest(t.held) } : {}) };
  }

  /** tasks/result: waits (bounded) for a finished task, then its CallToolResult. */
  async result(owner: string, id: string, waitMs = 25_000): Promise<CallToolResult> {
    const t = this.own(owner, id);
    if (!TERMINAL.includes(t.status) && t.status !== 'input_required')
      await Promise.race([t.done, new Promise((r) => setTimeout(r, waitMs).unref())]);
    if (!t.result) throw new TaskError(`task ${id} is ${t.status}: no result yet`);
    return t.result;
  }

  list(owner: string): TaskView[] {
    this.sweep();
    return [...this.tasks.values()].filter((t) => t.owner === owner).map(view);
  }

  cancel(owner: string, id: string): TaskView {
    const t = this.own(owner, id);
    if (TERMINAL.includes(t.status)) throw new TaskError(`task ${id} already ${t.status}`);
    t.abort.abort();
    this.set(t, 'cancelled', 'cancelled by the client');
    return view(t);
  }

  /**
   * tasks/update: the answer to an input_required task. `answerer` carries the credential of the
   * principal answering (not the owner's): the API decides whether it may decide the Approval.
   */
  async update(
    id: string,
    input: { decision?: unknown; note?: unknown },
    answerer: Pick<ToolContext, 'api'>,
  ): Promise<TaskView> {
    this.sweep();
    const t = this.tasks.get(id);
    if (!t) throw new TaskError(`task ${id} not found`);
    if (t.status !== 'input_required' || !t.held) throw new TaskError(`task ${id} is ${t.status}, not input_required`);
    const d = input.decision;
    if (d !== 'approve' && d !== 'deny')
      throw new TaskError('invalid argument input.decision: must be "approve" or "deny"', { field: 'input.decision' });
    if (input.note !== undefined && (typeof input.note !== 'string' || input.note.length > 1024))
      throw new TaskError('invalid argument input.note: a string of at most 1024 characters', { field: 'input.note' });
    const h = t.held;
    const r = await decideApproval(answerer, h.namespace, h.session, h.approval, d, input.note as string | undefined);
    if (r.kind !== 'ok')
      throw new TaskError(
        `the approval was not decided: ${r.kind === 'error' ? r.message : ''}`,
        r.kind === 'error' ? r.status : undefined,
      );
    // The waiting request (awaitDecision) sees the decision and finishes the task: runs the
    // command once when approved, fails with the API's 403 when denied.
    if (t.status === 'input_required')
      this.set(t, 'working', `${d === 'approve' ? 'approved' : 'denied'}: Approval ${h.approval}`);
    return view(t);
  }
}

function view(t: TaskRec): TaskView {
  return {
    taskId: t.taskId,
    status: t.status,
    ...(t.statusMessage !== undefined ? { statusMessage: t.statusMessage } : {}),
    createdAt: t.createdAt,
    lastUpdatedAt: t.lastUpdatedAt,
    ttl: t.ttl,
    pollInterval: t.pollInterval,
  };
}

function inputRequest(h: Held): Record<string, unknown> {
  return {
    kind: 'approval',
    approval: h.approval,
    namespace: h.namespace,
    session: h.session,
    commandLine: h.commandLine,
    ...(h.rule ? { rule: h.rule } : {}),
    ...(h.expiresAt ? { expiresAt: h.expiresAt } : {}),
    message: h.message,
    answer: {
      method: 'tasks/update',
      params: { taskId: '<this task>', input: { decision: 'approve | deny', note: '<optional>' } },
    },
  };
}
