// Sandbox and Changeset: create/get/list/delete, exec, files, and speculation (a Changeset:
// diff, approve, reject, apply, wait). Waiting is a watch (objects.ts waitFor), never a poll.
import { randomBytes } from 'node:crypto';
import type { FluxClient } from './client.js';
import { ConflictError } from './errors.js';
import { Files, type Signal } from './files.js';
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
import type { Changeset as ChangesetObject, Sandbox as SandboxObject, SandboxSpec } from './zz_generated.types.js';

export interface ExecOptions extends Signal {
  stdin?: string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutSeconds?: number;
  /** Sent as Idempotency-Key: a retry with the same key answers the first result and runs nothing. */
  idempotencyKey?: string;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  durationMs?: number;
  truncated?: boolean;
  timedOut?: boolean;
  signal?: string;
  oomKilled?: boolean;
  [field: string]: unknown;
}

/** An argv list, or one string run under `sh -c`. */
export type Command = string[] | string;
export const argv = (cmd: Command): string[] => (typeof cmd === 'string' ? ['sh', '-c', cmd] : cmd);

/** The JSON body of an exec (sandboxes/exec and agentsessions/exec). */
export function execBody(cmd: Command, o: ExecOptions): Record<string, unknown> {
  return {
    command: argv(cmd),
    ...(o.stdin !== undefined ? { stdin: o.stdin } : {}),
    ...(o.env ? { env: o.env } : {}),
    ...(o.cwd ? { cwd: o.cwd } : {}),
    ...(o.timeoutSeconds !== undefined ? { timeoutSeconds: o.timeoutSeconds } : {}),
  };
}

export interface CreateOptions extends WaitOptions {
  name?: string;
  /** metadata.generateName when no name is given (default "sbx-"). */
  generateName?: string;
  namespace?: string;
  labels?: Record<string, string>;
  /** Resolve only once Ready (default true). */
  wait?: boolean;
}

const ready = (o: { status?: { conditions?: { type: string; status: string }[] } } | undefined) =>
  conditionOf(o, 'Ready')?.status === 'True';

export class Sandbox {
  readonly files: Files;
  constructor(
    readonly client: FluxClient,
    public object: SandboxObject,
  ) {
    this.files = new Files(client, client.path('sandboxes', this.namespace, this.name));
  }
  get name(): string {
    return this.object.metadata.name!;
  }
  get namespace(): string {
    return this.object.metadata.namespace ?? this.client.namespace;
  }

  /** Creates a Sandbox and (unless `wait: false`) resolves once it is Ready. */
  static async create(c: FluxClient, spec: SandboxSpec = {}, o: CreateOptions = {}): Promise<Sandbox> {
    const ns = o.namespace ?? c.namespace;
    const obj = await createObject<SandboxObject>(
      c,
      'sandboxes',
      ns,
      {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Sandbox',
        metadata: {
          ...(o.name ? { name: o.name } : { generateName: o.generateName ?? 'sbx-' }),
          ...(o.labels ? { labels: o.labels } : {}),
        },
        spec,
      },
      o.signal,
    );
    const s = new Sandbox(c, obj);
    if (o.wait !== false) await s.waitReady({ ...o, initial: obj });
    return s;
  }

  static async get(c: FluxClient, name: string, o: Signal & { namespace?: string } = {}): Promise<Sandbox> {
    return new Sandbox(c, await getObject<SandboxObject>(c, 'sandboxes', o.namespace ?? c.namespace, name, o.signal));
  }

  static async list(
    c: FluxClient,
    o: Signal & { namespace?: string; labelSelector?: string } = {},
  ): Promise<Sandbox[]> {
    const l = await listObjects<SandboxObject>(c, 'sandboxes', o.namespace ?? c.namespace, o);
    return l.items.map((x) => new Sandbox(c, x));
  }

  /** Deletes a Sandbox by name (a missing one is not an error). */
  static delete(c: FluxClient, name: string, o: Signal & { namespace?: string } = {}): Promise<void> {
    return deleteObject(c, 'sandboxes', o.namespace ?? c.namespace, name, o.signal);
  }

  delete(o: Signal = {}): Promise<void> {
    return deleteObject(this.client, 'sandboxes', this.namespace, this.name, o.signal);
  }

  async refresh(o: Signal = {}): Promise<SandboxObject> {
    return (this.object = await getObject<SandboxObject>(
      this.client,
      'sandboxes',
      this.namespace,
      this.name,
      o.signal,
    ));
  }

  /** Resolves once the Sandbox is Ready (a watch); rejects when it Failed. */
  async waitReady(o: WaitOptions & { initial?: SandboxObject } = {}): Promise<SandboxObject> {
    this.object = (await waitFor<SandboxObject>(
      this.client,
      'sandboxes',
      this.namespace,
      this.name,
      (x) => {
        if (x?.status?.phase === 'Failed')
          throw new ConflictError({
            kind: 'Status',
            code: 409,
            reason: 'Failed',
            message: `sandbox ${this.name} failed: ${x.status.message ?? ''}`,
          });
        return ready(x);
      },
      o,
    ))!;
    return this.object;
  }

  /** Runs a command to its end: exit code and output (1 MiB per stream at most). */
  exec(cmd: Command, o: ExecOptions = {}): Promise<ExecResult> {
    return this.client.json<ExecResult>('POST', this.client.path('sandboxes', this.namespace, this.name, 'exec'), {
      body: execBody(cmd, o),
      headers: o.idempotencyKey ? { 'Idempotency-Key': o.idempotencyKey } : {},
      signal: o.signal,
    });
  }

  /**
   * Speculates: runs `cmd` in an isolated copy of the sandbox as a Changeset. Resolves once
   * created; `await cs.wait()` for the speculation's result, then diff/approve/apply.
   */
  async speculate(
    cmd: Command,
    o: Signal & { name?: string; paths?: string[]; timeoutSeconds?: number; ttlSeconds?: number } = {},
  ): Promise<Changeset> {
    const obj = await createObject<ChangesetObject>(
      this.client,
      'changesets',
      this.namespace,
      {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'Changeset',
        metadata: { name: o.name ?? `${this.name}-${randomBytes(4).toString('hex')}`.slice(-63).replace(/^-+/, '') },
        spec: {
          sandboxRef: { name: this.name },
          command: argv(cmd),
          ...(o.paths ? { paths: o.paths } : {}),
          ...(o.timeoutSeconds !== undefined ? { timeoutSeconds: o.timeoutSeconds } : {}),
          ...(o.ttlSeconds !== undefined ? { ttlSeconds: o.ttlSeconds } : {}),
        },
      },
      o.signal,
    );
    return new Changeset(this.client, obj);
  }
}

/** Phases after which a changeset changes no more. */
export const FINAL_PHASES = ['Applied', 'Rejected', 'Expired', 'Failed'];

/** Thrown by Changeset.apply when the changeset was not applied (conflict, not applicable, expired...). */
export class ApplyError extends Error {
  constructor(
    message: string,
    readonly changeset: ChangesetObject,
    /** Paths that changed in the sandbox since the speculation (first ten). */
    readonly conflicts: string[] = [],
  ) {
    super(message);
    this.name = 'ApplyError';
  }
}

export class Changeset {
  constructor(
    readonly client: FluxClient,
    public object: ChangesetObject,
  ) {}
  get name(): string {
    return this.object.metadata.name!;
  }
  get namespace(): string {
    return this.object.metadata.namespace ?? this.client.namespace;
  }
  get phase(): string | undefined {
    return this.object.status?.phase;
  }

  static async get(c: FluxClient, name: string, o: Signal & { namespace?: string } = {}): Promise<Changeset> {
    return new Changeset(
      c,
      await getObject<ChangesetObject>(c, 'changesets', o.namespace ?? c.namespace, name, o.signal),
    );
  }

  async refresh(o: Signal = {}): Promise<ChangesetObject> {
    return (this.object = await getObject<ChangesetObject>(
      this.client,
      'changesets',
      this.namespace,
      this.name,
      o.signal,
    ));
  }

  /**
   * Waits (a watch) until `until` holds; by default until the speculation finished (the phase
   * left Running: Pending for review, or Failed/Expired).
   */
  async wait(o: WaitOptions & { until?: (cs: ChangesetObject) => boolean } = {}): Promise<ChangesetObject> {
    const until = o.until ?? ((x: ChangesetObject) => !!x.status?.phase && x.status.phase !== 'Running');
    this.object = (await waitFor<ChangesetObject>(
      this.client,
      'changesets',
      this.namespace,
      this.name,
      (x) => x !== undefined && until(x),
      o,
    ))!;
    return this.object;
  }

  /** The unified diff of the staged change. */
  async diff(o: Signal = {}): Promise<string> {
    const a = await this.client.call('GET', this.client.path('changesets', this.namespace, this.name, 'diff'), {
      headers: { Accept: 'text/plain, */*' },
      signal: o.signal,
    });
    return a.body.toString('utf8');
  }

  private async decide(spec: Record<string, unknown>, signal?: AbortSignal): Promise<ChangesetObject> {
    return (this.object = await patchObject<ChangesetObject>(
      this.client,
      'changesets',
      this.namespace,
      this.name,
      { spec },
      { subresource: 'approval', signal },
    ));
  }

  /** spec.decision: Approve (through changesets/approval: needs the approver's right). */
  approve(o: Signal = {}): Promise<ChangesetObject> {
    return this.decide({ decision: 'Approve' }, o.signal);
  }

  /** spec.decision: Reject (also clears a refused apply). */
  reject(o: Signal = {}): Promise<ChangesetObject> {
    return this.decide({ decision: 'Reject', apply: null }, o.signal);
  }

  /**
   * Applies an approved changeset and waits for the outcome: resolves when Applied; rejects
   * with ApplyError (conflicts listed) when the sandbox drifted, it is not applicable, or it
   * ended otherwise.
   */
  async apply(o: WaitOptions = {}): Promise<ChangesetObject> {
    const patched = await this.decide({ apply: true }, o.signal);
    const gen = patched.metadata.generation ?? 1;
    const out = await this.wait({
      ...o,
      until: (x) => {
        if (FINAL_PHASES.includes(x.status?.phase ?? '')) return true;
        // The controller has seen spec.apply (the patch bumped the generation) and refused it.
        if ((x.status?.observedGeneration ?? 0) < gen) return false;
        return conditionOf(x, 'Conflict')?.status === 'True' || conditionOf(x, 'NotApplicable')?.status === 'True';
      },
    });
    if (out.status?.phase === 'Applied') return out;
    const s = out.status ?? {};
    if (conditionOf(out, 'Conflict')?.status === 'True')
      throw new ApplyError(
        `changeset ${this.name} not applied: the sandbox changed since the speculation`,
        out,
        s.conflicts ?? [],
      );
    throw new ApplyError(
      `changeset ${this.name} not applied: ${s.phase ?? ''} ${conditionOf(out, 'NotApplicable')?.message ?? s.message ?? ''}`.trim(),
      out,
    );
  }

  delete(o: Signal = {}): Promise<void> {
    return deleteObject(this.client, 'changesets', this.namespace, this.name, o.signal);
  }
}
