// Rewind and replay tools (spec/agent-sessions.md's session_rewind_points, session_rewind and the
// replay route; controllers/agentsession/README.md "Rewind" and "Replay"): one REST call each with
// the caller's credential.
import { DESTRUCTIVE, READ, S, WRITE, nsOf, obj, outcomeOf, resourcePath, type ToolDef } from './tool.js';

const TAG = { type: 'string', minLength: 1, maxLength: 63 };

export const rewindTools: ToolDef[] = [
  {
    name: 'session_rewind_points',
    title: 'Rewind points',
    description: "The session's rewind points (automatic checkpoints before each action), oldest first.",
    input: obj({ namespace: S.namespace, session: S.session }, ['session']),
    annotations: READ,
    task: 'forbidden',
    route: 'GET agentsessions/NAME/rewind',
    async run(ctx, a) {
      const path = resourcePath(nsOf(ctx, a), 'agentsessions', a.session as string, 'rewind');
      return outcomeOf(await ctx.api.call('GET', path));
    },
  },
  {
    name: 'session_rewind',
    title: 'Undo actions',
    description:
      'Puts the session back before its last `steps` actions, or to the point `to` (rewind/undo); the newer points are dropped. Long work: ask for a Task.',
    input: obj(
      { namespace: S.namespace, session: S.session, steps: { type: 'integer', minimum: 1, maximum: 2000 }, to: TAG },
      ['session'],
    ),
    annotations: DESTRUCTIVE,
    task: 'optional',
    route: 'POST agentsessions/NAME/rewind/undo',
    async run(ctx, a) {
      if ((a.steps === undefined) === (a.to === undefined))
        return { kind: 'error', message: 'invalid argument steps: give exactly one of steps and to' };
      const path = resourcePath(nsOf(ctx, a), 'agentsessions', a.session as string, 'rewind/undo');
      return outcomeOf(
        await ctx.api.call('POST', path, { body: a.to !== undefined ? { to: a.to } : { steps: a.steps } }),
      );
    },
  },
  {
    name: 'session_replay',
    title: 'Replay a session',
    description:
      "Runs the exec commands of this session's ledger, in order, in the target session (through the target's own policy, approvals and budget); dry_run lists the steps and runs nothing. Long work: ask for a Task.",
    input: obj(
      {
        namespace: S.namespace,
        session: S.session,
        target: { type: 'string', minLength: 1, maxLength: 253 },
        dry_run: { type: 'boolean' },
        since: { type: 'integer', minimum: 0 },
        until: { type: 'integer', minimum: 0 },
        stop_on_failure: { type: 'boolean' },
        timeout_seconds: { type: 'integer', minimum: 1, maximum: 3600 },
      },
      ['session'],
    ),
    annotations: WRITE,
    task: 'optional',
    route: 'POST agentsessions/NAME/replay',
    async run(ctx, a) {
      const path = resourcePath(nsOf(ctx, a), 'agentsessions', a.session as string, 'replay');
      const body = {
        ...(a.target !== undefined ? { target: a.target } : {}),
        ...(a.dry_run !== undefined ? { dryRun: a.dry_run } : {}),
        ...(a.since !== undefined ? { since: a.since } : {}),
        ...(a.until !== undefined ? { until: a.until } : {}),
        ...(a.stop_on_failure !== undefined ? { stopOnFailure: a.stop_on_failure } : {}),
        ...(a.timeout_seconds !== undefined ? { timeoutSeconds: a.timeout_seconds } : {}),
      };
      return outcomeOf(await ctx.api.call('POST', path, { body }));
    },
  },
];
