// agentsessions/NAME/replay (spec/agent-sessions.md "Replay"): the exec commands of
// this session's ledger, in order, through the TARGET session's own exec (execgate.ts beginExec
// and runTicketed: its lifecycle gate, process policy, approvals, budget, confinement and ledger
// apply, so a replay cannot do more than the target may).
//
//   POST {target?, dryRun?, since?, until?, stopOnFailure? (default true), keepGoing?,
//         timeoutSeconds? (per command, 1-3600, default 300), approvalName?}
//
// - since (exclusive, an entry number: "after entry N", as ledger?afterEntry) and until
//   (inclusive) bound the source entries; at most MAX_REPLAY_STEPS (500) commands per request:
//   past that the answer has `next.since` to continue from.
// - Steps that cannot be replayed are listed under `skipped` with the reason: file writes,
//   deletes and uploads (the ledger holds a path and size, not the content), jobs, git verbs
//   (commit, branch, and the git route's push/pull/fetch execs), terminal (tty) execs,
//   promotions, checkpoints/restores/forks, and commands the source refused.
// - Stops at the first non-zero exit unless stopOnFailure is false (keepGoing: true is the same),
//   and always at a refusal (403: policy, budget, a used approval) or an approval request (428:
//   policy.process.ask): `stopped` carries the reason, the entry, and for a 428 the Approval's
//   name; `next.since` says where to continue, and the continuation passes `approvalName` (used
//   for its first command only) once an operator approved it.
// - dryRun lists the steps and the skipped entries and runs nothing (a target is optional then).
// - Authorization: the request itself is `create agentsessions/replay` on the source (a session
//   token needs op exec: tokens.ts); then read of the source (`get agentsessions/ledger`) and exec
//   on the target (`create agentsessions/exec`) are checked with the API server's authorizer for
//   the requesting user (403 naming what is missing); a session token reaches only its own
//   session, so it can replay into nothing else. Tenant-scoped: a target in another namespace is
//   403, a missing one 404; the target must be another session (422).
// - The target's ledger gets one `replay` entry (source, range, counts, how it ended) after its
//   own exec entries; the answer names it (replayEntry).
import type { SubresourceHandler, SubresourceRequest } from '../../runtime/apiserver/http/subresources.js';
import { forbidden, type Attributes } from '../../runtime/apiserver/http/auth.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { jsonBody, timeoutOf } from '../sandbox/request.js';
import { GROUP, resolveSession, type AgentSessionSubresourceDeps, type SessionTarget } from './common.js';
import { beginExec, cutOutput, runTicketed } from './execgate.js';
import type { LedgerEntry } from './ledger.js';

export const MAX_REPLAY_STEPS = 500;
const OUTPUT_BYTES = 4096;
const FIELDS = [
  'target',
  'dryRun',
  'since',
  'until',
  'stopOnFailure',
  'keepGoing',
  'timeoutSeconds',
  'approvalName',
] as const;

export interface ReplayStep {
  entry: number;
  command: string | string[];
  argv: string[];
  recordedExitCode?: number;
}
export interface SkippedStep {
  entry: number;
  kind: string;
  reason: string;
  path?: string;
  command?: unknown;
}

const NOT_REPLAYED: Record<string, string> = {
  'file.write': 'a file write: the ledger records its path and size, not its content',
  'file.delete': 'a file delete: not an exec command (files are not replayed)',
  'file.upload': 'an upload: the ledger records its path and size, not its content',
  'job.start': 'a background job: replay runs plain exec commands only',
  'git.commit': 'a git commit: git steps are not replayed',
  'git.branch': 'a git branch: git steps are not replayed',
  promote: 'a promotion: it carried files from a child, which the ledger does not hold',
  'promote.out': 'a promotion to the parent: not replayed',
  fork: 'a fork: lifecycle operations are not replayed',
  checkpoint: 'a checkpoint: lifecycle operations are not replayed',
  restore: 'a restore: lifecycle operations are not replayed',
  'exec.refused': 'refused in the source session (it never ran there)',
};

/** The argv of a ledgered command (a string is what ran as `sh -c`), or undefined when it is not one. Pure. */
export function argvOfLedger(command: unknown): string[] | undefined {
  if (typeof command === 'string' && command) return ['sh', '-c', command];
  if (Array.isArray(command) && command.length > 0 && command.every((a) => typeof a === 'string'))
    return command as string[];
  return undefined;
}

/**
 * What a replay over `entries` (oldest first, all after `since`) runs and skips, up to `until`
 * (inclusive) and at most `max` commands; `more` when commands remain after the last step. Pure.
 */
export function replayPlan(
  entries: LedgerEntry[],
  until = Number.MAX_SAFE_INTEGER,
  max = MAX_REPLAY_STEPS,
): { steps: ReplayStep[]; skipped: SkippedStep[]; more: boolean } {
  const steps: ReplayStep[] = [];
  const skipped: SkippedStep[] = [];
  for (const e of entries) {
    if (e.entry > until) break;
    if (e.kind === 'exec') {
      const argv = argvOfLedger(e.command);
      let why: string | undefined;
      if (!argv) why = 'the ledgered command is not an argv list or a string';
      else if (e.tty) why = 'an interactive terminal (tty): its input is not recorded';
      else if (argv[0] === 'git' && argv[1] === '-C' && ['push', 'pull', 'fetch'].includes(argv[3] ?? ''))
        why = `a git ${argv[3]} (the git route's network verb): git steps are not replayed`;
      if (why) {
        skipped.push({ entry: e.entry, kind: e.kind, reason: why, command: e.command });
        continue;
      }
      if (steps.length >= max) return { steps, skipped, more: true };
      steps.push({
        entry: e.entry,
        command: e.command as string | string[],
        argv: argv!,
        ...(typeof e.exitCode === 'number' ? { recordedExitCode: e.exitCode } : {}),
      });
    } else if (NOT_REPLAYED[e.kind]) {
      skipped.push({
        entry: e.entry,
        kind: e.kind,
        reason: NOT_REPLAYED[e.kind]!,
        ...(typeof e.path === 'string' ? { path: e.path } : {}),
        ...(e.command !== undefined ? { command: e.command } : {}),
      });
    }
  }
  return { steps, skipped, more: false };
}

function intField(v: unknown, field: string): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0)
    throw errors.badRequest(
      `${field} must be a non-negative integer (a ledger entry number), got ${JSON.stringify(v)}`,
      [{ reason: 'FieldValueInvalid', field, message: 'must be a non-negative integer' }],
    );
  return v;
}

function boolField(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean')
    throw errors.badRequest(`${field} must be true or false, got ${JSON.stringify(v)}`, [
      { reason: 'FieldValueInvalid', field, message: 'must be a boolean' },
    ]);
  return v;
}

/** The target's name, from `target` as a name or as {name, namespace?}; 403 for another namespace. */
function targetOf(v: unknown, namespace: string): string | undefined {
  if (v === undefined || v === null || v === '') return undefined;
  let name: unknown = v;
  let ns: unknown = namespace;
  if (typeof v === 'object' && !Array.isArray(v)) {
    name = (v as Record<string, unknown>).name;
    ns = (v as Record<string, unknown>).namespace ?? namespace;
  }
  if (typeof name !== 'string' || !/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(name) || typeof ns !== 'string')
    throw errors.badRequest(`target must be the name of a session (or {name, namespace}), got ${JSON.stringify(v)}`, [
      { reason: 'FieldValueInvalid', field: 'target', message: 'not a session name' },
    ]);
  if (ns !== namespace) {
    const e = errors.forbidden(
      `replay is tenant-scoped: the target must be a session in the namespace "${namespace}", not "${ns}"`,
    );
    e.status.details = {
      name,
      group: GROUP,
      kind: 'agentsessions',
      causes: [{ reason: 'FieldValueForbidden', field: 'target.namespace', message: 'another namespace' }],
    };
    throw e;
  }
  return name;
}

/** Checks `verb agentsessions/sub` on `name` for the requesting user with the API's authorizer (403 naming it). */
async function authorizeOn(
  d: AgentSessionSubresourceDeps,
  r: SubresourceRequest,
  verb: string,
  sub: string,
  name: string,
  why: string,
): Promise<void> {
  const user = r.ctx?.user;
  if (!d.authorize || !user) return;
  const attrs: Attributes = {
    user,
    resource: {
      verb,
      namespace: r.namespace,
      group: GROUP,
      version: r.gvr.version,
      resource: 'agentsessions',
      subresource: sub,
      name,
    },
  };
  const dec = await d.authorize(attrs);
  if (!dec.allowed) throw forbidden(attrs, `${why}${dec.reason ? `: ${dec.reason}` : ''}`);
}

/** Aborts when the client goes away (the replay stops before its next command). */
function clientGone(r: SubresourceRequest): AbortSignal {
  const ac = new AbortController();
  const res = r.reply?.raw;
  res?.once('close', () => {
    if (!res.writableFinished) ac.abort();
  });
  return ac.signal;
}

interface Stopped {
  reason: 'Failed' | 'ApprovalRequired' | 'Refused' | 'Conflict' | 'Error' | 'ClientGone';
  entry: number;
  message: string;
  approval?: string;
  status?: unknown;
}

export function replayHandler(d: AgentSessionSubresourceDeps): SubresourceHandler {
  return {
    verbs: ['create'],
    async handle(r) {
      if (r.method !== 'POST') throw errors.methodNotAllowed(`replay takes POST, not ${r.method}`);
      const body = jsonBody(r, true);
      const unknown = Object.keys(body).filter((k) => !(FIELDS as readonly string[]).includes(k));
      if (unknown.length)
        throw errors.badRequest(`unknown field "${unknown[0]}" (replay takes ${FIELDS.join(', ')})`, [
          { reason: 'FieldValueInvalid', field: unknown[0]!, message: 'unknown field' },
        ]);
      const dryRun = boolField(body.dryRun, 'dryRun') ?? false;
      const since = intField(body.since, 'since') ?? 0;
      const until = intField(body.until, 'until');
      if (until !== undefined && until <= since)
        throw errors.badRequest(`until (${until}) must be greater than since (${since})`, [
          { reason: 'FieldValueInvalid', field: 'until', message: 'not after since' },
        ]);
      const keepGoing = boolField(body.keepGoing, 'keepGoing');
      const stopOnFailure =
        boolField(body.stopOnFailure, 'stopOnFailure') ?? (keepGoing === undefined ? true : !keepGoing);
      const timeoutMs = timeoutOf(body.timeoutSeconds, 300);
      if (body.approvalName !== undefined && (typeof body.approvalName !== 'string' || !body.approvalName))
        throw errors.badRequest('approvalName must be the name of an Approval', [
          { reason: 'FieldValueInvalid', field: 'approvalName', message: 'not a name' },
        ]);
      const target = targetOf(body.target, r.namespace!);
      if (!target && !dryRun)
        throw errors.badRequest('target is required (the session to replay into) unless dryRun is true', [
          { reason: 'FieldValueRequired', field: 'target', message: 'required unless dryRun' },
        ]);
      if (target === r.name)
        throw errors.invalid('AgentSessionReplay', GROUP, r.name, [
          {
            reason: 'FieldValueInvalid',
            field: 'target',
            message: 'the target must be another session than the source',
          },
        ]);
      await authorizeOn(d, r, 'get', 'ledger', r.name, "replay reads the source session's ledger");
      if (target)
        await authorizeOn(d, r, 'create', 'exec', target, "replay runs commands through the target session's exec");
      const source = await resolveSession(d, r, { running: false });
      const plan = replayPlan(await d.ledger.read(source.uid, since), until);
      const base = {
        kind: 'AgentSessionReplay',
        apiVersion: 'fluxvm.dev/v1alpha1',
        source: r.name,
        ...(target ? { target } : {}),
        dryRun,
        since,
        ...(until !== undefined ? { until } : {}),
      };
      const next = (after: number) => ({ since: after, ...(until !== undefined ? { until } : {}) });
      if (dryRun) {
        const last = plan.steps[plan.steps.length - 1]?.entry ?? since;
        return {
          ...base,
          steps: plan.steps.map(({ entry, command, recordedExitCode }) => ({ entry, command, recordedExitCode })),
          skipped: plan.skipped,
          completed: !plan.more,
          ...(plan.more ? { next: next(last) } : {}),
        };
      }
      const t: SessionTarget = await resolveSession(d, { ...r, name: target! });
      const gone = clientGone(r);
      const ran: Array<Record<string, unknown>> = [];
      let stopped: Stopped | undefined;
      let resume = since;
      for (const [i, s] of plan.steps.entries()) {
        if (gone.aborted) {
          stopped = { reason: 'ClientGone', entry: s.entry, message: 'the client went away' };
          break;
        }
        try {
          const tk = await beginExec(d, t, s.argv, timeoutMs, {
            name: i === 0 ? (body.approvalName as string | undefined) : undefined,
            waitMs: 0,
          });
          const { res, out, err, entry } = await runTicketed(d, t, tk, { argv: s.argv });
          const o = cutOutput(Buffer.from(out.text), OUTPUT_BYTES);
          const e = cutOutput(Buffer.from(err.text), OUTPUT_BYTES);
          ran.push({
            entry: s.entry,
            command: s.command,
            exitCode: res.exitCode,
            ...(s.recordedExitCode !== undefined
              ? { recordedExitCode: s.recordedExitCode, sameExitCode: s.recordedExitCode === res.exitCode }
              : {}),
            targetEntry: entry,
            durationMs: Math.round(res.durationMs),
            ...(res.timedOut ? { timedOut: true } : {}),
            stdout: o.text,
            stderr: e.text,
            ...(o.dropped || e.dropped || out.dropped || err.dropped ? { outputTruncated: true } : {}),
          });
          resume = s.entry;
          if (res.exitCode !== 0 && stopOnFailure) {
            stopped = { reason: 'Failed', entry: s.entry, message: `exit code ${res.exitCode} (stopOnFailure)` };
            break;
          }
        } catch (e) {
          if (!(e instanceof StatusError)) {
            stopped = { reason: 'Error', entry: s.entry, message: e instanceof Error ? e.message : String(e) };
            break;
          }
          const st = e.status;
          stopped = {
            reason:
              st.code === 428
                ? 'ApprovalRequired'
                : st.code === 403
                  ? 'Refused'
                  : st.code === 409
                    ? 'Conflict'
                    : 'Error',
            entry: s.entry,
            message: st.message ?? '',
            ...(st.code === 428 && st.details?.name ? { approval: st.details.name } : {}),
            status: st,
          };
          break;
        }
      }
      const completed = !stopped && !plan.more;
      const rec = await d.ledger.append(t.uid, 'replay', {
        source: r.name,
        sourceUid: source.uid,
        since,
        ...(until !== undefined ? { until } : {}),
        ran: ran.length,
        skipped: plan.skipped.length,
        completed,
        ...(stopped
          ? {
              stopped: stopped.reason,
              stoppedAt: stopped.entry,
              ...(stopped.approval ? { approval: stopped.approval } : {}),
            }
          : {}),
      });
      return {
        ...base,
        steps: ran,
        skipped: plan.skipped,
        completed,
        ...(stopped ? { stopped } : {}),
        // next: where to continue (none when the range is done, even if its last step failed)
        ...(completed || (until !== undefined && resume >= until) ? {} : { next: next(resume) }),
        replayEntry: rec.entry,
      };
    },
  };
}
