// `fluxctl agent approvals|approve|deny` (spec/agent-sessions.md "Approvals") over the
// Approval kind and its approvals/<name>/approval subresource (controllers/agentsession/approvals.ts):
//
//   approvals SESSION [-o json|yaml]       the session's approvals: name, kind, command, state,
//                                          approver, expiry (state: Pending, Approved, Denied,
//                                          Consumed, Expired)
//   approve SESSION APPROVAL [--note N]    decide (fluxvm-approver; never a session token)
//   deny SESSION APPROVAL [--note N]
// and the hint `fluxctl agent exec` prints when a command is held (428): the Approval's name,
// the command an operator runs to approve it, and the retry with --approval.
import type { Command } from 'commander';
import { approvalState, shellWord } from '../../controllers/agentsession/approval-rules.js';
import type { Approval } from '../../apis/zz_generated.types.js';
import type { ClientNodeClient } from '../../runtime/client/clientnode.js';
import type { StatusError } from '../../runtime/meta/errors.js';
import { gvrOf, type GVR } from '../../runtime/meta/types.js';
import { escapeLine } from './escape.js';
import { tabwrite, toJson, toYaml } from './printers.js';
import { CliError, type Io } from './util.js';
import { approval as approvalKind } from '../../apis/approval.js';

const APPROVALS: GVR = gvrOf(approvalKind);

interface Conn {
  client: ClientNodeClient;
  ns: string;
}

/** What agent.ts hands over. */
export interface ApprovalVerbApi {
  conn(cmd: Command): Conn;
  verb(name: string): Command;
}

function age(ts: string | undefined, now: number): string {
  if (!ts) return '<unknown>';
  const s = Math.floor((Date.parse(ts) - now) / 1000);
  const a = Math.abs(s);
  const d = a < 120 ? `${a}s` : a < 7200 ? `${Math.floor(a / 60)}m` : `${Math.floor(a / 3600)}h`;
  return s >= 0 ? `in ${d}` : `${d} ago`;
}

/**
 * The lines `fluxctl agent exec` prints for a 428: which Approval holds the command, the exact
 * command an operator runs, and the retry. Pure (names come from the server's Status).
 */
export function heldHint(e: StatusError, session: string, ns: string, words: string[]): string {
  const name = e.status.details?.name ?? '';
  const expires = e.status.details?.causes?.find((c) => c.reason === 'ExpiresAt')?.message;
  return [
    `fluxctl: the command is held for an operator's approval: Approval ${escapeLine(name)}${expires ? ` (pending until ${expires})` : ''}`,
    `  an operator approves it with:  fluxctl agent approve ${session} ${escapeLine(name)} -n ${ns}`,
    `  then run it with:              fluxctl agent exec ${session} -n ${ns} --approval ${escapeLine(name)} -- ${escapeLine(words.map(shellWord).join(' '))}`,
    '',
  ].join('\n');
}

/** Registers approvals, approve and deny on `fluxctl agent`. */
export function addApprovalVerbs(a: ApprovalVerbApi, io: Io, setExit: (code: number) => void): void {
  a.verb('approvals')
    .description("the session's approvals (held commands): name, kind, command, state, approver, expiry")
    .argument('<session>')
    .option('-o, --output <format>', 'json or yaml', (v: string) => (v.startsWith('=') ? v.slice(1) : v))
    .action(async (session: string, o, cmd: Command) => {
      const c = a.conn(cmd);
      const l = await c.client.list<Approval>(APPROVALS, c.ns, { fieldSelector: `spec.sessionRef.name=${session}` });
      if (o.output === 'json') return (io.out(toJson(l)), setExit(0));
      if (o.output === 'yaml') return (io.out(toYaml(l)), setExit(0));
      if (o.output)
        throw new CliError(
          `error: unable to match a printer suitable for the output format "${o.output}", allowed formats are: json,yaml`,
        );
      const now = Date.now();
      const rows = [['NAME', 'KIND', 'COMMAND', 'STATE', 'APPROVER', 'EXPIRES', 'AGE']];
      const items = l.items.sort((x, y) =>
        String(x.metadata?.creationTimestamp).localeCompare(String(y.metadata?.creationTimestamp)),
      );
      for (const x of items) {
        rows.push([
          x.metadata!.name!,
          x.spec.kind,
          escapeLine(x.spec.commandLine ?? x.spec.command.join(' ')),
          approvalState(x, now),
          escapeLine(x.status?.approver ?? ''),
          age(x.status?.expiresAt, now),
          age(x.metadata?.creationTimestamp, now).replace(/ ago$/, ''),
        ]);
      }
      io.out(items.length ? tabwrite(rows) : `No approvals found for session ${session} in ${c.ns} namespace.\n`);
      setExit(0);
    });

  for (const [name, decision] of [
    ['approve', 'Approved'],
    ['deny', 'Denied'],
  ] as const) {
    a.verb(name)
      .description(`${name} a held command of the session (needs approvals/approval: fluxvm-approver)`)
      .argument('<session>')
      .argument('<approval>')
      .option('--note <text>', 'a note kept with the decision (and in the ledger)')
      .action(async (session: string, approval: string, o, cmd: Command) => {
        const c = a.conn(cmd);
        const body = {
          spec: { sessionRef: { name: session } },
          status: { conditions: [{ type: decision, status: 'True', ...(o.note ? { message: o.note } : {}) }] },
        };
        const r = await c.client.patch<Approval>(APPROVALS, c.ns, approval, 'merge', body, { subresource: 'approval' });
        io.out(
          `approval.fluxvm.dev/${r.metadata.name} ${decision.toLowerCase()} (${escapeLine(r.spec.commandLine ?? '')})\n`,
        );
        setExit(0);
      });
  }
}
