// AgentSession: one handle for an agent (spec/agent-sessions.md): a policy-checked, ledgered
// exec; jobs; files with resumable upload/download; file watch; git; checkpoint, restore, fork,
// promote; previews; the events stream (resumed with Last-Event-ID); approvals; tokens.
import type { FluxClient } from './client.js';
import { ConflictError } from './errors.js';
import type { Signal } from './files.js';
import {
  conditionOf,
  createObject,
  deleteObject,
  getObject,
  listObjects,
  patchObject,
  waitFor,
  type WaitOptions,
} from './objects.js';
import { execBody, type Command, type CreateOptions, type ExecOptions, type ExecResult } from './sandbox.js';
import { Jobs, SessionFiles } from './session-io.js';
import { followSse } from './sse.js';
import type { AgentSession as SessionObject, AgentSessionSpec, Approval } from './zz_generated.types.js';

export interface SessionExecOptions extends ExecOptions {
  /** The Approval a held command (ApprovalRequiredError) was approved as: runs it once. */
  approvalName?: string;
  /** Wait this long for a decision instead of answering 428 at once. */
  approvalWaitSeconds?: number;
}

/** One event of events(): a ledger entry (id = its number), a resync, or the session's end. */
export interface SessionEvent {
  type: 'ledger' | 'resync' | 'end' | string;
  id?: string;
  data: Record<string, unknown>;
}

/** One change of watch(): created, modified, deleted, renamed, or ready/resync/limit/end. */
export interface FileEvent {
  type: string;
  id?: string;
  data: Record<string, unknown>;
}

export interface Preview {
  id: string;
  port: number;
  url?: string;
  path?: string;
  expiresAt?: string;
  [field: string]: unknown;
}

type Json = Record<string, unknown>;

export class AgentSession {
  readonly jobs: Jobs;
  readonly files: SessionFiles;
  readonly git: Git;
  readonly previews: Previews;
  readonly approvals: Approvals;
  readonly rewind: Rewind;

  constructor(
    readonly client: FluxClient,
    public object: SessionObject,
  ) {
    const base = client.path('agentsessions', this.namespace, this.name);
    this.jobs = new Jobs(client, `${base}/jobs`);
    this.files = new SessionFiles(client, base);
    this.git = new Git(client, `${base}/git`);
    this.previews = new Previews(client, `${base}/previews`);
    this.approvals = new Approvals(client, this.namespace, this.name);
    this.rewind = new Rewind(client, `${base}/rewind`);
  }
  get name(): string {
    return this.object.metadata.name!;
  }
  get namespace(): string {
    return this.object.metadata.namespace ?? this.client.namespace;
  }
  private sub(s: string): string {
    return this.client.path('agentsessions', this.namespace, this.name, s);
  }

  /** Creates a session and (unless `wait: false`) resolves once it is Ready. */
  static async create(c: FluxClient, spec: AgentSessionSpec, o: CreateOptions = {}): Promise<AgentSession> {
    const obj = await createObject<SessionObject>(
      c,
      'agentsessions',
      o.namespace ?? c.namespace,
      {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: {
          ...(o.name ? { name: o.name } : { generateName: o.generateName ?? 'ags-' }),
          ...(o.labels ? { labels: o.labels } : {}),
        },
        spec,
      },
      o.signal,
    );
    const s = new AgentSession(c, obj);
    if (o.wait !== false) await s.waitReady({ ...o, initial: obj });
    return s;
  }

  static async get(c: FluxClient, name: string, o: Signal & { namespace?: string } = {}): Promise<AgentSession> {
    return new AgentSession(
      c,
      await getObject<SessionObject>(c, 'agentsessions', o.namespace ?? c.namespace, name, o.signal),
    );
  }

  static async list(
    c: FluxClient,
    o: Signal & { namespace?: string; labelSelector?: string } = {},
  ): Promise<AgentSession[]> {
    const l = await listObjects<SessionObject>(c, 'agentsessions', o.namespace ?? c.namespace, o);
    return l.items.map((x) => new AgentSession(c, x));
  }

  static delete(c: FluxClient, name: string, o: Signal & { namespace?: string } = {}): Promise<void> {
    return deleteObject(c, 'agentsessions', o.namespace ?? c.namespace, name, o.signal);
  }

  delete(o: Signal = {}): Promise<void> {
    return deleteObject(this.client, 'agentsessions', this.namespace, this.name, o.signal);
  }

  async refresh(o: Signal = {}): Promise<SessionObject> {
    return (this.object = await getObject<SessionObject>(
      this.client,
      'agentsessions',
      this.namespace,
      this.name,
      o.signal,
    ));
  }

  /** A merge patch of the session (e.g. {spec: {policy: ...}}). */
  async patch(patch: Json, o: Signal = {}): Promise<SessionObject> {
    return (this.object = await patchObject<SessionObject>(
      this.client,
      'agentsessions',
      this.namespace,
      this.name,
      patch,
      o,
    ));
  }

  /** Resolves once the session is Ready (a watch); rejects when it Failed or Expired. */
  async waitReady(o: WaitOptions & { initial?: SessionObject } = {}): Promise<SessionObject> {
    this.object = (await waitFor<SessionObject>(
      this.client,
      'agentsessions',
      this.namespace,
      this.name,
      (x) => {
        const p = x?.status?.phase;
        if (p === 'Failed' || p === 'Expired')
          throw new ConflictError({
            kind: 'Status',
            code: 409,
            reason: p,
            message: `session ${this.name} is ${p}: ${conditionOf(x, 'Stalled')?.message ?? ''}`,
          });
        return conditionOf(x, 'Ready')?.status === 'True';
      },
      o,
    ))!;
    return this.object;
  }

  /**
   * Runs a command through the session's policy, budget and ledger. A command the policy holds
   * for approval rejects with ApprovalRequiredError (its approvalName: retry with it once approved).
   */
  exec(cmd: Command, o: SessionExecOptions = {}): Promise<ExecResult> {
    return this.client.json<ExecResult>('POST', this.sub('exec'), {
      body: {
        ...execBody(cmd, o),
        ...(o.approvalName ? { approvalName: o.approvalName } : {}),
        ...(o.approvalWaitSeconds !== undefined ? { approvalWaitSeconds: o.approvalWaitSeconds } : {}),
      },
      headers: o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {},
      signal: o.signal,
    });
  }

  private post(sub: string, body: Json, o: Signal & { idempotencyKey?: string } = {}): Promise<Json> {
    return this.client.json<Json>('POST', this.sub(sub), {
      body,
      headers: o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {},
      signal: o.signal,
    });
  }

  checkpoint(o: Signal & { tag?: string; memory?: boolean; idempotencyKey?: string } = {}): Promise<Json> {
    return this.post('checkpoint', { ...(o.tag ? { tag: o.tag } : {}), ...(o.memory ? { memory: true } : {}) }, o);
  }

  restore(tag: string, o: Signal & { idempotencyKey?: string } = {}): Promise<Json> {
    return this.post('restore', { tag }, o);
  }

  fork(o: Signal & { count?: number; identity?: string; idempotencyKey?: string } = {}): Promise<Json> {
    return this.post('fork', { count: o.count ?? 1, ...(o.identity ? { identity: o.identity } : {}) }, o);
  }

  promote(
    o: Signal & {
      dryRun?: boolean;
      planId?: string;
      skipConflicts?: boolean;
      paths?: string[];
      idempotencyKey?: string;
    } = {},
  ): Promise<Json> {
    const { signal: _s, idempotencyKey: _k, ...body } = o;
    return this.post('promote', body, o);
  }

  /** Workspace changes since the baseline, checkpoints, children, usage. */
  artifacts(o: Signal = {}): Promise<Json> {
    return this.client.json<Json>('GET', this.sub('artifacts'), { signal: o.signal });
  }

  /** A page of the ledger after an entry number. */
  ledger(o: Signal & { afterEntry?: number; limit?: number } = {}): Promise<{ entries: Json[]; lastEntry: number }> {
    return this.client.json('GET', this.sub('ledger'), {
      query: { afterEntry: o.afterEntry, limit: o.limit },
      signal: o.signal,
    });
  }

  /** Mints a session token limited to `ops` (read, exec, files.read, ...); shown once. */
  async token(ops: string[], o: Signal & { ttlSeconds?: number; label?: string } = {}): Promise<string> {
    const r = await this.client.json<{ status: { token: string } }>('POST', this.sub('token'), {
      body: { ops, ...(o.ttlSeconds ? { ttlSeconds: o.ttlSeconds } : {}), ...(o.label ? { label: o.label } : {}) },
      signal: o.signal,
    });
    return r.status.token;
  }

  /**
   * The session's events (events/stream) as they happen, from after `since` (an entry number):
   * ledger entries, a resync, and the session's end (then the iterator ends). A dropped
   * connection is resumed with Last-Event-ID: every entry once, none missed.
   */
  async *events(o: Signal & { since?: number } = {}): AsyncGenerator<SessionEvent> {
    for await (const ev of followSse(this.client, this.sub('events/stream'), {
      lastEventId: o.since !== undefined ? String(o.since) : undefined,
      signal: o.signal,
      final: (e) => e.event === 'end',
    }))
      yield { type: ev.event, id: ev.id, data: JSON.parse(ev.data) as Json };
  }

  /** Changes below a directory of the sandbox (files/watch), resumed after a dropped connection. */
  async *watch(path: string, o: Signal & { recursive?: boolean; cursor?: string } = {}): AsyncGenerator<FileEvent> {
    for await (const ev of followSse(this.client, this.sub('files/watch'), {
      query: { path, recursive: o.recursive ? 'true' : 'false' },
      lastEventId: o.cursor,
      signal: o.signal,
      final: (e) => e.event === 'end',
    }))
      yield { type: ev.event, id: ev.id, data: JSON.parse(ev.data) as Json };
  }

  /** Network policy: merge-patches spec.policy.network (see providers/ai-sdk.ts for the mapping). */
  setNetwork(network: NonNullable<AgentSessionSpec['policy']>['network'], o: Signal = {}): Promise<SessionObject> {
    return this.patch({ spec: { policy: { network } } }, o);
  }
}

export class Git {
  constructor(
    private readonly c: FluxClient,
    private readonly base: string,
  ) {}
  status(o: Signal & { repo?: string } = {}): Promise<Json> {
    return this.c.json('GET', `${this.base}/status`, { query: { repo: o.repo }, signal: o.signal });
  }
  diff(o: Signal & { repo?: string; staged?: boolean; paths?: string[] } = {}): Promise<Json> {
    return this.c.json('GET', `${this.base}/diff`, {
      query: { repo: o.repo, staged: o.staged ? 'true' : undefined, path: o.paths },
      signal: o.signal,
    });
  }
  log(o: Signal & { repo?: string; n?: number } = {}): Promise<Json> {
    return this.c.json('GET', `${this.base}/log`, { query: { repo: o.repo, n: o.n }, signal: o.signal });
  }
  commit(message: string, o: Signal & { repo?: string; stagedOnly?: boolean } = {}): Promise<Json> {
    return this.c.json('POST', `${this.base}/commit`, {
      body: { message, ...(o.repo ? { repo: o.repo } : {}), ...(o.stagedOnly ? { stagedOnly: true } : {}) },
      signal: o.signal,
    });
  }
  branch(name: string, o: Signal & { repo?: string; switch?: boolean } = {}): Promise<Json> {
    return this.c.json('POST', `${this.base}/branch`, {
      body: { name, ...(o.repo ? { repo: o.repo } : {}), ...(o.switch === false ? { switch: false } : {}) },
      signal: o.signal,
    });
  }
  /** push, pull or fetch: held for approval (ApprovalRequiredError) until approved; retry with approvalName. */
  remote(
    verb: 'push' | 'pull' | 'fetch',
    o: Signal & { remote?: string; ref?: string; repo?: string; approvalName?: string; timeoutSeconds?: number } = {},
  ): Promise<Json> {
    const { signal, ...body } = o;
    return this.c.json('POST', `${this.base}/${verb}`, { body, signal });
  }
}

/** Rewind points (spec.rewind): the list, undo, pin/unpin, config, branch, bisect. */
export class Rewind {
  constructor(
    private readonly c: FluxClient,
    private readonly base: string,
  ) {}
  /** The points, oldest first, and the ring's config and storage. */
  list(o: Signal = {}): Promise<Json & { points: Json[] }> {
    return this.c.json('GET', this.base, { signal: o.signal });
  }
  private act(action: string, body: Json, signal?: AbortSignal): Promise<Json> {
    return this.c.json('POST', `${this.base}/${action}`, { body, signal });
  }
  /** Restores the workspace `steps` points back, or to the point `to`. */
  undo(o: Signal & ({ steps: number } | { to: string })): Promise<Json> {
    const { signal, ...body } = o;
    return this.act('undo', body, signal);
  }
  pin(tag: string, o: Signal = {}): Promise<Json> {
    return this.act('pin', { tag }, o.signal);
  }
  unpin(tag: string, o: Signal = {}): Promise<Json> {
    return this.act('unpin', { tag }, o.signal);
  }
  /** A merge patch of spec.rewind ({enabled, maxPoints, memory, triggers}). */
  config(patch: Json, o: Signal = {}): Promise<Json> {
    return this.act('config', patch, o.signal);
  }
  /** New sessions started from a point (fork's rules). */
  branch(tag: string, o: Signal & { count?: number; identity?: string } = {}): Promise<Json> {
    const { signal, ...rest } = o;
    return this.act('branch', { tag, ...rest }, signal);
  }
  /** The first step whose point fails `test` (run in a forked copy). */
  bisect(test: Command, o: Signal & { good?: string; bad?: string; timeoutSeconds?: number } = {}): Promise<Json> {
    const { signal, ...rest } = o;
    return this.act('bisect', { test: typeof test === 'string' ? test : [...test], ...rest }, signal);
  }
}

export class Previews {
  constructor(
    private readonly c: FluxClient,
    private readonly base: string,
  ) {}
  /**
   * An expiring URL on serve that reaches `port` in the sandbox (the URL is the credential: the
   * previews list gives it again only to a caller allowed to create previews).
   */
  create(port: number, o: Signal & { ttlSeconds?: number } = {}): Promise<Preview> {
    return this.c.json('POST', this.base, {
      body: { port, ...(o.ttlSeconds ? { ttlSeconds: o.ttlSeconds } : {}) },
      signal: o.signal,
    });
  }
  async list(o: Signal = {}): Promise<Preview[]> {
    return (await this.c.json<{ items?: Preview[] }>('GET', this.base, { signal: o.signal })).items ?? [];
  }
  async revoke(id: string, o: Signal = {}): Promise<void> {
    await this.c.call('DELETE', `${this.base}/${encodeURIComponent(id)}`, { signal: o.signal });
  }
}

export class Approvals {
  constructor(
    private readonly c: FluxClient,
    private readonly ns: string,
    private readonly session: string,
  ) {}
  /** The session's Approvals (held commands). */
  async list(o: Signal = {}): Promise<Approval[]> {
    return (
      await listObjects<Approval>(this.c, 'approvals', this.ns, {
        fieldSelector: `spec.sessionRef.name=${this.session}`,
        signal: o.signal,
      })
    ).items;
  }
  private decide(name: string, type: 'Approved' | 'Denied', o: Signal & { note?: string }): Promise<Approval> {
    return patchObject<Approval>(
      this.c,
      'approvals',
      this.ns,
      name,
      {
        spec: { sessionRef: { name: this.session } },
        status: { conditions: [{ type, status: 'True', ...(o.note ? { message: o.note } : {}) }] },
      },
      { subresource: 'approval', signal: o.signal },
    );
  }
  /** Approves a held command (approvals/approval: an approver's right, never a session token's). */
  approve(name: string, o: Signal & { note?: string } = {}): Promise<Approval> {
    return this.decide(name, 'Approved', o);
  }
  deny(name: string, o: Signal & { note?: string } = {}): Promise<Approval> {
    return this.decide(name, 'Denied', o);
  }
  /** Waits (a watch) until an Approval of the session is pending and returns it. */
  async waitPending(o: WaitOptions = {}): Promise<Approval> {
    for await (const ev of this.c.watch<Approval>('approvals', this.ns, {
      fieldSelector: `spec.sessionRef.name=${this.session}`,
      signal: o.signal,
    }))
      if ((ev.type === 'ADDED' || ev.type === 'MODIFIED') && !ev.object.status?.conditions?.length) return ev.object;
    throw new Error('the approvals watch ended');
  }
}
