// The session_* tools (spec/agent-sessions.md's MCP list) over the AgentSession routes
// (controllers/agentsession/README.md "Routes of the document -> this API"). Each is one REST call
// with the caller's credential; a session token reaches only its own session and ops.
import {
  DESTRUCTIVE,
  IDEMPOTENT_WRITE,
  READ,
  S,
  WRITE,
  nsOf,
  obj,
  outcomeOf,
  resourcePath,
  terminalText,
  type Held,
  type Outcome,
  type ToolContext,
  type ToolDef,
} from './tool.js';
import { jsonOf, type ApiAnswer } from './api.js';

/** The largest file session_file_write takes (the API's request body limit, as fluxctl agent put). */
export const MAX_FILE_WRITE_BYTES = 1_500_000;
/** The most session_file_read returns in one call (files/range caps at 4 MiB; a tool answer stays small). */
export const MAX_FILE_READ_BYTES = 1024 * 1024;

const sess = (ctx: ToolContext, a: Record<string, unknown>, sub?: string) =>
  resourcePath(nsOf(ctx, a), 'agentsessions', a.session as string, sub);

function execValue(v: Record<string, unknown>): unknown {
  const out: Record<string, unknown> = { ...v };
  if (typeof v.stdout === 'string') out.stdout = terminalText(v.stdout);
  if (typeof v.stderr === 'string') out.stderr = terminalText(v.stderr);
  return out;
}

/** A 428 ApprovalRequired as a Held the Task machinery can carry (input_required). */
function heldOf(
  ctx: ToolContext,
  a: Record<string, unknown>,
  ans: ApiAnswer,
  retry: (approvalName: string, waitSeconds: number) => Promise<Outcome>,
): Outcome {
  const j = jsonOf(ans);
  const details = (j?.details ?? {}) as { name?: string; causes?: Array<{ reason?: string; message?: string }> };
  if (ans.status !== 428 || !details.name) return outcomeOf(ans);
  const cause = (r: string) => details.causes?.find((c) => c.reason === r)?.message;
  const cmd = a.command;
  const held: Held = {
    approval: details.name,
    namespace: nsOf(ctx, a),
    session: a.session as string,
    commandLine: typeof cmd === 'string' ? cmd : Array.isArray(cmd) ? cmd.join(' ') : '',
    rule: cause('MatchedRule') ?? cause('Matched'),
    expiresAt: cause('ExpiresAt'),
    message: typeof j?.message === 'string' ? j.message : 'held for approval',
    retry,
  };
  return { kind: 'held', held };
}

function execBody(a: Record<string, unknown>): Record<string, unknown> {
  return {
    command: a.command,
    ...(a.timeout_seconds !== undefined ? { timeoutSeconds: a.timeout_seconds } : {}),
    ...(a.cwd !== undefined ? { cwd: a.cwd } : {}),
    ...(a.env !== undefined ? { env: a.env } : {}),
    ...(a.stdin !== undefined ? { stdin: a.stdin } : {}),
  };
}

const exec: ToolDef = {
  name: 'session_exec',
  title: 'Run a command in a session',
  description:
    'Runs a command in the AgentSession (policy-checked, budgeted, ledgered). A command the policy holds for approval (process.ask) answers with the Approval; as a Task it waits in input_required until an approver answers through tasks/update. Output is bounded and control characters are shown visibly.',
  input: obj(
    {
      namespace: S.namespace,
      session: S.session,
      command: S.command,
      timeout_seconds: S.timeoutSeconds,
      cwd: S.path,
      env: { type: 'object', additionalProperties: { type: 'string', maxLength: 65536 }, maxProperties: 256 },
      stdin: { type: 'string', maxLength: 49152 },
    },
    ['session', 'command'],
  ),
  annotations: WRITE,
  task: 'optional',
  route: 'POST agentsessions/NAME/exec',
  async run(ctx, a) {
    const run = async (approvalName?: string, waitSeconds?: number): Promise<Outcome> => {
      const ans = await ctx.api.call('POST', sess(ctx, a, 'exec'), {
        body: {
          ...execBody(a),
          ...(approvalName ? { approvalName } : {}),
          ...(waitSeconds ? { approvalWaitSeconds: waitSeconds } : {}),
        },
      });
      if (ans.status === 428) return heldOf(ctx, a, ans, (n, w) => run(n, w));
      return outcomeOf(ans, execValue);
    };
    return run();
  },
};

const simple = (
  def: Omit<ToolDef, 'run' | 'route'> & {
    method: string;
    sub?: string;
    query?: (a: Record<string, unknown>) => Record<string, string | undefined>;
    body?: (a: Record<string, unknown>) => object | Buffer | undefined;
    shape?: (v: Record<string, unknown>) => unknown;
  },
): ToolDef => ({
  ...def,
  route: `${def.method} agentsessions/NAME${def.sub ? `/${def.sub}` : ''}`,
  async run(ctx, a) {
    const ans = await ctx.api.call(def.method, sess(ctx, a, def.sub), {
      query: def.query?.(a),
      body: def.body?.(a),
    });
    return outcomeOf(ans, def.shape);
  },
});

const str = (v: unknown) => (v === undefined ? undefined : String(v));

export const sessionTools: ToolDef[] = [
  {
    name: 'session_create',
    title: 'Create an agent session',
    description:
      'Creates an AgentSession (a sandbox with a workspace, policy, budget and ledger). Poll session_get until status.phase is Running.',
    input: obj(
      {
        namespace: S.namespace,
        name: { type: 'string', minLength: 1, maxLength: 63, pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$' },
        agent: { type: 'string', minLength: 1, maxLength: 253 },
        policy_preset: { type: 'string', enum: ['offline', 'developer-safe', 'open'] },
        ttl_seconds: { type: 'integer', minimum: 60, maximum: 604800 },
      },
      ['agent'],
    ),
    annotations: WRITE,
    task: 'forbidden',
    route: 'POST agentsessions',
    async run(ctx, a) {
      const body = {
        apiVersion: 'fluxvm.dev/v1alpha1',
        kind: 'AgentSession',
        metadata: a.name ? { name: a.name } : { generateName: 'session-' },
        spec: {
          agent: a.agent,
          ...(a.policy_preset ? { policy: { preset: a.policy_preset } } : {}),
          ...(a.ttl_seconds ? { ttlSeconds: a.ttl_seconds } : {}),
        },
      };
      return outcomeOf(await ctx.api.call('POST', resourcePath(nsOf(ctx, a), 'agentsessions'), { body }), (v) => ({
        name: (v.metadata as { name?: string })?.name,
        phase: (v.status as { phase?: string } | undefined)?.phase,
      }));
    },
  },
  simple({
    name: 'session_get',
    title: 'Get a session',
    description: "A session's spec and status (phase, conditions, capabilities, usage).",
    input: obj({ namespace: S.namespace, session: S.session }, ['session']),
    annotations: READ,
    task: 'forbidden',
    method: 'GET',
    shape: (v) => ({ metadata: { name: (v.metadata as { name?: string }).name }, spec: v.spec, status: v.status }),
  }),
  simple({
    name: 'session_delete',
    title: 'Delete a session',
    description: 'Deletes the AgentSession and its sandbox.',
    input: obj({ namespace: S.namespace, session: S.session }, ['session']),
    annotations: { ...DESTRUCTIVE, idempotentHint: true },
    task: 'forbidden',
    method: 'DELETE',
    shape: () => ({ deleted: true }),
  }),
  exec,
  simple({
    name: 'session_files',
    title: 'List a directory',
    description: 'Lists a directory of the session’s sandbox (names, types, sizes, modes).',
    input: obj({ namespace: S.namespace, session: S.session, path: S.path }, ['session', 'path']),
    annotations: READ,
    task: 'forbidden',
    method: 'GET',
    sub: 'files',
    query: (a) => ({ path: str(a.path) }),
  }),
  {
    name: 'session_file_read',
    title: 'Read a file',
    description: `Reads up to ${MAX_FILE_READ_BYTES} bytes of a file from offset (files/range); text is escaped for a terminal, binary comes as base64.`,
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        path: S.path,
        offset: { type: 'integer', minimum: 0 },
        length: { type: 'integer', minimum: 1, maximum: MAX_FILE_READ_BYTES },
      },
      ['session', 'path'],
    ),
    annotations: READ,
    task: 'forbidden',
    route: 'GET agentsessions/NAME/files/range',
    async run(ctx, a) {
      const ans = await ctx.api.call('GET', sess(ctx, a, 'files/range'), {
        query: { path: str(a.path), offset: str(a.offset ?? 0), length: str(a.length ?? MAX_FILE_READ_BYTES) },
      });
      if (ans.status < 200 || ans.status >= 300) return outcomeOf(ans);
      const text = new TextDecoder('utf-8', { fatal: true });
      let content: Record<string, unknown>;
      try {
        content = { text: terminalText(text.decode(ans.body), MAX_FILE_READ_BYTES) };
      } catch {
        content = { base64: ans.body.toString('base64') };
      }
      return {
        kind: 'ok',
        value: {
          path: a.path,
          size: Number(ans.headers['x-file-size']),
          bytes: ans.body.length,
          eof: ans.headers['x-file-eof'] === 'true',
          ...content,
        },
      };
    },
  },
  {
    name: 'session_file_write',
    title: 'Write a file',
    description: `Writes a file (parents created) from text or base64, at most ${MAX_FILE_WRITE_BYTES} bytes; larger files go through the resumable uploads (fluxctl agent upload).`,
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        path: S.path,
        content: { type: 'string', maxLength: MAX_FILE_WRITE_BYTES },
        content_base64: {
          type: 'string',
          maxLength: Math.ceil(MAX_FILE_WRITE_BYTES / 3) * 4,
          pattern: '^[A-Za-z0-9+/]*={0,2}$',
        },
        mode: { type: 'string', pattern: '^0?[0-7]{3,4}$' },
      },
      ['session', 'path'],
    ),
    annotations: IDEMPOTENT_WRITE,
    task: 'forbidden',
    route: 'PUT agentsessions/NAME/files',
    async run(ctx, a) {
      if ((a.content === undefined) === (a.content_base64 === undefined))
        return { kind: 'error', message: 'invalid argument content: give exactly one of content and content_base64' };
      const data =
        a.content !== undefined ? Buffer.from(a.content as string) : Buffer.from(a.content_base64 as string, 'base64');
      if (data.length > MAX_FILE_WRITE_BYTES)
        return {
          kind: 'error',
          message: `invalid argument content: ${data.length} bytes, the limit is ${MAX_FILE_WRITE_BYTES}`,
        };
      return outcomeOf(
        await ctx.api.call('PUT', sess(ctx, a, 'files'), {
          query: { path: str(a.path), mode: str(a.mode) },
          body: data,
        }),
      );
    },
  },
  simple({
    name: 'session_file_delete',
    title: 'Delete a file',
    description: 'Removes a file (or a directory with recursive).',
    input: obj({ namespace: S.namespace, session: S.session, path: S.path, recursive: { type: 'boolean' } }, [
      'session',
      'path',
    ]),
    annotations: DESTRUCTIVE,
    task: 'forbidden',
    method: 'DELETE',
    sub: 'files',
    query: (a) => ({ path: str(a.path), recursive: a.recursive ? 'true' : undefined }),
  }),
  simple({
    name: 'session_job_start',
    title: 'Start a background job',
    description:
      'Starts a supervised background job (output kept up to max_output_bytes); read it with session_job_read.',
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        command: S.command,
        stdin: { type: 'boolean', description: 'keep stdin open for session_job_stdin' },
        timeout_seconds: { type: 'integer', minimum: 1, maximum: 86400 },
        max_output_bytes: { type: 'integer', minimum: 0, maximum: 268435456 },
        cwd: S.path,
      },
      ['session', 'command'],
    ),
    annotations: WRITE,
    task: 'forbidden',
    method: 'POST',
    sub: 'jobs',
    body: (a) => ({
      command: a.command,
      ...(a.stdin !== undefined ? { stdin: a.stdin } : {}),
      ...(a.timeout_seconds !== undefined ? { timeoutSeconds: a.timeout_seconds } : {}),
      ...(a.max_output_bytes !== undefined ? { maxOutputBytes: a.max_output_bytes } : {}),
      ...(a.cwd !== undefined ? { cwd: a.cwd } : {}),
    }),
  }),
  {
    name: 'session_job_read',
    title: 'Read a job',
    description: "A job's state, exit code and output from an offset (long-polls up to wait_ms).",
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        job: { type: 'string', minLength: 1, maxLength: 64 },
        offset: { type: 'integer', minimum: 0 },
        stderr_offset: { type: 'integer', minimum: 0 },
        wait_ms: { type: 'integer', minimum: 0, maximum: 25000 },
        max_bytes: { type: 'integer', minimum: 1, maximum: 65536 },
      },
      ['session', 'job'],
    ),
    annotations: READ,
    task: 'forbidden',
    route: 'GET agentsessions/NAME/jobs/JOB',
    async run(ctx, a) {
      const ans = await ctx.api.call('GET', sess(ctx, a, `jobs/${encodeURIComponent(a.job as string)}`), {
        query: {
          offset: str(a.offset),
          stderrOffset: str(a.stderr_offset),
          waitMs: str(a.wait_ms),
          maxBytes: str(a.max_bytes ?? 65536),
        },
      });
      return outcomeOf(ans, (v) => {
        const o: Record<string, unknown> = { ...v };
        delete o.outputBase64;
        delete o.stderrBase64;
        if (typeof v.output === 'string') o.output = terminalText(v.output);
        else if (typeof v.outputBase64 === 'string') o.outputBase64 = v.outputBase64;
        if (typeof v.stderr === 'string') o.stderr = terminalText(v.stderr);
        else if (typeof v.stderrBase64 === 'string') o.stderrBase64 = v.stderrBase64;
        return o;
      });
    },
  },
  {
    name: 'session_job_stdin',
    title: 'Write to a job',
    description: "Writes text to a job's stdin (at most 48 KiB), optionally closing it.",
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        job: { type: 'string', minLength: 1, maxLength: 64 },
        text: { type: 'string', maxLength: 49152 },
        close: { type: 'boolean' },
      },
      ['session', 'job'],
    ),
    annotations: WRITE,
    task: 'forbidden',
    route: 'POST agentsessions/NAME/jobs/JOB/stdin',
    async run(ctx, a) {
      const path = sess(ctx, a, `jobs/${encodeURIComponent(a.job as string)}/stdin`);
      return outcomeOf(await ctx.api.call('POST', path, { body: { text: a.text ?? '', close: a.close === true } }));
    },
  },
  simple({
    name: 'session_jobs',
    title: 'List jobs',
    description: 'Every job the session started, with its state.',
    input: obj({ namespace: S.namespace, session: S.session }, ['session']),
    annotations: READ,
    task: 'forbidden',
    method: 'GET',
    sub: 'jobs',
  }),
  {
    name: 'session_job_kill',
    title: 'Kill a job',
    description: "Signals a job's whole process tree (default TERM).",
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        job: { type: 'string', minLength: 1, maxLength: 64 },
        signal: { type: 'string', enum: ['TERM', 'KILL', 'INT', 'HUP', 'QUIT', 'USR1', 'USR2', 'STOP', 'CONT'] },
      },
      ['session', 'job'],
    ),
    annotations: DESTRUCTIVE,
    task: 'forbidden',
    route: 'DELETE agentsessions/NAME/jobs/JOB',
    async run(ctx, a) {
      const path = sess(ctx, a, `jobs/${encodeURIComponent(a.job as string)}`);
      return outcomeOf(await ctx.api.call('DELETE', path, { query: { signal: str(a.signal) } }));
    },
  },
  {
    name: 'session_git',
    title: 'Git in the workspace',
    description:
      'git status|diff|log|commit|branch in the session workspace (repo: a directory in it). commit and branch write; push/pull/fetch are held for approval and are not offered here.',
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        op: { type: 'string', enum: ['status', 'diff', 'log', 'commit', 'branch'] },
        repo: S.path,
        message: { type: 'string', minLength: 1, maxLength: 65536 },
        name: { type: 'string', minLength: 1, maxLength: 255 },
        staged: { type: 'boolean' },
        n: { type: 'integer', minimum: 1, maximum: 1000 },
      },
      ['session', 'op'],
    ),
    annotations: WRITE,
    task: 'forbidden',
    route: 'GET|POST agentsessions/NAME/git/VERB',
    async run(ctx, a) {
      const op = a.op as string;
      const path = sess(ctx, a, `git/${op}`);
      if (op === 'commit' || op === 'branch') {
        const body =
          op === 'commit'
            ? { message: a.message, ...(a.repo ? { repo: a.repo } : {}) }
            : { name: a.name, ...(a.repo ? { repo: a.repo } : {}) };
        if (op === 'commit' && a.message === undefined)
          return { kind: 'error', message: 'invalid argument message: commit needs a message' };
        if (op === 'branch' && a.name === undefined)
          return { kind: 'error', message: 'invalid argument name: branch needs a name' };
        return outcomeOf(await ctx.api.call('POST', path, { body }));
      }
      const ans = await ctx.api.call('GET', path, {
        query: { repo: str(a.repo), staged: a.staged ? 'true' : undefined, n: str(a.n) },
      });
      return outcomeOf(ans, (v) => (typeof v.diff === 'string' ? { ...v, diff: terminalText(v.diff) } : v));
    },
  },
  ...lifecycleTools(),
];

function lifecycleTools(): ToolDef[] {
  return [
    simple({
      name: 'session_checkpoint',
      title: 'Checkpoint a session',
      description: 'Takes a checkpoint (tag, memory when the backend can); long work: ask for a Task.',
      input: obj(
        {
          namespace: S.namespace,
          session: S.session,
          tag: { type: 'string', minLength: 1, maxLength: 63 },
          memory: { type: 'boolean' },
        },
        ['session'],
      ),
      annotations: WRITE,
      task: 'optional',
      method: 'POST',
      sub: 'checkpoint',
      body: (a) => ({ ...(a.tag ? { tag: a.tag } : {}), ...(a.memory !== undefined ? { memory: a.memory } : {}) }),
    }),
    simple({
      name: 'session_restore',
      title: 'Restore a checkpoint',
      description: 'Puts the session back to a checkpoint (the workspace and, with memory, the processes).',
      input: obj({ namespace: S.namespace, session: S.session, tag: { type: 'string', minLength: 1, maxLength: 63 } }, [
        'session',
        'tag',
      ]),
      annotations: { ...DESTRUCTIVE, idempotentHint: true },
      task: 'optional',
      method: 'POST',
      sub: 'restore',
      body: (a) => ({ tag: a.tag }),
    }),
    simple({
      name: 'session_fork',
      title: 'Fork a session',
      description: 'Starts count child sessions from the session as it is now; long work: ask for a Task.',
      input: obj({ namespace: S.namespace, session: S.session, count: { type: 'integer', minimum: 1, maximum: 32 } }, [
        'session',
      ]),
      annotations: WRITE,
      task: 'optional',
      method: 'POST',
      sub: 'fork',
      body: (a) => ({ count: a.count ?? 1 }),
    }),
    simple({
      name: 'session_promote',
      title: 'Promote a child',
      description: "Carries a fork child's workspace changes into its parent: dry_run first, then plan_id to apply.",
      input: obj(
        {
          namespace: S.namespace,
          session: S.session,
          dry_run: { type: 'boolean' },
          plan_id: { type: 'string', minLength: 1, maxLength: 128 },
          skip_conflicts: { type: 'boolean' },
        },
        ['session'],
      ),
      annotations: DESTRUCTIVE,
      task: 'optional',
      method: 'POST',
      sub: 'promote',
      body: (a) => ({
        ...(a.dry_run !== undefined ? { dryRun: a.dry_run } : {}),
        ...(a.plan_id ? { planId: a.plan_id } : {}),
        ...(a.skip_conflicts !== undefined ? { skipConflicts: a.skip_conflicts } : {}),
      }),
    }),
    simple({
      name: 'session_expose',
      title: 'Expose a port',
      description: 'Mints an expiring preview URL for a TCP port of the session (the URL is the credential).',
      input: obj(
        {
          namespace: S.namespace,
          session: S.session,
          port: { type: 'integer', minimum: 1, maximum: 65535 },
          ttl_seconds: { type: 'integer', minimum: 1, maximum: 86400 },
        },
        ['session', 'port'],
      ),
      annotations: WRITE,
      task: 'forbidden',
      method: 'POST',
      sub: 'previews',
      body: (a) => ({ port: a.port, ...(a.ttl_seconds ? { ttlSeconds: a.ttl_seconds } : {}) }),
    }),
    simple({
      name: 'session_events',
      title: 'Session events',
      description:
        'A page of the ledger and runtime events after a cursor (since); pass the answer’s cursor to resume.',
      input: obj(
        {
          namespace: S.namespace,
          session: S.session,
          since: { type: 'string', maxLength: 64 },
          limit: { type: 'integer', minimum: 1, maximum: 1000 },
        },
        ['session'],
      ),
      annotations: READ,
      task: 'forbidden',
      method: 'GET',
      sub: 'events',
      query: (a) => ({ since: str(a.since), limit: str(a.limit ?? 100) }),
    }),
  ];
}
