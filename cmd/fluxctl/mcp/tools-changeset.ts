// sandbox_speculate and the changeset_* tools (Changeset resource, changesets/diff and
// changesets/approval, DESIGN.md section 6), and the approval tools of a session
// (approvals/NAME/approval: approvers only; a session token is refused by the API itself).
import type { Changeset } from '../../../apis/zz_generated.types.js';
import { jsonOf } from './api.js';
import {
  DESTRUCTIVE,
  GROUP_PATH,
  READ,
  S,
  WRITE,
  nsOf,
  obj,
  outcomeOf,
  pollUntil,
  resourcePath,
  statusError,
  terminalText,
  type Outcome,
  type ToolContext,
  type ToolDef,
} from './tool.js';

const CHANGESET = { type: 'string', minLength: 1, maxLength: 253, description: 'the Changeset name' };

/** What an agent reads of a changeset: phase, result, output (escaped, bounded), the changed paths, conflicts. */
export function changesetSummary(cs: Changeset): Record<string, unknown> {
  const s = cs.status ?? {};
  const cut = (l?: string[]) => (l && l.length > 200 ? [...l.slice(0, 200), `... ${l.length - 200} more`] : l);
  return {
    name: cs.metadata.name,
    sandbox: cs.spec.sandboxRef.name,
    command: cs.spec.command,
    phase: s.phase,
    decision: cs.spec.decision,
    apply: cs.spec.apply,
    result: s.result,
    exitCode: s.exitCode,
    stdout: s.stdout !== undefined ? terminalText(s.stdout) : undefined,
    stderr: s.stderr !== undefined ? terminalText(s.stderr) : undefined,
    changes: s.changes
      ? { added: cut(s.changes.added), modified: cut(s.changes.modified), deleted: cut(s.changes.deleted) }
      : undefined,
    unstaged: s.unstaged?.slice(0, 50),
    sideEffects: s.sideEffects ? { egress: s.sideEffects.egress, network: s.sideEffects.network } : undefined,
    conditions: s.conditions?.map((c) => ({ type: c.type, status: c.status, reason: c.reason, message: c.message })),
    expiresAt: (s as { expiresAt?: string }).expiresAt,
  };
}

async function getChangeset(ctx: ToolContext, ns: string, name: string): Promise<Changeset | Outcome> {
  const a = await ctx.api.call('GET', resourcePath(ns, 'changesets', name));
  if (a.status !== 200) return statusError(a.status, jsonOf(a));
  return jsonOf(a) as unknown as Changeset;
}

const isOutcome = (v: Changeset | Outcome): v is Outcome => 'kind' in v && typeof v.kind === 'string' && !('spec' in v);

/** Polls the changeset (bounded) until `done` says so; the summary or the timeout as a tool error. */
async function waitFor(
  ctx: ToolContext,
  ns: string,
  name: string,
  timeoutMs: number,
  done: (cs: Changeset) => boolean,
  what: string,
): Promise<Outcome> {
  let last: Changeset | undefined;
  const r = await pollUntil(ctx.signal, timeoutMs, async () => {
    const cs = await getChangeset(ctx, ns, name);
    if (isOutcome(cs)) return cs;
    last = cs;
    if (cs.status?.phase) ctx.progress(`changeset ${name}: ${cs.status.phase}`);
    return done(cs) ? ({ kind: 'ok', value: changesetSummary(cs) } as Outcome) : undefined;
  });
  if (r) return r;
  return {
    kind: 'error',
    message: `changeset ${name} did not ${what} within ${Math.round(timeoutMs / 1000)} s (phase ${last?.status?.phase ?? 'unknown'})`,
  };
}

const conflict = (cs: Changeset) => cs.status?.conditions?.some((c) => c.type === 'Conflict' && c.status === 'True');

export const changesetTools: ToolDef[] = [
  {
    name: 'sandbox_speculate',
    title: 'Speculate a command',
    description:
      'Runs a command in an isolated copy of a sandbox (an AgentSession’s sandbox has the session’s name) and returns what it would change, without changing the sandbox. Review with changeset_diff, decide with changeset_decide, then changeset_apply. Long work: ask for a Task.',
    input: obj(
      {
        namespace: S.namespace,
        sandbox: { type: 'string', minLength: 1, maxLength: 253 },
        command: {
          type: 'array',
          minItems: 1,
          maxItems: 4096,
          items: { type: 'string', maxLength: 65536 },
          description: 'argv, e.g. ["sh", "-c", "make format"]',
        },
        paths: { type: 'array', maxItems: 64, items: { type: 'string', pattern: '^/', maxLength: 4096 } },
        timeout_seconds: { type: 'integer', minimum: 1, maximum: 3600 },
        ttl_seconds: { type: 'integer', minimum: 1, maximum: 86400 },
      },
      ['sandbox', 'command'],
    ),
    annotations: WRITE,
    task: 'optional',
    route: 'POST changesets, then GET changesets/NAME until the speculation finished',
    async run(ctx, a) {
      const ns = nsOf(ctx, a);
      const created = await ctx.api.call('POST', resourcePath(ns, 'changesets'), {
        body: {
          apiVersion: 'fluxvm.dev/v1alpha1',
          kind: 'Changeset',
          metadata: { generateName: `${a.sandbox as string}-` },
          spec: {
            sandboxRef: { name: a.sandbox },
            command: a.command,
            ...(a.paths ? { paths: a.paths } : {}),
            ...(a.timeout_seconds ? { timeoutSeconds: a.timeout_seconds } : {}),
            ...(a.ttl_seconds ? { ttlSeconds: a.ttl_seconds } : {}),
          },
        },
      });
      if (created.status !== 201) return outcomeOf(created);
      const name = (jsonOf(created) as unknown as Changeset).metadata.name!;
      ctx.progress(`changeset ${name} created`);
      const limit = ((a.timeout_seconds as number | undefined) ?? 600) * 1000 + 60_000;
      return waitFor(ctx, ns, name, limit, (cs) => !!cs.status?.phase && cs.status.phase !== 'Running', 'finish');
    },
  },
  {
    name: 'changeset_get',
    title: 'Get a changeset',
    description: 'A changeset’s phase, result, output (escaped), changed paths, side effects and conditions.',
    input: obj({ namespace: S.namespace, changeset: CHANGESET }, ['changeset']),
    annotations: READ,
    task: 'forbidden',
    route: 'GET changesets/NAME',
    async run(ctx, a) {
      const cs = await getChangeset(ctx, nsOf(ctx, a), a.changeset as string);
      return isOutcome(cs) ? cs : { kind: 'ok', value: changesetSummary(cs) };
    },
  },
  {
    name: 'changeset_diff',
    title: 'Diff of a changeset',
    description: 'The unified diff of the staged change (escaped for a terminal, bounded).',
    input: obj({ namespace: S.namespace, changeset: CHANGESET }, ['changeset']),
    annotations: READ,
    task: 'forbidden',
    route: 'GET changesets/NAME/diff',
    async run(ctx, a) {
      const ans = await ctx.api.call('GET', resourcePath(nsOf(ctx, a), 'changesets', a.changeset as string, 'diff'));
      if (ans.status !== 200) return outcomeOf(ans);
      return { kind: 'ok', value: terminalText(ans.body.toString('utf8')) };
    },
  },
  {
    name: 'changeset_decide',
    title: 'Approve or reject a changeset',
    description: 'Sets spec.decision through changesets/approval (approvers only).',
    input: obj(
      { namespace: S.namespace, changeset: CHANGESET, decision: { type: 'string', enum: ['Approve', 'Reject'] } },
      ['changeset', 'decision'],
    ),
    annotations: { ...WRITE, idempotentHint: true },
    task: 'forbidden',
    route: 'PATCH changesets/NAME/approval',
    async run(ctx, a) {
      const spec = a.decision === 'Reject' ? { decision: 'Reject', apply: null } : { decision: 'Approve' };
      const ans = await ctx.api.call(
        'PATCH',
        resourcePath(nsOf(ctx, a), 'changesets', a.changeset as string, 'approval'),
        {
          body: { spec },
          contentType: 'application/merge-patch+json',
        },
      );
      return outcomeOf(ans, (v) => changesetSummary(v as unknown as Changeset));
    },
  },
  {
    name: 'changeset_apply',
    title: 'Apply an approved changeset',
    description:
      'Applies an approved changeset to the real sandbox (refused on drift: Conflict). Long work: ask for a Task; the result is Applied, Failed or the conflict.',
    input: obj({ namespace: S.namespace, changeset: CHANGESET }, ['changeset']),
    annotations: DESTRUCTIVE,
    task: 'optional',
    route: 'PATCH changesets/NAME/approval {spec.apply: true}, then GET changesets/NAME until Applied',
    async run(ctx, a) {
      const ns = nsOf(ctx, a);
      const name = a.changeset as string;
      const ans = await ctx.api.call('PATCH', resourcePath(ns, 'changesets', name, 'approval'), {
        body: { spec: { apply: true } },
        contentType: 'application/merge-patch+json',
      });
      if (ans.status !== 200) return outcomeOf(ans);
      const gen = (jsonOf(ans) as unknown as Changeset).metadata.generation ?? 1;
      const r = await waitFor(
        ctx,
        ns,
        name,
        600_000,
        (cs) =>
          ['Applied', 'Failed', 'Rejected', 'Expired'].includes(cs.status?.phase ?? '') ||
          (conflict(cs) === true && (cs.status?.observedGeneration ?? 0) >= gen),
        'apply',
      );
      if (r.kind === 'ok' && (r.value as { phase?: string }).phase !== 'Applied')
        return {
          kind: 'error',
          message: `changeset ${name} was not applied`,
          status: r.value as Record<string, unknown>,
        };
      return r;
    },
  },
  {
    name: 'session_approvals',
    title: 'Approvals of a session',
    description: 'The commands of a session held for approval: name, command, decision, expiry.',
    input: obj({ namespace: S.namespace, session: S.session }, ['session']),
    annotations: READ,
    task: 'forbidden',
    route: 'GET approvals',
    async run(ctx, a) {
      const ans = await ctx.api.call('GET', `${GROUP_PATH}/namespaces/${encodeURIComponent(nsOf(ctx, a))}/approvals`, {
        query: { limit: '500' },
      });
      return outcomeOf(ans, (v) =>
        (
          (v.items ?? []) as Array<{
            metadata: { name: string };
            spec: Record<string, unknown>;
            status?: Record<string, unknown>;
          }>
        )
          .filter((x) => (x.spec.sessionRef as { name?: string } | undefined)?.name === a.session)
          .map((x) => ({
            name: x.metadata.name,
            commandLine: terminalText(String(x.spec.commandLine ?? ''), 4096),
            decision: x.status?.decision,
            approver: x.status?.approver,
            expiresAt: x.status?.expiresAt,
            consumed: x.status?.consumed,
          })),
      );
    },
  },
  ...(['approve', 'deny'] as const).map((verb): ToolDef => ({
    name: `session_${verb}`,
    title: `${verb === 'approve' ? 'Approve' : 'Deny'} a held command`,
    description: `${verb === 'approve' ? 'Approves' : 'Denies'} a command held for approval (approvals/NAME/approval: approvers only; a session token is always refused).`,
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        approval: { type: 'string', minLength: 1, maxLength: 253 },
        note: { type: 'string', maxLength: 1024 },
      },
      ['session', 'approval'],
    ),
    annotations: { ...WRITE, idempotentHint: false },
    task: 'forbidden',
    route: 'PATCH approvals/NAME/approval',
    run: (ctx, a) =>
      decideApproval(ctx, nsOf(ctx, a), a.session as string, a.approval as string, verb, a.note as string | undefined),
  })),
];

/** Decides an Approval with the caller's credential (the one place the MCP server decides; tasks/update too). */
export async function decideApproval(
  ctx: Pick<ToolContext, 'api'>,
  ns: string,
  session: string,
  approval: string,
  verb: 'approve' | 'deny',
  note?: string,
): Promise<Outcome> {
  const type = verb === 'approve' ? 'Approved' : 'Denied';
  const ans = await ctx.api.call('PATCH', resourcePath(ns, 'approvals', approval, 'approval'), {
    body: {
      spec: { sessionRef: { name: session } },
      status: { conditions: [{ type, status: 'True', ...(note ? { message: note } : {}) }] },
    },
    contentType: 'application/merge-patch+json',
  });
  return outcomeOf(ans, (v) => ({
    approval: (v.metadata as { name?: string }).name,
    decision: type,
    approver: (v.status as { approver?: string } | undefined)?.approver,
  }));
}
